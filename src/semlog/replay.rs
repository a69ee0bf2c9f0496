//! `llmgate semlog replay`: sends the dead-letter files (documents the cluster refused,
//! kept as the `_bulk` pairs they were sent as) to the cluster again, once the mapping
//! or template that refused them is fixed, and says how many went in.
//!
//! Idempotent by event id: the data stream is first asked which of a batch's ids it
//! holds, in any backing index ([`held`](super::held): an earlier replay may have
//! indexed them into a backing index the stream has since rolled over), and only the
//! others are sent, each a `create` with the document's own `_id` (a 409 for one that
//! arrived in between). Those it holds are counted as already there, never indexed
//! twice. The files are left
//! where they are (the gateway may be appending to the newest), so running it again is
//! safe and says the same; `semlog.files_max_bytes` bounds them.

use std::path::{Path, PathBuf};

use super::config::SemlogConfig;
use super::document::Encoded;
use super::elasticsearch::{BulkResult, Cluster, Item};
use super::held;
use super::indexer::dead_letter_dir;

/// Documents per `_bulk` request.
const BATCH: usize = 500;

/// What a replay did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    pub files: usize,
    pub documents: usize,
    /// Indexed now.
    pub indexed: usize,
    /// Already in the index (409): an earlier replay took them.
    pub already: usize,
    /// Refused again: (id, status, error type, reason).
    pub refused: Vec<(String, u16, String, String)>,
    /// Lines that are not a `create` pair (a torn tail).
    pub unreadable: usize,
    /// The stream could not be searched: documents were sent without the look-up.
    pub unchecked: bool,
}

impl std::fmt::Display for ReplaySummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} documents in {} dead-letter files: {} indexed, {} already indexed, {} refused again",
            self.documents,
            self.files,
            self.indexed,
            self.already,
            self.refused.len()
        )?;
        if self.unreadable > 0 {
            write!(f, ", {} unreadable lines skipped", self.unreadable)?;
        }
        Ok(())
    }
}

/// The dead-letter files in `data_dir`, oldest first.
pub fn dead_letter_files(data_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let dir = dead_letter_dir(data_dir);
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dead-letter-") && n.ends_with(".ndjson"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The documents of a dead-letter file, and how many lines were neither a `create` pair
/// nor a line of the earlier format (`{"_id", "status", "error_type", "reason",
/// "document"}`, one per document, written before dead letters were `_bulk` pairs). A
/// source line is read only after a valid action, so one damaged line costs one document,
/// not the pairing of the rest.
pub fn read_pairs(text: &[u8]) -> (Vec<Encoded>, usize) {
    let mut docs = Vec::new();
    let mut unreadable = 0;
    let mut lines = text.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    while let Some(line) = lines.next() {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) else {
            unreadable += 1;
            continue;
        };
        if let Some(id) = value["create"]["_id"].as_str() {
            match lines.next() {
                Some(source) => docs.push(pair(id, line, source)),
                None => unreadable += 1,
            }
        } else if let (Some(id), true) = (value["_id"].as_str(), value["document"].is_object()) {
            let action = serde_json::json!({"create": {"_id": id}}).to_string();
            let source = value["document"].to_string();
            docs.push(pair(id, action.as_bytes(), source.as_bytes()));
        } else {
            unreadable += 1;
        }
    }
    (docs, unreadable)
}

fn pair(id: &str, action: &[u8], source: &[u8]) -> Encoded {
    let mut lines = Vec::with_capacity(action.len() + source.len() + 2);
    lines.extend_from_slice(action);
    lines.push(b'\n');
    lines.extend_from_slice(source);
    lines.push(b'\n');
    Encoded {
        id: id.to_owned(),
        lines: lines.into(),
    }
}

/// Sends `files` (the data directory's dead-letter files when empty) to the cluster of
/// `config`. An error when the cluster is not taking documents: the report so far and
/// why (nothing is lost: the files stay).
pub async fn replay(
    config: &SemlogConfig,
    files: &[PathBuf],
) -> Result<ReplaySummary, (ReplaySummary, String)> {
    let mut report = ReplaySummary::default();
    let Some(es) = &config.elasticsearch else {
        return Err((
            report,
            "no cluster is configured (semlog.es_url or semlog.es_cloud_id): replay sends the dead letters to one".into(),
        ));
    };
    let mut es = es.clone();
    if let Some(path) = &es.ca_cert {
        match std::fs::read(path) {
            Ok(pem) => es.ca_cert_pem = Some(pem),
            Err(e) => return Err((report, format!("{}: {e}", path.display()))),
        }
    }
    let cluster = match Cluster::new(&es, config.data_stream()) {
        Ok(cluster) => cluster,
        Err(e) => return Err((report, e)),
    };
    let files = if files.is_empty() {
        dead_letter_files(&config.data_dir)
            .map_err(|e| (ReplaySummary::default(), e.to_string()))?
    } else {
        files.to_vec()
    };
    for file in &files {
        let text = match std::fs::read(file) {
            Ok(text) => text,
            Err(e) => return Err((report, format!("{}: {e}", file.display()))),
        };
        let (docs, unreadable) = read_pairs(&text);
        report.files += 1;
        report.documents += docs.len();
        report.unreadable += unreadable;
        for batch in docs.chunks(BATCH) {
            let found = match held::held(&cluster, batch, true).await {
                Ok(held::Lookup::Held(found)) => found,
                // Sent as before; a document that is already there in the write index
                // is still answered 409.
                Ok(held::Lookup::NotSearchable(reason)) => {
                    if !report.unchecked {
                        eprintln!("llmgate semlog replay: the data stream cannot be searched ({reason}): documents are sent without asking which it holds, and one indexed before a rollover may be stored twice; grant the user read on logs-llmgate.requests-*");
                    }
                    report.unchecked = true;
                    Default::default()
                }
                Err((trouble, reason)) => {
                    let why = format!(
                        "the cluster is not answering ({}): {reason}",
                        trouble.as_str()
                    );
                    return Err((report, why));
                }
            };
            let rest: Vec<Encoded> = batch
                .iter()
                .filter(|doc| !found.contains(&doc.id))
                .cloned()
                .collect();
            report.already += batch.len() - rest.len();
            if rest.is_empty() {
                continue;
            }
            if let Err(why) = send(&cluster, &rest, &mut report).await {
                return Err((report, why));
            }
        }
    }
    Ok(report)
}

/// One batch; a 413 sends it in halves.
async fn send(
    cluster: &Cluster,
    batch: &[Encoded],
    report: &mut ReplaySummary,
) -> Result<(), String> {
    match cluster.bulk(batch).await {
        BulkResult::Items(items) => {
            // Every item is counted before a trouble stops the replay: the ones before
            // and after it in the batch may have gone in.
            let mut trouble_seen = None;
            for (doc, item) in batch.iter().zip(items) {
                match item {
                    Item::Indexed => report.indexed += 1,
                    Item::Duplicate => report.already += 1,
                    Item::Retry { trouble, reason } => {
                        trouble_seen.get_or_insert(format!(
                            "the cluster is not taking documents ({}): {reason}",
                            trouble.as_str()
                        ));
                    }
                    Item::Rejected {
                        status,
                        error_type,
                        reason,
                    } => report
                        .refused
                        .push((doc.id.clone(), status, error_type, reason)),
                }
            }
            trouble_seen.map_or(Ok(()), Err)
        }
        BulkResult::RetryAll {
            trouble, reason, ..
        } => Err(format!(
            "the cluster is not taking documents ({}): {reason}",
            trouble.as_str()
        )),
        BulkResult::Split if batch.len() > 1 => {
            let (first, second) = batch.split_at(batch.len() / 2);
            Box::pin(send(cluster, first, report)).await?;
            Box::pin(send(cluster, second, report)).await
        }
        BulkResult::Split => {
            report.refused.push((
                batch[0].id.clone(),
                413,
                "request_entity_too_large".into(),
                "over the cluster's request size limit".into(),
            ));
            Ok(())
        }
        BulkResult::RejectAll { status, reason } => {
            for doc in batch {
                report.refused.push((
                    doc.id.clone(),
                    status,
                    "bulk_request_rejected".into(),
                    reason.clone(),
                ));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_read_back_as_they_were_sent_and_a_torn_tail_is_counted() {
        let text = b"{\"create\":{\"_id\":\"a\"}}\n{\"x\":1}\n{\"create\":{\"_id\":\"b\"}}\n{\"x\":2}\n{\"create\":{\"_id\":\"c\"}}\n";
        let (docs, unreadable) = read_pairs(text);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].id, "b");
        assert_eq!(
            &docs[0].lines[..],
            b"{\"create\":{\"_id\":\"a\"}}\n{\"x\":1}\n"
        );
        assert_eq!(unreadable, 1);
    }

    #[test]
    fn a_damaged_line_costs_one_document_and_the_earlier_format_is_read() {
        let text = concat!(
            "not json\n",
            "{\"create\":{\"_id\":\"a\"}}\n{\"x\":1}\n",
            "{\"_id\":\"b\",\"status\":400,\"error_type\":\"mapper_parsing_exception\",\"reason\":\"r\",\"document\":{\"x\":2}}\n",
        );
        let (docs, unreadable) = read_pairs(text.as_bytes());
        assert_eq!(unreadable, 1);
        let ids: Vec<&str> = docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(
            &docs[1].lines[..],
            b"{\"create\":{\"_id\":\"b\"}}\n{\"x\":2}\n"
        );
    }
}

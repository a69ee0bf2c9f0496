//! Exactly once across rollovers: which documents may already be in the data stream,
//! and asking the stream which of them it holds before they are sent again.
//!
//! Every document is a `create` with its event id as `_id`, which the cluster answers
//! 409 when the id is already in the index the document goes to. A data stream writes
//! to one backing index at a time, so after a rollover a document already indexed into
//! the old backing index is created again in the new one: the spool's re-send, or a
//! second `llmgate semlog replay`, stored it twice. So documents whose fate is unknown
//! are first looked up in the whole stream (every backing index), and only those it
//! does not hold are sent. A document's fate is unknown when:
//! - it was in the spool when the gateway started: the last run may have sent it and
//!   stopped before it acknowledged it;
//! - it was sent in a `_bulk` request that got no item-by-item answer (a timeout, a
//!   broken connection, a 5xx or 429 for the whole request, which a proxy may give after
//!   the cluster took the request);
//! - it is a dead letter being replayed (an earlier replay may have indexed it).
//!
//! A document the cluster answered for item by item is known (indexed, a duplicate,
//! refused, or not taken and to be retried) and is sent without a look-up, so a healthy
//! cluster sees no search at all.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::document::Encoded;
use super::elasticsearch::Cluster;
use super::health::Trouble;

/// Ids looked up per search: with room for an id stored twice before (its hits count
/// twice), far under the default `index.max_result_window` (10,000).
const PER_SEARCH: usize = 1000;

/// Look-ups that fail in a row, while the cluster answers writes, before the documents
/// waiting on them are sent unchecked: a search that fails for good (a red old backing
/// index) while writes go through must not hold the log back for ever. While writes get
/// no answer either, sending unchecked gains nothing, and the documents wait.
pub const LOOKUP_TRIES: u32 = 5;

/// At most one `_refresh` of the stream per this long: a large spool left by the last
/// run is looked up batch after batch.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// The documents whose fate the indexer does not know (see the module's docs).
#[derive(Debug, Default)]
pub struct Unsure {
    /// Documents the spool held at start-up that are not yet acknowledged: the first
    /// this many read from it (read oldest first; a batch re-read after a failure is
    /// counted once, when it is acknowledged).
    from_last_run: u64,
    /// Ids sent in a request that got no item-by-item answer, until they are looked up.
    unanswered: HashSet<String>,
    /// The stream cannot be searched by the gateway (found once, said once): nothing is
    /// looked up any more.
    not_searchable: bool,
    /// Look-ups that failed in a row.
    failed: u32,
    /// A `_bulk` was answered document by document since the last failed look-up.
    writes_answered: bool,
    /// When the stream was last refreshed for a look-up.
    refreshed: Option<Instant>,
}

impl Unsure {
    /// The spool held `pending_docs` documents when the gateway started.
    pub fn at_start(pending_docs: u64) -> Self {
        Self {
            from_last_run: pending_docs,
            ..Self::default()
        }
    }

    /// `docs` (a batch read from the spool, oldest first) split into those that may
    /// already be in the stream, to look up, and those known not to be.
    pub fn split(&self, docs: Vec<Encoded>) -> (Vec<Encoded>, Vec<Encoded>) {
        if self.not_searchable {
            return (Vec::new(), docs);
        }
        let old = usize::try_from(self.from_last_run).unwrap_or(usize::MAX);
        let (mut look, mut send) = (Vec::new(), Vec::new());
        for (i, doc) in docs.into_iter().enumerate() {
            if i < old || self.unanswered.contains(&doc.id) {
                look.push(doc);
            } else {
                send.push(doc);
            }
        }
        (look, send)
    }

    /// `docs` were sent and no answer said what became of each.
    pub fn unanswered(&mut self, docs: &[Encoded]) {
        self.unanswered.extend(docs.iter().map(|d| d.id.clone()));
    }

    /// `docs` were looked up (each is in the stream, or not and about to be sent), or
    /// are sent unchecked.
    pub fn settled(&mut self, docs: &[Encoded]) {
        for doc in docs {
            self.unanswered.remove(&doc.id);
        }
    }

    /// `docs` documents read from the spool were acknowledged.
    pub fn acknowledged(&mut self, docs: u64) {
        self.from_last_run = self.from_last_run.saturating_sub(docs);
    }

    /// The stream cannot be searched: whether this is news (to be said once).
    pub fn not_searchable(&mut self) -> bool {
        !std::mem::replace(&mut self.not_searchable, true)
    }

    /// A look-up failed: whether it has failed [`LOOKUP_TRIES`] times in a row with
    /// writes answered meanwhile, and its documents go unchecked (the count starts
    /// again).
    pub fn lookup_failed(&mut self) -> bool {
        self.failed += 1;
        if self.failed < LOOKUP_TRIES || !self.writes_answered {
            return false;
        }
        self.failed = 0;
        self.writes_answered = false;
        true
    }

    /// A `_bulk` was answered document by document: the cluster takes writes.
    pub fn write_answered(&mut self) {
        self.writes_answered = true;
    }

    /// A look-up was answered.
    pub fn lookup_answered(&mut self) {
        self.failed = 0;
    }

    /// Whether the next look-up refreshes the stream first (and notes that it does).
    pub fn refresh_due(&mut self) -> bool {
        let due = self
            .refreshed
            .is_none_or(|at| at.elapsed() >= REFRESH_EVERY);
        if due {
            self.refreshed = Some(Instant::now());
        }
        due
    }
}

/// What the data stream said of some documents.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// The event ids it holds, in any backing index.
    Held(HashSet<String>),
    /// It cannot be searched by the gateway (a user without the `read` privilege on the
    /// stream, a server without `_search`), and never will be: the documents are sent
    /// as before, with the risk this module exists for, and the caller says so once.
    NotSearchable(String),
}

/// Which event ids of `docs` the data stream already holds, in any backing index;
/// `refresh`: refresh the stream first. Errors: the cluster could not say now (why, in
/// its words): the documents wait.
pub async fn held(
    cluster: &Cluster,
    docs: &[Encoded],
    refresh: bool,
) -> Result<Lookup, (Trouble, String)> {
    let mut found = HashSet::new();
    // What was indexed moments ago becomes searchable once its shard refreshes: ask for
    // that first. A cluster that refuses it (serverless, a user without `manage` or
    // `maintenance`) is still searched; the write index's 409 covers the documents a
    // search might not see yet.
    if refresh {
        let _ = cluster
            .call(
                "POST",
                // A closed backing index would fail the whole refresh; the open ones
                // are what the search reads.
                &format!(
                    "/{}/_refresh?ignore_unavailable=true&allow_no_indices=true",
                    cluster.data_stream()
                ),
                None,
            )
            .await;
    }
    for chunk in docs.chunks(PER_SEARCH) {
        let ids: Vec<&str> = chunk.iter().map(|d| d.id.as_str()).collect();
        match lookup(cluster, &ids).await? {
            Lookup::Held(these) => found.extend(these),
            cannot => return Ok(cannot),
        }
    }
    Ok(Lookup::Held(found))
}

/// What the stream says of `ids`.
async fn lookup(cluster: &Cluster, ids: &[&str]) -> Result<Lookup, (Trouble, String)> {
    let body = json!({
        "size": ids.len() * 2,
        "_source": false,
        "track_total_hits": false,
        "query": {"ids": {"values": ids}},
    });
    let path = format!(
        "/{}/_search?ignore_unavailable=true&allow_no_indices=true",
        cluster.data_stream()
    );
    let (status, text) = cluster
        .call("POST", &path, Some(&body))
        .await
        .map_err(|reason| (Trouble::Unreachable, reason))?;
    held_ids(status, &text)
}

/// The ids in a search answer (`status`, `body`); a stream not made yet holds none.
fn held_ids(status: u16, body: &str) -> Result<Lookup, (Trouble, String)> {
    let answer: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let reason = || {
        answer["error"]["reason"]
            .as_str()
            .map_or_else(|| format!("HTTP {status}"), str::to_owned)
    };
    match status {
        404 if answer["error"]["type"] == "index_not_found_exception" => {
            return Ok(Lookup::Held(HashSet::new()));
        }
        // Not allowed to search (no `read` privilege), or no search here at all: no
        // retry changes that.
        400 | 401 | 403 | 404 | 405 => return Ok(Lookup::NotSearchable(reason())),
        429 => {
            return Err((
                Trouble::Throttled,
                format!("looking up documents to send again: {}", reason()),
            ))
        }
        _ if !(200..300).contains(&status) => {
            return Err((
                Trouble::Unavailable,
                format!("looking up documents to send again: {}", reason()),
            ));
        }
        _ => {}
    }
    // A search that reached only some shards, or not in time, cannot say a document is
    // missing.
    if answer["_shards"]["failed"].as_u64().unwrap_or(0) > 0 || answer["timed_out"] == true {
        return Err((
            Trouble::Unavailable,
            "looking up documents to send again: some shards did not answer".into(),
        ));
    }
    Ok(Lookup::Held(
        answer["hits"]["hits"]
            .as_array()
            .map(|hits| {
                hits.iter()
                    .filter_map(|h| h["_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(id: &str) -> Encoded {
        Encoded {
            id: id.into(),
            lines: bytes::Bytes::new(),
        }
    }

    fn ids(docs: &[Encoded]) -> Vec<&str> {
        docs.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn what_the_last_run_left_and_what_got_no_answer_is_looked_up_until_known() {
        let mut unsure = Unsure::at_start(2);
        let (look, send) = unsure.split(vec![doc("a"), doc("b"), doc("c")]);
        assert_eq!(
            (ids(&look), ids(&send)),
            (vec!["a", "b"], vec!["c"]),
            "the spool at start-up"
        );
        unsure.acknowledged(2);
        let (look, _) = unsure.split(vec![doc("c"), doc("d")]);
        assert!(look.is_empty(), "a healthy run looks nothing up");
        unsure.unanswered(&[doc("d"), doc("e")]);
        let (look, send) = unsure.split(vec![doc("d"), doc("f")]);
        assert_eq!((ids(&look), ids(&send)), (vec!["d"], vec!["f"]));
        unsure.settled(&look);
        assert!(
            unsure.split(vec![doc("d")]).0.is_empty(),
            "known once looked up"
        );
        // A stream that cannot be searched: nothing is looked up any more.
        assert!(
            unsure.not_searchable() && !unsure.not_searchable(),
            "said once"
        );
        assert!(unsure.split(vec![doc("e")]).0.is_empty());
    }

    #[test]
    fn failing_look_ups_give_way_after_a_few_tries_while_writes_go_through() {
        let mut unsure = Unsure::default();
        for _ in 0..2 * LOOKUP_TRIES {
            assert!(
                !unsure.lookup_failed(),
                "no write answered either: they wait"
            );
        }
        unsure.write_answered();
        assert!(
            unsure.lookup_failed(),
            "searches fail, writes pass: sent unchecked"
        );
        assert!(!unsure.lookup_failed(), "and the count starts again");
        unsure.lookup_answered();
        assert!(
            unsure.refresh_due() && !unsure.refresh_due(),
            "one refresh a second"
        );
    }

    #[test]
    fn a_search_answer_gives_the_ids_held_or_says_why_it_cannot() {
        // OpenSearch 2.19's answer over two backing indices.
        let body = r#"{"took":2,"timed_out":false,"_shards":{"total":2,"successful":2,"skipped":0,"failed":0},
            "hits":{"max_score":1.0,"hits":[
              {"_index":".ds-logs-llmgate.requests-default-000001","_id":"a","_score":1.0},
              {"_index":".ds-logs-llmgate.requests-default-000002","_id":"c","_score":1.0}]}}"#;
        let held = |ids: &[&str]| Ok(Lookup::Held(ids.iter().map(|&i| i.to_owned()).collect()));
        assert_eq!(held_ids(200, body), held(&["a", "c"]));
        let missing = r#"{"error":{"type":"index_not_found_exception","reason":"no such index [logs-x]"},"status":404}"#;
        assert_eq!(held_ids(404, missing), held(&[]), "no stream yet");
        // A user with create_doc but not read: sent as before, said once.
        let forbidden = r#"{"error":{"type":"security_exception","reason":"action [indices:data/read/search] is unauthorized for user [llmgate]"},"status":403}"#;
        assert!(
            matches!(held_ids(403, forbidden), Ok(Lookup::NotSearchable(reason)) if reason.contains("unauthorized"))
        );
        let slow = r#"{"timed_out":true,"_shards":{"total":2,"successful":2,"failed":0},"hits":{"hits":[]}}"#;
        assert!(matches!(
            held_ids(200, slow),
            Err((Trouble::Unavailable, _))
        ));
        let partial = r#"{"_shards":{"total":2,"successful":1,"failed":1},"hits":{"hits":[]}}"#;
        assert!(matches!(
            held_ids(200, partial),
            Err((Trouble::Unavailable, _))
        ));
        let throttled = r#"{"error":{"type":"es_rejected_execution_exception","reason":"rejected execution"},"status":429}"#;
        assert_eq!(
            held_ids(429, throttled),
            Err((
                Trouble::Throttled,
                "looking up documents to send again: rejected execution".into()
            ))
        );
        assert!(
            matches!(held_ids(503, "<html>"), Err((Trouble::Unavailable, reason)) if reason.ends_with("HTTP 503"))
        );
    }
}

//! The disk spool: where documents wait while Elasticsearch is unreachable or the
//! in-memory queue is full, replayed oldest first when the cluster is back, also after
//! a restart.
//!
//! Layout under the spool directory: segment files `<seq>.ndjson` (20-digit sequence
//! numbers, each holding bulk pairs exactly as they are sent), and `cursor`, which says
//! where the first document not yet acknowledged by the cluster starts ("<seq> <offset>").
//! Segments are closed at `segment_bytes`; fully sent ones are deleted. Appends are
//! refused once the segments on disk reach `max_bytes`; the caller counts that as a drop.
//!
//! A crash between a successful bulk and the cursor update re-sends those documents;
//! Elasticsearch answers 409 for them (same `_id`), so they are indexed once.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::document::Encoded;

/// Why an append was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("the spool is full ({0} bytes)")]
    Full(u64),
    #[error("the spool could not be written: {0}")]
    Io(#[from] io::Error),
}

/// Where reading stands: segment and byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

/// Documents read from the spool, and the position just after the last of them: pass
/// it to [`Spool::ack`] once the cluster has them.
#[derive(Debug)]
pub struct Batch {
    pub docs: Vec<Encoded>,
    pub end: Position,
}

#[derive(Debug)]
struct State {
    /// Segments on disk, oldest first, with their sizes.
    segments: VecDeque<(u64, u64)>,
    /// The segment being appended to (the last in `segments`), if open.
    writer: Option<File>,
    read: Position,
}

#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    state: Mutex<State>,
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.ndjson"))
}

impl Spool {
    /// Opens (or creates) the spool in `dir`, picking up what an earlier run left.
    pub fn open(dir: &Path, max_bytes: u64, segment_bytes: u64) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut segments: Vec<(u64, u64)> = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(seq) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".ndjson"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            segments.push((seq, entry.metadata()?.len()));
        }
        segments.sort_unstable();
        let read = fs::read_to_string(dir.join("cursor"))
            .ok()
            .and_then(|text| {
                let mut parts = text.split_whitespace().map(|p| p.parse::<u64>().ok());
                Some(Position {
                    segment: parts.next()??,
                    offset: parts.next()??,
                })
            })
            .unwrap_or(Position {
                segment: segments.first().map_or(0, |s| s.0),
                offset: 0,
            });
        // Segments wholly before the cursor were sent; a crash kept them.
        segments.retain(|(seq, _)| {
            let sent = *seq < read.segment;
            if sent {
                let _ = fs::remove_file(segment_path(dir, *seq));
            }
            !sent
        });
        let read = match segments.first() {
            Some(&(first, _)) if first > read.segment => Position {
                segment: first,
                offset: 0,
            },
            _ => read,
        };
        Ok(Self {
            dir: dir.to_owned(),
            max_bytes,
            segment_bytes: segment_bytes.max(1),
            state: Mutex::new(State {
                segments: segments.into(),
                writer: None,
                read,
            }),
        })
    }

    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| io::Error::other("the spool lock is poisoned"))
    }

    /// Appends one document. Written to the OS before it returns (no fsync: a machine
    /// crash can lose the last writes, a process crash cannot).
    pub fn append(&self, doc: &Encoded) -> Result<(), SpoolError> {
        let mut s = self.lock()?;
        let on_disk: u64 = s.segments.iter().map(|(_, size)| size).sum();
        let len = doc.lines.len() as u64;
        if on_disk + len > self.max_bytes {
            return Err(SpoolError::Full(self.max_bytes));
        }
        let needs_new = match s.segments.back() {
            None => true,
            Some((_, size)) => s.writer.is_none() || size + len > self.segment_bytes,
        };
        if needs_new {
            let seq = s
                .segments
                .back()
                .map_or(s.read.segment, |(seq, _)| seq + 1)
                .max(s.read.segment);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(segment_path(&self.dir, seq))?;
            // The closed segment is flushed by the OS; `sync` makes it durable at
            // shutdown. No fsync here: this runs on the request path when the queue is full.
            s.writer = Some(file);
            s.segments.push_back((seq, 0));
        }
        let written = match s.writer.as_mut() {
            Some(writer) => writer.write_all(&doc.lines),
            None => Ok(()),
        };
        if let Err(error) = written {
            // A partial write leaves a torn tail: close the segment where it really ends,
            // so the next document starts a new one and `peek` stops at the tear.
            if let (Some(writer), Some(last)) = (s.writer.take(), s.segments.back_mut()) {
                last.1 = writer.metadata().map_or(last.1, |m| m.len());
            }
            return Err(error.into());
        }
        if let Some(last) = s.segments.back_mut() {
            last.1 += len;
        }
        Ok(())
    }

    /// Bytes on disk not yet acknowledged.
    pub fn pending_bytes(&self) -> u64 {
        self.lock().map_or(0, |s| {
            s.segments
                .iter()
                .map(|&(seq, size)| match seq.cmp(&s.read.segment) {
                    std::cmp::Ordering::Less => 0,
                    std::cmp::Ordering::Equal => size.saturating_sub(s.read.offset),
                    std::cmp::Ordering::Greater => size,
                })
                .sum()
        })
    }

    pub fn is_empty(&self) -> bool {
        self.pending_bytes() == 0
    }

    /// Reads up to `max_docs` documents (and about `max_bytes`) from the oldest unsent.
    /// A torn or unreadable pair ends its segment (what follows it in that segment cannot
    /// be trusted) and a missing segment file is skipped: the spool never stalls on one
    /// bad segment. `end` moves past them, so acknowledging the batch drops them.
    pub fn peek(&self, max_docs: usize, max_bytes: usize) -> io::Result<Batch> {
        let (segments, read) = {
            let s = self.lock()?;
            (s.segments.clone(), s.read)
        };
        // Segments are append-only and only the indexer removes them, so they are read
        // outside the lock the request path needs.
        let mut docs = Vec::new();
        let mut bytes = 0usize;
        let mut at = read;
        for (seq, size) in segments {
            if seq < at.segment {
                continue;
            }
            if seq > at.segment {
                at = Position {
                    segment: seq,
                    offset: 0,
                };
            }
            if at.offset >= size {
                continue;
            }
            let file = match File::open(segment_path(&self.dir, seq)) {
                Ok(file) => file,
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    tracing::error!(segment = seq, "A spool segment is missing; skipping it.");
                    at.offset = size;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let mut reader = BufReader::new(file);
            reader.seek(SeekFrom::Start(at.offset))?;
            let mut reader = reader.take(size - at.offset);
            loop {
                if docs.len() >= max_docs || bytes >= max_bytes {
                    return Ok(Batch { docs, end: at });
                }
                let mut pair = Vec::new();
                let action_len = reader.read_until(b'\n', &mut pair)?;
                if action_len == 0 {
                    break;
                }
                let source_len = reader.read_until(b'\n', &mut pair)?;
                let id = (source_len > 0 && pair.ends_with(b"\n"))
                    .then(|| serde_json::from_slice::<serde_json::Value>(&pair[..action_len]).ok())
                    .flatten()
                    .and_then(|a| a["create"]["_id"].as_str().map(str::to_owned));
                let Some(id) = id else {
                    tracing::error!(
                        segment = seq,
                        offset = at.offset,
                        "A spool segment ends in a torn or unreadable document; skipping the rest of it."
                    );
                    break;
                };
                at.offset += pair.len() as u64;
                bytes += pair.len();
                docs.push(Encoded {
                    id,
                    lines: pair.into(),
                });
            }
            // This segment is read to its end (or to a tear); the next one starts at 0.
            at.offset = size;
        }
        Ok(Batch { docs, end: at })
    }

    /// Marks everything before `end` as delivered: persists the cursor, then deletes the
    /// segments wholly sent (a crash in between leaves files `open` deletes).
    pub fn ack(&self, end: Position) -> io::Result<()> {
        let mut s = self.lock()?;
        let mut read = end;
        let mut finished = Vec::new();
        for &(seq, size) in &s.segments {
            let done = seq < end.segment || (seq == end.segment && end.offset >= size);
            if !done {
                break;
            }
            finished.push(seq);
            if seq >= read.segment {
                read = Position {
                    segment: seq + 1,
                    offset: 0,
                };
            }
        }
        let cursor = format!("{} {}\n", read.segment, read.offset);
        let tmp = self.dir.join("cursor.tmp");
        fs::write(&tmp, cursor)?;
        fs::rename(tmp, self.dir.join("cursor"))?;
        s.read = read;
        for seq in finished {
            if s.segments.len() == 1 {
                // The last segment is done: the next document starts a new one.
                s.writer = None;
            }
            s.segments.pop_front();
            fs::remove_file(segment_path(&self.dir, seq))?;
        }
        Ok(())
    }

    /// Makes every unsent segment durable (at shutdown).
    pub fn sync(&self) -> io::Result<()> {
        let segments = self.lock()?.segments.clone();
        for (seq, _) in segments {
            match File::open(segment_path(&self.dir, seq)) {
                Ok(file) => file.sync_all()?,
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(i: usize) -> Encoded {
        let id = format!("doc-{i}");
        Encoded {
            lines: format!("{{\"create\":{{\"_id\":\"{id}\"}}}}\n{{\"n\":{i}}}\n")
                .into_bytes()
                .into(),
            id,
        }
    }

    #[test]
    fn replays_in_order_across_segments_and_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spool = Spool::open(dir.path(), 1 << 20, 100).expect("open");
        for i in 0..10 {
            spool.append(&doc(i)).expect("append");
        }
        let first = spool.peek(4, usize::MAX).expect("peek");
        let ids: Vec<_> = first.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["doc-0", "doc-1", "doc-2", "doc-3"]);
        spool.ack(first.end).expect("ack");
        drop(spool);

        // A restart continues after the acknowledged documents.
        let spool = Spool::open(dir.path(), 1 << 20, 100).expect("reopen");
        spool.append(&doc(10)).expect("append after reopen");
        let rest = spool.peek(100, usize::MAX).expect("peek");
        let ids: Vec<_> = rest.docs.iter().map(|d| d.id.clone()).collect();
        let expected: Vec<_> = (4..=10).map(|i| format!("doc-{i}")).collect();
        assert_eq!(ids, expected);
        assert_eq!(rest.docs[0], doc(4), "bytes come back exactly");
        spool.ack(rest.end).expect("ack");
        assert!(spool.is_empty());
        let segments = fs::read_dir(dir.path())
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".ndjson"))
            })
            .count();
        assert!(segments <= 1, "sent segments are deleted ({segments} left)");
    }

    #[test]
    fn a_batch_ending_inside_a_segment_keeps_its_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = doc(0).lines.len() as u64;
        // Two documents per segment; a batch of three ends inside the second segment.
        let spool = Spool::open(dir.path(), 1 << 20, one * 2).expect("open");
        for i in 0..6 {
            spool.append(&doc(i)).expect("append");
        }
        let batch = spool.peek(3, usize::MAX).expect("peek");
        spool.ack(batch.end).expect("ack");
        assert_eq!(spool.pending_bytes(), one * 3);
        let ids = |spool: &Spool| -> Vec<String> {
            let batch = spool.peek(100, usize::MAX).expect("peek");
            batch.docs.into_iter().map(|d| d.id).collect()
        };
        assert_eq!(ids(&spool), ["doc-3", "doc-4", "doc-5"]);
        drop(spool);
        let reopened = Spool::open(dir.path(), 1 << 20, one * 2).expect("reopen");
        assert_eq!(
            ids(&reopened),
            ["doc-3", "doc-4", "doc-5"],
            "and after a restart"
        );
    }

    #[test]
    fn a_torn_tail_is_skipped_and_the_spool_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let spool = Spool::open(dir.path(), 1 << 20, 1 << 20).expect("open");
            spool.append(&doc(0)).expect("append");
        }
        // The process died in the middle of the second document (mid-character, too).
        let segment = segment_path(dir.path(), 0);
        let mut file = OpenOptions::new()
            .append(true)
            .open(&segment)
            .expect("open");
        file.write_all(
            "{\"create\":{\"_id\":\"doc-1\"}}\n{\"text\":\"caf\u{e9}".as_bytes()[..40].as_ref(),
        )
        .expect("torn write");
        drop(file);
        let spool = Spool::open(dir.path(), 1 << 20, 1 << 20).expect("reopen");
        spool.append(&doc(2)).expect("append after the tear");
        let batch = spool.peek(100, usize::MAX).expect("peek");
        let ids: Vec<_> = batch.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["doc-0", "doc-2"]);
        spool.ack(batch.end).expect("ack");
        assert!(spool.is_empty());
    }

    #[test]
    fn refuses_appends_beyond_its_size_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = doc(0).lines.len() as u64;
        let spool = Spool::open(dir.path(), one * 3, one * 2).expect("open");
        for i in 0..3 {
            spool.append(&doc(i)).expect("fits");
        }
        assert!(matches!(spool.append(&doc(3)), Err(SpoolError::Full(_))));
        let batch = spool.peek(2, usize::MAX).expect("peek");
        spool.ack(batch.end).expect("ack");
        spool.append(&doc(3)).expect("room again once sent");
    }
}

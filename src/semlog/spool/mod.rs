//! The disk spool: the write-ahead log of the semantic log. Every document is appended
//! here on the request path before it is counted queued; the indexer reads it oldest
//! first and acknowledges what the destination took, so documents survive an outage of
//! the cluster, a restart and a crash of the process.
//!
//! Layout under the spool directory: segment files `<seq>.ndjson` (20-digit sequence
//! numbers, each holding bulk pairs exactly as they are sent), and `cursor`, which says
//! where the first document not yet acknowledged by the cluster starts ("<seq> <offset>").
//! Segments are closed at `segment_bytes`; fully sent ones are deleted. Appends are
//! refused once the segments on disk reach `max_bytes`; the caller counts that as a drop.
//!
//! Durability: an append is a `write` to the OS, so a crash of the process (`kill -9`,
//! OOM) loses nothing appended; [`Spool::flush`], run every `semlog.fsync_ms`, makes it
//! durable against a crash of the machine. A crash between a successful bulk and the
//! cursor update re-sends those documents; Elasticsearch answers 409 for them (same
//! `_id`), so they are indexed once.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::document::Encoded;
use super::files::{private_dir, private_file};

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
    /// Appended since the last flush: closed segments to sync, and whether the open
    /// one has unsynced writes.
    unsynced: Vec<File>,
    dirty: bool,
    read: Position,
    /// Documents after `read` (complete pairs; a torn tail may count one too many
    /// until it is read past).
    pending_docs: u64,
}

#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    /// Sync each append before it returns (`semlog.fsync_ms = 0`).
    sync_each: bool,
    state: Mutex<State>,
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.ndjson"))
}

impl State {
    fn pending_bytes(&self) -> u64 {
        self.segments
            .iter()
            .map(|&(seq, size)| match seq.cmp(&self.read.segment) {
                std::cmp::Ordering::Less => 0,
                std::cmp::Ordering::Equal => size.saturating_sub(self.read.offset),
                std::cmp::Ordering::Greater => size,
            })
            .sum()
    }
}

impl Spool {
    /// Opens (or creates) the spool in `dir`, picking up what an earlier run left.
    /// `sync_each`: every append is synced before it returns, instead of at [`Self::flush`].
    pub fn open(
        dir: &Path,
        max_bytes: u64,
        segment_bytes: u64,
        sync_each: bool,
    ) -> io::Result<Self> {
        private_dir(dir)?;
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
        let pending_docs = count_pairs(dir, &segments, read)?;
        Ok(Self {
            dir: dir.to_owned(),
            max_bytes,
            segment_bytes: segment_bytes.max(1),
            sync_each,
            state: Mutex::new(State {
                segments: segments.into(),
                writer: None,
                unsynced: Vec::new(),
                dirty: false,
                read,
                pending_docs,
            }),
        })
    }

    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| io::Error::other("the spool lock is poisoned"))
    }

    /// Appends one document. Written to the OS before it returns, so a crash of the
    /// process cannot lose it; durable at the next [`Self::flush`] (or at once with
    /// `sync_each`).
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
            let file = private_file()
                .append(true)
                .open(segment_path(&self.dir, seq))?;
            if let Some(closed) = s.writer.replace(file) {
                // Synced at the next flush, not here on the request path.
                if s.dirty {
                    s.unsynced.push(closed);
                }
            }
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
        s.pending_docs += 1;
        s.dirty = true;
        if self.sync_each {
            if let Some(writer) = &s.writer {
                writer.sync_data()?;
            }
            s.dirty = false;
        }
        Ok(())
    }

    /// Makes what was appended since the last call durable (fsync), outside the lock
    /// appends take, so the request path never waits for the disk.
    pub fn flush(&self) -> io::Result<()> {
        let (closed, open) = {
            let mut s = self.lock()?;
            let open = match (&s.writer, s.dirty) {
                (Some(writer), true) => Some(writer.try_clone()?),
                _ => None,
            };
            s.dirty = false;
            (std::mem::take(&mut s.unsynced), open)
        };
        for file in closed.iter().chain(&open) {
            file.sync_data()?;
        }
        Ok(())
    }

    /// Documents written and not yet acknowledged.
    pub fn pending_docs(&self) -> u64 {
        self.lock().map_or(0, |s| s.pending_docs)
    }

    /// Bytes on disk not yet acknowledged.
    pub fn pending_bytes(&self) -> u64 {
        self.lock().map_or(0, |s| s.pending_bytes())
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

    /// Marks the batch read up to `end` (`docs` documents) as delivered: persists the
    /// cursor, then deletes the segments wholly sent (a crash in between leaves files
    /// `open` deletes).
    pub fn ack(&self, end: Position, docs: usize) -> io::Result<()> {
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
        private_file()
            .write(true)
            .truncate(true)
            .open(&tmp)?
            .write_all(cursor.as_bytes())?;
        fs::rename(tmp, self.dir.join("cursor"))?;
        s.read = read;
        s.pending_docs = s.pending_docs.saturating_sub(docs as u64);
        for seq in finished {
            if s.segments.len() == 1 {
                // The last segment is done: the next document starts a new one.
                s.writer = None;
            }
            s.segments.pop_front();
            fs::remove_file(segment_path(&self.dir, seq))?;
        }
        if s.pending_bytes() == 0 {
            // A damaged pair counted at start-up is never delivered: nothing is left.
            s.pending_docs = 0;
        }
        Ok(())
    }
}

/// Complete action/source pairs after `read`: the documents an earlier run left.
fn count_pairs(dir: &Path, segments: &[(u64, u64)], read: Position) -> io::Result<u64> {
    let mut lines = 0u64;
    for &(seq, _) in segments.iter().filter(|(seq, _)| *seq >= read.segment) {
        let mut file = match File::open(segment_path(dir, seq)) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        if seq == read.segment {
            file.seek(SeekFrom::Start(read.offset))?;
        }
        let mut buffer = [0u8; 64 << 10];
        loop {
            let n = file.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            lines += buffer[..n].iter().filter(|&&b| b == b'\n').count() as u64;
        }
    }
    Ok(lines / 2)
}

#[cfg(test)]
mod tests;

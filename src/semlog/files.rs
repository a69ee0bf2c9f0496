//! Local files: the default sink (rotating NDJSON files of bulk pairs, ready for
//! `curl -H 'Content-Type: application/x-ndjson' --data-binary @FILE .../_bulk`) and the
//! dead-letter file for documents Elasticsearch refused.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::document::Encoded;

/// Appends to `<prefix>-<seq>.ndjson` files, starting a new one past `max_bytes`.
#[derive(Debug)]
pub struct RotatingFile {
    dir: PathBuf,
    prefix: &'static str,
    max_bytes: u64,
    seq: u64,
    current: Option<(File, u64)>,
}

impl RotatingFile {
    pub fn open(dir: &Path, prefix: &'static str, max_bytes: u64) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        // Continue after the newest file an earlier run left.
        let seq = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(prefix))
                    .and_then(|n| n.strip_prefix('-'))
                    .and_then(|n| n.strip_suffix(".ndjson"))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .max()
            .map_or(0, |s| s + 1);
        Ok(Self {
            dir: dir.to_owned(),
            prefix,
            max_bytes,
            seq,
            current: None,
        })
    }

    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let len = bytes.len() as u64;
        if self
            .current
            .as_ref()
            .is_some_and(|(_, size)| size + len > self.max_bytes && *size > 0)
        {
            if let Some((file, _)) = self.current.take() {
                file.sync_all()?;
            }
        }
        if self.current.is_none() {
            let path = self
                .dir
                .join(format!("{}-{:08}.ndjson", self.prefix, self.seq));
            self.seq += 1;
            let file = OpenOptions::new().create(true).append(true).open(path)?;
            self.current = Some((file, 0));
        }
        if let Some((file, size)) = self.current.as_mut() {
            if let Err(error) = file.write_all(bytes) {
                // A partial line may be in the file: the next write starts a new file, so
                // the torn line stays at the end of this one.
                self.current = None;
                return Err(error);
            }
            *size += len;
        }
        Ok(())
    }

    pub fn sync(&mut self) -> io::Result<()> {
        match &self.current {
            Some((file, _)) => file.sync_all(),
            None => Ok(()),
        }
    }
}

/// One line per refused document: why, and the (redacted) document itself.
pub fn dead_letter_line(doc: &Encoded, status: u16, error_type: &str, reason: &str) -> Vec<u8> {
    let source = doc
        .lines
        .split(|b| *b == b'\n')
        .nth(1)
        .and_then(|s| serde_json::from_slice::<serde_json::Value>(s).ok())
        .unwrap_or(serde_json::Value::Null);
    let mut line = serde_json::to_vec(&serde_json::json!({
        "_id": doc.id,
        "status": status,
        "error_type": error_type,
        "reason": reason,
        "document": source,
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

//! Local files: the default sink (rotating NDJSON files of bulk pairs, ready for
//! `curl -H 'Content-Type: application/x-ndjson' --data-binary @FILE .../_bulk`), the
//! dead-letter files for documents the cluster refused (the same bulk pairs), and the
//! refusals files beside them (why each was refused).
//!
//! Every file the semantic log writes holds redacted excerpts of prompts and answers, so
//! [`private_dir`] and [`private_file`] create folders 0700 and files 0600: readable by
//! the gateway's user only, whatever the umask.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::document::Encoded;

/// Creates `dir` and any missing parents with mode 0700. Folders that exist are left
/// as they are (an operator's `/var/log` is not ours to change).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Options that create a file with mode 0600; add `append`, `write`, `truncate`.
pub fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.create(true).mode(0o600);
    options
}

/// Where the gateway keeps its own key for the semantic log's hashes, in the data
/// directory (see [`own_hash_key`]).
pub fn hash_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join("hash-key")
}

/// The gateway's own key for the semantic log's hashes, where no redaction key is set:
/// 32 random bytes as 64 hex digits (the digits' bytes are the key, as a configured
/// key's are), made on the first start and kept in `<data_dir>/hash-key` (mode 0600), so
/// one gateway's hashes agree across restarts. Made in a file of its own and linked into
/// place: two gateways starting on one folder both read the one that got there first.
pub fn own_hash_key(data_dir: &Path) -> io::Result<String> {
    let path = hash_key_path(data_dir);
    match fs::read_to_string(&path) {
        Ok(text) => return key_text(&path, &text),
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        Err(_) => {}
    }
    private_dir(data_dir)?;
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| io::Error::other(e.to_string()))?;
    let text = hex::encode(key);
    // A name of its own (two containers on one volume may both be PID 1), made new.
    let made = data_dir.join(format!("hash-key.{}.new", &text[..16]));
    let mut options = private_file();
    options.write(true).create_new(true);
    let mut file = options.open(&made)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    let linked = fs::hard_link(&made, &path);
    let _ = fs::remove_file(&made);
    match linked {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    // What is in place now, this one's or the one that got there first.
    key_text(&path, &fs::read_to_string(&path)?)
}

fn key_text(path: &Path, text: &str) -> io::Result<String> {
    let key = text.trim();
    if key.len() < 32 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds no key (delete it and a new one is made; documents indexed before keep hashes made with the old one)",
                path.display()
            ),
        ));
    }
    Ok(key.to_owned())
}

/// Appends to `<prefix>-<seq>.ndjson` files, starting a new one past `max_bytes`, and
/// deletes the oldest when all of them together would pass `total_max_bytes`.
#[derive(Debug)]
pub struct RotatingFile {
    dir: PathBuf,
    prefix: &'static str,
    max_bytes: u64,
    total_max_bytes: u64,
    seq: u64,
    current: Option<(File, u64)>,
    /// Files deleted to stay under `total_max_bytes`, not yet taken by [`Self::take_deleted`].
    deleted: u64,
}

impl RotatingFile {
    pub fn open(
        dir: &Path,
        prefix: &'static str,
        max_bytes: u64,
        total_max_bytes: u64,
    ) -> io::Result<Self> {
        private_dir(dir)?;
        // Continue after the newest file an earlier run left.
        let seq = Self::existing(dir, prefix)?
            .last()
            .map_or(0, |(seq, _)| seq + 1);
        Ok(Self {
            dir: dir.to_owned(),
            prefix,
            max_bytes,
            total_max_bytes,
            seq,
            current: None,
            deleted: 0,
        })
    }

    /// This prefix's files in `dir`, oldest first: sequence number and size.
    fn existing(dir: &Path, prefix: &str) -> io::Result<Vec<(u64, u64)>> {
        let mut files: Vec<(u64, u64)> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let seq = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(prefix))
                    .and_then(|n| n.strip_prefix('-'))
                    .and_then(|n| n.strip_suffix(".ndjson"))
                    .and_then(|n| n.parse::<u64>().ok())?;
                Some((seq, e.metadata().ok()?.len()))
            })
            .collect();
        files.sort_unstable();
        Ok(files)
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{}-{:08}.ndjson", self.prefix, seq))
    }

    /// Deletes the oldest files until a new one of up to `max_bytes` fits the total.
    fn make_room(&mut self) -> io::Result<()> {
        let files = Self::existing(&self.dir, self.prefix)?;
        let mut total: u64 = files.iter().map(|(_, size)| size).sum();
        for (seq, size) in files {
            if total + self.max_bytes <= self.total_max_bytes {
                break;
            }
            fs::remove_file(self.path(seq))?;
            total -= size;
            self.deleted += 1;
        }
        Ok(())
    }

    /// Files deleted by the size cap since the last call.
    pub fn take_deleted(&mut self) -> u64 {
        std::mem::take(&mut self.deleted)
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
            if let Err(error) = self.make_room() {
                tracing::warn!(error = %error, dir = %self.dir.display(), "Could not delete old NDJSON files to stay under the size cap.");
            }
            let path = self.path(self.seq);
            self.seq += 1;
            let file = private_file().append(true).open(path)?;
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

/// One line per refused document, beside the dead-letter file's `_bulk` pair: its id
/// and why the cluster refused it (the document itself is in the dead-letter file).
pub fn refusal_line(doc: &Encoded, status: u16, error_type: &str, reason: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "_id": doc.id,
        "status": status,
        "error_type": error_type,
        "reason": reason,
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn rotates_keeps_the_total_under_its_cap_and_deletes_oldest_first() {
        let parent = tempfile::tempdir().expect("tempdir");
        let dir = parent.path().join("semlog");
        // Files rotate past 100 bytes; all together stay within 300.
        let mut file = RotatingFile::open(&dir, "requests", 100, 300).expect("open");
        let line = [b'x'; 60];
        for _ in 0..10 {
            file.write(&line).expect("write");
        }
        // Each line opens a file; before a new one, the old ones plus a full new one must
        // fit in 300 bytes: four files of 60 bytes stay.
        assert_eq!(
            names(&dir),
            [
                "requests-00000006.ndjson",
                "requests-00000007.ndjson",
                "requests-00000008.ndjson",
                "requests-00000009.ndjson"
            ]
        );
        assert_eq!(file.take_deleted(), 6);
        assert_eq!(file.take_deleted(), 0);

        // A restart continues the numbering and the cap.
        drop(file);
        let mut file = RotatingFile::open(&dir, "requests", 100, 300).expect("reopen");
        file.write(&line).expect("write");
        assert_eq!(
            names(&dir).last().map(String::as_str),
            Some("requests-00000010.ndjson")
        );
        assert_eq!(file.take_deleted(), 1);

        let mode = |path: &Path| fs::metadata(path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        for name in names(&dir) {
            assert_eq!(mode(&dir.join(&name)), 0o600, "{name}");
        }
    }

    #[test]
    fn the_own_hash_key_is_made_once_kept_private_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let key = own_hash_key(&data).expect("made");
        assert_eq!(key.len(), 64);
        assert_eq!(
            own_hash_key(&data).expect("read"),
            key,
            "the same after a restart"
        );
        let mode = fs::metadata(hash_key_path(&data))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let other = tempfile::tempdir().expect("tempdir");
        assert_ne!(
            own_hash_key(other.path()).expect("made"),
            key,
            "each gateway its own"
        );
        fs::write(hash_key_path(&data), "\n").expect("emptied");
        assert!(
            own_hash_key(&data).is_err(),
            "an emptied key is an error, not a weak key"
        );
    }
}

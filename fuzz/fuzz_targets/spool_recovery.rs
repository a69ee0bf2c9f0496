//! The semantic log's disk spool after a crash: documents appended across segments, then
//! any file cut short, overwritten, extended or deleted, and the cursor rewritten; then
//! the spool reopened and drained as the indexer drains it. Reading never panics or
//! loops, every document handed on is a whole bulk pair, draining empties the spool, and
//! where the damage is only tears and lost files (what a crash can do), every document
//! handed on is one that was appended, in order, exactly once.

#![no_main]

use std::collections::HashSet;
use std::fs;
use std::io::Write;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use llmgate::semlog::document::Encoded;
use llmgate::semlog::spool::Spool;

#[derive(Debug, Arbitrary)]
enum Damage {
    /// Cut segment `file` (index among the segments, modulo their count) at `at`.
    Truncate { file: u8, at: u16 },
    /// Remove segment `file`.
    Remove { file: u8 },
    /// Overwrite bytes of segment `file` from `at`.
    Overwrite { file: u8, at: u16, bytes: Vec<u8> },
    /// Append bytes to segment `file`.
    Append { file: u8, bytes: Vec<u8> },
    /// Replace the cursor file.
    Cursor(Vec<u8>),
}

impl Damage {
    /// What a crash can leave: a torn write, a lost file.
    fn is_crash(&self) -> bool {
        matches!(self, Damage::Truncate { .. } | Damage::Remove { .. })
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// Sizes of the documents' payloads.
    docs: Vec<u8>,
    segment_bytes: u16,
    /// Documents acknowledged before the crash.
    acked: u8,
    damage: Vec<Damage>,
}

fn doc(i: usize, size: u8) -> Encoded {
    let id = format!("doc-{i}");
    let payload = "x".repeat(usize::from(size));
    Encoded {
        lines: format!("{{\"create\":{{\"_id\":\"{id}\"}}}}\n{{\"p\":\"{payload}\"}}\n")
            .into_bytes()
            .into(),
        id,
    }
}

fn segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .expect("the spool directory")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ndjson"))
        .collect();
    files.sort();
    files
}

fn damage(dir: &std::path::Path, damage: &Damage) {
    let files = segments(dir);
    let pick = |file: u8| files.get(usize::from(file) % files.len().max(1)).cloned();
    match damage {
        Damage::Truncate { file, at } => {
            if let Some(path) = pick(*file) {
                let f = fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .expect("open");
                let len = f.metadata().expect("len").len();
                f.set_len(u64::from(*at).min(len)).expect("truncate");
            }
        }
        Damage::Remove { file } => {
            if let Some(path) = pick(*file) {
                fs::remove_file(path).expect("remove");
            }
        }
        Damage::Overwrite { file, at, bytes } => {
            if let Some(path) = pick(*file) {
                let mut content = fs::read(&path).expect("read");
                let at = usize::from(*at).min(content.len());
                let end = (at + bytes.len()).min(content.len());
                content[at..end].copy_from_slice(&bytes[..end - at]);
                fs::write(&path, content).expect("write");
            }
        }
        Damage::Append { file, bytes } => {
            if let Some(path) = pick(*file) {
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .expect("open");
                f.write_all(bytes).expect("append");
            }
        }
        Damage::Cursor(bytes) => fs::write(dir.join("cursor"), bytes).expect("cursor"),
    }
}

fuzz_target!(|input: Input| {
    if input.docs.len() > 64 || input.damage.len() > 16 {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let segment_bytes = u64::from(input.segment_bytes.max(1));
    let written: Vec<Encoded> = input
        .docs
        .iter()
        .enumerate()
        .map(|(i, &size)| doc(i, size))
        .collect();
    {
        let spool = Spool::open(dir.path(), 1 << 30, segment_bytes, false).expect("open");
        for d in &written {
            spool.append(d).expect("append");
        }
        let acked = spool
            .peek(usize::from(input.acked), usize::MAX)
            .expect("peek");
        spool.ack(acked.end, acked.docs.len()).expect("ack");
    }
    for d in &input.damage {
        damage(dir.path(), d);
    }
    let crash_only = input.damage.iter().all(Damage::is_crash);

    let spool = match Spool::open(dir.path(), 1 << 30, segment_bytes, false) {
        Ok(spool) => spool,
        Err(error) => panic!("a damaged spool does not open: {error}"),
    };
    let mut delivered: Vec<Encoded> = Vec::new();
    // Each round hands on a document or moves past damage: a bound on rounds is a bound
    // on loops.
    let rounds = written.len() + 4 * input.damage.len() + 4;
    for _ in 0..rounds {
        let batch = spool.peek(3, usize::MAX).expect("peek");
        if batch.docs.is_empty() && spool.is_empty() {
            break;
        }
        spool.ack(batch.end, batch.docs.len()).expect("ack");
        delivered.extend(batch.docs);
    }
    assert!(
        spool.is_empty(),
        "draining left {} bytes",
        spool.pending_bytes()
    );
    assert_eq!(spool.pending_docs(), 0);
    for d in &delivered {
        assert!(d.lines.ends_with(b"\n"), "a document without its newline");
        assert_eq!(
            d.lines.iter().filter(|&&b| b == b'\n').count(),
            2,
            "not one bulk pair"
        );
    }
    if crash_only {
        let mut seen = HashSet::new();
        let mut last = None;
        for d in &delivered {
            let i = written.iter().position(|w| w == d);
            let Some(i) = i else {
                panic!("a document nobody wrote: {d:?}")
            };
            assert!(seen.insert(i), "{} handed on twice", d.id);
            assert!(last.is_none_or(|l| l < i), "{} out of order", d.id);
            last = Some(i);
        }
    }
    drop(spool);
    let reopened = Spool::open(dir.path(), 1 << 30, segment_bytes, false).expect("reopen");
    assert!(
        reopened
            .peek(100, usize::MAX)
            .expect("peek")
            .docs
            .is_empty(),
        "delivered twice"
    );
});

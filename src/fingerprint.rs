//! `system_fingerprint`: one short id for "the same model file, engine, device and gateway
//! version", so that an answer can be reproduced against the configuration that made it.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

/// The gateway's own version, part of the fingerprint.
pub const GATEWAY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Hex sha256 of a file, streamed (model files are large).
pub fn file_sha256(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// `fp_` and the first 16 hex digits of sha256(model sha256, engine, device, version).
pub fn system_fingerprint(model_sha256: &str, engine: &str, device: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [model_sha256, engine, device, GATEWAY_VERSION] {
        hasher.update(part.as_bytes());
        // A separator, so ("ab", "c") and ("a", "bc") differ.
        hasher.update([0u8]);
    }
    let digest = hex::encode(hasher.finalize());
    format!("fp_{}", &digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn file_hash_matches_known_digest() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(b"abc").expect("write");
        assert_eq!(
            file_sha256(file.path()).expect("hash"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn fingerprint_changes_with_each_part() {
        let base = system_fingerprint("aa", "mistral.rs 0.8.1", "cpu");
        assert!(base.starts_with("fp_") && base.len() == 19);
        assert_eq!(base, system_fingerprint("aa", "mistral.rs 0.8.1", "cpu"));
        assert_ne!(base, system_fingerprint("ab", "mistral.rs 0.8.1", "cpu"));
        assert_ne!(base, system_fingerprint("aa", "mistral.rs 0.8.2", "cpu"));
        assert_ne!(base, system_fingerprint("aa", "mistral.rs 0.8.1", "cuda"));
    }
}

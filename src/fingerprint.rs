//! What an answer depends on, and the one short id for it: `system_fingerprint` changes
//! when the model file, the engine, the device, the gateway's version or commit, the CPU
//! features it was built for, or the GPU, its driver or CUDA version change, so that an
//! answer can be reproduced against the configuration that made it. The same facts are
//! exported as `llmgate_build_info` / `llmgate_model_info`, in `/ready` and in each
//! semantic-log document.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The gateway's own version, part of the fingerprint.
pub const GATEWAY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// How this binary was built (`build.rs` reads them at compile time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Build {
    pub version: &'static str,
    /// Short git commit, or `unknown`.
    pub commit: &'static str,
    pub rustc: &'static str,
    /// `debug` or `release`.
    pub profile: &'static str,
    /// The SIMD features the code was compiled for, comma-separated (`avx2,fma,...`).
    pub target_features: &'static str,
}

pub const BUILD: Build = Build {
    version: GATEWAY_VERSION,
    commit: env!("LLMGATE_GIT_COMMIT"),
    rustc: env!("LLMGATE_RUSTC"),
    profile: env!("LLMGATE_PROFILE"),
    target_features: env!("LLMGATE_TARGET_FEATURES"),
};

/// The GPU a model runs on: empty strings on CPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Accelerator {
    /// The device's name (`NVIDIA H200`).
    pub gpu: String,
    /// The driver's version (`580.65.06`).
    pub driver: String,
    /// The CUDA version the driver supports (`13.0`).
    pub cuda: String,
}

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

/// `fp_` and the first 16 hex digits of sha256 of the model file's sha256, the engine,
/// the device, the accelerator and this build's version, commit and CPU features.
pub fn system_fingerprint(
    model_sha256: &str,
    engine: &str,
    device: &str,
    accelerator: &Accelerator,
) -> String {
    fingerprint_of(model_sha256, engine, device, accelerator, &BUILD)
}

fn fingerprint_of(
    model_sha256: &str,
    engine: &str,
    device: &str,
    accelerator: &Accelerator,
    build: &Build,
) -> String {
    let mut hasher = Sha256::new();
    let parts = [
        model_sha256,
        engine,
        device,
        &accelerator.gpu,
        &accelerator.driver,
        &accelerator.cuda,
        build.version,
        build.commit,
        build.target_features,
    ];
    for part in parts {
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
        let none = Accelerator::default();
        let base = system_fingerprint("aa", "mistral.rs 0.8.1", "cpu", &none);
        assert!(base.starts_with("fp_") && base.len() == 19);
        assert_eq!(
            base,
            system_fingerprint("aa", "mistral.rs 0.8.1", "cpu", &none)
        );
        for (model_sha256, engine, device) in [
            ("ab", "mistral.rs 0.8.1", "cpu"),
            ("aa", "mistral.rs 0.8.2", "cpu"),
            ("aa", "mistral.rs 0.8.1", "cuda"),
        ] {
            assert_ne!(
                base,
                system_fingerprint(model_sha256, engine, device, &none)
            );
        }
        let h200 = Accelerator {
            gpu: "NVIDIA H200".into(),
            driver: "580.65.06".into(),
            cuda: "13.0".into(),
        };
        let on_gpu = system_fingerprint("aa", "e", "cuda", &h200);
        let newer_driver = Accelerator {
            driver: "580.95.05".into(),
            ..h200.clone()
        };
        assert_ne!(on_gpu, system_fingerprint("aa", "e", "cuda", &newer_driver));
        for other in [
            Build {
                commit: "0123456789ab",
                ..BUILD
            },
            Build {
                target_features: "sse4.2",
                ..BUILD
            },
            Build {
                version: "9.9.9",
                ..BUILD
            },
        ] {
            assert_ne!(
                base,
                fingerprint_of("aa", "mistral.rs 0.8.1", "cpu", &none, &other)
            );
        }
        let other_profile = Build {
            profile: "other",
            ..BUILD
        };
        assert_eq!(
            base,
            fingerprint_of("aa", "mistral.rs 0.8.1", "cpu", &none, &other_profile),
            "the profile of our own code does not change the numbers"
        );
    }

    #[test]
    fn the_build_facts_are_filled_in() {
        assert_eq!(BUILD.version, env!("CARGO_PKG_VERSION"));
        assert!(!BUILD.commit.is_empty() && !BUILD.rustc.is_empty());
        assert!(BUILD.rustc.starts_with("rustc "), "{}", BUILD.rustc);
        assert!(matches!(BUILD.profile, "debug" | "release"));
    }
}

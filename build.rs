//! Build facts for `llmgate_build_info`, `/ready`, the semantic log and the
//! `system_fingerprint`: the commit, the compiler, the profile and the CPU features the
//! code was compiled for (`target-cpu=native` makes them the build machine's, and they
//! change floating-point results). `LLMGATE_GIT_COMMIT` overrides the commit where there
//! is no `.git` (a Docker build context).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LLMGATE_GIT_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    let head = std::fs::read_to_string(".git/HEAD").unwrap_or_default();
    if let Some(reference) = head.strip_prefix("ref: ") {
        println!("cargo:rerun-if-changed=.git/{}", reference.trim());
    }
    let commit = std::env::var("LLMGATE_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| output("git", &["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc = output(&rustc, &["--version"]).unwrap_or_else(|| "unknown".to_owned());
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_owned());
    // The SIMD levels that decide which kernels candle and gemm run.
    const WATCHED: &[&str] = &[
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vnni",
        "neon",
    ];
    let enabled = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let features: Vec<&str> = WATCHED
        .iter()
        .copied()
        .filter(|f| enabled.split(',').any(|e| e == *f))
        .collect();
    println!("cargo:rustc-env=LLMGATE_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=LLMGATE_RUSTC={rustc}");
    println!("cargo:rustc-env=LLMGATE_PROFILE={profile}");
    println!(
        "cargo:rustc-env=LLMGATE_TARGET_FEATURES={}",
        features.join(",")
    );
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

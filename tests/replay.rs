//! `llmgate replay` against a running gateway with the scripted engine.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::engine::scripted::Script;
use llmgate::replay::{replay, ReplayFile};
use serde_json::json;
use sha2::{Digest, Sha256};

fn file(output_hash: String, fingerprint: &str) -> ReplayFile {
    ReplayFile {
        request: chat_body("hi", json!({"seed": 3, "temperature": 0.7, "stream": true})),
        system_fingerprint: fingerprint.into(),
        output_hash,
    }
}

#[tokio::test]
async fn replay_reports_match_and_mismatch() {
    let engine = scripted(Script::tokens(&["Hel", "lo!"], Duration::ZERO));
    let server = start(Arc::new(engine), &test_config("")).await;
    let client = reqwest::Client::new();
    let right = hex::encode(Sha256::digest(b"Hello!"));

    let same = replay(&client, &server.base, &file(right.clone(), "fp_test"))
        .await
        .expect("replay");
    assert!(same.output_matches && same.fingerprint_matches);
    assert_eq!(same.summary(), "match");

    let wrong = replay(&client, &server.base, &file("0".repeat(64), "fp_test"))
        .await
        .expect("replay");
    assert!(!wrong.output_matches);
    assert_eq!(wrong.output_hash, right);

    let moved = replay(&client, &server.base, &file(right, "fp_other"))
        .await
        .expect("replay");
    assert!(moved.output_matches && !moved.fingerprint_matches);

    let mut bad = file(String::new(), "fp_test");
    bad.request["model"] = json!("nope");
    let error = replay(&client, &server.base, &bad).await.expect_err("404");
    assert!(error.to_string().contains("404"), "{error}");
    server.stop().await;
}

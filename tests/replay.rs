//! `llmgate replay` and `llmgate compare` against running gateways with the scripted
//! engine.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::engine::scripted::Script;
use llmgate::redact::HashKey;
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
    let server = TestServer::builder(Arc::new(engine)).start().await;
    let client = reqwest::Client::new();
    // The logged hash is keyed: the semantic log's hash key over the answer's digest.
    let key = HashKey::new(b"the gateway's hash key");
    let right = key.hash(&hex::encode(Sha256::digest(b"Hello!")));
    let plain = hex::encode(Sha256::digest(b"Hello!"));

    let same = replay(&client, &server.base, &file(right.clone(), "fp_test"), &key)
        .await
        .expect("replay");
    assert!(same.output_matches && same.fingerprint_matches);
    assert_eq!(same.summary(), "match");

    let unkeyed = replay(&client, &server.base, &file(plain, "fp_test"), &key)
        .await
        .expect("replay");
    assert!(
        !unkeyed.output_matches,
        "a plain digest is never what is logged"
    );

    let wrong = replay(
        &client,
        &server.base,
        &file("0".repeat(64), "fp_test"),
        &key,
    )
    .await
    .expect("replay");
    assert!(!wrong.output_matches);
    assert_eq!(wrong.output_hash, right);

    let moved = replay(&client, &server.base, &file(right, "fp_other"), &key)
        .await
        .expect("replay");
    assert!(moved.output_matches && !moved.fingerprint_matches);

    let mut bad = file(String::new(), "fp_test");
    bad.request["model"] = json!("nope");
    let error = replay(&client, &server.base, &bad, &key)
        .await
        .expect_err("404");
    assert!(error.to_string().contains("404"), "{error}");
}

#[tokio::test]
async fn compare_reports_agreement_and_deltas_between_two_gateways() {
    let same = || Script::tokens(&["Par", "is"], Duration::ZERO);
    // The candidate answers one prompt differently and refuses another.
    let baseline = scripted(same()).with_script(
        "What is the capital of Spain?",
        Script::tokens(&["Mad", "rid"], Duration::ZERO),
    );
    let candidate = scripted(same())
        .with_script(
            "What is the capital of Spain?",
            Script::tokens(&["Bar", "celona"], Duration::ZERO),
        )
        .with_script(
            "Name a colour.",
            Script::tokens(&["I'm sorry, but I can't help with that."], Duration::ZERO),
        );
    let baseline = TestServer::builder(Arc::new(baseline)).start().await;
    let candidate = TestServer::builder(Arc::new(candidate)).start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let prompts = dir.path().join("prompts.jsonl");
    let line = |id: &str, text: &str| {
        format!(
            "{}\n",
            json!({"id": id, "messages": [{"role": "user", "content": text}]})
        )
    };
    std::fs::write(
        &prompts,
        [
            line("france", "What is the capital of France?"),
            line("spain", "What is the capital of Spain?"),
            line("colour", "Name a colour."),
        ]
        .concat(),
    )
    .expect("write");
    let args = llmgate::compare::CompareArgs {
        baseline: Some(baseline.base.clone()),
        candidate: Some(candidate.base.clone()),
        semlog: None,
        baseline_fingerprint: None,
        candidate_fingerprint: None,
        model: MODEL.into(),
        prompts,
        max_tokens: 8,
        temperature: 0.0,
        seed: 42,
        api_key: None,
        min_agreement: None,
        json: None,
        live: None,
        gateway: String::new(),
        fail_on_worse: false,
    };
    let report = llmgate::compare::compare_gateways(&args)
        .await
        .expect("report");
    let s = &report.summary;
    assert_eq!((s.compared, s.failed, s.identical), (3, 0, 1));
    assert_eq!((s.refusals_baseline, s.refusals_candidate), (0, 1));
    assert_eq!(s.baseline_fingerprint.as_deref(), Some("fp_test"));
    let ids: Vec<&str> = report.rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["france", "spain", "colour"]);
    assert!(report.rows[0].identical && !report.rows[1].identical);
    assert!(
        report.rows[0].ttft_ms_delta.is_some(),
        "the gateways' timings are compared"
    );
    assert!(report.table().contains("1 of 3 answers identical"));
}

//! API keys, black-box over HTTP with the scripted engine: what each route requires, the
//! 401 and 415 answers, key rotation by editing the file while the server runs, and that
//! a key never shows up in a log line, a metric or a record (only its id does).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::logs::captured_logs;
use common::*;
use llmgate::auth::{add_key, watch, Guard, Keys};
use llmgate::engine::scripted::Script;
use serde_json::{json, Value};

fn hello() -> Script {
    Script::tokens(&["Hel", "lo", "!"], Duration::ZERO)
}

/// Keys from `file`, re-read every 50 ms.
fn guard(file: &Path, metrics_need_key: bool) -> Guard {
    let keys = Arc::new(Keys::load(file).expect("keys"));
    tokio::spawn(watch(Arc::clone(&keys), Duration::from_millis(50)));
    Guard {
        keys: Some(keys),
        metrics_need_key,
    }
}

async fn chat(server: &TestServer, key: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body("hi", json!({})));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("request")
}

async fn get(server: &TestServer, path: &str, key: Option<&str>) -> u16 {
    let mut request = reqwest::Client::new().get(server.url(path));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("request").status().as_u16()
}

async fn expect_401(response: reqwest::Response) {
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert!(response.headers().contains_key("x-request-id"));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    assert!(body["error"]["message"].is_string());
}

/// Polls for up to five seconds until `key` gets `status` from the chat route.
async fn until_chat_answers(server: &TestServer, key: &str, status: u16) -> bool {
    for _ in 0..100 {
        if chat(server, Some(key)).await.status().as_u16() == status {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_guard_v1_and_only_their_ids_travel() {
    let logs = captured_logs();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let alice = add_key(&file, "alice").expect("add");
    let server = start_guarded(
        Arc::new(scripted(hello())),
        &test_config(""),
        guard(&file, false),
    )
    .await;

    // No key, a wrong one, a right one.
    expect_401(chat(&server, None).await).await;
    expect_401(chat(&server, Some("llmgate-not-a-key")).await).await;
    let answer = chat(&server, Some(&alice)).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("json");
    assert_eq!(answer["choices"][0]["message"]["content"], "Hello!");

    // What each route requires.
    assert_eq!(get(&server, "/v1/models", None).await, 401);
    assert_eq!(get(&server, "/v1/models", Some(&alice)).await, 200);
    assert_eq!(get(&server, "/v1/nothing-here", None).await, 401);
    for open in ["/health", "/ready", "/metrics"] {
        assert_eq!(get(&server, open, None).await, 200, "{open}");
    }

    // Only JSON bodies.
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let response = reqwest::Client::new()
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(&alice)
            .header("content-type", content_type)
            .body(chat_body("hi", json!({})).to_string())
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 415, "{content_type}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "unsupported_media_type");
    }

    // Rotation while the server runs: a new key works as soon as its line is there...
    let bob = add_key(&file, "bob").expect("add");
    assert!(
        until_chat_answers(&server, &bob, 200).await,
        "bob's new key"
    );
    // ...a removed one stops working...
    let text = std::fs::read_to_string(&file).expect("read");
    let without_alice: String = text
        .lines()
        .filter(|l| !l.starts_with("alice "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&file, without_alice).expect("write");
    assert!(
        until_chat_answers(&server, &alice, 401).await,
        "alice removed"
    );
    // ...and a malformed version keeps the keys in use, with the line named in the log.
    std::fs::write(&file, "bob\n").expect("write");
    let named = async {
        for _ in 0..100 {
            let text = String::from_utf8_lossy(&logs.lock().expect("lock")).into_owned();
            if text.contains("line 1: expected '<key-id> <sha256-hex>'") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    assert!(named.await, "the malformed line is named in the log");
    assert_eq!(chat(&server, Some(&bob)).await.status(), 200);

    // The id travels with the request; the key goes nowhere.
    let records = server.observer.records();
    let ids: Vec<Option<&str>> = records.iter().map(|r| r.api_key_id.as_deref()).collect();
    assert!(
        ids.contains(&Some("alice")) && ids.contains(&Some("bob")),
        "{ids:?}"
    );
    assert!(
        records
            .iter()
            .all(|r| r.api_key_id.is_some() || r.error_kind.is_some()),
        "only refused requests lack an id: {ids:?}"
    );
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let logs = String::from_utf8_lossy(&logs.lock().expect("lock")).into_owned();
    assert!(
        logs.contains("\"api_key_id\":\"bob\""),
        "log lines carry the key id"
    );
    for key in [&alice, &bob] {
        assert!(!logs.contains(key.as_str()), "a key reached a log line");
        assert!(!metrics.contains(key.as_str()), "a key reached /metrics");
        assert!(
            !format!("{records:?}").contains(key.as_str()),
            "a key reached a record"
        );
    }
    assert!(!metrics.contains("alice"), "key ids are not metric labels");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_a_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let ops = add_key(&file, "prometheus").expect("add");
    let server = start_guarded(
        Arc::new(scripted(hello())),
        &test_config(""),
        guard(&file, true),
    )
    .await;
    assert_eq!(get(&server, "/metrics", None).await, 401);
    assert_eq!(get(&server, "/metrics", Some(&ops)).await, 200);
    assert_eq!(get(&server, "/health", None).await, 200);
    assert_eq!(get(&server, "/ready", None).await, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_gateway_is_open_but_still_wants_json() {
    let server = start(Arc::new(scripted(hello())), &test_config("")).await;
    assert_eq!(chat(&server, None).await.status(), 200);
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .body(chat_body("hi", json!({})).to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 415, "no Content-Type");
    server.stop().await;
}

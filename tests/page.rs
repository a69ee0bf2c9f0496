//! The built-in page and the live view behind it, black-box over HTTP with the scripted
//! engine: the page's headers and that it loads nothing from elsewhere, the setting that
//! turns it off, and `GET /stats`: its figures, redacted records (none of their text under
//! `stats_only`), and that with keys on a key sees only its own requests' records. The
//! page itself runs in Chromium in tests/browser/.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::auth::limits::Limits;
use llmgate::auth::{add_key, Guard, Keys};
use llmgate::clock::ManualClock;
use llmgate::engine::scripted::Script;
use serde_json::{json, Value};

fn engine() -> Arc<llmgate::engine::scripted::ScriptedEngine> {
    Arc::new(scripted(Script::tokens(
        &["Paris", " it", " is", "."],
        Duration::from_millis(5),
    )))
}

async fn ask(server: &TestServer, prompt: &str, key: Option<&str>) {
    let response = post_with_key(
        server,
        CHAT,
        &chat_body(prompt, json!({"stream": true})),
        key,
    )
    .await;
    assert_eq!(response.status(), 200);
    response.text().await.expect("the whole stream");
}

/// `/stats` once it lists `records` documents (the semantic log is written just after
/// the response ends).
async fn stats_with(server: &TestServer, records: usize, key: Option<&str>) -> Value {
    for _ in 0..200 {
        let stats: Value = get_with_key(server, "/stats", key)
            .await
            .json()
            .await
            .expect("json");
        if stats["records"]
            .as_array()
            .is_some_and(|r| r.len() >= records)
        {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("/stats never listed {records} records");
}

/// API keys from `file`, `/metrics` left open.
fn guard(file: &std::path::Path) -> Guard {
    Guard {
        keys: Some(Arc::new(
            Keys::load(file, Limits::default(), Arc::new(ManualClock::new())).expect("keys"),
        )),
        metrics_need_key: false,
    }
}

/// The gateway with the semantic log in `dir/data` (`extra` added to its table) and the
/// API keys of `dir/keys`.
async fn keyed(dir: &std::path::Path, extra: &str) -> TestServer {
    TestServer::builder(engine())
        .config(&semlog_config(&dir.join("data"), extra))
        .semlog()
        .guard(guard(&dir.join("keys")))
        .start()
        .await
}

fn semlog_config(dir: &std::path::Path, extra: &str) -> llmgate::config::Config {
    test_config(&format!(
        "[semlog]\ndata_dir = \"{}\"\nbatch_age_ms = 50\n{extra}",
        dir.display()
    ))
}

#[tokio::test]
async fn the_page_is_served_with_a_strict_policy_and_nothing_from_elsewhere() {
    let server = TestServer::builder(engine()).start().await;
    let page = get_with_key(&server, "/", None).await;
    assert_eq!(page.status(), 200);
    let headers = page.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().expect("ascii");
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let html = page.text().await.expect("html");
    assert!(html.contains("<script src=\"/page/timeline.js\" defer>"));
    assert!(html.contains("<script src=\"/page/page.js\" defer>"));
    assert!(
        !html.contains("<script>") && !html.contains(" style=\""),
        "nothing inline"
    );

    for (path, kind) in [
        ("/page/page.js", "text/javascript"),
        ("/page/timeline.js", "text/javascript"),
        ("/page/page.css", "text/css"),
        ("/page/icon.svg", "image/svg+xml"),
    ] {
        let response = get_with_key(&server, path, None).await;
        assert_eq!(response.status(), 200, "{path}");
        assert!(response.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with(kind));
        let text = response.text().await.expect("text");
        // The one absolute URL is SVG's XML namespace, which is never fetched.
        let elsewhere = text.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !elsewhere.contains("http://") && !elsewhere.contains("https://"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn the_page_can_be_turned_off() {
    let server = TestServer::builder(engine())
        .config(&test_config("[server]\npage = false\n"))
        .start()
        .await;
    for path in ["/", "/page/page.js", "/page/timeline.js"] {
        let response = get_with_key(&server, path, None).await;
        assert_eq!(response.status(), 404, "{path}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "not_found");
    }
    assert_eq!(
        get_with_key(&server, "/stats", None).await.status(),
        200,
        "the live view stays"
    );
}

#[tokio::test]
async fn stats_count_requests_and_list_their_redacted_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder(engine())
        .config(&semlog_config(dir.path(), ""))
        .semlog()
        .start()
        .await;
    let empty: Value = get_with_key(&server, "/stats", None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(empty["requests"], 0);
    assert_eq!(empty["ttft_ms"]["p50"], Value::Null);
    assert_eq!(
        (empty["running"].as_u64(), empty["waiting"].as_u64()),
        (Some(0), Some(0))
    );

    ask(&server, "Mail jane@example.com the capital of France", None).await;
    ask(&server, "And of Italy?", None).await;
    let bad = post(&server, CHAT, &chat_body("hi", json!({"temperature": 9}))).await;
    assert_eq!(bad.status(), 400);
    let stats = stats_with(&server, 3, None).await;
    assert_eq!(stats["requests"], 3);
    assert_eq!(stats["ttft_ms"]["count"], 2);
    assert!(
        stats["ttft_ms"]["p95"].as_f64().expect("p95")
            >= stats["ttft_ms"]["p50"].as_f64().expect("p50")
    );
    assert!(stats["tpot_ms"]["p50"].as_f64().is_some());
    assert!(stats["tokens_per_second"].as_f64().expect("rate") > 0.0);
    assert_eq!(stats["errors"], json!({"invalid_value": 1}), "{stats}");
    // Without keys anyone may read /stats: the records carry figures, never text.
    let records = stats["records"].as_array().expect("records");
    assert_eq!(records[0]["error"]["type"], "invalid_value", "newest first");
    assert_eq!(records[2]["gen_ai"]["usage"]["output_tokens"], 4);
    assert_eq!(
        records[2]["gen_ai"]["response"]["finish_reasons"],
        json!(["stop"])
    );
    assert!(records[2]["llm"]["ttft_ms"].as_f64().is_some());
    let text = stats.to_string();
    assert!(
        !text.contains("France") && !text.contains("Italy") && !text.contains("Paris"),
        "{text}"
    );
    assert!(
        records[2].get("trace").is_none() && records[2]["llm"].get("build").is_none(),
        "only what the view shows"
    );
}

#[tokio::test]
async fn stats_only_keeps_the_text_out_of_the_live_view_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let alice = add_key(&file, "alice").expect("add");
    let server = keyed(dir.path(), "stats_only = true\n").await;
    ask(&server, "The secret plan is in the attic", Some(&alice)).await;
    // Even to the key that sent it.
    let stats = stats_with(&server, 1, Some(&alice)).await;
    let record = &stats["records"][0]["llm"];
    assert!(
        record.get("prompt_excerpt").is_none() && record.get("response_excerpt").is_none(),
        "{record}"
    );
    assert!(record["ttft_ms"].as_f64().is_some(), "the figures stay");
    assert!(!stats.to_string().contains("attic") && !stats.to_string().contains("Paris"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_each_key_sees_its_own_records_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let alice = add_key(&file, "alice").expect("add");
    let bob = add_key(&file, "bob").expect("add");
    let server = keyed(dir.path(), "").await;
    assert_eq!(get_with_key(&server, "/stats", None).await.status(), 401);
    assert_eq!(
        get_with_key(&server, "/stats", Some("llmgate-wrong"))
            .await
            .status(),
        401
    );
    assert_eq!(
        get_with_key(&server, "/", None).await.status(),
        200,
        "the page loads without a key"
    );

    // The router decodes the path; the key check sees it as the router does.
    for path in ["/%73tats", "/%761/models"] {
        assert_eq!(
            get_with_key(&server, path, None).await.status(),
            401,
            "{path}"
        );
    }

    ask(&server, "alice asks jane@example.com", Some(&alice)).await;
    let seen_by_alice = stats_with(&server, 1, Some(&alice)).await;
    let own = &seen_by_alice["records"][0]["llm"];
    assert_eq!(own["prompt_excerpt"], "alice asks <EMAIL>");
    assert_eq!(own["response_excerpt"], "Paris it is.");
    assert!(!seen_by_alice.to_string().contains("jane@example.com"));
    let seen_by_bob: Value = get_with_key(&server, "/stats", Some(&bob))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        seen_by_bob["records"],
        json!([]),
        "not another key's records"
    );
    assert_eq!(seen_by_bob["requests"], 1, "the figures are the gateway's");
}

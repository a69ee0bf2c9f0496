//! API keys, black-box over HTTP with the scripted engine: what each route requires, the
//! 401 and 415 answers, key rotation by editing the file while the server runs, and that
//! a key never shows up in a log line, a metric or a record (only its id does).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::logs::captured_logs;
use common::*;
use llmgate::auth::limits::Limits;
use llmgate::auth::{add_key, watch, Guard, Keys};
use llmgate::clock::{ManualClock, SharedClock};
use serde_json::{json, Value};

/// Keys from `file`, re-read every 50 ms; their limits refill by a clock that stands
/// still.
fn guard(file: &Path, metrics_need_key: bool) -> Guard {
    guard_on(file, metrics_need_key, Arc::new(ManualClock::new()))
}

/// Keys from `file` whose limits refill by `clock`.
fn guard_on(file: &Path, metrics_need_key: bool, clock: SharedClock) -> Guard {
    let keys = Arc::new(Keys::load(file, Limits::default(), clock).expect("keys"));
    tokio::spawn(watch(Arc::clone(&keys), Duration::from_millis(50)));
    Guard {
        keys: Some(keys),
        metrics_need_key,
    }
}

/// A keys file in a fresh directory with a key for each of `names`: the directory (gone
/// when dropped), the file, and the keys in the order of `names`.
fn keys_file<const N: usize>(names: [&str; N]) -> (tempfile::TempDir, PathBuf, [String; N]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let keys = names.map(|name| add_key(&file, name).expect("add"));
    (dir, file, keys)
}

async fn chat(server: &TestServer, key: Option<&str>) -> reqwest::Response {
    post_with_key(server, CHAT, &chat_body("hi", json!({})), key).await
}

async fn get(server: &TestServer, path: &str, key: Option<&str>) -> u16 {
    get_with_key(server, path, key).await.status().as_u16()
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
    let (_dir, file, [alice]) = keys_file(["alice"]);
    let server = TestServer::builder(hello_engine())
        .guard(guard(&file, false))
        .start()
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
    let tokenize = post(&server, "/tokenize", &json!({"prompt": "hi"})).await;
    assert_eq!(tokenize.status(), 401, "/tokenize needs a key too");
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
            if text.contains("line 1: expected '<key-id> <sha256-hex> [rpm=N] [tpm=N] [daily_tokens=N] [monthly_tokens=N]'") {
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
    let metrics = metrics(&server).await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_a_key() {
    let (_dir, file, [ops]) = keys_file(["prometheus"]);
    let server = TestServer::builder(hello_engine())
        .guard(guard(&file, true))
        .start()
        .await;
    assert_eq!(get(&server, "/metrics", None).await, 401);
    assert_eq!(get(&server, "/metrics", Some(&ops)).await, 200);
    assert_eq!(get(&server, "/health", None).await, 200);
    assert_eq!(get(&server, "/ready", None).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_gateway_is_open_but_still_wants_json() {
    let server = TestServer::builder(hello_engine()).start().await;
    assert_eq!(chat(&server, None).await.status(), 200);
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .body(chat_body("hi", json!({})).to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 415, "no Content-Type");
}

/// A guard whose keys file gives `alice` her own limits and `bob` none.
/// Alice's key with `alice_limits`, Bob's without; the limits refill by `clock`.
fn limited(dir: &Path, alice_limits: &str, clock: SharedClock) -> (Guard, String, String) {
    let file = dir.join("keys");
    let alice = add_key(&file, "alice").expect("add");
    let bob = add_key(&file, "bob").expect("add");
    let text = std::fs::read_to_string(&file).expect("read");
    let text = text.replacen('\n', &format!(" {alice_limits}\n"), 1);
    std::fs::write(&file, text).expect("write");
    (guard_on(&file, false, clock), alice, bob)
}

async fn chat_with(server: &TestServer, key: &str, max_tokens: u32) -> reqwest::Response {
    let body = chat_body("hi", json!({"max_tokens": max_tokens}));
    post_with_key(server, CHAT, &body, Some(key)).await
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_refuse_with_openais_429_and_recover() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 3,000 tokens a minute (50 a second); each request below costs 1 + 499. The limits
    // refill only when the test moves their clock, so every figure below is exact however
    // slow the machine is.
    let clock = Arc::new(ManualClock::new());
    let (guard, alice, bob) = limited(dir.path(), "rpm=100 tpm=3000", clock.clone());
    let engine = llmgate::engine::scripted::ScriptedEngine::new(model_info(4096), hello());
    let config = test_config("[engine]\nmax_tokens_cap = 4000\n");
    let server = TestServer::builder(Arc::new(engine))
        .config(&config)
        .guard(guard)
        .start()
        .await;

    let first = chat_with(&server, &alice, 499).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "x-ratelimit-limit-requests"), "100");
    assert_eq!(header(&first, "x-ratelimit-remaining-requests"), "99");
    assert_eq!(header(&first, "x-ratelimit-reset-requests"), "600ms");
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), "3000");
    assert_eq!(header(&first, "x-ratelimit-remaining-tokens"), "2500");
    assert_eq!(header(&first, "x-ratelimit-reset-tokens"), "10s");
    for _ in 0..5 {
        assert_eq!(chat_with(&server, &alice, 499).await.status(), 200);
    }
    let refused = chat_with(&server, &alice, 499).await;
    assert_eq!(refused.status(), 429);
    // Nothing is left, and 500 tokens take 10 s to come back at 50 a second.
    assert_eq!(header(&refused, "retry-after"), "10");
    assert_eq!(header(&refused, "x-ratelimit-remaining-tokens"), "0");
    assert_eq!(header(&refused, "x-ratelimit-reset-tokens"), "1m0s");
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(body["error"]["type"], "tokens", "{body}");
    let refused_record = server.observer.records();
    assert_eq!(
        refused_record.last().and_then(|r| r.error_kind),
        Some("rate_limit_exceeded"),
        "a refusal leaves its record"
    );

    // Another key is not touched, and has no limits: no headers.
    let other = chat_with(&server, &bob, 499).await;
    assert_eq!(other.status(), 200);
    assert!(!other.headers().contains_key("x-ratelimit-limit-tokens"));

    // 50 tokens come back every second: after 180 ms, 9 of them; a request of 1 + 9
    // needs one more, which 20 ms later is there.
    clock.advance(Duration::from_millis(180));
    let short = chat_with(&server, &alice, 9).await;
    assert_eq!(short.status(), 429);
    assert_eq!(header(&short, "x-ratelimit-remaining-tokens"), "9");
    clock.advance(Duration::from_millis(20));
    let fits = chat_with(&server, &alice, 9).await;
    assert_eq!(fits.status(), 200, "the token limit recovers at its rate");
    assert_eq!(header(&fits, "x-ratelimit-remaining-tokens"), "0");

    // A request that could never fit says so, without a Retry-After.
    let too_large = chat_with(&server, &alice, 3500).await;
    assert_eq!(too_large.status(), 429);
    assert!(!too_large.headers().contains_key("retry-after"));
    let body: Value = too_large.json().await.expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Request too large") && m.contains("Requested 3501")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_unless_origins_are_named() {
    let origin = "https://app.example.com";
    let preflight = |server: &TestServer, from: &str| {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
            .header("origin", from)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    let closed = TestServer::builder(hello_engine()).start().await;
    let answer = preflight(&closed, origin).await.expect("preflight");
    assert!(!answer.headers().contains_key("access-control-allow-origin"));

    let config = test_config(&format!("[server]\ncors_origins = [\"{origin}\"]\n"));
    let (_dir, file, [key]) = keys_file(["web"]);
    let open = TestServer::builder(hello_engine())
        .config(&config)
        .guard(guard(&file, false))
        .start()
        .await;
    // The preflight carries no key and is answered before authentication.
    let answer = preflight(&open, origin).await.expect("preflight");
    assert!(answer.status().is_success(), "{}", answer.status());
    assert_eq!(header(&answer, "access-control-allow-origin"), origin);
    let other = preflight(&open, "https://evil.example")
        .await
        .expect("preflight");
    assert!(!other.headers().contains_key("access-control-allow-origin"));
    let answer = reqwest::Client::new()
        .post(open.url("/v1/chat/completions"))
        .header("origin", origin)
        .bearer_auth(&key)
        .json(&chat_body("hi", json!({})))
        .send()
        .await
        .expect("request");
    assert_eq!(answer.status(), 200);
    assert_eq!(header(&answer, "access-control-allow-origin"), origin);
    assert!(header(&answer, "access-control-expose-headers").contains("x-request-id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_have_a_listener_of_their_own() {
    // The configured address only tells the API listener to leave /metrics out; the test
    // binds the metrics listener itself, on a free port.
    let config = test_config("[server]\nmetrics_listen = \"127.0.0.1:9464\"\n");
    let server = TestServer::builder(hello_engine())
        .config(&config)
        .start()
        .await;
    assert_eq!(get(&server, "/metrics", None).await, 404);
    assert_eq!(get(&server, "/health", None).await, 200);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let metrics = llmgate::serve_metrics(server.state.clone(), listener).expect("metrics");
    let handle = metrics.handle();
    tokio::spawn(metrics);
    assert_eq!(chat(&server, None).await.status(), 200);
    let scrape = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(scrape.contains("llmgate_requests_total"), "{scrape}");
    let api = reqwest::get(format!("{base}/v1/models"))
        .await
        .expect("get");
    assert_eq!(api.status(), 404, "the metrics listener serves no API");
    handle.stop(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_figures_are_found_by_its_ids_by_its_own_key_only() {
    let (_dir, file, [alice, bob]) = keys_file(["alice", "bob"]);
    let server = TestServer::builder(hello_engine())
        .guard(guard(&file, false))
        .start()
        .await;
    let body = chat_body(
        "hi",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let response = post_with_key(&server, CHAT, &body, Some(&alice)).await;
    let request_id = response.headers()["x-request-id"]
        .to_str()
        .expect("id")
        .to_owned();
    let text = response.text().await.expect("body");
    let last: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .next_back()
        .expect("the usage chunk");
    let figures = |id: String, key: String| {
        let url = server.url(&format!("/stats/requests/{id}"));
        async move {
            let response = reqwest::Client::new()
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .expect("request");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("json"))
        }
    };
    // The record is written as the request ends, a moment after its last frame.
    let mut found = (0, Value::Null);
    for _ in 0..100 {
        found = figures(request_id.clone(), alice.clone()).await;
        if found.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, answer) = found;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["request_id"], request_id.as_str());
    assert_eq!(answer["id"], last["id"], "the response's id");
    assert_eq!(answer["status"], "ok");
    assert_eq!(answer["finish_reason"], "stop");
    assert_eq!(answer["usage"], last["usage"]);
    // The same keys as the answer's own timings, the same values but for the end: the
    // record's e2e is taken at [DONE], the answer's a moment before.
    let (mine, theirs) = (&answer["timings"], &last["timings"]);
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(mine), keys(theirs));
    for key in [
        "ttft_ms",
        "tpot_ms",
        "output_tokens",
        "repetition_rate",
        "itl_ms",
    ] {
        assert_eq!(mine[key], theirs[key], "{key}");
    }
    assert!(mine["e2e_ms"].as_f64() >= theirs["e2e_ms"].as_f64());
    // By its response id too; not by another key, nor without one.
    let by_id = figures(last["id"].as_str().unwrap().to_owned(), alice.clone()).await;
    assert_eq!(by_id.1["request_id"], request_id.as_str());
    let (status, error) = figures(request_id.clone(), bob.clone()).await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["code"], "request_not_found");
    assert_eq!(error["error"]["param"], "id");
    assert_eq!(
        get(&server, &format!("/stats/requests/{request_id}"), None).await,
        401
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_quota_refuses_with_insufficient_quota_until_the_next_day() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new());
    let (guard, alice, bob) = limited(dir.path(), "daily_tokens=40", clock.clone());
    let server = TestServer::builder(hello_engine())
        .guard(guard)
        .start()
        .await;
    let mut answered = 0;
    let refused = loop {
        let response = chat_with(&server, &alice, 8).await;
        if response.status() != 200 {
            break response;
        }
        answered += 1;
        assert!(answered < 40, "the quota never stopped the key");
    };
    assert!(
        answered >= 2,
        "{answered} answered before the quota was spent"
    );
    assert_eq!(refused.status(), 429);
    assert_eq!(
        header(&refused, "x-should-retry"),
        "false",
        "the SDKs must not retry"
    );
    let retry_after: u64 = header(&refused, "retry-after").parse().expect("seconds");
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["type"], "insufficient_quota", "{body}");
    assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
    let stats: Value = get_with_key(&server, "/stats", Some(&alice))
        .await
        .json()
        .await
        .expect("json");
    let quota = &stats["quotas"][0];
    assert_eq!(
        (quota["period"].as_str(), quota["limit"].as_u64()),
        (Some("day"), Some(40))
    );
    assert!(quota["used"].as_u64().is_some_and(|u| u >= 40), "{stats}");
    assert_eq!(
        quota["current"], "2026-01-01",
        "the server's clock's day, UTC"
    );
    // Bob has no quota, and a new day gives Alice a new one.
    assert_eq!(chat_with(&server, &bob, 8).await.status(), 200);
    clock.advance(Duration::from_secs(86_400));
    assert_eq!(chat_with(&server, &alice, 8).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_api_key_is_a_key_and_the_routes_without_v1_are_guarded_too() {
    let (_dir, file, [key]) = keys_file(["web"]);
    let server = TestServer::builder(hello_engine())
        .guard(guard(&file, false))
        .start()
        .await;
    let client = reqwest::Client::new();
    for path in ["/v1/chat/completions", "/chat/completions"] {
        let without = client
            .post(server.url(path))
            .json(&chat_body("hi", json!({})))
            .send()
            .await
            .expect("request");
        assert_eq!(without.status(), 401, "{path} needs a key");
        let with = client
            .post(server.url(path))
            .header("x-api-key", &key)
            .json(&chat_body("hi", json!({})))
            .send()
            .await
            .expect("request");
        assert_eq!(with.status(), 200, "{path} with X-Api-Key");
    }
    let wrong = client
        .get(server.url("/models"))
        .header("x-api-key", "not-a-key")
        .send()
        .await
        .expect("request");
    assert_eq!(wrong.status(), 401);
    let models = client
        .get(server.url("/models"))
        .header("x-api-key", &key)
        .send()
        .await
        .expect("request");
    assert_eq!(models.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_localhost_is_any_port_on_this_machine() {
    let config = test_config("[server]\ncors_origins = [\"localhost\", \"127.0.0.1:8443\"]\n");
    let server = TestServer::builder(hello_engine())
        .config(&config)
        .start()
        .await;
    let preflight = |from: &'static str| {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
            .header("origin", from)
            .header("access-control-request-method", "POST")
            .send()
    };
    for allowed in [
        "http://localhost:5173",
        "http://127.0.0.1:3000",
        "http://[::1]:8000",
        "http://localhost",
    ] {
        let answer = preflight(allowed).await.expect("preflight");
        assert_eq!(header(&answer, "access-control-allow-origin"), allowed);
    }
    for refused in [
        "http://localhost.evil.example",
        "http://localhost:80x",
        "https://app.example.com",
    ] {
        let answer = preflight(refused).await.expect("preflight");
        assert!(
            !answer.headers().contains_key("access-control-allow-origin"),
            "{refused}"
        );
    }
}

//! Black-box tests over HTTP with the scripted engine: exact SSE frames, usage on/off,
//! every error case, cancellation on disconnect, admission control, probes and headers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use llmgate::engine::scripted::{Script, Step};
use llmgate::engine::EngineError;
use llmgate::record::Status;
use serde_json::{json, Value};

const HEAD: &str = r#"data: {"id":"chatcmpl-t1","object":"chat.completion.chunk","created":1767225600,"model":"test-model","system_fingerprint":"fp_test","choices":"#;
const ZERO_TIMINGS: &str = r#""timings":{"ttft_ms":0.0,"engine_ttft_ms":0.0,"tpot_ms":0.0,"e2e_ms":0.0,"queue_ms":0.0,"itl_ms":{"p50":0.0,"p95":0.0,"max":0.0},"tokens_per_second":null,"output_tokens":3,"chunks":3,"delivery_ms":{"p50":0.0,"p95":0.0,"max":0.0},"client_wait_ms":0.0,"overhead_ms":0.0,"repetition_rate":0.0,"degenerated":false,"refusal":false,"intent":"greeting","language":"und","answer_language":"und","mean_logprob":-0.2,"min_logprob":-0.3,"low_confidence_share":0.0}"#;

#[tokio::test]
async fn streamed_frames_are_exact_without_usage() {
    let server = TestServer::builder(hello_engine()).frozen().start().await;
    let response = post(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    assert_eq!(response.status(), 200);
    let headers = response.headers();
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["cache-control"], "no-cache");
    assert_eq!(headers["x-accel-buffering"], "no");
    assert_eq!(headers["x-request-id"], "t1");
    let body = response.text().await.expect("body");
    let choice = |delta: &str, finish: &str| {
        format!(r#"[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]"#)
    };
    let expected = [
        format!(
            "{HEAD}{}}}\n\n",
            choice(r#"{"role":"assistant","content":""}"#, "null")
        ),
        format!("{HEAD}{}}}\n\n", choice(r#"{"content":"Hel"}"#, "null")),
        format!("{HEAD}{}}}\n\n", choice(r#"{"content":"lo"}"#, "null")),
        format!("{HEAD}{}}}\n\n", choice(r#"{"content":"!"}"#, "null")),
        format!("{HEAD}{},{ZERO_TIMINGS}}}\n\n", choice("{}", r#""stop""#)),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    assert_eq!(body, expected);
}

#[tokio::test]
async fn streamed_frames_are_exact_with_usage() {
    let server = TestServer::builder(hello_engine()).frozen().start().await;
    let body = json!({"stream": true, "stream_options": {"include_usage": true}});
    let text = post_text(&server, CHAT, &chat_body("hi", body)).await;
    let frames: Vec<&str> = text.split_inclusive("\n\n").collect();
    assert_eq!(frames.len(), 7, "{text}");
    for frame in &frames[..5] {
        assert!(frame.ends_with(",\"usage\":null}\n\n"), "{frame}");
    }
    assert_eq!(
        frames[5],
        format!("{HEAD}[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":3,\"total_tokens\":4}},{ZERO_TIMINGS}}}\n\n")
    );
    assert_eq!(frames[6], "data: [DONE]\n\n");
}

#[tokio::test]
async fn non_streamed_response_is_exact() {
    let server = TestServer::builder(hello_engine()).frozen().start().await;
    let response = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        body,
        json!({
            "id": "chatcmpl-t1", "object": "chat.completion", "created": 1767225600u64,
            "model": "test-model", "system_fingerprint": "fp_test",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!", "refusal": null},
                         "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
            "timings": {"ttft_ms": 0.0, "engine_ttft_ms": 0.0, "tpot_ms": 0.0, "e2e_ms": 0.0, "queue_ms": 0.0,
                        "itl_ms": {"p50": 0.0, "p95": 0.0, "max": 0.0}, "tokens_per_second": null, "output_tokens": 3,
                        "chunks": 3, "delivery_ms": {"p50": 0.0, "p95": 0.0, "max": 0.0},
                        "client_wait_ms": null, "overhead_ms": 0.0, "repetition_rate": 0.0, "degenerated": false, "refusal": false, "intent": "greeting", "language": "und", "answer_language": "und",
                        "mean_logprob": -0.2, "min_logprob": -0.3, "low_confidence_share": 0.0}
        })
    );
}

#[tokio::test]
async fn timings_follow_the_definitions_with_real_delays() {
    let script = Script::tokens(&["a", "b", "c", "d"], Duration::from_millis(30))
        .after_queue(Duration::from_millis(50));
    let server = TestServer::builder(Arc::new(scripted(script)))
        .start()
        .await;
    let body: Value = post_json(&server, CHAT, &chat_body("hi", json!({}))).await;
    let t = &body["timings"];
    let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k} in {t}"));
    assert!(f("ttft_ms") >= 80.0, "{t}");
    assert!(f("ttft_ms") <= f("e2e_ms"));
    assert!(
        f("tpot_ms") >= 25.0 && f("tpot_ms") * 3.0 <= f("e2e_ms"),
        "{t}"
    );
    // Queue: t_recv -> the engine starts (50 ms in its queue); engine TTFT starts there.
    assert!(f("queue_ms") >= 45.0 && f("queue_ms") < f("ttft_ms"), "{t}");
    let engine_ttft = f("engine_ttft_ms");
    assert!((25.0..f("ttft_ms") - 45.0).contains(&engine_ttft), "{t}");
    let itl = |k: &str| {
        t["itl_ms"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("itl_ms.{k} in {t}"))
    };
    assert!(itl("p50") >= 25.0 && itl("max") >= itl("p50"), "{t}");
    let records = server.observer.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::Ok);
    assert_eq!(records[0].timings.output_tokens, 4);
}

#[tokio::test]
async fn finish_reason_length_when_max_tokens_is_reached() {
    let server = TestServer::builder(hello_engine()).start().await;
    let body: Value = post_json(&server, CHAT, &chat_body("hi", json!({"max_tokens": 2}))).await;
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello");
    assert_eq!(body["usage"]["completion_tokens"], 2);
}

async fn expect_error(server: &TestServer, body: Vec<u8>, status: u16, code: &str, param: Value) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("request");
    assert_eq!(
        response.status().as_u16(),
        status,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(response.headers().contains_key("x-request-id"));
    let json: Value = response.json().await.expect("error body is JSON");
    let error = &json["error"];
    assert_eq!(error["code"], code, "{json}");
    assert_eq!(error["param"], param, "{json}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(error["type"].is_string());
}

#[tokio::test]
async fn every_error_case_has_its_status_and_body() {
    let config = test_config("[server]\nmax_body_bytes = 2048\n[engine]\nmax_tokens_cap = 100\ndefault_max_tokens = 50\n");
    let server = TestServer::builder(hello_engine())
        .config(&config)
        .start()
        .await;
    let to_vec = |v: Value| v.to_string().into_bytes();
    let cases = [
        (b"{\"model\": ".to_vec(), 400, "invalid_json", Value::Null),
        (
            to_vec(chat_body("hi", json!({"temperature": "warm"}))),
            400,
            "invalid_value",
            json!("temperature"),
        ),
        (
            to_vec(json!({"model": MODEL, "messages": []})),
            400,
            "invalid_value",
            json!("messages"),
        ),
        (
            to_vec(json!({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]})),
            400,
            "invalid_value",
            json!("messages[0].role"),
        ),
        (
            to_vec(chat_body("hi", json!({"model": "gpt-4o"}))),
            404,
            "model_not_found",
            json!("model"),
        ),
        (
            to_vec(chat_body("hi", json!({"n": 9}))),
            400,
            "invalid_value",
            json!("n"),
        ),
        (
            to_vec(chat_body(
                "hi",
                json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
            )),
            400,
            "unsupported_parameter",
            json!("tools"),
        ),
        (
            to_vec(chat_body("hi", json!({"max_tokens": 101}))),
            400,
            "invalid_value",
            json!("max_tokens"),
        ),
        (
            to_vec(chat_body(&"word ".repeat(600), json!({}))),
            413,
            "payload_too_large",
            Value::Null,
        ),
        (
            to_vec(chat_body(&"word ".repeat(100), json!({}))),
            400,
            "context_length_exceeded",
            json!("messages"),
        ),
    ];
    for (body, status, code, param) in cases {
        expect_error(&server, body, status, code, param).await;
    }
    // Every refused request still leaves a record with its error kind.
    let kinds: Vec<_> = server
        .observer
        .records()
        .iter()
        .map(|r| r.error_kind)
        .collect();
    assert_eq!(kinds.len(), 10);
    assert!(kinds.contains(&Some("payload_too_large")));
}

#[tokio::test]
async fn failure_mid_stream_is_one_error_frame_then_done() {
    let failing = Script::tokens(&["par", "tial"], Duration::ZERO)
        .then_fail(EngineError::Internal("kernel panic at 0xdead".into()));
    let engine = scripted(hello()).with_script("break", failing);
    let server = TestServer::builder(Arc::new(engine)).start().await;
    let text = post_text(&server, CHAT, &chat_body("break", json!({"stream": true}))).await;
    let frames: Vec<&str> = text.split_inclusive("\n\n").collect();
    assert_eq!(frames.len(), 5, "{text}");
    assert!(frames[2].contains("\"content\":\"tial\""));
    let error: Value =
        serde_json::from_str(frames[3].trim_start_matches("data: ").trim()).expect("error frame");
    assert_eq!(error["error"]["code"], "engine_error");
    assert!(
        !frames[3].contains("0xdead"),
        "internals are logged, not sent"
    );
    assert_eq!(frames[4], "data: [DONE]\n\n");
    assert!(
        eventually(5, || server
            .observer
            .records()
            .first()
            .is_some_and(|r| r.status == Status::Error))
        .await
    );
}

#[tokio::test]
async fn non_streamed_failure_is_a_500_in_openai_shape() {
    let engine = scripted(
        Script::tokens(&["x"], Duration::ZERO).then_fail(EngineError::Internal("boom".into())),
    );
    let server = TestServer::builder(Arc::new(engine)).start().await;
    let response = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "engine_error");
    let records = server.observer.records();
    assert_eq!(
        records.len(),
        1,
        "exactly one record per request: {records:?}"
    );
    assert_eq!(records[0].error_kind, Some("engine_error"));
}

#[tokio::test]
async fn client_disconnect_cancels_generation() {
    let slow = Script::tokens(&vec!["tok"; 500], Duration::from_millis(10));
    let engine = Arc::new(scripted_long(slow));
    let server = TestServer::builder(engine.clone()).start().await;
    let response = post(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    let mut body = response.bytes_stream();
    let mut received = 0;
    while received < 5 {
        let chunk = body.next().await.expect("frame").expect("bytes");
        received += chunk.windows(5).filter(|w| w == b"\"tok\"").count();
    }
    drop(body);

    assert!(
        eventually(5, || engine.generations_cancelled() == 1).await,
        "the engine was not told to stop"
    );
    let stopped_at = engine.tokens_produced();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        engine.tokens_produced(),
        stopped_at,
        "tokens are still being produced"
    );
    assert!(stopped_at < 100, "generation ran on: {stopped_at} tokens");
    assert!(
        eventually(5, || server
            .observer
            .records()
            .iter()
            .any(|r| r.status == Status::Cancelled))
        .await
    );
}

#[tokio::test]
async fn admission_overflow_gets_429_with_retry_after() {
    // Each stream would run for a minute: only a dropped client can free its slot.
    let endless = Script::tokens(&vec!["x"; 3_000], Duration::from_millis(20));
    let engine = Arc::new(scripted_long(endless));
    let server = TestServer::builder(engine.clone())
        .config(&test_config("[server]\nmax_in_flight = 2\n"))
        .start()
        .await;
    let a = post(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    let b = post(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));

    let third = post(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["retry-after"], "1");
    let body: Value = third.json().await.expect("json");
    assert_eq!(body["error"]["code"], "server_overloaded");
    assert_eq!(body["error"]["type"], "rate_limit_error");

    drop(a);
    assert!(eventually(5, || engine.generations_cancelled() == 1).await);
    // The freed slot admits a new request, well before the other stream could end.
    let mut admitted = false;
    for _ in 0..50 {
        let r = post(&server, CHAT, &chat_body("hi", json!({"max_tokens": 1}))).await;
        if r.status() == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admitted, "the slot of the dropped request was not freed");
    drop(b);
}

#[tokio::test]
async fn keepalive_comments_fill_long_gaps() {
    let gap = Script {
        steps: vec![Step::Token {
            text: "late".into(),
            delay: Duration::from_millis(2_500),
        }],
        ..hello()
    };
    let server = TestServer::builder(Arc::new(scripted(gap)))
        .config(&test_config("[server]\nkeepalive_secs = 1\n"))
        .start()
        .await;
    let text = post_text(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    assert_eq!(text.matches(": keep-alive\n\n").count(), 2, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn probes_models_and_request_ids() {
    let engine = hello_engine();
    let server = TestServer::builder(engine.clone()).start().await;
    let client = reqwest::Client::new();

    let health = client
        .get(server.url("/health"))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
    let generated = health.headers()["x-request-id"]
        .to_str()
        .expect("id")
        .to_owned();
    assert_eq!(generated.len(), 32, "a uuid when the client sends none");

    let ready: Value = client
        .get(server.url("/ready"))
        .send()
        .await
        .expect("ready")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["system_fingerprint"], "fp_test");
    // Which engine serves, for the default model and for each.
    assert_eq!(ready["engine"], "scripted");
    assert_eq!(ready["models"][0]["engine"], "scripted");

    let models: Value = client
        .get(server.url("/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(
        client
            .get(server.url("/v1/models/nope"))
            .send()
            .await
            .expect("model")
            .status(),
        404
    );

    let unknown = client
        .get(server.url("/v2/nothing"))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .expect("404");
    assert_eq!(unknown.status(), 404);
    assert_eq!(unknown.headers()["x-request-id"], "abc-123");
    let unsafe_id = client
        .get(server.url("/health"))
        .header("x-request-id", "a b<script>")
        .send()
        .await
        .expect("health");
    assert_ne!(unsafe_id.headers()["x-request-id"], "a b<script>");

    engine.set_ready(false);
    assert_eq!(
        client
            .get(server.url("/ready"))
            .send()
            .await
            .expect("ready")
            .status(),
        503
    );
    let loading = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(loading.status(), 503);
    assert_eq!(loading.headers()["retry-after"], "5");
}

fn looping(tokens: usize) -> Script {
    let words: Vec<&str> = ["la ", "femme ", "au ", "martyre, "]
        .iter()
        .copied()
        .cycle()
        .take(tokens)
        .collect();
    Script::tokens(&words, Duration::from_millis(2))
}

#[tokio::test]
async fn quality_signals_are_reported_and_recorded() {
    let engine = scripted(hello())
        .with_script("loop", looping(40))
        .with_script(
            "Write a Python function, please",
            Script::tokens(
                &["I'm sorry, but I can't ", "help with that."],
                Duration::ZERO,
            ),
        );
    let server = TestServer::builder(Arc::new(engine)).start().await;

    let body: Value = post_json(&server, CHAT, &chat_body("loop", json!({}))).await;
    // 40 tokens cycling through 4 ids: 37 four-grams, 4 unique.
    let rate = body["timings"]["repetition_rate"].as_f64().expect("rate");
    assert_eq!(rate, ((1.0 - 4.0 / 37.0) * 10_000.0_f64).round() / 10_000.0);
    assert_eq!(
        body["timings"]["degenerated"], false,
        "the guard is off by default"
    );
    assert_eq!(body["usage"]["completion_tokens"], 40);

    let body: Value = post_json(
        &server,
        CHAT,
        &chat_body("Write a Python function, please", json!({})),
    )
    .await;
    assert_eq!(body["timings"]["refusal"], true);
    assert_eq!(body["timings"]["intent"], "coding");
    assert_eq!(body["timings"]["repetition_rate"], 0.0);

    let records = server.observer.records();
    let refusal = records.last().expect("record");
    let quality = refusal.quality.as_ref().expect("quality");
    assert!(quality.refusal);
    use sha2::Digest;
    let expected_hash = hex::encode(sha2::Sha256::digest(
        b"I'm sorry, but I can't help with that.",
    ));
    assert_eq!(refusal.output_hash.as_deref(), Some(expected_hash.as_str()));
    assert_eq!(refusal.input_hash.as_ref().map(String::len), Some(64));
}

#[tokio::test]
async fn the_guard_leaves_a_request_for_a_length_alone() {
    let engine = Arc::new(scripted(hello()).with_script("loop", looping(400)));
    let config = test_config(
        "[quality]\ndegeneration_guard = true\nguard_window = 16\nguard_threshold = 0.5\n",
    );
    let server = TestServer::builder(engine).config(&config).start().await;
    for extra in [
        json!({"ignore_eos": true, "max_tokens": 40}),
        json!({"min_tokens": 30, "max_tokens": 40}),
    ] {
        let body: Value = post_json(&server, CHAT, &chat_body("loop", extra.clone())).await;
        assert_eq!(body["timings"]["degenerated"], false, "{extra}: {body}");
        assert_eq!(body["usage"]["completion_tokens"], 40, "{extra}: {body}");
        assert_eq!(body["choices"][0]["finish_reason"], "length", "{extra}");
    }
}

#[tokio::test]
async fn degeneration_guard_stops_a_loop_early() {
    let engine = Arc::new(scripted(hello()).with_script("loop", looping(400)));
    let config = test_config(
        "[quality]\ndegeneration_guard = true\nguard_window = 16\nguard_threshold = 0.5\n",
    );
    let server = TestServer::builder(engine.clone())
        .config(&config)
        .start()
        .await;

    for stream in [false, true] {
        let response = post(&server, CHAT, &chat_body("loop", json!({"stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }}))).await;
        let body: Value = if stream {
            let text = response.text().await.expect("body");
            let last = text
                .split("\n\n")
                .filter_map(|f| f.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .last()
                .expect("usage chunk")
                .to_owned();
            assert!(text.contains("\"finish_reason\":\"stop\""), "{text}");
            serde_json::from_str(&last).expect("json")
        } else {
            let body: Value = response.json().await.expect("json");
            assert_eq!(body["choices"][0]["finish_reason"], "stop");
            body
        };
        assert_eq!(body["timings"]["degenerated"], true, "{body}");
        // A 16-token window of a 4-token cycle has 13 four-grams, 4 unique: the guard
        // trips when the window is first full.
        assert_eq!(body["usage"]["completion_tokens"], 16, "{body}");
    }
    assert!(
        eventually(5, || engine.generations_cancelled() == 2).await,
        "the engine kept generating"
    );
    assert!(engine.tokens_produced() < 100);
    let records = server.observer.records();
    assert!(records
        .iter()
        .all(|r| r.status == Status::Ok && r.quality.as_ref().is_some_and(|q| q.degenerated)));

    // Varied text is not stopped.
    let body: Value = post_json(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(body["timings"]["degenerated"], false);
}

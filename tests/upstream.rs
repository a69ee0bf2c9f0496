//! The upstream engine against a scripted OpenAI-compatible server: what is forwarded,
//! what comes back, every fault's outcome (status, code, the record), and several models
//! in one gateway.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::upstream::*;
use common::*;
use futures_util::StreamExt;
use llmgate::bench::upstream::UpstreamScript;
use llmgate::engine::scripted::Script;
use llmgate::engine::upstream::UpstreamEngine;
use llmgate::engine::Backend;
use llmgate::record::Status;
use serde_json::{json, Value};

fn script(tokens: u32) -> UpstreamScript {
    UpstreamScript {
        model: UPSTREAM_MODEL.into(),
        tokens,
        interval: Duration::from_millis(2),
        ..UpstreamScript::default()
    }
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
fn data_of(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// The chunks of a streamed answer, which must end with `[DONE]`.
fn chunks_before_done(text: &str) -> Vec<Value> {
    let data = data_of(text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect()
}

#[tokio::test]
async fn a_stream_is_forwarded_timed_and_counted_from_the_upstreams_usage() {
    let upstream = start_upstream(script(6)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let body = chat_body(
        "hi",
        json!({"stream": true, "stream_options": {"include_usage": true}, "seed": 7,
               "temperature": 0.5, "stop": ["\n"], "max_tokens": 32, "ignore_eos": true,
               "min_tokens": 2, "top_k": 5, "logit_bias": {"42": -100}}),
    );
    const ID: &str = "6f1c4a52-8a1e-4a8b-9a41-2f0c1d3e5b77";
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .header("x-request-id", ID)
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("body");
    let chunks = chunks_before_done(&text);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "tok0 tok1 tok2 tok3 tok4 tok5");
    assert!(
        chunks.iter().all(|c| c["model"] == MODEL),
        "the served id, not the upstream's name"
    );
    assert!(
        chunks.iter().all(|c| c["choices"][0]["logprobs"].is_null()),
        "the client did not ask for logprobs"
    );
    let last = &chunks[chunks.len() - 1];
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11})
    );
    let t = &last["timings"];
    let upstream_ttft = t["upstream_ttft_ms"].as_f64().expect("upstream_ttft_ms");
    let ttft = t["ttft_ms"].as_f64().expect("ttft_ms");
    assert!(upstream_ttft > 0.0 && upstream_ttft <= ttft, "{t}");
    assert_eq!(t["repetition_basis"], "logprob_tokens");
    assert_eq!(
        t["mean_logprob"], -0.5,
        "confidence from the upstream's logprobs"
    );

    // What the upstream was asked: always streamed with usage and logprobs, the
    // client's parameters passed on, the trace and the request id continued.
    let sent = upstream.received();
    assert_eq!(sent.len(), 1);
    let sent = &sent[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    let b = &sent.body;
    assert_eq!(b["model"], UPSTREAM_MODEL);
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"], json!({"include_usage": true}));
    assert_eq!(b["logprobs"], true);
    assert_eq!(
        (
            b["seed"].clone(),
            b["temperature"].clone(),
            b["max_tokens"].clone()
        ),
        (json!(7), json!(0.5), json!(32))
    );
    assert_eq!(b["stop"], json!(["\n"]));
    assert_eq!(
        (
            b["ignore_eos"].clone(),
            b["min_tokens"].clone(),
            b["top_k"].clone()
        ),
        (json!(true), json!(2), json!(5))
    );
    assert_eq!(b["logit_bias"], json!({"42": -100.0}), "passed on");
    assert_eq!(
        sent.header("x-request-id"),
        Some(ID),
        "a UUID id is passed on"
    );
    let record = &server.observer.records()[0];
    let traceparent = sent.header("traceparent").expect("traceparent");
    assert!(
        traceparent.starts_with(&format!(
            "00-{}-{}-",
            record.trace.trace_id, record.trace.span_id
        )),
        "{traceparent}"
    );
    assert_eq!(record.status, Status::Ok);
    assert_eq!(record.usage.completion_tokens, 6);
    assert_eq!(record.response_model(), UPSTREAM_MODEL);
    let upstream_record = record.upstream.as_ref().expect("upstream record");
    assert_eq!(
        upstream_record.system_fingerprint.as_deref(),
        Some("fp_scripted")
    );
}

#[tokio::test]
async fn non_streamed_and_legacy_requests_and_asked_logprobs_come_back() {
    let upstream = start_upstream(script(3)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let chat: Value = post_json(
        &server,
        CHAT,
        &chat_body("hi", json!({"logprobs": true, "top_logprobs": 0})),
    )
    .await;
    assert_eq!(chat["choices"][0]["message"]["content"], "tok0 tok1 tok2");
    assert_eq!(chat["choices"][0]["finish_reason"], "stop");
    assert_eq!(chat["usage"]["completion_tokens"], 3);
    let tokens = chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs");
    assert_eq!(tokens.len(), 3);
    assert_eq!(tokens[1]["token"], " tok1");
    assert_eq!(tokens[1]["logprob"], -0.5);

    let legacy: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "Once", "max_tokens": 2, "echo": true}),
    )
    .await;
    assert_eq!(
        legacy["choices"][0]["text"], "Oncetok0 tok1",
        "echo by the gateway"
    );
    assert_eq!(legacy["choices"][0]["finish_reason"], "length");
    let sent = upstream.received();
    assert_eq!(
        sent[0].header("x-request-id"),
        None,
        "not a UUID: llama.cpp's server refuses those"
    );
    assert_eq!(sent[1].path, "/v1/completions");
    assert_eq!(sent[1].body["prompt"], "Once");
    assert_eq!(
        sent[1].body["logprobs"], 1,
        "asked for the confidence figures"
    );
    assert!(sent[1].body.get("echo").is_none(), "echo is the gateway's");
}

#[tokio::test]
async fn the_gateways_own_share_is_reported_without_the_upstreams_waits() {
    // Three chunks 25 ms apart: at least 50 ms of each answer is waiting on the upstream.
    let upstream = start_upstream(UpstreamScript {
        interval: Duration::from_millis(25),
        ..script(3)
    })
    .await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let response = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(response.status(), 200);
    let header = response
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .expect("a Server-Timing header")
        .to_owned();
    let duration = |name: &str| -> f64 {
        let entry = header
            .split(", ")
            .find(|e| e.starts_with(&format!("{name};")))
            .unwrap_or_else(|| panic!("{name} in {header}"));
        let dur = entry.split(';').find_map(|p| p.strip_prefix("dur="));
        dur.and_then(|d| d.parse().ok()).expect("dur")
    };
    let body: Value = response.json().await.expect("body");
    let t = &body["timings"];
    let (overhead, e2e) = (
        t["overhead_ms"].as_f64().unwrap(),
        t["e2e_ms"].as_f64().unwrap(),
    );
    assert!(overhead > 0.0 && overhead < e2e - 40.0, "{t}");
    let (header_overhead, total) = (duration("overhead"), duration("total"));
    assert!(header_overhead >= overhead, "measured later: {header} {t}");
    assert!(total >= e2e && total >= header_overhead, "{header} {t}");

    let streamed = post_text(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    let chunks = chunks_before_done(&streamed);
    let t = &chunks[chunks.len() - 1]["timings"];
    let (overhead, e2e) = (
        t["overhead_ms"].as_f64().unwrap(),
        t["e2e_ms"].as_f64().unwrap(),
    );
    assert!(overhead > 0.0 && overhead < e2e - 40.0, "{t}");

    assert!(eventually(5, || server.observer.records().len() == 2).await);
    let records = server.observer.records();
    assert!(records.iter().all(|r| r.timings.overhead_ms > 0.0));
    let text = metrics(&server).await;
    let count = format!("llmgate_gateway_overhead_seconds_count{{model=\"{MODEL}\"}} 2");
    assert!(text.contains(&count), "{count} in\n{text}");
}

/// What one fault gave the client and the record.
struct Outcome {
    status: u16,
    code: String,
    body: String,
    retry_after: Option<String>,
}

async fn non_streamed(server: &TestServer, prompt: &str) -> Outcome {
    let response = post(server, CHAT, &chat_body(prompt, json!({}))).await;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.text().await.expect("body");
    let code = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Outcome {
        status,
        code,
        body,
        retry_after,
    }
}

#[tokio::test]
async fn every_fault_before_the_stream_is_an_openai_error_and_a_record() {
    let upstream = start_upstream(script(4)).await;
    let mut config = upstream_config(&upstream.url);
    config.first_byte_timeout = Duration::from_secs(1);
    let server = gateway(config).await;
    for (prompt, status, code) in [
        ("fault:401", 502, "upstream_auth_failed"),
        ("fault:429", 429, "upstream_rate_limited"),
        ("fault:500", 502, "upstream_error"),
        ("fault:400", 400, "upstream_invalid_request"),
        ("fault:no-first-byte", 504, "upstream_timeout"),
        ("fault:not-a-stream", 502, "upstream_protocol_error"),
        ("fault:cut", 502, "upstream_stream_cut"),
        ("fault:bad-json", 502, "upstream_protocol_error"),
        ("fault:bad-sse", 502, "upstream_protocol_error"),
        ("fault:other-model", 502, "upstream_model_mismatch"),
        ("fault:error-event", 502, "upstream_error"),
        ("fault:idle", 504, "upstream_timeout"),
    ] {
        let outcome = non_streamed(&server, prompt).await;
        assert_eq!(
            (outcome.status, outcome.code.as_str()),
            (status, code),
            "{prompt}: {}",
            outcome.body
        );
        let error: Value = serde_json::from_str(&outcome.body).expect("OpenAI shape");
        assert!(error["error"]["message"].is_string() && error["error"]["type"].is_string());
        assert!(
            !outcome.body.contains("sk-upstream-secret") && !outcome.body.contains("0xdead"),
            "{prompt}: the upstream's words stay out: {}",
            outcome.body
        );
        if prompt == "fault:429" {
            assert_eq!(outcome.retry_after.as_deref(), Some("7"));
        }
        if prompt == "fault:400" {
            assert_eq!(error["error"]["param"], "top_k");
        }
    }
    let records = server.observer.records();
    assert_eq!(records.len(), 12, "one record each");
    assert!(records.iter().all(|r| r.status == Status::Error));
    assert_eq!(records[0].error_kind, Some("upstream_auth_failed"));
    assert_eq!(records[11].error_kind, Some("upstream_timeout"));
    // Still serving.
    assert_eq!(non_streamed(&server, "hi").await.status, 200);
    let metrics = metrics(&server).await;
    assert!(
        metrics.contains(r#"error_type="upstream_model_mismatch""#),
        "counted by error_type"
    );
}

#[tokio::test]
async fn a_fault_mid_stream_is_an_error_frame_then_done() {
    let upstream = start_upstream(script(4)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    for (prompt, code) in [
        ("fault:cut", "upstream_stream_cut"),
        ("fault:idle", "upstream_timeout"),
        ("fault:bad-json", "upstream_protocol_error"),
    ] {
        let response = post(&server, CHAT, &chat_body(prompt, json!({"stream": true}))).await;
        assert_eq!(response.status(), 200, "{prompt}");
        let data = data_of(&response.text().await.expect("body"));
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{prompt}");
        let error: Value = serde_json::from_str(&data[data.len() - 2]).expect("error frame");
        assert_eq!(error["error"]["code"], code, "{prompt}");
    }
    // Another model named in the first chunk: nothing has reached the client, so it
    // gets the HTTP error the fault stands for, not a 200 with an error frame.
    let response = post(
        &server,
        CHAT,
        &chat_body("fault:other-model", json!({"stream": true})),
    )
    .await;
    assert_eq!(response.status(), 502);
    let error: Value = response.json().await.expect("error body");
    assert_eq!(error["error"]["code"], "upstream_model_mismatch");
    let records = server.observer.records();
    assert_eq!(records.len(), 4);
    assert_eq!(records[1].error_kind, Some("upstream_timeout"));
    assert!(
        records[3].stream,
        "refused before its stream, still a streamed request"
    );
}

#[tokio::test]
async fn unreachable_upstreams_fail_fast_and_the_gateway_stays_ready_for_the_others() {
    let up = start_upstream(script(2)).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let closed_url = format!("http://{}/v1", closed.local_addr().expect("addr"));
    drop(closed);
    let tls_to_plain = up.url.replace("http://", "https://");
    let engine = |url: &str| -> Arc<dyn Backend> {
        UpstreamEngine::start("x", upstream_config(url), monotonic()).expect("engine")
    };
    let server = gateway_of(
        vec![
            ("good", engine(&up.url)),
            ("refused", engine(&closed_url)),
            ("dns", engine("http://no-such-host.invalid:9/v1")),
            ("tls", engine(&tls_to_plain)),
        ],
        &["good", "refused", "dns", "tls"],
    )
    .await;
    for model in ["refused", "dns", "tls"] {
        let started = std::time::Instant::now();
        let response = post(
            &server,
            CHAT,
            &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(response.status(), 502, "{model}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "upstream_unreachable", "{model}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{model}: no hang"
        );
    }
    let ok = post(
        &server,
        CHAT,
        &json!({"model": "good", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(ok.status(), 200);
    let ready = reqwest::get(server.url("/ready")).await.expect("ready");
    assert_eq!(ready.status(), 200, "one model serves");
    let ready: Value = ready.json().await.expect("json");
    let status_of = |id: &str| {
        ready["models"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["id"] == id))
            .map(|m| m["status"].clone())
    };
    assert_eq!(status_of("good"), Some(json!("ready")));
    assert_eq!(status_of("refused"), Some(json!("unreachable")));
    let metrics = metrics(&server).await;
    assert!(
        metrics.contains(r#"llmgate_upstream_up{model="good"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"llmgate_upstream_up{model="refused"} 0"#));
}

#[tokio::test]
async fn an_upstream_without_logprobs_is_asked_once_then_no_more() {
    let upstream = start_upstream(script(3)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    for _ in 0..2 {
        let outcome = non_streamed(&server, "fault:no-logprobs").await;
        assert_eq!(outcome.status, 200, "{}", outcome.body);
        let body: Value = serde_json::from_str(&outcome.body).expect("json");
        assert_eq!(body["timings"]["repetition_basis"], "words");
        assert!(body["timings"]["mean_logprob"].is_null());
    }
    let asked: Vec<bool> = upstream
        .received()
        .iter()
        .map(|r| r.body.get("logprobs").is_some())
        .collect();
    assert_eq!(asked, [true, false, false]);
}

#[tokio::test]
async fn one_gateway_serves_an_in_process_model_and_an_upstream_side_by_side() {
    let upstream = start_upstream(script(2)).await;
    let local: Arc<dyn Backend> =
        Arc::new(scripted(Script::tokens(&["Hel", "lo"], Duration::ZERO)));
    let remote: Arc<dyn Backend> =
        UpstreamEngine::start("remote", upstream_config(&upstream.url), monotonic())
            .expect("engine");
    let server = gateway_of(vec![("local", local), ("remote", remote)], &["remote"]).await;
    let models: Value = reqwest::get(server.url("/v1/models"))
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["local", "remote"]);
    let ask =
        |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let local_answer: Value = post_json(&server, CHAT, &ask("local")).await;
    assert_eq!(local_answer["choices"][0]["message"]["content"], "Hello");
    let remote_answer: Value = post_json(&server, CHAT, &ask("remote")).await;
    assert_eq!(
        remote_answer["choices"][0]["message"]["content"],
        "tok0 tok1"
    );
    assert_eq!(remote_answer["model"], "remote");
    let missing = post(&server, CHAT, &ask("nope")).await;
    assert_eq!(missing.status(), 404);
    let records = server.observer.records();
    let by_model: Vec<&str> = records.iter().map(|r| r.model.as_str()).collect();
    assert_eq!(by_model, ["local", "remote", "none"]);
    let metrics = metrics(&server).await;
    assert!(metrics.contains(r#"llmgate_requests_total{model="local",status="ok""#));
    assert!(metrics.contains(r#"llmgate_requests_total{model="remote",status="ok""#));
    assert!(
        metrics.contains(r#"upstream_model="scripted""#),
        "model_info names the upstream"
    );
    assert!(metrics
        .contains(r#"llmgate_repetition_basis_total{model="remote",basis="logprob_tokens"} 1"#));
}

#[tokio::test]
async fn without_logprobs_the_models_own_tokenizer_gives_the_ids() {
    let gguf = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(llmgate::config::DEFAULT_MODEL_PATH);
    let tokenizer = llmgate::engine::upstream::tokens::load_tokenizer(&gguf).expect("tokenizer");
    // SmolLM2's own tokenizer: "Hello" and "Ġworld".
    let ids = tokenizer.encode("Hello world", false).expect("encode");
    assert_eq!(ids.get_ids(), [19556, 905]);
    let special = tokenizer.encode("<|im_start|>user", false).expect("encode");
    assert_eq!(special.get_ids()[0], 1, "control tokens are one token");

    let upstream = start_upstream(script(4)).await;
    let mut config = upstream_config(&upstream.url);
    config.logprobs = false;
    config.tokenizer = Some(gguf);
    let server = gateway(config).await;
    let answer: Value = post_json(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(answer["timings"]["repetition_basis"], "tokenizer");
    assert!(
        answer["timings"]["mean_logprob"].is_null(),
        "none asked for"
    );
    assert!(upstream.received()[0].body.get("logprobs").is_none());
    let tokenized: Value = post_json(
        &server,
        "/tokenize",
        &json!({"model": MODEL, "prompt": "Hello world", "add_special_tokens": false}),
    )
    .await;
    assert_eq!(tokenized["tokens"], json!([19556, 905]));
}

#[tokio::test]
async fn waits_that_end_in_time_and_streams_that_never_end() {
    let upstream = start_upstream(script(3)).await;
    let mut config = upstream_config(&upstream.url);
    config.first_byte_timeout = Duration::from_secs(2);
    // The queue timeout (1 s) is not the upstream's: its headers after 1.5 s are fine.
    let server = gateway_with(
        config,
        limits(MODEL),
        "[server]\nqueue_timeout_secs = 1\nrequest_timeout_secs = 3\n",
    )
    .await;
    let late = non_streamed(&server, "fault:late-headers").await;
    assert_eq!(late.status, 200, "{}", late.body);
    // Headers, then nothing: the first byte never comes.
    let silent = non_streamed(&server, "fault:silent").await;
    assert_eq!(
        (silent.status, silent.code.as_str()),
        (504, "upstream_timeout")
    );
    // Keep-alive comments forever move the idle deadline; the request's own ends it.
    let started = std::time::Instant::now();
    let pings = non_streamed(&server, "fault:pings").await;
    assert_eq!(
        (pings.status, pings.code.as_str()),
        (504, "request_timeout"),
        "{}",
        pings.body
    );
    assert!(started.elapsed() < Duration::from_secs(6));
    // A line without an end is refused before it fills memory.
    let huge = non_streamed(&server, "fault:huge-line").await;
    assert_eq!(
        (huge.status, huge.code.as_str()),
        (502, "upstream_protocol_error")
    );
}

#[tokio::test]
async fn without_usage_the_gateway_counts_and_says_so() {
    let upstream = start_upstream(script(4)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let answer: Value = post_json(&server, CHAT, &chat_body("fault:no-usage", json!({}))).await;
    assert_eq!(
        answer["usage"]["completion_tokens"], 4,
        "counted from the logprob tokens"
    );
    let record = &server.observer.records()[0];
    assert!(record.upstream.as_ref().is_some_and(|u| u.usage_estimated));
}

#[tokio::test]
async fn the_gateways_cap_ends_an_answer_the_upstream_got_no_budget_for() {
    let upstream = start_upstream(script(6)).await;
    let capped = llmgate::engine::served::ModelPolicy {
        max_tokens_cap: 3,
        ..limits(MODEL)
    };
    let server = gateway_with(upstream_config(&upstream.url), capped, "").await;
    let answer: Value = post_json(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["choices"][0]["message"]["content"], "tok0 tok1 tok2");
    assert!(
        upstream.received()[0].body.get("max_tokens").is_none(),
        "the upstream's own default applies there"
    );
}

/// vLLM refuses some requests only once the stream is open (an out-of-vocabulary
/// `stop_token_ids`, an invalid `json_schema`): a 200 stream whose first event is an error
/// object with code 400. Streamed or not, the client gets the 400 naming the parameter
/// that an HTTP refusal gives, counted as the client's mistake, not the upstream's.
#[tokio::test]
async fn a_refusal_inside_the_stream_is_the_400_an_http_refusal_is() {
    let upstream = start_upstream(script(4)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    for stream in [false, true] {
        let response = post(
            &server,
            CHAT,
            &chat_body("fault:refused-in-stream", json!({"stream": stream})),
        )
        .await;
        assert_eq!(response.status(), 400, "stream {stream}");
        let body: Value = response.json().await.expect("OpenAI error");
        assert_eq!(body["error"]["param"], "stop_token_ids", "{body}");
        assert_eq!(body["error"]["code"], "upstream_invalid_request", "{body}");
        assert!(body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("out of vocabulary")));
    }
    let records = server.observer.records();
    assert_eq!(records.len(), 2);
    assert!(records
        .iter()
        .all(|r| r.error_kind == Some("upstream_invalid_request")));
    // A streamed request refused before its stream began is still logged as streamed.
    assert_eq!(
        records.iter().map(|r| r.stream).collect::<Vec<_>>(),
        [false, true]
    );
    // The same error after content is the stream's error frame, as before.
    let text = post_text(
        &server,
        CHAT,
        &chat_body("fault:error-event", json!({"stream": true})),
    )
    .await;
    assert!(text.contains("\"error\""), "{text}");
}

/// An upstream that ignores the `max_tokens` it was sent (a hostile-upstream test found
/// 123,889 tokens streamed to a `max_tokens: 16` request): the answer ends at 16 either
/// way, `length`, and the gateway drops the upstream's connection.
#[tokio::test]
async fn an_upstream_that_ignores_max_tokens_is_cut_at_the_budget() {
    let upstream = start_upstream(UpstreamScript {
        ignore_max_tokens: true,
        interval: Duration::from_millis(1),
        ..script(2000)
    })
    .await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let answer: Value = post_json(&server, CHAT, &chat_body("hi", json!({"max_tokens": 16}))).await;
    assert_eq!(upstream.received()[0].body["max_tokens"], 16, "it was sent");
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["usage"]["completion_tokens"], 16);
    let words = answer["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .split_whitespace()
        .count();
    assert_eq!(words, 16, "{answer}");

    let text = post_text(
        &server,
        CHAT,
        &chat_body(
            "hi",
            json!({"max_tokens": 16, "stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    let chunks = chunks_before_done(&text);
    let content = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert_eq!(content, 16, "one token a chunk");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "length"));
    let abandoned = Arc::clone(&upstream.abandoned);
    assert!(
        eventually(5, || abandoned.load(std::sync::atomic::Ordering::SeqCst)
            == 2)
        .await,
        "both answers dropped the upstream's connection"
    );
}

#[tokio::test]
async fn a_client_that_leaves_closes_the_upstreams_stream() {
    let upstream = start_upstream(UpstreamScript {
        interval: Duration::from_millis(50),
        ..script(200)
    })
    .await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let response = post(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    let mut body = response.bytes_stream();
    let _ = body.next().await;
    let _ = body.next().await;
    drop(body);
    let abandoned = Arc::clone(&upstream.abandoned);
    assert!(
        eventually(5, || abandoned.load(std::sync::atomic::Ordering::SeqCst)
            == 1)
        .await,
        "the upstream saw its reader go"
    );
    let records = server.observer.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::Cancelled);
}

//! The routes beside chat, black-box over HTTP with the scripted engine: legacy
//! completions (exact frames, the same records as chat), `/tokenize` and `/detokenize`,
//! and a `response_format` an engine cannot honour.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::engine::scripted::{token_id, Script};
use llmgate::record::Status;
use serde_json::{json, Value};

fn hello() -> Script {
    Script::tokens(&["Hel", "lo", "!"], Duration::ZERO)
}

async fn post(server: &TestServer, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(server.url(path))
        .header("x-request-id", "t1")
        .json(body)
        .send()
        .await
        .expect("request")
}

const HEAD: &str = r#"data: {"id":"cmpl-t1","object":"text_completion","created":1767225600,"model":"test-model","system_fingerprint":"fp_test","choices":"#;

#[tokio::test]
async fn completions_stream_text_pieces_and_record_like_chat() {
    let server = start_frozen(Arc::new(scripted(hello())), &test_config("")).await;
    let body = json!({"model": MODEL, "prompt": "say hi", "stream": true, "stream_options": {"include_usage": true}});
    let response = post(&server, "/v1/completions", &body).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("body");
    let piece = |t: &str, finish: &str| {
        format!("{HEAD}[{{\"text\":\"{t}\",\"index\":0,\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n")
    };
    let expected_start = [
        piece("Hel", "null"),
        piece("lo", "null"),
        piece("!", "null"),
        piece("", "\"stop\""),
    ]
    .concat();
    assert!(text.starts_with(&expected_start), "{text}");
    assert!(text.contains(
        "\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,\"total_tokens\":5}"
    ));
    assert!(text.ends_with("data: [DONE]\n\n"));

    let answer: Value = post(
        &server,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ["say hi"]}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(answer["object"], "text_completion");
    assert_eq!(answer["choices"][0]["text"], "Hello!");
    assert_eq!(answer["usage"]["prompt_tokens"], 2);
    assert!(answer["timings"]["e2e_ms"].is_number());

    let records = server.observer.records();
    assert_eq!(records.len(), 2);
    for record in &records {
        assert_eq!(record.status, Status::Ok);
        assert_eq!(record.operation, "text_completion");
        assert_eq!(record.prompt.as_deref(), Some("say hi"));
    }
    let refused = post(
        &server,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "echo": true}),
    )
    .await;
    assert_eq!(refused.status(), 400);
    assert_eq!(
        server.observer.records().len(),
        3,
        "a refusal leaves its record too"
    );
    server.stop().await;
}

#[tokio::test]
async fn tokenize_counts_as_the_engine_does_and_detokenize_needs_a_vocabulary() {
    let server = start(Arc::new(scripted(hello())), &test_config("")).await;
    let counted: Value = post(
        &server,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "say hi now"}]}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(counted["count"], 3);
    assert_eq!(counted["max_model_len"], 64);
    assert_eq!(
        counted["tokens"],
        json!([token_id("say"), token_id("hi"), token_id("now")])
    );
    assert_eq!(counted["token_strs"], Value::Null);
    let chat: Value = post(
        &server,
        "/v1/chat/completions",
        &chat_body("say hi now", json!({})),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(chat["usage"]["prompt_tokens"], counted["count"]);

    let cases = [
        (
            "/tokenize",
            json!({"prompt": "x", "return_token_strs": true}),
            400,
            "return_token_strs",
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "model": "other"}),
            404,
            "model",
        ),
        ("/detokenize", json!({"tokens": [1, 2]}), 400, "tokens"),
        ("/detokenize", json!({"tokens": ["a"]}), 400, "tokens[0]"),
    ];
    for (path, body, status, param) in cases {
        let response = post(&server, path, &body).await;
        assert_eq!(response.status(), status, "{path} {body}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["param"], param, "{error}");
    }
    server.stop().await;
}

#[tokio::test]
async fn an_engine_without_a_grammar_refuses_response_format() {
    let server = start(Arc::new(scripted(hello())), &test_config("")).await;
    let body = chat_body("hi", json!({"response_format": {"type": "json_object"}}));
    let response = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["code"], "unsupported_parameter");
    assert_eq!(error["error"]["param"], "response_format");
    server.stop().await;
}

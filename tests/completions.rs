//! The routes beside chat and what both generation routes share, black-box over HTTP
//! with the scripted engine: legacy completions (exact frames, the same records as chat),
//! `/tokenize` and `/detokenize`, a `response_format` an engine cannot honour, `logprobs`
//! in OpenAI's two shapes, stop sequences cut by the gateway, and 405s for wrong methods.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::engine::scripted::{token_id, Script};
use llmgate::record::Status;
use serde_json::{json, Value};

const HEAD: &str = r#"data: {"id":"cmpl-t1","object":"text_completion","created":1767225600,"model":"test-model","system_fingerprint":"fp_test","choices":"#;

#[tokio::test]
async fn completions_stream_text_pieces_and_record_like_chat() {
    let server = TestServer::builder(hello_engine()).frozen().start().await;
    let body = json!({"model": MODEL, "prompt": "say hi", "stream": true, "stream_options": {"include_usage": true}});
    let response = post(&server, COMPLETIONS, &body).await;
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

    let answer: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": ["say hi"]}),
    )
    .await;
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
        assert_eq!(
            record.response_id.as_deref(),
            Some("cmpl-t1"),
            "as the answer's id"
        );
        assert_eq!(
            record.params.max_tokens,
            Some(62),
            "no max_tokens: what the 64-token context leaves after 2 prompt tokens"
        );
    }
    let refused = post(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "x", "echo": true, "logprobs": 1}),
    )
    .await;
    assert_eq!(refused.status(), 400);
    assert_eq!(
        server.observer.records().len(),
        3,
        "a refusal leaves its record too"
    );
}

#[tokio::test]
async fn tokenize_counts_as_the_engine_does_and_detokenize_needs_a_vocabulary() {
    let server = TestServer::builder(hello_engine()).start().await;
    let counted: Value = post_json(
        &server,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "say hi now"}]}),
    )
    .await;
    assert_eq!(counted["count"], 3);
    assert_eq!(counted["max_model_len"], 64);
    assert_eq!(
        counted["tokens"],
        json!([token_id("say"), token_id("hi"), token_id("now")])
    );
    assert_eq!(counted["token_strs"], Value::Null);
    let chat: Value = post_json(&server, CHAT, &chat_body("say hi now", json!({}))).await;
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
}

#[tokio::test]
async fn an_engine_without_a_grammar_refuses_response_format() {
    let server = TestServer::builder(hello_engine()).start().await;
    let body = chat_body("hi", json!({"response_format": {"type": "json_object"}}));
    let response = post(&server, CHAT, &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["code"], "unsupported_parameter");
    assert_eq!(error["error"]["param"], "response_format");
}

#[tokio::test]
async fn logprobs_come_in_openais_shape_streamed_and_not() {
    let server = TestServer::builder(hello_engine()).start().await;
    let ask = json!({"logprobs": true, "top_logprobs": 2});
    let answer: Value = post_json(&server, CHAT, &chat_body("hi", ask.clone())).await;
    let content = &answer["choices"][0]["logprobs"]["content"];
    assert_eq!(content.as_array().map(Vec::len), Some(3), "{answer}");
    assert_eq!(content[0]["token"], "Hel");
    assert_eq!(content[0]["bytes"], json!([72, 101, 108]));
    assert!((content[0]["logprob"].as_f64().expect("lp") + 0.3).abs() < 1e-6);
    assert_eq!(content[0]["top_logprobs"].as_array().map(Vec::len), Some(2));
    assert_eq!(content[0]["top_logprobs"][1]["token"], "alt1");
    assert_eq!(answer["choices"][0]["logprobs"]["refusal"], Value::Null);
    assert_eq!(answer["timings"]["mean_logprob"], -0.2);
    assert_eq!(answer["timings"]["min_logprob"], -0.3);

    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let text = post_text(&server, CHAT, &chat_body("hi", streamed)).await;
    let chunks = chunks_of(&text);
    let tokens: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .map(|t| t["token"].as_str().expect("token"))
        .collect();
    assert_eq!(tokens, ["Hel", "lo", "!"]);
    assert_eq!(
        chunks[0]["choices"][0]["logprobs"],
        Value::Null,
        "the role chunk has none"
    );

    let plain: Value = post_json(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(
        plain["choices"][0]["logprobs"],
        Value::Null,
        "not asked, not sent"
    );
    assert_eq!(
        plain["timings"]["mean_logprob"], -0.2,
        "confidence is always measured"
    );
}

#[tokio::test]
async fn legacy_completions_echo_and_give_logprobs_in_their_own_shape() {
    let server = TestServer::builder(hello_engine()).start().await;
    let answer: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "say hi", "logprobs": 2}),
    )
    .await;
    let logprobs = &answer["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["Hel", "lo", "!"]), "{answer}");
    assert_eq!(logprobs["text_offset"], json!([0, 3, 5]));
    let first = logprobs["token_logprobs"][0].as_f64().expect("a number");
    assert!((first + 0.3).abs() < 1e-6);
    let top = logprobs["top_logprobs"][0].as_object().expect("a map");
    assert_eq!(top.len(), 2, "{top:?}");
    assert!(top.contains_key("Hel") && top.contains_key("alt1"));

    let streamed = post_text(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "say hi", "logprobs": 0, "stream": true}),
    )
    .await;
    let chunks = chunks_of(&streamed);
    let offsets: Vec<u64> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["text_offset"].as_array())
        .flatten()
        .map(|o| o.as_u64().expect("offset"))
        .collect();
    assert_eq!(offsets, [0, 3, 5], "offsets run on across chunks");
    assert_eq!(
        chunks[1]["choices"][0]["logprobs"]["top_logprobs"],
        json!([{"lo": -0.2}]),
        "0 alternatives: the picked token only"
    );

    let echoed: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "say hi", "echo": true}),
    )
    .await;
    assert_eq!(echoed["choices"][0]["text"], "say hiHello!");
    assert_eq!(
        echoed["usage"]["completion_tokens"], 3,
        "the echo is not generated"
    );
    let echoed_stream = post_text(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "say hi", "echo": true, "stream": true}),
    )
    .await;
    let texts: Vec<Value> = chunks_of(&echoed_stream)
        .iter()
        .map(|c| c["choices"][0]["text"].clone())
        .collect();
    assert_eq!(
        texts[..4],
        [json!("say hi"), json!("Hel"), json!("lo"), json!("!")]
    );
    let records = server.observer.records();
    let last = records.last().expect("a record");
    assert_eq!(
        last.response.as_deref(),
        Some("Hello!"),
        "the record keeps the answer, not the echo"
    );
}

#[tokio::test]
async fn stop_sequences_end_the_answer_where_they_begin_and_stop_the_engine() {
    let slow = Script::tokens(
        &["Hel", "lo", "!", " More", " text"],
        Duration::from_millis(20),
    );
    let engine = Arc::new(scripted(slow));
    let server = TestServer::builder(engine.clone()).start().await;
    let cut: Value = post_json(
        &server,
        CHAT,
        &chat_body("hi", json!({"stop": ["lo!", "never"]})),
    )
    .await;
    assert_eq!(cut["choices"][0]["message"]["content"], "Hel", "{cut}");
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        cut["usage"]["completion_tokens"], 3,
        "the stop's tokens were generated"
    );
    assert!(
        eventually(5, || engine.generations_cancelled() == 1).await,
        "the engine stops at the stop sequence"
    );

    let streamed = post_text(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "hi", "stop": [" M"], "stream": true}),
    )
    .await;
    let chunks = chunks_of(&streamed);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "Hello!");
    assert_eq!(
        chunks.last().expect("chunks")["choices"][0]["finish_reason"],
        "stop"
    );
    assert!(!streamed.contains(" M"), "the stop sequence is never sent");

    let whole: Value = post_json(&server, CHAT, &chat_body("hi", json!({"stop": ["text!"]}))).await;
    assert_eq!(
        whole["choices"][0]["message"]["content"], "Hello! More text",
        "text held back for a stop that never came is the answer's"
    );
    let records = server.observer.records();
    assert_eq!(records[0].response.as_deref(), Some("Hel"));
    assert_eq!(records[2].response.as_deref(), Some("Hello! More text"));

    // The tokens that spelled the stop are not the answer's: no log-probabilities.
    let scored: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "hi", "stop": ["lo!"], "logprobs": 1}),
    )
    .await;
    assert_eq!(scored["choices"][0]["text"], "Hel");
    assert_eq!(scored["choices"][0]["logprobs"]["tokens"], json!(["Hel"]));
    let streamed = post_text(
        &server,
        CHAT,
        &chat_body(
            "hi",
            json!({"stop": ["lo!"], "logprobs": true, "stream": true}),
        ),
    )
    .await;
    let tokens: Vec<Value> = chunks_of(&streamed)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .map(|t| t["token"].clone())
        .collect();
    assert_eq!(tokens, [json!("Hel")], "{streamed}");
}

#[tokio::test]
async fn a_route_asked_with_the_wrong_method_is_405_naming_the_right_one() {
    let server = TestServer::builder(hello_engine()).start().await;
    let client = reqwest::Client::new();
    let got = client
        .get(server.url("/v1/chat/completions"))
        .send()
        .await
        .expect("request");
    assert_eq!(got.status(), 405);
    assert_eq!(got.headers()["allow"], "POST");
    let body: Value = got.json().await.expect("json");
    assert_eq!(body["error"]["code"], "method_not_allowed");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let posted = client
        .post(server.url("/v1/models"))
        .send()
        .await
        .expect("request");
    assert_eq!(posted.status(), 405);
    assert_eq!(posted.headers()["allow"], "GET, HEAD");
    let head = client
        .head(server.url("/health"))
        .send()
        .await
        .expect("request");
    assert_eq!(head.status(), 200);
    let missing = client
        .get(server.url("/v2/x"))
        .send()
        .await
        .expect("request");
    assert_eq!(missing.status(), 404);
}

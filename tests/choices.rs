//! OpenAI's `n` > 1 and batches of prompts over HTTP with the scripted engine: one response with every choice in
//! `index` order and the usage summed, streamed and not; each choice a request of its own
//! in the records (its id the client's with `-1`, `-2`..., its seed `seed + i`); a choice
//! the gateway cannot take fails the whole request.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::engine::scripted::Script;
use llmgate::record::Status;
use serde_json::{json, Value};

#[tokio::test]
async fn a_whole_answer_has_every_choice_and_the_usage_summed() {
    let server = TestServer::builder(hello_engine()).start().await;
    let body = post_json(&server, CHAT, &chat_body("hi", json!({"n": 3, "seed": 10}))).await;
    assert_eq!(body["id"], "chatcmpl-t1", "{body}");
    let choices = body["choices"].as_array().expect("choices");
    let indexed: Vec<(u64, &str, &str)> = choices
        .iter()
        .map(|c| {
            (
                c["index"].as_u64().expect("index"),
                c["message"]["content"].as_str().expect("content"),
                c["finish_reason"].as_str().expect("reason"),
            )
        })
        .collect();
    assert_eq!(
        indexed,
        vec![
            (0, "Hello!", "stop"),
            (1, "Hello!", "stop"),
            (2, "Hello!", "stop")
        ]
    );
    let prompt = body["usage"]["prompt_tokens"].as_u64().expect("prompt");
    assert_eq!(
        body["usage"]["completion_tokens"], 9,
        "three choices of three"
    );
    assert_eq!(body["usage"]["total_tokens"], prompt + 9, "the prompt once");
    assert!(
        body["timings"]["ttft_ms"].is_number(),
        "the first choice's timings"
    );

    let mut records: Vec<(String, Option<u64>, Status)> = server
        .observer
        .records()
        .iter()
        .map(|r| (r.request_id.clone(), r.seed, r.status))
        .collect();
    records.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        records,
        vec![
            ("t1".to_owned(), Some(10), Status::Ok),
            ("t1-1".to_owned(), Some(11), Status::Ok),
            ("t1-2".to_owned(), Some(12), Status::Ok),
        ],
        "each choice is recorded as a request of its own, seeded seed + i"
    );
}

#[tokio::test]
async fn a_stream_interleaves_the_choices_and_ends_once() {
    let server = TestServer::builder(Arc::new(scripted(Script::tokens(
        &["a", "b", "c"],
        Duration::from_millis(5),
    ))))
    .start()
    .await;
    let text = post_text(
        &server,
        CHAT,
        &chat_body(
            "hi",
            json!({"n": 2, "stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(text.matches("[DONE]").count(), 1, "{text}");
    let chunks = chunks_of(&text);
    assert!(chunks.iter().all(|c| c["id"] == "chatcmpl-t1"), "{text}");
    let created: Vec<&Value> = chunks.iter().map(|c| &c["created"]).collect();
    assert!(
        created.windows(2).all(|w| w[0] == w[1]),
        "one created: {text}"
    );
    for index in 0..2 {
        let of_choice: Vec<&Value> = chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().into_iter().flatten())
            .filter(|c| c["index"] == index)
            .collect();
        assert_eq!(of_choice[0]["delta"]["role"], "assistant", "{text}");
        let content: String = of_choice
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "abc", "choice {index}: {text}");
        assert_eq!(of_choice.last().expect("a finish")["finish_reason"], "stop");
    }
    let usage: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"].as_array().is_some_and(Vec::is_empty))
        .collect();
    assert_eq!(usage.len(), 1, "one usage chunk: {text}");
    assert_eq!(usage[0]["usage"]["completion_tokens"], 6);
    assert!(
        std::ptr::eq(usage[0], chunks.last().expect("last")),
        "the usage chunk is last: {text}"
    );
}

#[tokio::test]
async fn more_choices_than_the_gateway_takes_at_once_are_refused() {
    let server = TestServer::builder(hello_engine())
        .config(&test_config("[server]\nmax_in_flight = 2\n"))
        .start()
        .await;
    let response = post(&server, CHAT, &chat_body("hi", json!({"n": 3}))).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["param"], "n", "{body}");
}

/// A gateway taking three requests at once, one place held by an endless stream.
async fn two_places_left() -> (TestServer, reqwest::Response) {
    let endless = Script::tokens(&vec!["x"; 3_000], Duration::from_millis(20));
    let engine = Arc::new(
        scripted(endless).with_script("hi", Script::tokens(&["a", "b"], Duration::from_millis(5))),
    );
    let server = TestServer::builder(engine)
        .config(&test_config("[server]\nmax_in_flight = 3\n"))
        .start()
        .await;
    let busy = post(&server, CHAT, &chat_body("busy", json!({"stream": true}))).await;
    assert_eq!(busy.status(), 200);
    (server, busy)
}

#[tokio::test]
async fn a_choice_the_gateway_cannot_take_fails_a_whole_answer() {
    let (server, _busy) = two_places_left().await;
    let response = post(&server, CHAT, &chat_body("hi", json!({"n": 3}))).await;
    assert_eq!(response.status(), 429);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "server_overloaded", "{body}");
    assert!(
        eventually(5, || server
            .observer
            .records()
            .iter()
            .any(|r| r.request_id == "t1-2" && r.status == Status::Error))
        .await,
        "the refused choice is recorded"
    );
}

#[tokio::test]
async fn a_streamed_choice_that_cannot_start_ends_in_an_error_frame() {
    let (server, _busy) = two_places_left().await;
    let text = post_text(
        &server,
        CHAT,
        &chat_body("hi", json!({"n": 3, "stream": true})),
    )
    .await;
    let chunks = chunks_of(&text);
    assert!(
        chunks
            .iter()
            .any(|c| c["error"]["code"] == "server_overloaded"),
        "{text}"
    );
    let content = |index: u64| -> String {
        chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().into_iter().flatten())
            .filter(|c| c["index"] == index)
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect()
    };
    // The first choice starts before the stream; of the two others, one takes the last
    // place and the other is the error frame.
    assert_eq!(content(0), "ab", "{text}");
    let mut others = [content(1), content(2)];
    others.sort();
    assert_eq!(others, [String::new(), "ab".to_owned()], "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[tokio::test]
async fn a_native_batch_stream_names_the_answer_that_could_not_start() {
    let (server, _busy) = two_places_left().await;
    let text = post_text(
        &server,
        "/completion",
        &json!({"prompt": ["hi", "hi", "hi"], "stream": true}),
    )
    .await;
    let frames = chunks_of(&text);
    let failed: Vec<&Value> = frames.iter().filter(|f| f.get("error").is_some()).collect();
    assert_eq!(failed.len(), 1, "{text}");
    let index = failed[0]["index"]
        .as_u64()
        .expect("the failed answer's index");
    assert!(index == 1 || index == 2, "{text}");
    let content: String = frames
        .iter()
        .filter(|f| f["index"] == 3 - index)
        .filter_map(|f| f["content"].as_str())
        .collect();
    assert_eq!(content, "ab", "the other answer: {text}");
    assert!(!text.contains("[DONE]"), "{text}");
}

/// The scripted engine answering "one" with "A", "B" and "two" with "C".
fn by_prompt() -> Arc<llmgate::engine::scripted::ScriptedEngine> {
    Arc::new(
        scripted(hello())
            .with_script("one", Script::tokens(&["A", "B"], Duration::ZERO))
            .with_script("two", Script::tokens(&["C"], Duration::ZERO)),
    )
}

#[tokio::test]
async fn a_batch_of_prompts_has_each_prompts_choices_in_order() {
    let server = TestServer::builder(by_prompt()).start().await;
    let body = |prompt: Value| json!({"model": MODEL, "prompt": prompt, "n": 2, "seed": 5});
    let batch = post_json(&server, COMPLETIONS, &body(json!(["one", "two"]))).await;
    let texts = indexed_texts(&batch);
    assert_eq!(
        texts,
        [(0, "AB"), (1, "AB"), (2, "C"), (3, "C")],
        "prompt i's choice c at index i × n + c"
    );
    let mut records: Vec<(String, Option<u64>)> = server
        .observer
        .records()
        .iter()
        .map(|r| (r.request_id.clone(), r.seed))
        .collect();
    records.sort();
    assert_eq!(
        records,
        [
            ("t1".to_owned(), Some(5)),
            ("t1-1".to_owned(), Some(6)),
            ("t1-2".to_owned(), Some(5)),
            ("t1-3".to_owned(), Some(6)),
        ],
        "each part a request of its own; each prompt's choices seeded seed + c"
    );
    let one = post_json(&server, COMPLETIONS, &body(json!("one"))).await;
    let two = post_json(&server, COMPLETIONS, &body(json!("two"))).await;
    let prompt = |answer: &Value| answer["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert_eq!(
        batch["usage"]["prompt_tokens"],
        prompt(&one) + prompt(&two),
        "each prompt once: {batch}"
    );
    assert_eq!(batch["usage"]["completion_tokens"], 6, "{batch}");
    // Streamed, one usage chunk with the same sums.
    let mut streamed = body(json!(["one", "two"]));
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let text = post_text(&server, COMPLETIONS, &streamed).await;
    let chunks = chunks_of(&text);
    let usage: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c.get("usage"))
        .filter(|u| !u.is_null())
        .collect();
    assert_eq!(usage.len(), 1, "{text}");
    assert_eq!(
        usage[0]["prompt_tokens"], batch["usage"]["prompt_tokens"],
        "{text}"
    );
    assert_eq!(usage[0]["completion_tokens"], 6, "{text}");
    let mut by_index: Vec<(u64, String)> = Vec::new();
    for choice in chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().into_iter().flatten())
    {
        let index = choice["index"].as_u64().expect("index");
        match by_index.iter_mut().find(|(i, _)| *i == index) {
            Some((_, text)) => text.push_str(choice["text"].as_str().unwrap_or("")),
            None => by_index.push((index, choice["text"].as_str().unwrap_or("").to_owned())),
        }
    }
    by_index.sort();
    let texts: Vec<(u64, &str)> = by_index.iter().map(|(i, t)| (*i, t.as_str())).collect();
    assert_eq!(texts, [(0, "AB"), (1, "AB"), (2, "C"), (3, "C")], "{text}");
}

#[tokio::test]
async fn a_batch_on_llamacpps_route_is_a_list_of_answers() {
    let server = TestServer::builder(by_prompt()).start().await;
    let listed = post_json(&server, "/completion", &json!({"prompt": ["one", "two"]})).await;
    let answers: Vec<(u64, &str, &str)> = listed
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|a| {
            (
                a["index"].as_u64().expect("index"),
                a["content"].as_str().expect("content"),
                a["prompt"].as_str().expect("prompt"),
            )
        })
        .collect();
    assert_eq!(answers, [(0, "AB", "one"), (1, "C", "two")], "{listed}");

    let text = post_text(
        &server,
        "/completion",
        &json!({"prompt": ["one", "two"], "stream": true}),
    )
    .await;
    assert!(
        !text.contains("[DONE]"),
        "llama.cpp's stream has none: {text}"
    );
    let frames = chunks_of(&text);
    for (index, expected) in [(0, "AB"), (1, "C")] {
        let of: Vec<&Value> = frames.iter().filter(|f| f["index"] == index).collect();
        let content: String = of.iter().filter_map(|f| f["content"].as_str()).collect();
        assert_eq!(content, expected, "answer {index}: {text}");
        assert_eq!(of.last().expect("frames")["stop"], true, "{text}");
    }
}

#[tokio::test]
async fn a_batch_larger_than_the_gateway_takes_at_once_is_refused() {
    let server = TestServer::builder(hello_engine())
        .config(&test_config("[server]\nmax_in_flight = 2\n"))
        .start()
        .await;
    let body = json!({"model": MODEL, "prompt": ["a", "b", "c"]});
    let response = post(&server, COMPLETIONS, &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["param"], "prompt", "{error}");
}

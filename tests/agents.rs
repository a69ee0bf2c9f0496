//! Agents and reasoning models through an upstream (issue 62): tools, tool messages,
//! tool calls in the history and image parts reach the upstream as sent; tool calls and
//! reasoning come back framed as OpenAI frames them, streamed and whole; and each kind
//! of output is timed (docs/timings.md, "Reasoning and tool calls").

mod common;

use std::time::Duration;

use common::upstream::*;
use common::*;
use llmgate::bench::upstream::UpstreamScript;
use serde_json::{json, Value};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time",
          "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
    ])
}

fn agent_script(reasoning: u32) -> UpstreamScript {
    UpstreamScript {
        model: UPSTREAM_MODEL.into(),
        tokens: 4,
        interval: Duration::from_millis(2),
        reasoning,
        ..UpstreamScript::default()
    }
}

/// The message a streamed answer adds up to, as the OpenAI SDK's accumulator builds it:
/// content and reasoning joined, each tool call's id and name from its first piece and
/// its arguments from every piece, by index.
fn accumulated(chunks: &[Value]) -> (Value, Option<String>) {
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = None;
    for chunk in chunks {
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        for piece in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = piece["index"].as_u64().expect("index") as usize;
            if calls.len() <= i {
                assert!(
                    piece["id"].is_string(),
                    "a call's first piece has its id: {piece}"
                );
                assert_eq!(piece["type"], "function");
                assert!(piece["function"]["name"].is_string());
                calls.push(json!({"id": piece["id"], "type": "function",
                    "function": {"name": piece["function"]["name"], "arguments": ""}}));
            }
            let arguments = piece["function"]["arguments"].as_str().unwrap_or("");
            let so_far = calls[i]["function"]["arguments"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            calls[i]["function"]["arguments"] = json!(so_far + arguments);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_owned());
        }
    }
    let mut message = json!({"role": "assistant", "content": (!content.is_empty()).then_some(content), "refusal": null});
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    (message, finish)
}

/// A tool call's message without its id (each answer's calls get new ids).
fn without_ids(mut message: Value) -> Value {
    for call in message["tool_calls"].as_array_mut().into_iter().flatten() {
        call["id"] = Value::Null;
    }
    message
}

#[tokio::test]
async fn tools_history_and_images_reach_the_upstream_as_sent() {
    let upstream = start_upstream(agent_script(0)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let messages = json!([
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture, and the weather in Paris?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
        ]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": "18 C, clear"}
    ]);
    let body = json!({"model": MODEL, "messages": messages, "tools": tools(),
        "tool_choice": "required", "parallel_tool_calls": false, "reasoning_effort": "low",
        "reasoning_format": "deepseek", "chat_template_kwargs": {"enable_thinking": true}});
    let answer = post_json(&server, "/v1/chat/completions", &body).await;
    let sent = &upstream.received()[0].body;
    assert_eq!(
        sent["messages"], messages,
        "the conversation as the client sent it"
    );
    assert_eq!(sent["tools"], tools());
    assert_eq!(sent["tool_choice"], "required");
    assert_eq!(sent["parallel_tool_calls"], false);
    assert_eq!(sent["reasoning_effort"], "low");
    // llama-server's and vLLM's own, for the upstream's template and its split.
    assert_eq!(sent["reasoning_format"], "deepseek");
    assert_eq!(
        sent["chat_template_kwargs"],
        json!({"enable_thinking": true})
    );
    assert_eq!(sent["model"], UPSTREAM_MODEL);
    // get_weather was called in the history: the scripted model calls get_time now.
    let message = &answer["choices"][0]["message"];
    assert_eq!(
        answer["choices"][0]["finish_reason"], "tool_calls",
        "{answer}"
    );
    assert!(message["content"].is_null(), "tool calls alone: {message}");
    let calls = message["tool_calls"].as_array().expect("tool calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_time");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().expect("string"))
            .expect("JSON arguments");
    assert_eq!(arguments, json!({"zone": "UTC"}));
    let timings = &answer["timings"];
    assert!(timings["tool_call_ttft_ms"].as_f64().is_some(), "{timings}");
    assert!(
        timings["tool_calls_done_ms"].as_f64() >= timings["tool_call_ttft_ms"].as_f64(),
        "{timings}"
    );
    assert!(
        timings.get("answer_ttft_ms").is_none(),
        "no content: {timings}"
    );
    let by_kind = &timings["output_tokens_by_kind"];
    assert_eq!(
        by_kind["tool_calls"].as_u64().unwrap_or(0) + by_kind["answer"].as_u64().unwrap_or(0),
        answer["usage"]["completion_tokens"]
            .as_u64()
            .expect("usage"),
        "{timings}"
    );
}

#[tokio::test]
async fn a_streamed_tool_call_adds_up_to_the_whole_answer() {
    let upstream = start_upstream(UpstreamScript {
        parallel_calls: true,
        ..agent_script(0)
    })
    .await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let ask = |stream: bool| {
        json!({"model": MODEL, "stream": stream, "tools": tools(),
               "messages": [{"role": "user", "content": "Weather in Paris, and the time?"}]})
    };
    let whole = post_json(&server, "/v1/chat/completions", &ask(false)).await;
    let streamed = chunks_of(&post_text(&server, "/v1/chat/completions", &ask(true)).await);
    let (message, finish) = accumulated(&streamed);
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert_eq!(
        streamed[0]["choices"][0]["delta"],
        json!({"role": "assistant"}),
        "with tools, the role alone: an SDK's accumulator keeps content null as the whole answer has it"
    );
    let calls = message["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2, "both tools at once: {message}");
    assert_eq!(
        without_ids(message.clone()),
        without_ids(whole["choices"][0]["message"].clone()),
        "the stream adds up to the whole answer"
    );
    // OpenAI's framing: a call's first piece carries id, type and name with empty
    // arguments; the fragments after carry only the index and arguments.
    let pieces: Vec<&Value> = streamed
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(pieces[0]["function"]["arguments"], "");
    assert!(pieces[1..]
        .iter()
        .any(|p| p.get("id").is_none() && p["function"].get("name").is_none()));
}

#[tokio::test]
async fn reasoning_is_passed_on_counted_and_timed_apart_from_the_answer() {
    let upstream = start_upstream(UpstreamScript {
        interval: Duration::from_millis(20),
        ..agent_script(5)
    })
    .await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let body = json!({"model": MODEL, "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "Think first."}]});
    let chunks = chunks_of(&post_text(&server, "/v1/chat/completions", &body).await);
    let (message, finish) = accumulated(&chunks);
    assert_eq!(finish.as_deref(), Some("stop"));
    assert_eq!(
        message["reasoning_content"],
        "think0 think1 think2 think3 think4"
    );
    assert_eq!(message["content"], "tok0 tok1 tok2 tok3");
    let last = chunks.last().expect("usage chunk");
    assert_eq!(
        last["usage"]["completion_tokens_details"]["reasoning_tokens"],
        5
    );
    assert_eq!(last["usage"]["completion_tokens"], 9);
    let t = &last["timings"];
    let (ttft, answer_ttft) = (
        t["ttft_ms"].as_f64().expect("ttft"),
        t["answer_ttft_ms"].as_f64().expect("answer"),
    );
    // Five reasoning chunks 20 ms apart come before the answer.
    assert!(answer_ttft - ttft >= 70.0, "{t}");
    let reasoning = t["reasoning_ms"].as_f64().expect("reasoning_ms");
    assert!((80.0..answer_ttft).contains(&reasoning), "{t}");
    assert_eq!(t["reasoning_tokens"], 5);
    assert_eq!(
        t["output_tokens_by_kind"],
        json!({"reasoning": 5, "answer": 4, "tool_calls": 0})
    );
    assert!(
        t["tpot_ms_by_kind"]["reasoning"].as_f64().expect("tpot") >= 15.0,
        "{t}"
    );
}

#[tokio::test]
async fn legacy_functions_go_up_as_tools_and_come_back_as_a_function_call() {
    let upstream = start_upstream(agent_script(0)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let functions = json!([{"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    let body = json!({"model": MODEL, "functions": functions,
        "messages": [{"role": "user", "content": "Weather?"}]});
    let answer = post_json(&server, "/v1/chat/completions", &body).await;
    let sent = &upstream.received()[0].body;
    assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
    assert!(sent.get("functions").is_none());
    assert_eq!(
        answer["choices"][0]["finish_reason"], "function_call",
        "{answer}"
    );
    let call = &answer["choices"][0]["message"]["function_call"];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], "{\"city\":\"Paris\"}");
}

#[tokio::test]
async fn a_request_without_model_gets_the_one_served_model() {
    let upstream = start_upstream(agent_script(0)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let answer = post_json(&server, "/v1/chat/completions", &body).await;
    assert_eq!(answer["model"], MODEL, "{answer}");
}

#[tokio::test]
async fn tool_mistakes_are_refused_naming_the_parameter() {
    let upstream = start_upstream(agent_script(0)).await;
    let server = gateway(upstream_config(&upstream.url)).await;
    let cases = [
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "has space"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "18 C"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0].image_url",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "video", "video": {}}]}]}),
            "messages[0].content[0].type",
        ),
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let response = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.expect("error");
        assert_eq!(error["error"]["param"], param, "{error}");
    }
    assert!(
        upstream.received().is_empty(),
        "nothing reached the upstream"
    );
}

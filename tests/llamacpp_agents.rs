//! Agents and reasoning models on the default model in this process (llama.cpp): tool
//! calls in the generic format held by a grammar, what the engine cannot serve refused
//! by name, and `<think>` sections split out as llama-server's `reasoning_format` does.

mod common;

use common::*;
use llmgate::engine::llamacpp::{LlamaCppEngine, LlamaCppSettings};
use llmgate::engine::Front;
use serde_json::{json, Value};

/// The default model in llama.cpp.
fn engine() -> Front {
    LlamaCppEngine::load_now(LlamaCppSettings {
        sequences: 2,
        context_length: Some(2048),
        ..LlamaCppSettings::new(model_path(), MODEL)
    })
    .expect("llama.cpp loads the default model")
    .into()
}

async fn ask(server: &TestServer, body: &Value) -> Value {
    let response = post(server, CHAT, body).await;
    let status = response.status();
    let answer: Value = response.json().await.expect("json");
    assert_eq!(status, 200, "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_names_and_an_effort_the_template_ignores_are_refused_by_name() {
    let server = TestServer::builder(engine()).start().await;
    let user = json!({"role": "user", "content": "hi"});
    let cases = [
        (
            json!({"messages": [user], "reasoning_effort": "low"}),
            "reasoning_effort",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}),
            "messages[0].content[1].image_url",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi", "name": "ann"}]}),
            "messages[0].name",
        ),
        (
            json!({"messages": [user], "tools": weather_tools(), "logprobs": true}),
            "logprobs",
        ),
    ];
    for (mut body, param) in cases {
        body["model"] = json!(MODEL);
        let response = post(&server, CHAT, &body).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["param"], param, "{error}");
        assert_eq!(error["error"]["code"], "unsupported_parameter", "{error}");
    }
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                        "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
         "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                        "required": ["zone"]}}}
    ])
}

/// The default model knows no tools: the generic format and its grammar give a valid
/// call all the same, streamed as OpenAI frames it, the same message whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_calls_a_tool_when_required_streamed_and_whole() {
    let server = TestServer::builder(engine()).start().await;
    let body = json!({"model": MODEL, "tools": weather_tools(), "tool_choice": "required",
        "seed": 3, "temperature": 0, "max_tokens": 64,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}]});
    let whole = ask(&server, &body).await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    let call = &choice["message"]["tool_calls"][0];
    assert!(choice["message"]["content"].is_null(), "{whole}");
    let name = call["function"]["name"].as_str().expect("name");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments"))
            .expect("the arguments are JSON");
    match name {
        "get_weather" => assert!(
            arguments["city"].is_string() && arguments.as_object().map(|o| o.len()) == Some(1),
            "the tool's keys only: {arguments}"
        ),
        "get_time" => assert!(
            ["UTC", "CET"].contains(&arguments["zone"].as_str().unwrap_or("")),
            "{arguments}"
        ),
        other => panic!("{other} is not a tool offered"),
    }
    assert!(call["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    let t = &whole["timings"];
    assert!(
        t["tool_calls_done_ms"].as_f64() >= t["tool_call_ttft_ms"].as_f64(),
        "{t}"
    );
    assert_eq!(
        t["output_tokens_by_kind"]["tool_calls"], whole["usage"]["completion_tokens"],
        "every token was the call's: {t}"
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = chunks_of(&post_text(&server, CHAT, &streamed).await);
    let mut arguments_text = String::new();
    let mut names = Vec::new();
    for chunk in &chunks {
        for piece in chunk["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(n) = piece["function"]["name"].as_str() {
                names.push(n.to_owned());
            }
            arguments_text.push_str(piece["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        names,
        vec![name.to_owned()],
        "one call, named in its first piece"
    );
    assert_eq!(
        arguments_text, call["function"]["arguments"],
        "the same seeded call"
    );
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));

    // A named tool is the one called; the history's call and result are read.
    let named = json!({"model": MODEL, "tools": weather_tools(), "seed": 1, "max_tokens": 64,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "messages": [
            {"role": "user", "content": "Weather in Paris, then the time?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "18 C"}]});
    let answer = ask(&server, &named).await;
    assert_eq!(
        answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time",
        "{answer}"
    );
}

/// The thinking the default model writes when a grammar makes it: `<think>…</think>`
/// first, then the answer.
const THINK_FIRST: &str = r#"root ::= "<think>" [a-z ]{8,40} "</think>" [A-Za-z .]{4,30}"#;

fn thinking_body(format: Option<&str>) -> Value {
    let mut body = json!({"model": MODEL, "grammar": THINK_FIRST, "seed": 5,
        "temperature": 0, "max_tokens": 80,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    if let Some(format) = format {
        body["reasoning_format"] = json!(format);
    }
    body
}

/// `reasoning_format: "deepseek"` splits the section out, streamed and whole, and the
/// reasoning is timed and counted; `none` and (for a template that writes no `<think>`)
/// the default leave the text as the model wrote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn think_sections_are_split_out_as_reasoning_by_format() {
    let server = TestServer::builder(engine()).start().await;
    let whole = ask(&server, &thinking_body(Some("deepseek"))).await;
    let message = &whole["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().expect("reasoning");
    let content = message["content"].as_str().expect("content");
    assert!(
        !reasoning.is_empty() && !reasoning.contains("think>"),
        "{whole}"
    );
    assert!(
        !content.is_empty() && !content.contains("think>"),
        "{whole}"
    );
    let reasoning_tokens = whole["usage"]["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .expect("reasoning tokens");
    let completion = whole["usage"]["completion_tokens"]
        .as_u64()
        .expect("tokens");
    assert!(
        0 < reasoning_tokens && reasoning_tokens < completion,
        "{whole}"
    );
    let t = &whole["timings"];
    assert_eq!(
        t["reasoning_tokens"].as_u64(),
        Some(reasoning_tokens),
        "{t}"
    );
    assert!(t["answer_ttft_ms"].as_f64() > t["ttft_ms"].as_f64(), "{t}");

    let mut streamed = thinking_body(Some("deepseek"));
    streamed["stream"] = json!(true);
    let chunks = chunks_of(&post_text(&server, CHAT, &streamed).await);
    let delta = |key: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][key].as_str())
            .collect()
    };
    assert_eq!(
        (delta("reasoning_content"), delta("content")),
        (reasoning.to_owned(), content.to_owned()),
        "the same seeded answer, split the same way"
    );

    // Left whole: asked so, or by default where the template writes no thinking.
    for format in [Some("none"), None] {
        let answer = ask(&server, &thinking_body(format)).await;
        let message = &answer["choices"][0]["message"];
        let text = message["content"].as_str().expect("content");
        // The split drops the white space after each tag, no more.
        assert!(
            text.starts_with("<think>") && text.contains(reasoning) && text.ends_with(content),
            "{answer}"
        );
        assert!(!message["reasoning_content"].is_string(), "{answer}");
    }
    // The file's Jinja template takes variables (this one reads none of them).
    let mut kwargs = thinking_body(None);
    kwargs["chat_template_kwargs"] = json!({"enable_thinking": false});
    ask(&server, &kwargs).await;
}

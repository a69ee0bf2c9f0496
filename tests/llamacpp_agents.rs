//! Agents and reasoning models on the default model in this process (llama.cpp): tool
//! calls in the generic format held by a grammar, what the engine cannot serve refused
//! by name, the tool-call formats of templates that render tools, and `<think>` sections
//! split out as llama-server's `reasoning_format` does.

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
    let whole = chat_ok(&server, &body).await;
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
    let answer = chat_ok(&server, &named).await;
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
    let whole = chat_ok(&server, &thinking_body(Some("deepseek"))).await;
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
        let answer = chat_ok(&server, &thinking_body(format)).await;
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
    chat_ok(&server, &kwargs).await;
}

/// A chat template of our own in the Hermes format (as Qwen's and Hermes' write tools):
/// the tools listed in `<tools>`, each call in `<tool_call>` tags, results in
/// `<tool_response>`.
const HERMES_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call these functions, whose signatures are in <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Write each call as <tool_call>
{"name": <function name>, "arguments": <arguments object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// `body` streamed: the `tool_calls` pieces of its chunks, in order, and their
/// arguments put together.
async fn streamed_call(server: &TestServer, body: &Value) -> (Vec<Value>, String) {
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = chunks_of(&post_text(server, CHAT, &streamed).await);
    let pieces: Vec<Value> = chunks
        .iter()
        .flat_map(|c| {
            c["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .cloned()
        })
        .collect();
    let arguments = pieces
        .iter()
        .filter_map(|p| p["function"]["arguments"].as_str())
        .collect();
    (pieces, arguments)
}

/// The default model with [`HERMES_TEMPLATE`] in place of its file's
/// (`engine.chat_template_file`).
fn hermes_engine(folder: &std::path::Path) -> Front {
    engine_with_template(folder, HERMES_TEMPLATE)
}

/// The default model with `template` in place of its file's.
fn engine_with_template(folder: &std::path::Path, template: &str) -> Front {
    let file = folder.join("template.jinja");
    std::fs::write(&file, template).expect("the template is written");
    LlamaCppEngine::load_now(LlamaCppSettings {
        sequences: 2,
        context_length: Some(2048),
        chat_template_file: Some(file),
        ..LlamaCppSettings::new(model_path(), MODEL)
    })
    .expect("llama.cpp loads the default model")
    .into()
}

/// A template that renders tools in the Hermes format gets them, and the history's
/// calls and results, as it writes them; the answer is held to a `<tool_call>` under
/// `required` and read back into OpenAI's `tool_calls`, streamed and whole alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_renders_tools_gets_them_and_its_calls_are_read_back() {
    let folder = tempfile::tempdir().expect("a folder");
    let server = TestServer::builder(hermes_engine(folder.path()))
        .start()
        .await;
    let ask_weather = json!({"role": "user", "content": "What is the weather in Paris?"});
    let body = json!({"model": MODEL, "tools": weather_tools(), "tool_choice": "required",
        "seed": 3, "temperature": 0, "max_tokens": 64, "messages": [ask_weather]});
    let whole = chat_ok(&server, &body).await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    assert!(choice["message"]["content"].is_null(), "{whole}");
    let call = &choice["message"]["tool_calls"][0];
    let name = call["function"]["name"].as_str().expect("name");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments"))
            .expect("the arguments are JSON");
    let key = match name {
        "get_weather" => "city",
        "get_time" => "zone",
        other => panic!("{other} is not a tool offered"),
    };
    assert!(arguments[key].is_string(), "{arguments}");
    assert_eq!(
        whole["timings"]["output_tokens_by_kind"]["tool_calls"],
        whole["usage"]["completion_tokens"],
        "every token was the call's: {whole}"
    );

    let (pieces, streamed_arguments) = streamed_call(&server, &body).await;
    assert_eq!(
        pieces[0]["function"]["name"], name,
        "named in its first piece"
    );
    assert!(pieces[0]["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    assert_eq!(streamed_arguments, call["function"]["arguments"]);

    // The history's call and result are the template's to write: the prompt grows by
    // them, and a named tool is the one called.
    let after = json!({"model": MODEL, "tools": weather_tools(), "seed": 1, "max_tokens": 64,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "messages": [ask_weather,
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "18 C"}]});
    let answer = chat_ok(&server, &after).await;
    assert_eq!(
        answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time",
        "{answer}"
    );
    assert!(
        answer["usage"]["prompt_tokens"].as_u64() > whole["usage"]["prompt_tokens"].as_u64(),
        "{answer}"
    );
    // Under auto the model writes what it likes: text is content, a call is a call,
    // and a call that is not JSON naming a tool is an error that says so.
    let mut auto = body.clone();
    auto["tool_choice"] = json!("auto");
    let response = post(&server, CHAT, &auto).await;
    let status = response.status();
    let answer: Value = response.json().await.expect("json");
    let message = &answer["choices"][0]["message"];
    assert!(
        (status == 200 && (message["content"].is_string() || message["tool_calls"].is_array()))
            || answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("tool call")),
        "{status} {answer}"
    );
}

/// Templates of our own in the other formats a template is told by: Llama 3's (bare
/// JSON with `parameters`), Mistral's `[TOOL_CALLS]name[ARGS]` (whose templates refuse a
/// call id that is not nine letters and digits) and DeepSeek R1's blocks.
const FORMAT_TEMPLATES: [(&str, &str); 3] = [
    (
        "llama3",
        r#"{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Answer a call as {"name": function name, "parameters": arguments}. Functions:
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|eot_id|>{% endif %}
{%- for m in messages %}{% if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>{% elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}{% endfor %}<|eot_id|>{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#,
    ),
    (
        "mistral",
        r#"{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'tool' %}{% if m.tool_call_id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}[TOOL_RESULTS]{{ m.tool_call_id }}[TOOL_CONTENT]{{ m.content }}[/TOOL_RESULTS]
{%- elif m.tool_calls %}{% for c in m.tool_calls %}{% if c.id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}[TOOL_CALLS]{{ c.function.name }}[CALL_ID]{{ c.id }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}</s>
{%- else %}{{ m.content }}</s>{% endif %}{% endfor %}"#,
    ),
    (
        "deepseek-r1",
        r#"{%- if tools %}Functions: {% for t in tools %}{{ t | tojson }} {% endfor %}{% endif %}
{%- for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}
{%- elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>
{%- elif m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>{% for c in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}
```json
{{ c.function.arguments | tojson }}
```<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
{%- else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{% endif %}"#,
    ),
];

/// A template in each of those formats is told at load: the grammar holds a required
/// call to its spelling, the call is read back the same streamed and whole, and the
/// history's call and result (with an id Mistral's template would refuse as sent) are
/// the template's to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_templates_own_tool_call_format_is_written_and_read_back() {
    for (format, template) in FORMAT_TEMPLATES {
        let folder = tempfile::tempdir().expect("a folder");
        let server = TestServer::builder(engine_with_template(folder.path(), template))
            .start()
            .await;
        let ask = json!({"role": "user", "content": "What time is it in Paris?"});
        // DeepSeek's markers are single tokens in its own vocabulary and ~15 each here.
        // Seeded: decoded alone, never from a cached prefix, so streamed and whole agree.
        let body = json!({"model": MODEL, "tools": weather_tools(), "tool_choice": "required",
            "seed": 3, "temperature": 0, "max_tokens": 200, "messages": [ask]});
        let whole = chat_ok(&server, &body).await;
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{format}: {whole}");
        let call = &choice["message"]["tool_calls"][0];
        let arguments: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments"))
                .expect("the arguments are JSON");
        let key = match call["function"]["name"].as_str() {
            Some("get_weather") => "city",
            Some("get_time") => "zone",
            other => panic!("{format}: {other:?} is not a tool offered"),
        };
        assert!(arguments[key].is_string(), "{format}: {arguments}");
        let id = call["id"].as_str().expect("an id");
        if format == "mistral" {
            assert!(
                id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "{id}"
            );
        }

        let (pieces, streamed_arguments) = streamed_call(&server, &body).await;
        assert_eq!(pieces[0]["function"]["name"], call["function"]["name"]);
        assert_eq!(
            streamed_arguments, call["function"]["arguments"],
            "{format}"
        );

        let after = json!({"model": MODEL, "tools": weather_tools(), "max_tokens": 200,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "messages": [ask,
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a", "type": "function",
                  "function": {"name": "get_time", "arguments": "{\"zone\":\"CET\"}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "12:00"}]});
        let answer = chat_ok(&server, &after).await;
        assert_eq!(
            answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather",
            "{format}: {answer}"
        );
    }
}

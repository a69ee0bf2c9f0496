//! The request body the gateway sends an upstream: always streamed, always with usage,
//! the conversation as the client sent it (parts, tool calls, tool results) and the
//! tools in today's shape.

use serde_json::{json, Map, Value};

use crate::engine::upstream::config::UpstreamConfig;
use crate::engine::{
    ChatMessage, ContentPart, GenerationRequest, Prompt, ResponseFormat, Sampling, ToolChoice,
    Tools,
};

/// What to ask the upstream for, beyond the client's request.
#[derive(Debug, Clone, Copy)]
pub struct Asks {
    /// Ask for each token's log-probability (for confidence) even when the client did not.
    pub logprobs: bool,
}

/// The route and body for `request` against the upstream `config` describes.
pub fn request_body(
    request: &GenerationRequest,
    config: &UpstreamConfig,
    asks: Asks,
) -> (&'static str, Value) {
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    let route = put_prompt(&mut body, request, asks);
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    // The budget goes upstream when the client chose it or the model has a default;
    // otherwise the upstream's own default applies (it knows its context, the gateway
    // may not), and the gateway ends the answer at its cap as it streams.
    if let Some(max_tokens) = request.budget.sent() {
        // `max_tokens` by default: llama.cpp's server reads only this; OpenAI's reasoning
        // models only `max_completion_tokens` (`max_tokens_param`).
        body.insert(config.max_tokens_param.clone(), json!(max_tokens));
    }
    put_sampling(&mut body, &request.sampling);
    if let Some(format) = response_format(&request.response_format) {
        body.insert("response_format".into(), format);
    }
    if let Some(tools) = &request.tools {
        put_tools(&mut body, tools);
    }
    if let Some(effort) = &request.reasoning_effort {
        body.insert("reasoning_effort".into(), json!(effort));
    }
    // llama-server's and vLLM's own; a server that knows neither ignores them.
    if let Some(format) = request.reasoning_format {
        body.insert("reasoning_format".into(), json!(format.as_str()));
    }
    if let Some(kwargs) = &request.template_kwargs {
        body.insert("chat_template_kwargs".into(), Value::Object(kwargs.clone()));
    }
    // llama.cpp's server reads a GBNF grammar as `grammar`; a server that does not
    // (vLLM takes `structured_outputs`) answers without it (docs/upstream.md).
    if let ResponseFormat::Grammar(gbnf) = &request.response_format {
        body.insert("grammar".into(), json!(gbnf));
    }
    (route, Value::Object(body))
}

/// The prompt and the ask for log-probabilities, in the shape of its route: the route.
fn put_prompt(
    body: &mut Map<String, Value>,
    request: &GenerationRequest,
    asks: Asks,
) -> &'static str {
    // The alternatives asked for: the client's, or 1 for the gateway's own ask.
    let top = match (request.top_logprobs, asks.logprobs) {
        (Some(top), _) => Some(top.max(1)),
        (None, true) => Some(1),
        (None, false) => None,
    };
    match &request.prompt {
        Prompt::Chat(messages) => {
            let messages: Vec<Value> = messages.iter().map(message).collect();
            body.insert("messages".into(), Value::Array(messages));
            // At least one alternative: llama.cpp's server returns no log-probabilities at
            // all for `logprobs: true` alone. The gateway keeps only what the client asked.
            if let Some(top) = top {
                body.insert("logprobs".into(), json!(true));
                body.insert("top_logprobs".into(), json!(top));
            }
            "/chat/completions"
        }
        Prompt::Text(_) | Prompt::Tokens(_) => {
            let prompt = match &request.prompt {
                Prompt::Tokens(ids) => json!(ids),
                other => json!(other.last_user_text()),
            };
            body.insert("prompt".into(), prompt);
            // Legacy completions take the count of alternatives; 1 is the cheapest ask
            // that every server answers with the picked token's log-probability.
            if let Some(top) = top {
                body.insert("logprobs".into(), json!(top));
            }
            "/completions"
        }
    }
}

/// A message as OpenAI's chat API takes it: its parts where it has more than text, its
/// tool calls, the call a tool's result answers, the participant's name.
fn message(m: &ChatMessage) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), json!(m.role.as_str()));
    let content = if !m.parts.is_empty() {
        let parts = m.parts.iter().map(|part| match part {
            ContentPart::Text(text) => json!({"type": "text", "text": text}),
            ContentPart::Media(media) => {
                let kind = media.kind.as_str();
                json!({"type": kind, kind: media.value})
            }
        });
        Value::Array(parts.collect())
    } else if m.content.is_empty() && !m.tool_calls.is_empty() {
        // OpenAI's own shape for an assistant turn of tool calls alone.
        Value::Null
    } else {
        json!(m.content)
    };
    out.insert("content".into(), content);
    if !m.tool_calls.is_empty() {
        let calls = m.tool_calls.iter().map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        });
        out.insert("tool_calls".into(), Value::Array(calls.collect()));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    if let Some(name) = &m.name {
        out.insert("name".into(), json!(name));
    }
    Value::Object(out)
}

/// The tools in today's shape, whichever the client used (vLLM and llama.cpp's server
/// take no legacy `functions`); the answer goes back in the client's.
fn put_tools(body: &mut Map<String, Value>, tools: &Tools) {
    let functions = tools.functions.iter().map(|f| {
        let mut function = Map::new();
        function.insert("name".into(), json!(f.name));
        if let Some(description) = &f.description {
            function.insert("description".into(), json!(description));
        }
        function.insert("parameters".into(), f.parameters.clone());
        if let Some(strict) = f.strict {
            function.insert("strict".into(), json!(strict));
        }
        json!({"type": "function", "function": function})
    });
    body.insert("tools".into(), Value::Array(functions.collect()));
    let choice = match &tools.choice {
        // The default everywhere; left out for servers that take only some choices.
        ToolChoice::Auto => None,
        ToolChoice::None => Some(json!("none")),
        ToolChoice::Required => Some(json!("required")),
        ToolChoice::Named(name) => Some(json!({"type": "function", "function": {"name": name}})),
    };
    if let Some(choice) = choice {
        body.insert("tool_choice".into(), choice);
    }
    if let Some(parallel) = tools.parallel {
        body.insert("parallel_tool_calls".into(), json!(parallel));
    }
}

/// The sampling parameters the client set, and vLLM's extensions, passed on.
fn put_sampling(body: &mut Map<String, Value>, s: &Sampling) {
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            body.insert(key.to_owned(), value);
        }
    };
    put("temperature", s.temperature.map(|v| json!(v)));
    put("top_p", s.top_p.map(|v| json!(v)));
    put("seed", s.seed.map(|v| json!(v as i64)));
    put("presence_penalty", s.presence_penalty.map(|v| json!(v)));
    put("frequency_penalty", s.frequency_penalty.map(|v| json!(v)));
    put("top_k", s.top_k.map(|v| json!(v)));
    put("min_p", s.min_p.map(|v| json!(v)));
    put("repetition_penalty", s.repetition_penalty.map(|v| json!(v)));
    put("stop", (!s.stop.is_empty()).then(|| json!(s.stop)));
    put("ignore_eos", s.ignore_eos.then(|| json!(true)));
    put(
        "min_tokens",
        (s.min_tokens > 0).then(|| json!(s.min_tokens)),
    );
    put(
        "stop_token_ids",
        (!s.stop_token_ids.is_empty()).then(|| json!(s.stop_token_ids)),
    );
    put(
        "logit_bias",
        (!s.logit_bias.is_empty()).then(|| {
            let bias: serde_json::Map<String, Value> = s
                .logit_bias
                .iter()
                .map(|(id, bias)| (id.to_string(), json!(bias)))
                .collect();
            Value::Object(bias)
        }),
    );
}

/// OpenAI's `response_format`, where the client asked for more than text.
fn response_format(format: &ResponseFormat) -> Option<Value> {
    match format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(json!({"type": "json_object"})),
        ResponseFormat::JsonSchema(schema) => Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": schema},
        })),
        // Sent as `grammar` instead.
        ResponseFormat::Grammar(_) => None,
        // An engine in this process's own, for its tool-call format: an upstream is sent
        // the tools.
        ResponseFormat::Lark(_) => None,
    }
}

//! The chat-completions request: the wire type as OpenAI defines it, and its one-time
//! conversion into a validated [`ChatRequest`] ("parse, don't validate"). Every rejection
//! names the offending parameter in OpenAI's error shape.
//!
//! Parameters this server cannot honour are refused with a 400 naming them, never ignored;
//! the same parameters at their neutral values (`n: 1`, `tools: []`, `logprobs: false`...)
//! are accepted, because SDKs often send them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::engine::{ChatMessage, GenerationRequest, Role, Sampling};
use crate::error::ApiError;

/// Longest stop sequence accepted. The engine compares every stop sequence with the text
/// at each step, so their length is a per-token cost a client should not choose freely.
pub const MAX_STOP_CHARS: usize = 256;

/// Limits a request is validated against.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    pub served_model: String,
    pub max_tokens_cap: u32,
    pub default_max_tokens: u32,
}

/// A validated chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`: send the usage chunk before `[DONE]`.
    pub include_usage: bool,
    pub user: Option<String>,
    /// sha256 of the canonicalised request (see [`input_hash`]).
    pub input_hash: String,
    pub generation: GenerationRequest,
}

/// sha256 (hex) of the request as the model sees it: model, messages and every sampling
/// parameter after defaults are applied, in a fixed JSON layout. Two requests with the
/// same hash ask for the same thing, whatever their JSON spelling; a logged request can
/// be matched to its replay without storing the prompt.
pub fn input_hash(model: &str, generation: &GenerationRequest) -> String {
    #[derive(Serialize)]
    struct Canonical<'a> {
        model: &'a str,
        messages: Vec<(&'static str, &'a str)>,
        max_tokens: u32,
        temperature: Option<f64>,
        top_p: Option<f64>,
        seed: Option<u64>,
        presence_penalty: Option<f32>,
        frequency_penalty: Option<f32>,
        stop: &'a [String],
    }
    let s = &generation.sampling;
    let canonical = Canonical {
        model,
        messages: generation
            .messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect(),
        max_tokens: generation.max_tokens,
        temperature: s.temperature,
        top_p: s.top_p,
        seed: s.seed,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        stop: &s.stop,
    };
    // Serialising plain data into memory cannot fail.
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

/// Parameters we know. Anything else is refused like OpenAI does.
const KNOWN: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "n",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "response_format",
    "store",
    "metadata",
    "service_tier",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
];

#[derive(Debug, Deserialize)]
struct WireRequest {
    model: String,
    messages: Vec<WireMessage>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<WireStreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    stop: Option<WireStop>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireStreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
    #[serde(default)]
    include_obfuscation: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WireStop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    role: String,
    #[serde(default)]
    content: Option<WireContent>,
    #[serde(default)]
    tool_calls: Option<Value>,
    /// Participant name; the chat template has no place for it.
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Deserialize)]
struct WirePart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// Parses and validates a request body.
pub fn parse_chat_request(
    body: &[u8],
    limits: &RequestLimits,
    request_id: &str,
) -> Result<ChatRequest, ApiError> {
    let object: Map<String, Value> = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return Err(ApiError::InvalidJson(
                "the body must be a JSON object".into(),
            ))
        }
        Err(e) => return Err(ApiError::InvalidJson(e.to_string())),
    };
    if let Some(unknown) = object.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::UnknownParameter(unknown.clone()));
    }
    refuse_unsupported(&object)?;
    for required in ["model", "messages"] {
        if object.get(required).is_none_or(Value::is_null) {
            return Err(ApiError::invalid(required, "this parameter is required"));
        }
    }
    let wire: WireRequest =
        serde_path_to_error::deserialize(Value::Object(object)).map_err(|e| {
            let param = e.path().to_string();
            ApiError::invalid(param, e.into_inner().to_string())
        })?;
    validate(wire, limits, request_id)
}

/// Refuses features this server does not serve when they are asked for.
fn refuse_unsupported(object: &Map<String, Value>) -> Result<(), ApiError> {
    let get = |key: &str| object.get(key).filter(|v| !v.is_null());
    if let Some(n) = get("n") {
        if n.as_u64() != Some(1) {
            return Err(ApiError::unsupported("n", "only n = 1 is served"));
        }
    }
    for key in ["tools", "functions"] {
        if let Some(v) = get(key) {
            if !v.as_array().is_some_and(Vec::is_empty) {
                return Err(ApiError::unsupported(key, "tool calling is not available"));
            }
        }
    }
    if let Some(v) = get("tool_choice") {
        if v.as_str() != Some("none") {
            return Err(ApiError::unsupported(
                "tool_choice",
                "tool calling is not available",
            ));
        }
    }
    if let Some(v) = get("function_call") {
        if v.as_str() != Some("none") {
            return Err(ApiError::unsupported(
                "function_call",
                "tool calling is not available",
            ));
        }
    }
    if get("logprobs").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ApiError::unsupported(
            "logprobs",
            "log probabilities are not returned",
        ));
    }
    if get("top_logprobs").is_some_and(|v| v.as_u64() != Some(0)) {
        return Err(ApiError::unsupported(
            "top_logprobs",
            "log probabilities are not returned",
        ));
    }
    if get("logit_bias").is_some_and(|v| !v.as_object().is_some_and(Map::is_empty)) {
        return Err(ApiError::unsupported("logit_bias", ""));
    }
    if let Some(v) = get("response_format") {
        if v.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::unsupported(
                "response_format",
                "only {\"type\": \"text\"} is served",
            ));
        }
    }
    if let Some(v) = get("modalities") {
        let text_only = v
            .as_array()
            .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")));
        if !text_only {
            return Err(ApiError::unsupported("modalities", "only text is served"));
        }
    }
    if get("store").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ApiError::unsupported("store", "completions are not stored"));
    }
    for key in [
        "audio",
        "prediction",
        "reasoning_effort",
        "web_search_options",
    ] {
        if get(key).is_some() {
            return Err(ApiError::unsupported(key, ""));
        }
    }
    Ok(())
}

fn validate(
    wire: WireRequest,
    limits: &RequestLimits,
    request_id: &str,
) -> Result<ChatRequest, ApiError> {
    if wire.model != limits.served_model {
        return Err(ApiError::ModelNotFound(wire.model));
    }
    if wire.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "must contain at least one message",
        ));
    }
    let messages = wire
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;

    let (max_param, requested) = match (wire.max_completion_tokens, wire.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, Some(n)) => ("max_tokens", Some(n)),
        (None, None) => ("max_tokens", None),
    };
    let max_tokens = match requested {
        Some(0) => return Err(ApiError::invalid(max_param, "must be at least 1")),
        Some(n) if n > limits.max_tokens_cap => {
            return Err(ApiError::invalid(
                max_param,
                format!(
                    "{n} is over this server's limit of {}",
                    limits.max_tokens_cap
                ),
            ))
        }
        Some(n) => n,
        None => limits.default_max_tokens,
    };

    let temperature = in_range("temperature", wire.temperature, 0.0, 2.0)?;
    let top_p = in_range("top_p", wire.top_p, 0.0, 1.0)?;
    if top_p == Some(0.0) {
        return Err(ApiError::invalid("top_p", "must be greater than 0"));
    }
    let presence_penalty = in_range(
        "presence_penalty",
        wire.presence_penalty.map(f64::from),
        -2.0,
        2.0,
    )?;
    let frequency_penalty = in_range(
        "frequency_penalty",
        wire.frequency_penalty.map(f64::from),
        -2.0,
        2.0,
    )?;
    let stop = match wire.stop {
        None => Vec::new(),
        Some(WireStop::One(s)) => vec![s],
        Some(WireStop::Many(v)) => v,
    };
    if stop.len() > 4 {
        return Err(ApiError::invalid(
            "stop",
            "at most 4 stop sequences are allowed",
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    if stop.iter().any(|s| s.chars().count() > MAX_STOP_CHARS) {
        return Err(ApiError::invalid(
            "stop",
            format!("each stop sequence must be at most {MAX_STOP_CHARS} characters"),
        ));
    }
    let stream = wire.stream.unwrap_or(false);
    let include_usage = match wire.stream_options {
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "stream_options",
                "only allowed when stream is true",
            ))
        }
        Some(options) => {
            let _ = options.include_obfuscation;
            options.include_usage.unwrap_or(false)
        }
        None => false,
    };
    let _ = (wire.n, wire.logprobs, wire.top_logprobs);

    let generation = GenerationRequest {
        request_id: request_id.to_owned(),
        messages,
        max_tokens,
        max_tokens_set: requested.is_some(),
        sampling: Sampling {
            temperature,
            top_p,
            // Negative seeds are valid in OpenAI's API; the bits are what matter.
            seed: wire.seed.map(|s| s as u64),
            presence_penalty: presence_penalty.map(|p| p as f32),
            frequency_penalty: frequency_penalty.map(|p| p as f32),
            stop,
        },
    };
    Ok(ChatRequest {
        input_hash: input_hash(&wire.model, &generation),
        model: wire.model,
        stream,
        include_usage,
        user: wire.user,
        generation,
    })
}

fn in_range(param: &str, value: Option<f64>, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
    match value {
        Some(v) if !(min..=max).contains(&v) => Err(ApiError::invalid(
            param,
            format!("{v} is not between {min} and {max}"),
        )),
        other => Ok(other),
    }
}

fn message(index: usize, wire: WireMessage) -> Result<ChatMessage, ApiError> {
    let role = match wire.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" | "function" => {
            return Err(ApiError::unsupported(
                format!("messages[{index}].role"),
                format!(
                    "'{}' messages need tool calling, which is not available",
                    wire.role
                ),
            ))
        }
        other => {
            return Err(ApiError::invalid(
                format!("messages[{index}].role"),
                format!("'{other}' is not one of system, developer, user, assistant"),
            ))
        }
    };
    if wire.name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Err(ApiError::unsupported(
            format!("messages[{index}].name"),
            "participant names are not passed to the model",
        ));
    }
    if wire.tool_calls.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::unsupported(
            format!("messages[{index}].tool_calls"),
            "tool calling is not available",
        ));
    }
    let content = match wire.content {
        Some(WireContent::Text(text)) => text,
        Some(WireContent::Parts(parts)) => {
            let mut text = String::new();
            for (p, part) in parts.into_iter().enumerate() {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    ("text", None) => {
                        return Err(ApiError::invalid(
                            format!("messages[{index}].content[{p}].text"),
                            "a text part needs text",
                        ))
                    }
                    (kind, _) => {
                        return Err(ApiError::unsupported(
                            format!("messages[{index}].content[{p}].type"),
                            format!("'{kind}' parts are not served; only text"),
                        ))
                    }
                }
            }
            text
        }
        None => {
            return Err(ApiError::invalid(
                format!("messages[{index}].content"),
                "this parameter is required",
            ))
        }
    };
    Ok(ChatMessage { role, content })
}

#[cfg(test)]
mod tests;

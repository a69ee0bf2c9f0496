//! The `POST /v1/chat/completions` body: messages and the chat-only parameters.

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::{
    n_predict, object_of, read, refuse_unsupported, require, validate, RequestLimits,
    ValidatedRequest, WireCommon, COMMON,
};
use crate::engine::{ChatMessage, Prompt, Role};
use crate::error::ApiError;

/// Chat parameters we know beyond [`COMMON`]. Anything else is refused like OpenAI does.
pub(super) const KNOWN: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "top_logprobs",
    "store",
    "metadata",
    "service_tier",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "verbosity",
    "prompt_cache_key",
    "safety_identifier",
];

#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ChatParameters)]
pub(super) struct WireChat {
    #[schema(min_items = 1)]
    messages: Vec<WireMessage>,
    /// OpenAI's successor of `user` for abuse monitoring; kept (hashed) like `user`.
    #[serde(default)]
    safety_identifier: Option<String>,
    /// The completion budget; wins over `max_tokens`.
    #[serde(default)]
    #[schema(minimum = 1)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    logprobs: Option<bool>,
    /// Alternatives per token, with `logprobs: true`.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 20)]
    top_logprobs: Option<u32>,
}

/// The most alternatives `top_logprobs` may ask for, as in OpenAI's API.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// `logprobs` and `top_logprobs` as OpenAI takes them: `top_logprobs` (0 to 20) only with
/// `logprobs: true`. `None`: not asked.
fn top_logprobs(logprobs: Option<bool>, top: Option<u32>) -> Result<Option<u8>, ApiError> {
    match (logprobs.unwrap_or(false), top) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS => Err(ApiError::invalid(
            "top_logprobs",
            format!("{n} is more than {MAX_TOP_LOGPROBS}"),
        )),
        (false, Some(n)) if n > 0 => Err(ApiError::invalid(
            "top_logprobs",
            "logprobs must be true to ask for top_logprobs",
        )),
        (false, _) => Ok(None),
        (true, n) => Ok(Some(n.unwrap_or(0) as u8)),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ChatMessage)]
pub(super) struct WireMessage {
    #[schema(pattern = "^(system|developer|user|assistant)$")]
    role: String,
    /// Required but for an assistant's message.
    #[serde(default)]
    #[schema(value_type = WireContent, required = true)]
    content: Option<WireContent>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    tool_calls: Option<Value>,
    /// Participant name; the chat template has no place for it.
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[schema(as = ChatContent)]
enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ChatContentPart)]
struct WirePart {
    #[serde(rename = "type")]
    kind: String,
    /// Text parts only: the model reads text.
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    text: Option<String>,
}

/// Parses and validates a `POST /v1/chat/completions` body.
pub fn parse_chat_request(
    body: &[u8],
    limits: &RequestLimits,
    request_id: &str,
) -> Result<ValidatedRequest, ApiError> {
    let mut object = object_of(body, &[COMMON, KNOWN], limits)?;
    n_predict(&mut object)?;
    refuse_unsupported(&object)?;
    refuse_chat_unsupported(&object)?;
    require(&object, &["model", "messages"])?;
    let common: WireCommon = read(&object)?;
    let chat: WireChat = read(&object)?;
    limits.model(&common.model)?;
    if chat.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "must contain at least one message",
        ));
    }
    let messages = chat
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let budget = match (chat.max_completion_tokens, common.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, n) => ("max_tokens", n),
    };
    let top_logprobs = top_logprobs(chat.logprobs, chat.top_logprobs)?;
    let mut request = validate(common, Prompt::Chat(messages), budget, limits, request_id)?;
    // Not in the input hash: asking for log-probabilities does not change the answer.
    request.generation.top_logprobs = top_logprobs;
    if request.user.is_none() {
        request.user = chat.safety_identifier;
    }
    Ok(request)
}

/// Refuses chat features this server does not serve when they are asked for.
fn refuse_chat_unsupported(object: &Map<String, Value>) -> Result<(), ApiError> {
    let get = |key: &str| object.get(key).filter(|v| !v.is_null());
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
    // A reasoning model's answer length; this model has one length, "medium".
    if get("verbosity").is_some_and(|v| v.as_str() != Some("medium")) {
        return Err(ApiError::unsupported(
            "verbosity",
            "only \"medium\" is served",
        ));
    }
    for key in ["prompt_cache_key", "safety_identifier"] {
        if get(key).is_some_and(|v| !v.is_string()) {
            return Err(ApiError::invalid(key, "must be a string"));
        }
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

pub(super) fn message(index: usize, wire: WireMessage) -> Result<ChatMessage, ApiError> {
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
            // Joined as separate lines, as llama.cpp's server joins them: "What is" and
            // "the best book" are two texts, not "What isthe best book".
            let mut text = String::new();
            for (p, part) in parts.into_iter().enumerate() {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(t)) => {
                        if p > 0 {
                            text.push('\n');
                        }
                        text.push_str(&t);
                    }
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

//! The `POST /v1/chat/completions` body: messages and the chat-only parameters.

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::tools;
use super::{
    n_predict, object_of, read, refuse_unsupported, require, validate, Agentic, RequestLimits,
    ValidatedRequest, WireCommon, COMMON,
};
use crate::engine::reasoning::ReasoningFormat;
use crate::engine::{ChatMessage, ContentPart, MediaKind, MediaPart, Prompt, Role};
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
    "reasoning_format",
    "chat_template_kwargs",
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
    #[schema(pattern = "^(system|developer|user|assistant|tool|function)$")]
    role: String,
    /// Required but for an assistant's message (which may carry tool calls alone).
    #[serde(default)]
    #[schema(value_type = WireContent, required = true)]
    content: Option<WireContent>,
    /// An assistant's calls of the tools (`{"id", "type": "function", "function":
    /// {"name", "arguments"}}`).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    tool_calls: Option<Value>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default)]
    tool_call_id: Option<String>,
    /// Legacy: an assistant's call of one of the `functions`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    function_call: Option<Value>,
    /// The participant's name; in a legacy `function` message, the function's.
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
    /// `text`, `image_url`, `input_audio` or `file`; the parts that are not text go to an
    /// upstream model that reads them, and are refused by a model that does not.
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    image_url: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    input_audio: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    file: Option<Value>,
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
    let tools = tools::tools_of(&object)?;
    let mut messages = chat
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    link_function_results(&mut messages);
    let budget = match (chat.max_completion_tokens, common.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, n) => ("max_tokens", n),
    };
    let top_logprobs = top_logprobs(chat.logprobs, chat.top_logprobs)?;
    let agentic = Agentic {
        tools,
        reasoning_effort: reasoning_effort(&object)?,
        reasoning_format: reasoning_format(&object)?,
        template_kwargs: template_kwargs(&object)?,
    };
    let prompt = Prompt::Chat(messages);
    let mut request = validate(common, prompt, agentic, budget, limits, request_id)?;
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
    for key in ["audio", "prediction", "web_search_options"] {
        if get(key).is_some() {
            return Err(ApiError::unsupported(key, ""));
        }
    }
    Ok(())
}

pub(super) fn message(index: usize, wire: WireMessage) -> Result<ChatMessage, ApiError> {
    let at = format!("messages[{index}]");
    let role = match wire.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" | "function" => Role::Tool,
        other => {
            return Err(ApiError::invalid(
                format!("{at}.role"),
                format!("'{other}' is not one of system, developer, user, assistant, tool"),
            ))
        }
    };
    let mut message = ChatMessage {
        role,
        name: wire.name.filter(|n| !n.is_empty()),
        ..ChatMessage::default()
    };
    match wire.content {
        Some(WireContent::Text(text)) => message.content = text,
        Some(WireContent::Parts(parts)) => content_parts(&at, parts, &mut message)?,
        // An assistant's turn may be its tool calls alone.
        None if role == Role::Assistant => {}
        None => {
            return Err(ApiError::invalid(
                format!("{at}.content"),
                "this parameter is required",
            ))
        }
    }
    if let Some(calls) = wire.tool_calls.filter(|v| !v.is_null()) {
        if role != Role::Assistant {
            return Err(ApiError::invalid(
                format!("{at}.tool_calls"),
                "only an assistant's message carries tool calls",
            ));
        }
        message.tool_calls = tools::history_calls(&at, &calls)?;
    }
    if let Some(call) = wire.function_call.filter(|v| !v.is_null()) {
        let id = format!("call_{index}");
        message
            .tool_calls
            .push(tools::history_function_call(&at, &call, id)?);
    }
    match (wire.role.as_str(), wire.tool_call_id) {
        ("tool", Some(id)) => message.tool_call_id = Some(id),
        ("tool", None) => {
            return Err(ApiError::invalid(
                format!("{at}.tool_call_id"),
                "a tool message needs the id of the call it answers",
            ))
        }
        ("function", _) if message.name.is_none() => {
            return Err(ApiError::invalid(
                format!("{at}.name"),
                "a function message needs the function's name",
            ))
        }
        _ => {}
    }
    Ok(message)
}

/// A content array: the text parts joined as separate lines, as llama.cpp's server
/// joins them ("What is" and "the best book" are two texts, not "What isthe best
/// book"), and every part kept in order where one is not text.
fn content_parts(
    at: &str,
    parts: Vec<WirePart>,
    message: &mut ChatMessage,
) -> Result<(), ApiError> {
    let mut kept = Vec::with_capacity(parts.len());
    for (p, part) in parts.into_iter().enumerate() {
        let at = format!("{at}.content[{p}]");
        if part.kind == "text" {
            let Some(text) = part.text else {
                return Err(ApiError::invalid(
                    format!("{at}.text"),
                    "a text part needs text",
                ));
            };
            if kept.iter().any(|k| matches!(k, ContentPart::Text(_))) {
                message.content.push('\n');
            }
            message.content.push_str(&text);
            kept.push(ContentPart::Text(text));
            continue;
        }
        let Some(kind) = MediaKind::of(&part.kind) else {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!(
                    "'{}' is not one of text, image_url, input_audio, file",
                    part.kind
                ),
            ));
        };
        let value = match kind {
            MediaKind::ImageUrl => part.image_url,
            MediaKind::InputAudio => part.input_audio,
            MediaKind::File => part.file,
        };
        let Some(value) = value.filter(Value::is_object) else {
            return Err(ApiError::invalid(
                format!("{at}.{}", kind.as_str()),
                format!("a {} part needs its object", kind.as_str()),
            ));
        };
        kept.push(ContentPart::Media(MediaPart { kind, value }));
    }
    if kept.iter().any(|p| matches!(p, ContentPart::Media(_))) {
        message.parts = kept;
    }
    Ok(())
}

/// A legacy `function` message answers the latest call of its function before it:
/// it takes that call's id, so an upstream gets the conversation in today's shape.
fn link_function_results(messages: &mut [ChatMessage]) {
    for i in 0..messages.len() {
        if messages[i].role != Role::Tool || messages[i].tool_call_id.is_some() {
            continue;
        }
        let name = messages[i].name.clone();
        let id = messages[..i]
            .iter()
            .rev()
            .flat_map(|m| m.tool_calls.iter().rev())
            .find(|call| Some(&call.name) == name.as_ref())
            .map(|call| call.id.clone());
        messages[i].tool_call_id = id;
    }
}

/// OpenAI's `reasoning_effort`, for a reasoning model (passed on; an engine without
/// reasoning refuses it).
pub(super) fn reasoning_effort(object: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];
    match object.get("reasoning_effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => Ok(Some(e.clone())),
        Some(_) => Err(ApiError::invalid(
            "reasoning_effort",
            format!("must be one of {}", EFFORTS.join(", ")),
        )),
    }
}

/// llama-server's `reasoning_format`: how an engine in this process hands over a model's
/// thinking (passed on to an upstream).
fn reasoning_format(object: &Map<String, Value>) -> Result<Option<ReasoningFormat>, ApiError> {
    match object.get("reasoning_format") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if ReasoningFormat::parse(name).is_some() => {
            Ok(ReasoningFormat::parse(name))
        }
        Some(_) => Err(ApiError::invalid(
            "reasoning_format",
            format!("must be one of {}", ReasoningFormat::NAMES.join(", ")),
        )),
    }
}

/// `chat_template_kwargs` (llama-server's and vLLM's): variables for the model's chat
/// template, such as Qwen3's `enable_thinking`.
pub(super) fn template_kwargs(
    object: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, ApiError> {
    match object.get("chat_template_kwargs") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(kwargs)) => Ok(Some(kwargs.clone())),
        Some(_) => Err(ApiError::invalid(
            "chat_template_kwargs",
            "must be an object of template variables",
        )),
    }
}

//! `POST /tokenize` and `POST /detokenize` bodies, in vLLM's shapes: a `prompt` or chat
//! `messages` to turn into ids, or `tokens` to turn into text; and in llama.cpp's
//! server's: `content` (special tokens added only with `add_special`), and `with_pieces`
//! for each id's text.

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::{message, object_of, read, RequestLimits, WireMessage};
use crate::engine::{Prompt, TemplateInputs, TokenizeRequest};
use crate::error::ApiError;

/// A validated `/tokenize` request.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenize {
    /// The served model to count with; `None`: the default (first) one.
    pub model: Option<String>,
    pub request: TokenizeRequest,
    /// Also answer how the vocabulary spells each token (`token_strs`).
    pub return_token_strs: bool,
    /// Answer each token as `{id, piece}`, its text (llama.cpp's `with_pieces`).
    pub with_pieces: bool,
}

const TOKENIZE_KNOWN: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "add_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "return_token_strs",
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "content",
    "add_special",
    "with_pieces",
];

#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = TokenizeRequest)]
pub struct WireTokenize {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<WireMessage>>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    return_token_strs: Option<bool>,
    /// llama.cpp's name of `prompt`; special tokens only with `add_special`.
    #[serde(default)]
    content: Option<String>,
    /// llama.cpp's `add_special_tokens` for `content` (default false).
    #[serde(default)]
    add_special: Option<bool>,
    /// Answer `tokens` as `[{"id", "piece"}]` (llama.cpp's).
    #[serde(default)]
    with_pieces: Option<bool>,
}

/// A `model`, when given, must be a served one.
fn check_model(model: Option<String>, limits: &RequestLimits) -> Result<Option<String>, ApiError> {
    model
        .map(|m| limits.model(&m).map(|policy| policy.id.clone()))
        .transpose()
}

/// Parses a `/tokenize` body. Its defaults render the prompt as a generation does, so
/// `count` equals a request's `usage.prompt_tokens` (vLLM's chat default adds no special
/// tokens; here the default is what this engine counts with).
pub fn parse_tokenize_request(body: &[u8], limits: &RequestLimits) -> Result<Tokenize, ApiError> {
    let object = object_of(body, &[TOKENIZE_KNOWN], limits)?;
    for key in ["tools", "chat_template", "chat_template_kwargs"] {
        let set = object
            .get(key)
            .is_some_and(|v| !v.is_null() && v != &Value::Array(Vec::new()));
        if set {
            return Err(ApiError::unsupported(
                key,
                "the model's own chat template is used",
            ));
        }
    }
    let wire: WireTokenize = read(&object)?;
    let model = check_model(wire.model, limits)?;
    if wire.continue_final_message == Some(true) {
        return Err(ApiError::unsupported(
            "continue_final_message",
            "the conversation is rendered as a generation sees it",
        ));
    }
    if wire.content.is_some() && (wire.prompt.is_some() || wire.messages.is_some()) {
        return Err(ApiError::invalid(
            "content",
            "send one of content, prompt or messages",
        ));
    }
    if wire.content.is_some() && wire.add_special_tokens.is_some() {
        return Err(ApiError::invalid(
            "add_special_tokens",
            "content takes add_special, prompt takes add_special_tokens",
        ));
    }
    // llama.cpp's server adds no special tokens to `content` unless asked.
    let add_special = match &wire.content {
        Some(_) => Some(wire.add_special.unwrap_or(false)),
        None if wire.add_special.is_some() => {
            return Err(ApiError::invalid(
                "add_special",
                "goes with content; prompt takes add_special_tokens",
            ))
        }
        None => wire.add_special_tokens,
    };
    let prompt = match (wire.prompt.or(wire.content), wire.messages) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "send either prompt or messages, not both",
            ))
        }
        (Some(text), None) => Prompt::Text(text),
        (None, Some(messages)) => Prompt::Chat(
            messages
                .into_iter()
                .enumerate()
                .map(|(i, m)| message(i, m))
                .collect::<Result<_, _>>()?,
        ),
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "send a prompt, or chat messages",
            ))
        }
    };
    let mut request = TokenizeRequest::as_generated(prompt);
    if let Some(add) = add_special {
        request.add_special_tokens = add;
    }
    if let Some(add) = wire.add_generation_prompt {
        if !matches!(request.prompt, Prompt::Chat(_)) && add {
            return Err(ApiError::invalid(
                "add_generation_prompt",
                "only chat messages have a generation prompt",
            ));
        }
        request.add_generation_prompt = add;
    }
    Ok(Tokenize {
        model,
        request,
        return_token_strs: wire.return_token_strs.unwrap_or(false),
        with_pieces: wire.with_pieces.unwrap_or(false),
    })
}

/// What a `POST /apply-template` body may hold beside `messages`: what the template is
/// given as a generation gives it.
const APPLY_TEMPLATE_KNOWN: &[&str] = &[
    "model",
    "messages",
    "add_generation_prompt",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "chat_template_kwargs",
    "reasoning_effort",
];

/// A `POST /apply-template` body (llama.cpp's server's): the conversation to render with
/// the model's chat template, with the tools, `chat_template_kwargs` and
/// `reasoning_effort` a generation would give it, ending with the assistant's turn
/// opening (unless `add_generation_prompt` is false), as a generation renders it.
pub fn parse_apply_template_request(
    body: &[u8],
    limits: &RequestLimits,
) -> Result<TokenizeRequest, ApiError> {
    let object = object_of(body, &[APPLY_TEMPLATE_KNOWN], limits)?;
    let Some(Value::Array(items)) = object.get("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "send the conversation: a list of {\"role\", \"content\"} messages",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "must not be empty"));
    }
    #[derive(Deserialize)]
    struct Wire {
        messages: Vec<WireMessage>,
    }
    let wire: Wire = read(&object)?;
    let messages = wire
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<_, _>>()?;
    let add_generation_prompt = match object.get("add_generation_prompt") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(add)) => *add,
        Some(_) => {
            return Err(ApiError::invalid(
                "add_generation_prompt",
                "must be a boolean",
            ))
        }
    };
    Ok(TokenizeRequest {
        prompt: Prompt::Chat(messages),
        // Only what the template itself writes.
        add_special_tokens: false,
        add_generation_prompt,
        template: TemplateInputs {
            tools: super::tools::tools_of(&object)?,
            kwargs: super::chat::template_kwargs(&object)?,
            reasoning_effort: super::chat::reasoning_effort(&object)?,
        },
    })
}

const DETOKENIZE_KNOWN: &[&str] = &["model", "tokens", "skip_special_tokens"];

#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = DetokenizeRequest)]
pub struct WireDetokenize {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
    #[serde(default)]
    skip_special_tokens: Option<bool>,
}

/// Parses a `/detokenize` body: the ids, and whether special tokens are left out of the
/// text (vLLM's default: they are).
pub fn parse_detokenize_request(
    body: &[u8],
    limits: &RequestLimits,
) -> Result<Detokenize, ApiError> {
    let object = object_of(body, &[DETOKENIZE_KNOWN], limits)?;
    if object.get("tokens").is_none_or(Value::is_null) {
        return Err(ApiError::invalid("tokens", "this parameter is required"));
    }
    let wire: WireDetokenize = read(&object)?;
    Ok(Detokenize {
        model: check_model(wire.model, limits)?,
        tokens: wire.tokens,
        skip_special_tokens: wire.skip_special_tokens.unwrap_or(true),
    })
}

/// A validated `/detokenize` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detokenize {
    /// The served model whose vocabulary to read; `None`: the default (first) one.
    pub model: Option<String>,
    pub tokens: Vec<u32>,
    /// Leave special tokens out of the text (vLLM's default: they are).
    pub skip_special_tokens: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> RequestLimits {
        RequestLimits::single("m", 100)
    }

    fn tokenize(body: Value) -> Result<Tokenize, ApiError> {
        parse_tokenize_request(body.to_string().as_bytes(), &limits())
    }

    #[test]
    fn defaults_count_as_a_generation_does() {
        let chat =
            tokenize(json!({"messages": [{"role": "user", "content": "hi"}]})).expect("valid");
        assert_eq!(
            chat.request,
            TokenizeRequest::as_generated(Prompt::user("hi"))
        );
        let text = tokenize(json!({"model": "m", "prompt": "hi", "return_token_strs": true}))
            .expect("valid");
        assert_eq!(
            text.request,
            TokenizeRequest::as_generated(Prompt::Text("hi".into()))
        );
        assert!(text.return_token_strs);
        let raw = tokenize(json!({"prompt": "hi", "add_special_tokens": false})).expect("valid");
        assert!(!raw.request.add_special_tokens);
    }

    #[test]
    fn llama_cpp_content_adds_special_tokens_only_when_asked() {
        let plain = tokenize(json!({"content": "hi", "with_pieces": true})).expect("valid");
        assert_eq!(plain.request.prompt, Prompt::Text("hi".into()));
        assert!(!plain.request.add_special_tokens, "llama.cpp's default");
        assert!(plain.with_pieces);
        let special = tokenize(json!({"content": "hi", "add_special": true})).expect("valid");
        assert!(special.request.add_special_tokens);
        for (body, param) in [
            (json!({"content": "a", "prompt": "b"}), "content"),
            (
                json!({"content": "a", "add_special_tokens": true}),
                "add_special_tokens",
            ),
            (json!({"prompt": "a", "add_special": true}), "add_special"),
        ] {
            let error = tokenize(body.clone()).expect_err(&body.to_string());
            assert_eq!(error.param(), Some(param), "{body}: {error}");
        }
    }

    #[test]
    fn refusals_name_the_parameter() {
        let cases = [
            (json!({}), "prompt"),
            (json!({"prompt": "a", "messages": []}), "messages"),
            (json!({"prompt": "a", "model": "other"}), "model"),
            (
                json!({"prompt": "a", "add_generation_prompt": true}),
                "add_generation_prompt",
            ),
            (
                json!({"prompt": "a", "tools": [{"type": "function"}]}),
                "tools",
            ),
            (json!({"prompt": 5}), "prompt"),
            (json!({"prompt": "a", "bogus": 1}), "bogus"),
            (
                json!({"messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
            ),
        ];
        for (body, param) in cases {
            let error = tokenize(body.clone()).expect_err(&body.to_string());
            assert_eq!(error.param(), Some(param), "{body}: {error}");
        }
    }

    #[test]
    fn apply_template_takes_a_conversation() {
        let parse =
            |body: Value| parse_apply_template_request(body.to_string().as_bytes(), &limits());
        let request =
            parse(json!({"messages": [{"role": "user", "content": "Hi"}]})).expect("valid");
        assert_eq!(request.prompt, Prompt::user("Hi"));
        assert!(request.add_generation_prompt && !request.add_special_tokens);
        assert_eq!(request.template, TemplateInputs::default());
        // What a generation gives the template, as llama-server's takes it.
        let request = parse(json!({"messages": [{"role": "user", "content": "Hi"}],
            "add_generation_prompt": false, "chat_template_kwargs": {"enable_thinking": false},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}))
        .expect("valid");
        assert!(!request.add_generation_prompt);
        assert_eq!(
            request.template.tools.map(|t| t.names()),
            Some(vec!["f".into()])
        );
        assert_eq!(
            request.template.kwargs,
            json!({"enable_thinking": false}).as_object().cloned()
        );
        for (body, param) in [
            (json!({}), "messages"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": "Hi"}), "messages"),
            (
                json!({"messages": [{"role": "x", "content": "Hi"}]}),
                "messages[0].role",
            ),
            (json!({"messages": [], "prompt": "Hi"}), "prompt"),
            (
                json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": 1}),
                "add_generation_prompt",
            ),
        ] {
            let error = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!(error.param(), Some(param), "{body}: {error}");
        }
    }

    #[test]
    fn detokenize_takes_ids() {
        let parse = |body: Value| parse_detokenize_request(body.to_string().as_bytes(), &limits());
        let ids = |d: Detokenize| (d.tokens, d.skip_special_tokens);
        assert_eq!(
            ids(parse(json!({"tokens": [1, 2]})).expect("valid")),
            (vec![1, 2], true)
        );
        assert_eq!(
            ids(parse(json!({"tokens": [], "skip_special_tokens": false})).expect("valid")),
            (vec![], false)
        );
        let named = parse(json!({"model": "m", "tokens": [3]})).expect("valid");
        assert_eq!(named.model.as_deref(), Some("m"));
        let other = parse(json!({"model": "x", "tokens": [3]})).expect_err("not served");
        assert_eq!(other.kind(), "model_not_found");
        for (body, param) in [
            (json!({}), "tokens"),
            (json!({"tokens": [-1]}), "tokens[0]"),
            (json!({"tokens": "12"}), "tokens"),
        ] {
            let error = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!(error.param(), Some(param), "{body}: {error}");
        }
    }
}

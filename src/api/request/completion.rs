//! The `POST /v1/completions` body (legacy text completions): one prompt and the few
//! parameters only this route has.

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::chat::MAX_TOP_LOGPROBS;
use super::{
    n_predict, object_of, read, refuse_unsupported, require, validate, RequestLimits,
    ValidatedRequest, WireCommon, COMMON,
};
use crate::engine::Prompt;
use crate::error::ApiError;

/// Completions parameters we know beyond [`COMMON`]. Anything else is refused.
const COMPLETION_KNOWN: &[&str] = &["prompt", "echo", "suffix", "best_of"];

#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = CompletionParameters)]
pub(super) struct WireCompletion {
    #[schema(schema_with = prompt_schema)]
    prompt: WirePrompt,
    /// The answer's text starts with the prompt.
    #[serde(default)]
    echo: Option<bool>,
    /// Alternatives to list beside each picked token (read as a JSON value: the check
    /// and its message are [`top_logprobs`]'s).
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 0, maximum = 20)]
    logprobs: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WirePrompt {
    One(String),
    Many(Vec<Value>),
}

/// `prompt`'s schema, written out: the derive cannot bound the strings inside an
/// untagged enum's variants. One non-empty text or token-id list, or a list of one.
fn prompt_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
    let text = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
    };
    let ids = || {
        ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0))
                    .maximum(Some(u32::MAX)),
            )
            .min_items(Some(1))
    };
    let one_of = |item: utoipa::openapi::schema::Schema| {
        ArrayBuilder::new()
            .items(utoipa::openapi::RefOr::T(item))
            .min_items(Some(1))
            .max_items(Some(1))
    };
    OneOfBuilder::new()
        .item(text())
        .item(ids())
        .item(one_of(text().into()))
        .item(one_of(ids().into()))
        .description(Some(
            "The prompt: one text or one list of token ids (read as they are: no BOS is \
             added), or a list of one (one prompt per request).",
        ))
        .build()
        .into()
}

/// The prompt a `prompt` field names: one text or one list of token ids, bare or in a
/// list of one. Anything else is refused naming `prompt`.
fn prompt_of(wire: WirePrompt) -> Result<Prompt, ApiError> {
    let ids = token_ids;
    let prompt = match wire {
        WirePrompt::One(text) => Prompt::Text(text),
        WirePrompt::Many(items) => match items.as_slice() {
            [Value::String(text)] => Prompt::Text(text.clone()),
            [Value::Array(inner)] => Prompt::Tokens(ids(inner).ok_or_else(not_ids)?),
            [] => return Err(ApiError::invalid("prompt", "must not be empty")),
            [Value::String(_) | Value::Array(_), _, ..] => {
                return Err(ApiError::unsupported(
                    "prompt",
                    "one prompt per request (send a string or a list of token ids, or a list \
                     of one)",
                ))
            }
            items => Prompt::Tokens(ids(items).ok_or_else(not_ids)?),
        },
    };
    match &prompt {
        Prompt::Text(text) if text.is_empty() => {
            Err(ApiError::invalid("prompt", "must not be empty"))
        }
        Prompt::Tokens(ids) if ids.is_empty() => {
            Err(ApiError::invalid("prompt", "must not be empty"))
        }
        _ => Ok(prompt),
    }
}

/// A JSON list as token ids; `None` when an item is not one (a whole number that fits).
pub(crate) fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn not_ids() -> ApiError {
    ApiError::invalid(
        "prompt",
        "must be a string, a list of token ids (whole numbers from 0), or a list of one",
    )
}

/// Parses and validates a `POST /v1/completions` body (legacy text completions).
pub fn parse_completion_request(
    body: &[u8],
    limits: &RequestLimits,
    request_id: &str,
) -> Result<ValidatedRequest, ApiError> {
    let mut object = object_of(body, &[COMMON, COMPLETION_KNOWN], limits)?;
    n_predict(&mut object)?;
    refuse_unsupported(&object)?;
    let get = |key: &str| object.get(key).filter(|v| !v.is_null());
    if get("suffix").is_some_and(|v| v.as_str() != Some("")) {
        return Err(ApiError::unsupported("suffix", "insertion is not served"));
    }
    if get("best_of").is_some_and(|v| v.as_u64() != Some(1)) {
        return Err(ApiError::unsupported(
            "best_of",
            "only best_of = 1 is served",
        ));
    }
    require(&object, &["model", "prompt"])?;
    let common: WireCommon = read(&object)?;
    let completion: WireCompletion = read(&object)?;
    let top_logprobs = completion
        .logprobs
        .as_ref()
        .filter(|v| !v.is_null())
        .map(top_logprobs)
        .transpose()?;
    limits.model(&common.model)?;
    let prompt = prompt_of(completion.prompt)?;
    let echo = completion.echo.unwrap_or(false);
    if echo && matches!(prompt, Prompt::Tokens(_)) {
        return Err(ApiError::unsupported(
            "echo",
            "echo sends the prompt's text back; send the prompt as text",
        ));
    }
    if echo && top_logprobs.is_some() {
        return Err(ApiError::unsupported(
            "echo",
            "echo with logprobs needs the prompt's log-probabilities, which the engine does \
             not compute; ask for one or the other",
        ));
    }
    let budget = ("max_tokens", common.max_tokens);
    let mut request = validate(common, prompt, budget, limits, request_id)?;
    // Neither is in the input hash: they do not change the answer.
    request.generation.top_logprobs = top_logprobs;
    request.echo = echo;
    Ok(request)
}

/// The legacy `logprobs`: how many alternatives to list beside each picked token (0 to
/// 20; OpenAI allows 5, vLLM 20).
fn top_logprobs(value: &Value) -> Result<u8, ApiError> {
    match value.as_u64() {
        Some(n) if n <= u64::from(MAX_TOP_LOGPROBS) => Ok(n as u8),
        Some(n) => Err(ApiError::invalid(
            "logprobs",
            format!("{n} is more than {MAX_TOP_LOGPROBS}"),
        )),
        None => Err(ApiError::invalid(
            "logprobs",
            "must be an integer from 0 to 20 (the alternatives to list per token)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse_chat_request;
    use super::super::tests::limits;
    use super::*;

    #[test]
    fn completions_take_a_prompt_and_refuse_what_they_cannot_do() {
        let parse =
            |body: Value| parse_completion_request(body.to_string().as_bytes(), &limits(), "r");
        let request =
            parse(json!({"model": "m", "prompt": "Once upon", "max_tokens": 5, "seed": 3}))
                .expect("valid");
        assert_eq!(request.generation.prompt, Prompt::Text("Once upon".into()));
        assert_eq!(request.generation.budget, crate::engine::Budget::Asked(5));
        let listed = parse(json!({"model": "m", "prompt": ["Once upon"]})).expect("a list of one");
        assert_eq!(listed.generation.prompt, Prompt::Text("Once upon".into()));
        let chat = parse_chat_request(
            json!({"model": "m", "messages": [{"role": "user", "content": "Once upon"}]})
                .to_string()
                .as_bytes(),
            &limits(),
            "r",
        )
        .expect("valid");
        assert_ne!(
            listed.input_hash, chat.input_hash,
            "a raw prompt is not a chat"
        );
        assert_eq!((listed.echo, listed.generation.top_logprobs), (false, None));
        // Token ids, bare or in a list of one, read as they are.
        let ids = parse(json!({"model": "m", "prompt": [1, 2, 3]})).expect("token ids");
        assert_eq!(ids.generation.prompt, Prompt::Tokens(vec![1, 2, 3]));
        let listed_ids =
            parse(json!({"model": "m", "prompt": [[1, 2, 3]]})).expect("a list of one");
        assert_eq!(listed_ids.input_hash, ids.input_hash);
        let digits = parse(json!({"model": "m", "prompt": "1,2,3"})).expect("text");
        assert_ne!(ids.input_hash, digits.input_hash, "ids are not text");
        let echoed = parse(json!({"model": "m", "prompt": "x", "echo": true})).expect("echo alone");
        assert!(echoed.echo);
        let scored =
            parse(json!({"model": "m", "prompt": "x", "logprobs": 0})).expect("logprobs 0");
        assert_eq!(
            scored.generation.top_logprobs,
            Some(0),
            "0: the picked tokens' only"
        );
        let five = parse(json!({"model": "m", "prompt": "x", "logprobs": 5, "echo": false}));
        assert_eq!(five.expect("valid").generation.top_logprobs, Some(5));
        let plain = parse(json!({"model": "m", "prompt": "x"})).expect("valid");
        assert_eq!(
            (scored.input_hash, echoed.input_hash),
            (plain.input_hash.clone(), plain.input_hash),
            "neither changes the answer"
        );
        let cases = [
            (json!({"model": "m"}), "invalid_value", "prompt"),
            (
                json!({"model": "m", "prompt": ""}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": ["a", "b"]}),
                "unsupported_parameter",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": [[1, 2], [3]]}),
                "unsupported_parameter",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": []}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": [[]]}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": [1, -2]}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": [1.5]}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": [4_294_967_296_u64]}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": [1, "a"]}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": [1, 2], "echo": true}),
                "unsupported_parameter",
                "echo",
            ),
            (
                json!({"model": "m", "prompt": "x", "echo": true, "logprobs": 1}),
                "unsupported_parameter",
                "echo",
            ),
            (
                json!({"model": "m", "prompt": "x", "logprobs": 21}),
                "invalid_value",
                "logprobs",
            ),
            (
                json!({"model": "m", "prompt": "x", "logprobs": true}),
                "invalid_value",
                "logprobs",
            ),
            (
                json!({"model": "m", "prompt": "x", "suffix": "y"}),
                "unsupported_parameter",
                "suffix",
            ),
            (
                json!({"model": "m", "prompt": "x", "best_of": 2}),
                "unsupported_parameter",
                "best_of",
            ),
            (
                json!({"model": "m", "prompt": "x", "messages": []}),
                "unknown_parameter",
                "messages",
            ),
            (
                json!({"model": "m", "prompt": "x", "max_tokens": 0}),
                "invalid_value",
                "max_tokens",
            ),
        ];
        for (body, kind, param) in cases {
            let error = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!((error.kind(), error.param()), (kind, Some(param)), "{body}");
        }
    }
}

//! The `POST /v1/completions` body (legacy text completions): a prompt (or a batch of
//! them) and the few parameters only this route has.

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::chat::MAX_TOP_LOGPROBS;
use super::{
    n_predict, object_of, read, refuse_unsupported, require, validate, Agentic, RequestLimits,
    ValidatedRequest, WireCommon, COMMON, MAX_PROMPTS,
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
/// untagged enum's variants. One non-empty text or token-id list, or a list of them.
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
    let batch = ArrayBuilder::new()
        .items(utoipa::openapi::RefOr::T(
            OneOfBuilder::new().item(text()).item(ids()).build().into(),
        ))
        .min_items(Some(1))
        .max_items(Some(MAX_PROMPTS));
    OneOfBuilder::new()
        .item(text())
        .item(ids())
        .item(batch)
        .description(Some(
            "The prompt: one text or one list of token ids (read as they are: no BOS is \
             added), or a list of them: a batch, each prompt answered with its own `n` \
             choices (choice `index` = prompt's place × n + choice).",
        ))
        .build()
        .into()
}

/// The prompts a `prompt` field names: one text or one list of token ids, or a list of
/// them (a batch, each answered with its own choices). Anything else is refused naming
/// `prompt`.
fn prompts_of(wire: WirePrompt) -> Result<Vec<Prompt>, ApiError> {
    let prompts = match wire {
        WirePrompt::One(text) => vec![Prompt::Text(text)],
        WirePrompt::Many(items) if items.iter().all(Value::is_number) => {
            vec![Prompt::Tokens(token_ids(&items).ok_or_else(not_ids)?)]
        }
        WirePrompt::Many(items) => {
            super::batch_fits(items.len())?;
            let not_a_prompt = |i: usize| {
                ApiError::invalid(
                    format!("prompt[{i}]"),
                    "must be a string or a list of token ids (whole numbers from 0)",
                )
            };
            items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(text) => Ok(Prompt::Text(text.clone())),
                    Value::Array(ids) => token_ids(ids)
                        .map(Prompt::Tokens)
                        .ok_or_else(|| not_a_prompt(i)),
                    _ => Err(not_a_prompt(i)),
                })
                .collect::<Result<_, _>>()?
        }
    };
    let empty = |prompt: &Prompt| match prompt {
        Prompt::Text(text) => text.is_empty(),
        Prompt::Tokens(ids) => ids.is_empty(),
        Prompt::Chat(_) => false,
    };
    match prompts.iter().position(empty) {
        _ if prompts.is_empty() => Err(ApiError::invalid("prompt", "must not be empty")),
        Some(0) if prompts.len() == 1 => Err(ApiError::invalid("prompt", "must not be empty")),
        Some(i) => Err(ApiError::invalid(
            format!("prompt[{i}]"),
            "must not be empty",
        )),
        None => Ok(prompts),
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
        "must be a string, a list of token ids (whole numbers from 0), or a list of strings \
         and token-id lists (a batch)",
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
    let mut prompts = prompts_of(completion.prompt)?.into_iter();
    let prompt = prompts.next().ok_or(ApiError::Internal)?;
    let more_prompts: Vec<Prompt> = prompts.collect();
    let echo = completion.echo.unwrap_or(false);
    if echo
        && std::iter::once(&prompt)
            .chain(&more_prompts)
            .any(|p| matches!(p, Prompt::Tokens(_)))
    {
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
    let mut request = validate(
        common,
        prompt,
        Agentic::default(),
        budget,
        limits,
        request_id,
    )?;
    // Neither is in the input hash: they do not change the answer.
    request.generation.top_logprobs = top_logprobs;
    request.echo = echo;
    if !more_prompts.is_empty() && request.continuous_usage {
        return Err(ApiError::invalid(
            "stream_options.continuous_usage_stats",
            "is served with one prompt only (each prompt counts its own tokens)",
        ));
    }
    request.more_prompts = more_prompts;
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
        assert!(ids.more_prompts.is_empty() && listed_ids.more_prompts.is_empty());
        // A batch: texts and token-id lists, each a prompt of its own.
        let batch = parse(json!({"model": "m", "prompt": ["a", [1, 2], "b"]})).expect("batch");
        assert_eq!(batch.generation.prompt, Prompt::Text("a".into()));
        assert_eq!(
            batch.more_prompts,
            [Prompt::Tokens(vec![1, 2]), Prompt::Text("b".into())]
        );
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
                json!({"model": "m", "prompt": ["a", ""]}),
                "invalid_value",
                "prompt[1]",
            ),
            (
                json!({"model": "m", "prompt": ["a", 1]}),
                "invalid_value",
                "prompt[1]",
            ),
            (
                json!({"model": "m", "prompt": [[1], [-1]]}),
                "invalid_value",
                "prompt[1]",
            ),
            (
                json!({"model": "m", "prompt": vec!["a"; MAX_PROMPTS + 1]}),
                "invalid_value",
                "prompt",
            ),
            (
                json!({"model": "m", "prompt": ["a", [1]], "echo": true}),
                "unsupported_parameter",
                "echo",
            ),
            (
                json!({"model": "m", "prompt": ["a", "b"], "stream": true,
                       "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
                "invalid_value",
                "stream_options.continuous_usage_stats",
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
                "prompt[0]",
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

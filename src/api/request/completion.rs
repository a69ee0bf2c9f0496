//! The `POST /v1/completions` body (legacy text completions): one prompt and the few
//! parameters only this route has.

use serde::Deserialize;
use serde_json::Value;

use super::{
    object_of, read, refuse_unsupported, require, validate, RequestLimits, ValidatedRequest,
    WireCommon, COMMON,
};
use crate::engine::Prompt;
use crate::error::ApiError;

/// Completions parameters we know beyond [`COMMON`]. Anything else is refused.
const COMPLETION_KNOWN: &[&str] = &["prompt", "echo", "suffix", "best_of"];

#[derive(Debug, Deserialize)]
struct WireCompletion {
    prompt: WirePrompt,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WirePrompt {
    One(String),
    Many(Vec<Value>),
}

/// Parses and validates a `POST /v1/completions` body (legacy text completions).
pub fn parse_completion_request(
    body: &[u8],
    limits: &RequestLimits,
    request_id: &str,
) -> Result<ValidatedRequest, ApiError> {
    let object = object_of(body, &[COMMON, COMPLETION_KNOWN], limits)?;
    refuse_unsupported(&object)?;
    let get = |key: &str| object.get(key).filter(|v| !v.is_null());
    if get("logprobs").is_some_and(|v| v.as_u64() != Some(0)) {
        return Err(ApiError::unsupported(
            "logprobs",
            "log probabilities are returned on chat completions only",
        ));
    }
    if get("echo").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ApiError::unsupported("echo", "the prompt is not echoed"));
    }
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
    if common.model != limits.served_model {
        return Err(ApiError::ModelNotFound(common.model));
    }
    let text = match completion.prompt {
        WirePrompt::One(text) => text,
        WirePrompt::Many(items) => match items.as_slice() {
            [Value::String(text)] => text.clone(),
            [] => return Err(ApiError::invalid("prompt", "must not be empty")),
            [Value::String(_), ..] => {
                return Err(ApiError::unsupported(
                    "prompt",
                    "one prompt per request (send a string, or a list of one)",
                ))
            }
            _ => {
                return Err(ApiError::unsupported(
                    "prompt",
                    "token-id prompts are not served; send text",
                ))
            }
        },
    };
    if text.is_empty() {
        return Err(ApiError::invalid("prompt", "must not be empty"));
    }
    let budget = ("max_tokens", common.max_tokens);
    validate(common, Prompt::Text(text), budget, limits, request_id)
}

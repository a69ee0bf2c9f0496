//! The sentences clients read in `error.message`, in OpenAI's wording where OpenAI has
//! one.

use std::time::Duration;

use crate::auth::limits::{reset_text, Unit};

/// The client's sentence for each upstream fault.
pub(super) fn upstream_message(kind: &str) -> &'static str {
    match kind {
        "upstream_unreachable" => "The model server behind this gateway cannot be reached; retry shortly",
        "upstream_auth_failed" => "The model server behind this gateway refused the gateway's credentials; the operator has to fix its API key",
        "upstream_rate_limited" => "The model server behind this gateway is rate-limiting; retry after the time Retry-After says",
        "upstream_timeout" => "The model server behind this gateway sent nothing within its timeout",
        "upstream_stream_cut" => "The model server behind this gateway ended its stream before the answer was complete",
        "upstream_protocol_error" => "The model server behind this gateway answered in a format the gateway cannot read",
        "upstream_model_mismatch" => "The model server behind this gateway answered as another model than the one configured; the answer was stopped",
        _ => "The model server behind this gateway failed; the error was logged with the request id",
    }
}

/// OpenAI's wording, with the completion's share when the client's budget is the excess.
pub(super) fn context_message(
    prompt_tokens: u32,
    max_tokens: Option<u32>,
    context_length: u32,
    prompt: &str,
) -> String {
    match max_tokens {
        Some(completion) => format!(
            "This model's maximum context length is {context_length} tokens. However, you requested {} tokens ({prompt_tokens} in the {prompt}, {completion} in the completion). Please reduce the length of the {prompt} or completion.",
            u64::from(prompt_tokens) + u64::from(completion)
        ),
        None => {
            let have = if prompt == "messages" { "have" } else { "has" };
            format!(
                "This model's maximum context length is {context_length} tokens, but the {prompt} {have} {prompt_tokens} tokens"
            )
        }
    }
}

/// OpenAI's wording: "Rate limit reached ... on tokens per min (TPM): Limit 600, Requested 700."
pub(super) fn rate_message(
    unit: Unit,
    limit: u32,
    requested: u32,
    retry_after: Option<Duration>,
) -> String {
    let per_min = match unit {
        Unit::Requests => "requests per min (RPM)",
        Unit::Tokens => "tokens per min (TPM)",
    };
    match retry_after {
        Some(wait) => format!(
            "Rate limit reached for this API key on {per_min}: Limit {limit}, Requested {requested}. Please try again in {}.",
            reset_text(wait)
        ),
        None => format!(
            "Request too large for this API key on {per_min}: Limit {limit}, Requested {requested} (the prompt's tokens and max_tokens). Lower max_tokens or shorten the messages."
        ),
    }
}

pub(super) fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

//! The sentences clients read in `error.message`, in OpenAI's wording where OpenAI has
//! one.

use std::time::Duration;

use super::RateUnit;
use crate::engine::upstream::fault::FaultKind;

/// The client's sentence for each upstream fault.
pub(super) fn upstream_message(kind: &FaultKind) -> &'static str {
    match kind {
        FaultKind::Unreachable => "The model server behind this gateway cannot be reached; retry shortly",
        FaultKind::AuthFailed => "The model server behind this gateway refused the gateway's credentials; the operator has to fix its API key",
        FaultKind::RateLimited => "The model server behind this gateway is rate-limiting; retry after the time Retry-After says",
        FaultKind::Timeout => "The model server behind this gateway sent nothing within its timeout",
        FaultKind::StreamCut => "The model server behind this gateway ended its stream before the answer was complete",
        FaultKind::ProtocolError => "The model server behind this gateway answered in a format the gateway cannot read",
        FaultKind::ModelMismatch => "The model server behind this gateway answered as another model than the one configured; the answer was stopped",
        FaultKind::Error | FaultKind::InvalidRequest => "The model server behind this gateway failed; the error was logged with the request id",
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
    unit: RateUnit,
    limit: u32,
    requested: u32,
    retry_after: Option<Duration>,
) -> String {
    let per_min = match unit {
        RateUnit::Requests => "requests per min (RPM)",
        RateUnit::Tokens => "tokens per min (TPM)",
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

/// A duration as OpenAI writes its reset headers: `20ms`, `1.5s`, `6m0s`, `1h2m3s`.
pub fn reset_text(reset: Duration) -> String {
    let ms = reset.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let hours = ms / 3_600_000;
    let minutes = ms / 60_000 % 60;
    let seconds = (ms % 60_000) as f64 / 1000.0;
    // Whole seconds print without a fraction ("6m0s"), others with up to three digits.
    let seconds = format!("{seconds:.3}");
    let seconds = seconds.trim_end_matches('0').trim_end_matches('.');
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_text_is_written_like_openai_writes_it() {
        let cases = [
            (Duration::from_millis(20), "20ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(360), "6m0s"),
            (Duration::from_millis(61_250), "1m1.25s"),
            (Duration::from_secs(3723), "1h2m3s"),
        ];
        for (duration, text) in cases {
            assert_eq!(reset_text(duration), text);
        }
    }
}

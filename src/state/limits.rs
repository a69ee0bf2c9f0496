//! Per-key limits in Redis: the same GCRA buckets as [`crate::auth::limits`], shared by
//! every gateway, each request checked against the key's quotas ([`super::quota`]) and
//! charged in one call of `limits.lua` ([`super::budget`] makes the call); here, the
//! script and what its answer means.
//!
//! A bucket's key is `<prefix>:limit:{<key id>}:<rpm|tpm>:<limit>`: the braces put a
//! key's buckets in one Redis Cluster slot, and the limit in the name starts a new bucket
//! when the keys file changes it (as the in-process limits do). A bucket expires a
//! second after it is full again, so Redis holds only the keys used in the last minute.

use std::num::NonZeroU32;
use std::sync::LazyLock;
use std::time::Duration;

use crate::auth::limits::{RateHeaders, Refusal, Window};
use crate::error::RateUnit;

pub(super) static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("limits.lua")));

/// The charging script, for the watcher to load ahead of the requests.
pub(super) fn script() -> &'static redis::Script {
    &SCRIPT
}

/// One limit's line of the script's answer: `{outcome, remaining, retry_us}`.
pub(super) type Line = (i64, i64, i64);

const CHARGED: i64 = 1;
const REFUSED: i64 = 0;
const NEVER_FITS: i64 = -1;

/// The answer's one line when a quota is spent or held:
/// `{-2, quota's place, used, held}`.
pub(super) const QUOTA_SPENT: i64 = -2;

/// The window of a limit of `limit` per minute with `remaining` left.
fn window(limit: NonZeroU32, remaining: i64) -> Window {
    let remaining = u32::try_from(remaining.max(0))
        .unwrap_or(u32::MAX)
        .min(limit.get());
    Window {
        limit: limit.get(),
        remaining,
        reset: Duration::from_secs(60) / limit.get() * (limit.get() - remaining),
    }
}

/// The script's answer as the headers or the refusal the in-process limits give.
pub(super) fn outcome(
    meters: &[(RateUnit, NonZeroU32, u32)],
    lines: &[Line],
) -> Result<RateHeaders, Refusal> {
    let mut headers = RateHeaders::default();
    let mut refusal = None;
    for (&(unit, limit, cost), &(result, remaining, retry_us)) in meters.iter().zip(lines) {
        let retry_after = Duration::from_micros(u64::try_from(retry_us).unwrap_or(0));
        let mut shown = window(limit, remaining);
        if result == REFUSED && unit == RateUnit::Requests {
            // As one gateway says it: nothing left until the refused request would pass.
            shown = Window {
                reset: retry_after + Duration::from_secs(60) / limit.get() * (limit.get() - 1),
                ..window(limit, 0)
            };
        }
        match unit {
            RateUnit::Requests => headers.requests = Some(shown),
            RateUnit::Tokens => headers.tokens = Some(shown),
        }
        if refusal.is_none() {
            refusal = match result {
                REFUSED => Some((unit, limit.get(), cost, Some(retry_after))),
                NEVER_FITS => Some((unit, limit.get(), cost, None)),
                _ => None,
            };
        }
        debug_assert!(
            result == CHARGED || refusal.is_some(),
            "untried after a pass"
        );
    }
    match refusal {
        None => Ok(headers),
        Some((unit, limit, requested, Some(retry_after))) => Err(Refusal::Exhausted {
            unit,
            limit,
            requested,
            retry_after,
            headers,
        }),
        Some((_, limit, requested, None)) => Err(Refusal::TooLarge {
            limit,
            requested,
            headers,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RPM: NonZeroU32 = NonZeroU32::new(3).unwrap();
    const TPM: NonZeroU32 = NonZeroU32::new(600).unwrap();

    #[test]
    fn a_pass_gives_both_windows() {
        let meters = [(RateUnit::Requests, RPM, 1), (RateUnit::Tokens, TPM, 450)];
        let headers = outcome(&meters, &[(1, 2, 0), (1, 150, 0)]).expect("passed");
        let requests = headers.requests.expect("requests");
        assert_eq!(
            (requests.remaining, requests.reset),
            (2, Duration::from_secs(20))
        );
        let tokens = headers.tokens.expect("tokens");
        assert_eq!(
            (tokens.remaining, tokens.reset),
            (150, Duration::from_secs(45))
        );
    }

    #[test]
    fn a_refused_request_says_when_it_passes() {
        let meters = [(RateUnit::Requests, RPM, 1), (RateUnit::Tokens, TPM, 10)];
        let Err(Refusal::Exhausted {
            unit,
            retry_after,
            headers,
            ..
        }) = outcome(&meters, &[(0, 0, 20_000_000), (2, 600, 0)])
        else {
            panic!("refused");
        };
        assert_eq!(
            (unit, retry_after),
            (RateUnit::Requests, Duration::from_secs(20))
        );
        let requests = headers.requests.expect("requests");
        // As one gateway says it: the refused request's wait, then the rest of the limit.
        assert_eq!(
            (requests.remaining, requests.reset),
            (0, Duration::from_secs(60))
        );
        assert_eq!(
            headers.tokens.map(|w| w.remaining),
            Some(600),
            "as it stands"
        );
    }

    #[test]
    fn tokens_over_the_limit_never_pass() {
        let meters = [(RateUnit::Requests, RPM, 1), (RateUnit::Tokens, TPM, 601)];
        let refused = outcome(&meters, &[(1, 2, 0), (-1, 600, 0)]);
        assert!(matches!(
            refused,
            Err(Refusal::TooLarge {
                limit: 600,
                requested: 601,
                ..
            })
        ));
    }
}

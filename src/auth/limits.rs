//! Per-key rate limits: requests per minute and tokens per minute.
//!
//! Each key has a [`KeyBudget`]: one GCRA limiter ([`governor`]) per limit it has. A request
//! is charged when the gateway knows what it will cost, after its prompt is counted and
//! before it waits for the engine: one request, and its prompt's tokens plus its
//! completion budget (`max_tokens` after it is fitted to the context), which is how
//! OpenAI counts tokens against a limit. A refused request still counts as a request.
//!
//! The outcome of a charge is [`RateHeaders`]: OpenAI's `x-ratelimit-*` headers, which
//! every answer to a charged request carries, refusals included.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use governor::clock::{Clock, Reference};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::clock::SharedClock;
use crate::error::messages::reset_text;
use crate::error::{ApiError, RateUnit};

/// The gateway's [`crate::clock::Clock`] as governor's clock: limits run on the time
/// the server is given, so a test drives them with a `ManualClock` and asserts exact
/// figures instead of racing the refill.
#[derive(Debug, Clone)]
pub struct LimitClock(pub SharedClock);

impl Clock for LimitClock {
    // Readings are offsets from the clock's origin; governor does its maths on them.
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.0.now()
    }
}

/// A key's limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub requests_per_minute: Option<NonZeroU32>,
    pub tokens_per_minute: Option<NonZeroU32>,
}

impl Limits {
    pub fn is_unlimited(&self) -> bool {
        self.requests_per_minute.is_none() && self.tokens_per_minute.is_none()
    }
}

/// One limit after a charge, as the `x-ratelimit-*` headers give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The limit per minute.
    pub limit: u32,
    /// What could still be charged now.
    pub remaining: u32,
    /// Time until the whole limit is available again.
    pub reset: Duration,
}

/// The `x-ratelimit-*` headers of a charged request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    pub requests: Option<Window>,
    pub tokens: Option<Window>,
}

impl RateHeaders {
    /// Adds OpenAI's headers: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (unit, window) in [("requests", self.requests), ("tokens", self.tokens)] {
            let Some(w) = window else { continue };
            let values = [
                ("limit", w.limit.to_string()),
                ("remaining", w.remaining.to_string()),
                ("reset", reset_text(w.reset)),
            ];
            for (what, value) in values {
                let name = format!("x-ratelimit-{what}-{unit}");
                if let (Ok(name), Ok(value)) = (
                    HeaderName::try_from(name),
                    HeaderValue::try_from(value.as_str()),
                ) {
                    headers.insert(name, value);
                }
            }
        }
    }
}

/// Why a charge was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The limit is spent for now; `retry_after` is when the charge would pass.
    Exhausted {
        unit: RateUnit,
        limit: u32,
        requested: u32,
        retry_after: Duration,
        headers: RateHeaders,
    },
    /// The request costs more tokens than the limit allows in a minute: it never passes.
    TooLarge {
        limit: u32,
        requested: u32,
        headers: RateHeaders,
    },
    /// The limits are shared and the shared state did not answer, with
    /// `state.on_failure = "fail_closed"`.
    Unavailable,
    /// A token quota of the key is used up, or held by its requests in flight
    /// ([`super::quota`]).
    QuotaSpent(super::quota::Spent),
}

impl Refusal {
    pub fn headers(&self) -> RateHeaders {
        match self {
            Refusal::Exhausted { headers, .. } | Refusal::TooLarge { headers, .. } => *headers,
            Refusal::Unavailable | Refusal::QuotaSpent(_) => RateHeaders::default(),
        }
    }
}

type Limiter<C> = RateLimiter<NotKeyed, InMemoryState, C, StateInformationMiddleware>;

/// One limit: its limiter and its size.
struct Meter<C: Clock + Clone> {
    limiter: Limiter<C>,
    quota: Quota,
    /// When the last charge passed and what it left: governor tells what is left only
    /// when a charge passes, and a refusal's headers still need it. Written after the
    /// charge, not with it, so two charges at once may store out of order; that moves a
    /// refusal's `remaining` by a cell or so, fine for a header (the limit itself is
    /// governor's, exact).
    last: Mutex<Option<(C::Instant, u32)>>,
}

impl<C: Clock + Clone> Meter<C> {
    fn new(per_minute: NonZeroU32, clock: &C) -> Self {
        let quota = Quota::per_minute(per_minute);
        Self {
            limiter: RateLimiter::direct_with_clock(quota, clock.clone())
                .with_middleware::<StateInformationMiddleware>(),
            quota,
            last: Mutex::new(None),
        }
    }

    fn limit(&self) -> u32 {
        self.quota.burst_size().get()
    }

    /// Time until `remaining` is back to the whole limit.
    fn refill(&self, remaining: u32) -> Duration {
        self.quota.replenish_interval() * (self.limit() - remaining.min(self.limit()))
    }

    /// What is left now, without charging: the last passed charge's remainder, refilled
    /// at the rate since; the whole limit before any charge passed.
    fn remaining_now(&self, clock: &C) -> u32 {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        let Some((at, left)) = last else {
            return self.limit();
        };
        let elapsed = Duration::from(clock.now().duration_since(at));
        let interval = self.quota.replenish_interval().as_nanos().max(1);
        let refilled = u32::try_from(elapsed.as_nanos() / interval).unwrap_or(u32::MAX);
        left.saturating_add(refilled).min(self.limit())
    }

    /// The window as it stands now, for a refused request.
    fn window_now(&self, clock: &C) -> Window {
        self.window(self.remaining_now(clock))
    }

    fn window(&self, remaining: u32) -> Window {
        Window {
            limit: self.limit(),
            remaining,
            reset: self.refill(remaining),
        }
    }

    /// Charges `n` cells: the window after it, or when it could pass (`None`: never).
    fn charge(&self, n: u32, clock: &C) -> Result<Window, Option<Duration>> {
        // Every request costs at least one of each unit.
        let n = NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
        match self.limiter.check_n(n) {
            Ok(Ok(snapshot)) => {
                let remaining = snapshot.remaining_burst_capacity();
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((clock.now(), remaining));
                Ok(self.window(remaining))
            }
            Ok(Err(not_until)) => Err(Some(not_until.wait_time_from(clock.now()))),
            Err(_insufficient) => Err(None),
        }
    }
}

/// The limiters of one key, kept while the key and its limits stay in the keys file.
pub struct KeyBudget<C: Clock + Clone = LimitClock> {
    limits: Limits,
    requests: Option<Meter<C>>,
    tokens: Option<Meter<C>>,
    clock: C,
}

impl<C: Clock + Clone> std::fmt::Debug for KeyBudget<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyBudget")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<C: Clock + Clone> KeyBudget<C> {
    pub fn with_clock(limits: Limits, clock: C) -> Self {
        Self {
            limits,
            requests: limits.requests_per_minute.map(|n| Meter::new(n, &clock)),
            tokens: limits.tokens_per_minute.map(|n| Meter::new(n, &clock)),
            clock,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Charges one request of `tokens` tokens against the key's limits.
    pub fn charge(&self, tokens: u32) -> Result<RateHeaders, Refusal> {
        let mut headers = RateHeaders::default();
        if let Some(meter) = &self.requests {
            match meter.charge(1, &self.clock) {
                Ok(window) => headers.requests = Some(window),
                Err(retry_after) => {
                    // A limit of at least one request always fits one request.
                    let retry_after = retry_after.unwrap_or_default();
                    headers.requests = Some(Window {
                        reset: retry_after + meter.refill(1),
                        ..meter.window(0)
                    });
                    headers.tokens = self.tokens.as_ref().map(|t| t.window_now(&self.clock));
                    return Err(Refusal::Exhausted {
                        unit: RateUnit::Requests,
                        limit: meter.limit(),
                        requested: 1,
                        retry_after,
                        headers,
                    });
                }
            }
        }
        if let Some(meter) = &self.tokens {
            match meter.charge(tokens, &self.clock) {
                Ok(window) => headers.tokens = Some(window),
                Err(when) => {
                    headers.tokens = Some(meter.window_now(&self.clock));
                    return Err(match when {
                        Some(retry_after) => Refusal::Exhausted {
                            unit: RateUnit::Tokens,
                            limit: meter.limit(),
                            requested: tokens,
                            retry_after,
                            headers,
                        },
                        None => Refusal::TooLarge {
                            limit: meter.limit(),
                            requested: tokens,
                            headers,
                        },
                    });
                }
            }
        }
        Ok(headers)
    }
}

/// A refusal as the client sees it: 429 with OpenAI's message and, when it will pass,
/// when.
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Exhausted {
                unit,
                limit,
                requested,
                retry_after,
                ..
            } => ApiError::RateLimited {
                unit,
                limit,
                requested,
                retry_after: Some(retry_after),
            },
            Refusal::TooLarge {
                limit, requested, ..
            } => ApiError::RateLimited {
                unit: RateUnit::Tokens,
                limit,
                requested,
                retry_after: None,
            },
            Refusal::Unavailable => ApiError::StateUnavailable,
            Refusal::QuotaSpent(spent) if spent.is_used_up() => ApiError::InsufficientQuota {
                period: spent.period.as_str(),
                limit: spent.limit,
                used: spent.used,
                resets_in: spent.resets_in,
            },
            Refusal::QuotaSpent(spent) => ApiError::QuotaHeld {
                period: spent.period.as_str(),
                limit: spent.limit,
                used: spent.used,
                held: spent.held,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    fn budget(rpm: u32, tpm: u32) -> (KeyBudget<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        let limits = Limits {
            requests_per_minute: NonZeroU32::new(rpm),
            tokens_per_minute: NonZeroU32::new(tpm),
        };
        (KeyBudget::with_clock(limits, clock.clone()), clock)
    }

    #[test]
    fn requests_run_out_and_come_back_at_the_rate() {
        let (budget, clock) = budget(3, 0);
        for remaining in [2, 1, 0] {
            let headers = budget.charge(10).expect("within the limit");
            let w = headers.requests.expect("requests window");
            assert_eq!((w.limit, w.remaining), (3, remaining));
            assert_eq!(w.reset, Duration::from_secs(20) * (3 - remaining));
            assert_eq!(headers.tokens, None, "no token limit");
        }
        let Err(Refusal::Exhausted {
            unit, retry_after, ..
        }) = budget.charge(10)
        else {
            panic!("the fourth request in a minute is refused");
        };
        assert_eq!(unit, RateUnit::Requests);
        assert_eq!(retry_after, Duration::from_secs(20));
        clock.advance(Duration::from_secs(20));
        assert!(budget.charge(10).is_ok(), "one request back after 20 s");
        assert!(budget.charge(10).is_err());
    }

    #[test]
    fn tokens_are_charged_by_the_request_and_a_request_over_the_limit_never_passes() {
        let (budget, clock) = budget(0, 600);
        let headers = budget.charge(450).expect("fits");
        let w = headers.tokens.expect("tokens window");
        assert_eq!((w.limit, w.remaining), (600, 150));
        assert_eq!(w.reset, Duration::from_secs(45));
        let Err(Refusal::Exhausted {
            unit,
            retry_after,
            requested,
            ..
        }) = budget.charge(200)
        else {
            panic!("200 more do not fit in the 150 left");
        };
        assert_eq!((unit, requested), (RateUnit::Tokens, 200));
        assert_eq!(retry_after, Duration::from_secs(5), "50 tokens at 10/s");
        clock.advance(Duration::from_secs(5));
        assert!(budget.charge(200).is_ok());
        assert!(matches!(
            budget.charge(601),
            Err(Refusal::TooLarge {
                limit: 600,
                requested: 601,
                ..
            })
        ));
    }

    #[test]
    fn a_refused_token_charge_still_counts_the_request() {
        let (budget, _clock) = budget(2, 100);
        assert!(matches!(budget.charge(500), Err(Refusal::TooLarge { .. })));
        let headers = budget.charge(10).expect("fits");
        assert_eq!(headers.requests.map(|w| w.remaining), Some(0));
    }

    #[test]
    fn a_refusal_reports_what_is_left_as_it_stands() {
        let (key, clock) = budget(2, 1000);
        key.charge(28).expect("fits");
        key.charge(28).expect("fits");
        let Err(refused) = key.charge(28) else {
            panic!("a third request in the minute is refused");
        };
        let tokens = refused.headers().tokens.expect("the token window too");
        assert_eq!(
            (tokens.remaining, tokens.reset),
            (944, Duration::from_millis(3360))
        );
        clock.advance(Duration::from_secs(30));
        let Err(too_large) = key.charge(5000) else {
            panic!("more than the limit never passes");
        };
        let tokens = too_large.headers().tokens.expect("tokens window");
        assert_eq!(tokens.remaining, 1000, "30 s refilled the 56 used");
        let (small, _clock) = budget(0, 100);
        small.charge(30).expect("fits");
        let Err(Refusal::Exhausted { headers, .. }) = small.charge(90) else {
            panic!("90 do not fit in the 70 left");
        };
        assert_eq!(headers.tokens.map(|w| w.remaining), Some(70));
    }

    #[test]
    fn unlimited_keys_get_no_headers() {
        let (budget, _clock) = budget(0, 0);
        assert_eq!(budget.charge(1_000_000), Ok(RateHeaders::default()));
    }

    #[test]
    fn headers_are_openais() {
        let (budget, _clock) = budget(60, 1000);
        let mut map = HeaderMap::new();
        budget.charge(250).expect("fits").apply(&mut map);
        let get = |name: &str| {
            map.get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(get("x-ratelimit-limit-requests"), "60");
        assert_eq!(get("x-ratelimit-remaining-requests"), "59");
        assert_eq!(get("x-ratelimit-reset-requests"), "1s");
        assert_eq!(get("x-ratelimit-limit-tokens"), "1000");
        assert_eq!(get("x-ratelimit-remaining-tokens"), "750");
        assert_eq!(get("x-ratelimit-reset-tokens"), "15s");
    }
}

//! The keys' limits and quotas in Redis, as the keys ask for them
//! ([`crate::auth::SharedBudget`]): a request checked and charged in one call of the
//! limits script ([`super::limits`]); an answer's tokens added after it ends.
//!
//! A quota's counter is a key per API key and day or month,
//! `<prefix>:quota:{<key id>}:day:2026-12-05` and `...:month:2026-12`; it expires a day
//! after its period ends. The key's requests in flight hold their tokens in
//! `<prefix>:quota:{<key id>}:held` until they end.

use std::num::NonZeroU32;
use std::sync::LazyLock;
use std::time::Duration;

use super::limits::{outcome, Line, QUOTA_SPENT, SCRIPT};
use super::{OnFailure, SharedState};
use crate::auth::limits::{Limits, RateHeaders, Refusal};
use crate::auth::quota::{Calendar, Period, Quotas, Spent};
use crate::auth::{Charged, QuotaCheck, SharedBudget, Unanswered};
use crate::error::RateUnit;

static SPEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("spend.lua")));

/// The spending script, for the watcher to load ahead of the calls.
pub(super) fn spend_script() -> &'static redis::Script {
    &SPEND
}

/// How long spending and reading quotas may take: off a request's path, so longer than
/// its call, but not for ever.
const OFF_PATH_TIMEOUT: Duration = Duration::from_secs(1);

/// A limit: what it counts, its size a minute, and what this request costs.
type Meter = (RateUnit, NonZeroU32, u32);

impl SharedState {
    /// One call of the limits script: each limit's key, size and cost, then each quota's
    /// key and size and the key's holds (this request's hold and how long it lasts).
    fn charge_invocation(
        &self,
        key_id: &str,
        meters: &[Meter],
        counted: &[(Period, u64)],
        quotas: Option<QuotaCheck<'_>>,
        tokens: u32,
    ) -> redis::ScriptInvocation<'static> {
        let mut invocation = SCRIPT.prepare_invoke();
        invocation.arg(meters.len()).arg(counted.len());
        for (unit, limit, cost) in meters {
            let name = match unit {
                RateUnit::Requests => "rpm",
                RateUnit::Tokens => "tpm",
            };
            invocation
                .key(format!(
                    "{}:limit:{{{key_id}}}:{name}:{limit}",
                    self.key_prefix()
                ))
                .arg(limit.get())
                .arg(*cost);
        }
        if let Some(check) = quotas.filter(|_| !counted.is_empty()) {
            for (period, size) in counted {
                invocation
                    .key(self.quota_key(key_id, *period, check.calendar))
                    .arg(*size);
            }
            let lasts = u64::try_from(check.hold_for.as_millis()).unwrap_or(u64::MAX);
            invocation
                .key(self.holds_key(key_id))
                .arg(check.hold_id)
                .arg(tokens)
                .arg(lasts.max(1));
        }
        invocation
    }

    fn quota_key(&self, key_id: &str, period: Period, calendar: &Calendar) -> String {
        format!(
            "{}:quota:{{{key_id}}}:{}:{}",
            self.key_prefix(),
            period.as_str(),
            calendar.name(period)
        )
    }

    fn holds_key(&self, key_id: &str) -> String {
        format!("{}:quota:{{{key_id}}}:held", self.key_prefix())
    }
}

/// The script's answer when a quota refused the request: its one line
/// `{QUOTA_SPENT, quota's place, used, held}`.
fn quota_spent(
    lines: &[Vec<i64>],
    counted: &[(Period, u64)],
    quotas: Option<QuotaCheck<'_>>,
) -> Option<Charged> {
    let ([refused], Some(check)) = (lines, quotas) else {
        return None;
    };
    let [QUOTA_SPENT, j, used, held] = refused[..] else {
        return None;
    };
    let (period, limit) = usize::try_from(j - 1)
        .ok()
        .and_then(|j| counted.get(j).copied())
        .unwrap_or((Period::Day, 0));
    let used = u64::try_from(used).unwrap_or(0);
    Some(Charged {
        outcome: Err(Refusal::QuotaSpent(Spent {
            period,
            limit,
            used,
            held: u64::try_from(held).unwrap_or(0),
            resets_in: check.calendar.ends_in(period),
        })),
        used: vec![(period, used)],
    })
}

#[async_trait::async_trait]
impl SharedBudget for SharedState {
    async fn charge(
        &self,
        key_id: &str,
        limits: Limits,
        quotas: Option<QuotaCheck<'_>>,
        tokens: u32,
    ) -> Result<Charged, Unanswered> {
        let meters: Vec<Meter> = [
            (RateUnit::Requests, limits.requests_per_minute, 1),
            // Every request costs at least one token, as in one gateway.
            (RateUnit::Tokens, limits.tokens_per_minute, tokens.max(1)),
        ]
        .into_iter()
        .filter_map(|(unit, limit, cost)| Some((unit, limit?, cost)))
        .collect();
        let counted: Vec<(Period, u64)> = quotas
            .map(|check| {
                check
                    .quotas
                    .each()
                    .map(|(p, size)| (p, size.get()))
                    .collect()
            })
            .unwrap_or_default();
        if meters.is_empty() && counted.is_empty() {
            return Ok(Charged {
                outcome: Ok(RateHeaders::default()),
                used: Vec::new(),
            });
        }
        let invocation = self.charge_invocation(key_id, &meters, &counted, quotas, tokens);
        let lines: Vec<Vec<i64>> = self
            .call(self.config.timeout, |mut connection| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await?;
        if let Some(spent) = quota_spent(&lines, &counted, quotas) {
            return Ok(spent);
        }
        let lines: Vec<Line> = lines
            .iter()
            .map(|line| match line[..] {
                [outcome, remaining, retry_us] => (outcome, remaining, retry_us),
                _ => (0, 0, 0),
            })
            .collect();
        // After the limits' lines, each quota's: {3, used, 0}.
        let used = counted
            .iter()
            .zip(lines.get(meters.len()..).unwrap_or_default())
            .map(|(&(period, _), &(_, used, _))| (period, u64::try_from(used).unwrap_or(0)))
            .collect();
        Ok(Charged {
            outcome: outcome(&meters, &lines),
            used,
        })
    }

    async fn spend(
        &self,
        key_id: &str,
        quotas: &Quotas,
        calendar: &Calendar,
        tokens: [u64; 2],
        (hold_id, held): (&str, u32),
    ) -> Result<(), Unanswered> {
        // One script: no other gateway sees the tokens both counted and held, or neither
        // (and a Cluster, where MULTI is not served, runs it on the key's one node).
        let mut invocation = SPEND.prepare_invoke();
        invocation
            .key(self.holds_key(key_id))
            .arg(format!("{hold_id}:{held}"));
        for (period, _) in quotas.each() {
            let keep = calendar.ends_in(period) + Duration::from_secs(86_400);
            let tokens = match period {
                Period::Day => tokens[0],
                Period::Month => tokens[1],
            };
            invocation
                .key(self.quota_key(key_id, period, calendar))
                .arg(tokens)
                .arg(keep.as_secs());
        }
        self.call(OFF_PATH_TIMEOUT, |mut connection| {
            let invocation = &invocation;
            async move { invocation.invoke_async::<i64>(&mut connection).await }
        })
        .await
        .map(drop)
    }

    async fn quota_used(&self, key_id: &str, calendar: &Calendar) -> Result<[u64; 3], Unanswered> {
        let keys = [Period::Day, Period::Month].map(|p| self.quota_key(key_id, p, calendar));
        let holds = self.holds_key(key_id);
        let (used, holds): (Vec<Option<u64>>, Vec<(String, f64)>) = self
            .call(OFF_PATH_TIMEOUT, |mut connection| {
                let (keys, holds) = (&keys, &holds);
                async move {
                    redis::pipe()
                        .cmd("MGET")
                        .arg(&keys[..])
                        .cmd("ZRANGE")
                        .arg(holds)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut connection)
                        .await
                }
            })
            .await?;
        let at = |slot: usize| used.get(slot).copied().flatten().unwrap_or(0);
        // Lapsed holds are dropped by the next charge; here they are only not counted.
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_micros() as f64);
        let held = holds
            .iter()
            .filter(|(_, lapses)| *lapses > now_us)
            .filter_map(|(hold, _)| hold.rsplit_once(':')?.1.parse::<u64>().ok())
            .sum();
        Ok([at(0), at(1), held])
    }

    fn fails_closed(&self) -> bool {
        self.on_failure() == OnFailure::FailClosed
    }
}

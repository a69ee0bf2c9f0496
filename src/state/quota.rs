//! Per-key token quotas in Redis ([`crate::auth::quota`]): a counter per key and day and
//! per key and month, `<prefix>:quota:{<key id>}:day:2026-12-05` and `...:month:2026-12`,
//! checked by the charging script ([`super::limits`]) and added to when an answer ends;
//! and the keys' view of it all ([`SharedBudget`]).
//! A counter expires a day after its period ends.

use std::time::Duration;

use super::{Failure, SharedState};
use crate::auth::limits::{Limits, RateHeaders, Refusal};
use crate::auth::quota::{Calendar, Period, Quotas};
use crate::auth::{SharedBudget, Unanswered};

/// How long spending may take: it runs after the answer, so it may wait longer than a
/// request's call, but not for ever.
const SPEND_TIMEOUT: Duration = Duration::from_secs(1);

impl SharedState {
    pub(super) fn quota_key(&self, key_id: &str, period: Period, calendar: &Calendar) -> String {
        format!(
            "{}:quota:{{{key_id}}}:{}:{}",
            self.key_prefix(),
            period.as_str(),
            calendar.name(period)
        )
    }

    /// Adds an answer's tokens to the key's counters of each quota it has.
    pub async fn spend_key(
        &self,
        key_id: &str,
        quotas: &Quotas,
        calendar: &Calendar,
        tokens: u64,
    ) -> Result<(), Failure> {
        let mut pipe = redis::pipe();
        for (period, _) in quotas.each() {
            let key = self.quota_key(key_id, period, calendar);
            let keep = calendar.ends_in(period) + Duration::from_secs(86_400);
            pipe.incr(&key, tokens).ignore();
            pipe.expire(&key, i64::try_from(keep.as_secs()).unwrap_or(i64::MAX))
                .ignore();
        }
        self.call(SPEND_TIMEOUT, |mut connection| {
            let pipe = &pipe;
            async move { pipe.query_async::<()>(&mut connection).await }
        })
        .await
    }

    /// What the key has used of the day and of the month now (0 for a counter not there).
    pub async fn used_by_key(
        &self,
        key_id: &str,
        calendar: &Calendar,
    ) -> Result<[u64; 2], Failure> {
        let keys = [Period::Day, Period::Month].map(|p| self.quota_key(key_id, p, calendar));
        let used: Vec<Option<u64>> = self
            .call(SPEND_TIMEOUT, |mut connection| {
                let keys = &keys;
                async move {
                    redis::cmd("MGET")
                        .arg(&keys[..])
                        .query_async(&mut connection)
                        .await
                }
            })
            .await?;
        let at = |slot: usize| used.get(slot).copied().flatten().unwrap_or(0);
        Ok([at(0), at(1)])
    }
}

#[async_trait::async_trait]
impl SharedBudget for SharedState {
    async fn charge(
        &self,
        key_id: &str,
        limits: Limits,
        quotas: &Quotas,
        calendar: &Calendar,
        tokens: u32,
    ) -> Result<Result<RateHeaders, Refusal>, Unanswered> {
        self.charge_key(key_id, limits, quotas, calendar, tokens)
            .await
            .map_err(|_| Unanswered)
    }

    async fn spend(
        &self,
        key_id: &str,
        quotas: &Quotas,
        calendar: &Calendar,
        tokens: u64,
    ) -> Result<(), Unanswered> {
        self.spend_key(key_id, quotas, calendar, tokens)
            .await
            .map_err(|_| Unanswered)
    }

    async fn quota_used(&self, key_id: &str, calendar: &Calendar) -> Result<[u64; 2], Unanswered> {
        self.used_by_key(key_id, calendar)
            .await
            .map_err(|_| Unanswered)
    }

    fn fails_closed(&self) -> bool {
        self.on_failure() == super::OnFailure::FailClosed
    }
}

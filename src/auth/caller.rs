//! Who an accepted request is ([`Caller`]): the key it presented, what that key may
//! spend, and how a request is charged to it and counted against its quotas.

use std::sync::Arc;

use super::limits::Limits;
use super::limits::{KeyBudget, RateHeaders, Refusal};
use super::quota::{self, Calendar, KeyQuota, Period, Quotas};
use super::Keys;
use crate::clock::SharedClock;

/// The shared store did not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unanswered;

/// Where keys' limits and quotas are kept when gateways share them: Redis, through the
/// `state` module's `SharedState`. A trait, so that keys know what they ask of it and not
/// where it is (and `auth` does not depend on `state`, which depends on it).
#[async_trait::async_trait]
pub trait SharedBudget: Send + Sync + std::fmt::Debug {
    /// Checks `quotas` (with the calendar they count in; none when the key has none)
    /// and charges one request of `tokens` tokens to `limits`.
    async fn charge(
        &self,
        key_id: &str,
        limits: Limits,
        quotas: Option<(&Quotas, &Calendar)>,
        tokens: u32,
    ) -> Result<Result<RateHeaders, Refusal>, Unanswered>;

    /// Adds an answer's tokens to the key's quota counters.
    async fn spend(
        &self,
        key_id: &str,
        quotas: &Quotas,
        calendar: &Calendar,
        tokens: u64,
    ) -> Result<(), Unanswered>;

    /// What the key has used of the day and of the month `calendar` is in.
    async fn quota_used(&self, key_id: &str, calendar: &Calendar) -> Result<[u64; 2], Unanswered>;

    /// A request the store cannot check is refused (`fail_closed`) rather than charged
    /// to this gateway's own limits (`fail_open`).
    fn fails_closed(&self) -> bool;
}

/// Who an accepted request is: the id of the key it presented and that key's budget.
#[derive(Debug, Clone)]
pub struct Caller {
    pub key_id: String,
    pub budget: Arc<KeyBudget>,
    /// Where the budget is kept when gateways share it; `None`: in `budget` alone.
    pub shared: Option<Arc<dyn SharedBudget>>,
    /// Its token quotas and what this process counted of them.
    pub quota: Arc<KeyQuota>,
    /// The quotas' calendar: their time zone and the server's clock.
    pub calendar: QuotaCalendar,
}

/// Where quotas take their days and months from.
#[derive(Clone)]
pub struct QuotaCalendar {
    pub zone: chrono_tz::Tz,
    pub clock: SharedClock,
}

impl std::fmt::Debug for QuotaCalendar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaCalendar")
            .field("zone", &self.zone)
            .finish_non_exhaustive()
    }
}

impl QuotaCalendar {
    pub fn now(&self) -> Calendar {
        Calendar::at(self.clock.system_time(), self.zone)
    }
}

impl Caller {
    /// Charges one request of `tokens` tokens to the key: across every gateway when the
    /// limits are shared, in this one otherwise, or when the shared state does not
    /// answer and the operator chose `fail_open`.
    /// A request is first checked against the key's quotas: one spent refuses it
    /// before any limit is charged.
    pub async fn charge(&self, tokens: u32) -> Result<RateHeaders, Refusal> {
        let limits = self.budget.limits();
        let quotas = self.quota.quotas;
        // The day and month are told only for a key with a quota: a time zone's
        // arithmetic and two dates written out are not every request's cost.
        let calendar = (!quotas.is_none()).then(|| self.calendar.now());
        let counted = calendar.as_ref().map(|calendar| (&quotas, calendar));
        let shared = self.shared.as_ref();
        let Some(shared) = shared.filter(|_| !limits.is_unlimited() || counted.is_some()) else {
            return self.charge_here(tokens, calendar.as_ref());
        };
        match shared.charge(&self.key_id, limits, counted, tokens).await {
            Ok(outcome) => outcome,
            Err(Unanswered) if shared.fails_closed() => Err(Refusal::Unavailable),
            Err(Unanswered) => self.charge_here(tokens, calendar.as_ref()),
        }
    }

    /// Charged in this process alone.
    fn charge_here(
        &self,
        tokens: u32,
        calendar: Option<&Calendar>,
    ) -> Result<RateHeaders, Refusal> {
        if let Some(spent) = calendar.and_then(|calendar| self.quota.spent(calendar)) {
            return Err(Refusal::QuotaSpent(spent));
        }
        self.budget.charge(tokens)
    }

    /// Counts an answer's tokens against the key's quotas: in Redis when shared (in the
    /// background: the answer has gone), here otherwise or when Redis does not take it.
    pub fn spend(&self, tokens: u64) {
        if self.quota.quotas.is_none() || tokens == 0 {
            return;
        }
        let calendar = self.calendar.now();
        let Some(shared) = self.shared.clone() else {
            self.quota.spend(tokens, &calendar);
            return;
        };
        let (key_id, quota) = (self.key_id.clone(), Arc::clone(&self.quota));
        // A record may end outside a runtime (a run dropped at shutdown): counted here.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.quota.spend(tokens, &calendar);
            return;
        };
        runtime.spawn(async move {
            if shared
                .spend(&key_id, &quota.quotas, &calendar, tokens)
                .await
                .is_err()
            {
                quota.spend(tokens, &calendar);
            }
        });
    }

    /// Each of the key's quotas with what is used of it, for `/stats`.
    pub async fn quota_uses(&self) -> Vec<quota::QuotaUse> {
        let quotas = self.quota.quotas;
        let calendar = self.calendar.now();
        let shared_use = match &self.shared {
            Some(shared) if !quotas.is_none() => {
                shared.quota_used(&self.key_id, &calendar).await.ok()
            }
            _ => None,
        };
        quota::uses(&quotas, &calendar, |period| match shared_use {
            Some([day, month]) => match period {
                Period::Day => day,
                Period::Month => month,
            },
            None => self.quota.used(period, &calendar),
        })
    }
}

/// Counts each answer's tokens (its usage, prompt and completion) against its key's
/// quotas when the request ends.
pub struct QuotaCounter(pub Arc<Keys>);

impl crate::record::RequestObserver for QuotaCounter {
    fn observe(&self, record: &crate::record::RequestRecord) {
        let Some(id) = &record.api_key_id else {
            return;
        };
        let usage = &record.usage;
        // An answer, whole or cut short, is counted; a request that was refused or failed
        // before any token (a fleet that is down, a client retrying) costs nothing.
        if usage.completion_tokens == 0 {
            return;
        }
        let tokens = u64::from(usage.prompt_tokens) + u64::from(usage.completion_tokens);
        if let Some(caller) = self.0.caller_by_id(id) {
            caller.spend(tokens);
        }
    }
}

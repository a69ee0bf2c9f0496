//! Who an accepted request is ([`Caller`]): the key it presented, what that key may
//! spend, and how a request is charged to it and counted against its quotas.

use std::sync::Arc;
use std::time::Duration;

use super::limits::Limits;
use super::limits::{KeyBudget, RateHeaders, Refusal};
use super::quota::{self, Calendar, KeyQuota, Period, Quotas};
use super::Keys;
use crate::clock::SharedClock;
use crate::record::QuotaHold;

/// The shared store did not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unanswered {
    /// The call may have reached the store, and may yet run there (it timed out, or its
    /// connection broke after it was written); `false`: it was never sent.
    pub maybe_ran: bool,
}

/// Where keys' limits and quotas are kept when gateways share them: Redis, through the
/// `state` module's `SharedState`. A trait, so that keys know what they ask of it and not
/// where it is (and `auth` does not depend on `state`, which depends on it).
/// A request's check against its key's quotas in the shared state: the quotas, the
/// calendar they count in, and the hold the request takes when it passes.
#[derive(Debug, Clone, Copy)]
pub struct QuotaCheck<'a> {
    pub quotas: &'a Quotas,
    pub calendar: &'a Calendar,
    /// The hold's id, unique across gateways.
    pub hold_id: &'a str,
    /// How long the hold lasts should its gateway never release it (it stopped).
    pub hold_for: Duration,
}

/// What the shared store answered a charge.
#[derive(Debug)]
pub struct Charged {
    pub outcome: Result<RateHeaders, Refusal>,
    /// What it counts as used of each quota it checked: where a gateway that falls back
    /// to its own count starts from.
    pub used: Vec<(Period, u64)>,
}

#[async_trait::async_trait]
pub trait SharedBudget: Send + Sync + std::fmt::Debug {
    /// Checks the key's quotas (none when it has none) and charges one request of
    /// `tokens` tokens to `limits`; a request that passes holds `tokens` of the quotas.
    async fn charge(
        &self,
        key_id: &str,
        limits: Limits,
        quotas: Option<QuotaCheck<'_>>,
        tokens: u32,
    ) -> Result<Charged, Unanswered>;

    /// Adds an answer's tokens (`[day, month]`, 0 for none) to the key's quota
    /// counters and releases the hold `hold_id` of `held` tokens, in one step.
    async fn spend(
        &self,
        key_id: &str,
        quotas: &Quotas,
        calendar: &Calendar,
        tokens: [u64; 2],
        hold: (&str, u32),
    ) -> Result<(), Unanswered>;

    /// What the key has used of the day and of the month `calendar` is in, and what its
    /// requests in flight hold.
    async fn quota_used(&self, key_id: &str, calendar: &Calendar) -> Result<[u64; 3], Unanswered>;

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
    /// A request is first checked against the key's quotas: one spent, or held by the
    /// key's requests in flight, refuses it before any limit is charged. One that passes
    /// holds `tokens` of them until [`Caller::spend`] (at most `hold_for` in the shared
    /// state, should this gateway stop before). `hold` says what to release when the
    /// request ends; it is set before the call, so a request that ends while the call
    /// waits still releases what the call may have taken.
    pub async fn charge(
        &self,
        tokens: u32,
        hold_for: Duration,
        hold: &mut Option<QuotaHold>,
    ) -> Result<RateHeaders, Refusal> {
        let limits = self.budget.limits();
        let quotas = self.quota.quotas;
        // The day and month are told only for a key with a quota: a time zone's
        // arithmetic and two dates written out are not every request's cost.
        let calendar = (!quotas.is_none()).then(|| self.calendar.now());
        let shared = self.shared.as_ref();
        let Some(shared) = shared.filter(|_| !limits.is_unlimited() || calendar.is_some()) else {
            return self.charge_here(tokens, calendar.as_ref(), hold);
        };
        let hold_id = calendar
            .as_ref()
            .map(|_| uuid::Uuid::new_v4().simple().to_string());
        *hold = hold_id.clone().map(|id| QuotaHold {
            tokens,
            shared: Some(id),
            local: false,
        });
        let check = calendar
            .as_ref()
            .zip(hold_id.as_deref())
            .map(|(calendar, hold_id)| QuotaCheck {
                quotas: &quotas,
                calendar,
                hold_id,
                hold_for,
            });
        let charged = shared.charge(&self.key_id, limits, check, tokens).await;
        if let (Ok(charged), Some(calendar)) = (&charged, &calendar) {
            for &(period, used) in &charged.used {
                self.quota.saw(period, calendar, used);
            }
        }
        match charged.map(|c| c.outcome) {
            Ok(Ok(headers)) => {
                // Redis holds it; this gateway's own count mirrors the hold until the
                // request ends, so that a fallback meanwhile (`fail_open`, Redis silent)
                // counts what its own requests hold (issue 61: a 500-token quota went to
                // 1,984 when it did not).
                if let Some(held) = hold.as_mut() {
                    self.quota.mirror(tokens);
                    held.local = true;
                }
                Ok(headers)
            }
            Ok(Err(refusal)) => {
                // Refused in the script, which then holds nothing.
                *hold = None;
                Err(refusal)
            }
            // The hold stays to be released: the call may have run.
            Err(Unanswered { .. }) if shared.fails_closed() => Err(Refusal::Unavailable),
            Err(Unanswered { .. }) => self.charge_here(tokens, calendar.as_ref(), hold),
        }
    }

    /// Charged in this process alone; a hold taken here is marked in `hold`.
    fn charge_here(
        &self,
        tokens: u32,
        calendar: Option<&Calendar>,
        hold: &mut Option<QuotaHold>,
    ) -> Result<RateHeaders, Refusal> {
        let Some(calendar) = calendar else {
            return self.budget.charge(tokens);
        };
        self.quota
            .hold(tokens, calendar)
            .map_err(Refusal::QuotaSpent)?;
        match self.budget.charge(tokens) {
            Ok(headers) => {
                let held = hold.get_or_insert(QuotaHold {
                    tokens,
                    shared: None,
                    local: true,
                });
                held.local = true;
                Ok(headers)
            }
            Err(refusal) => {
                self.quota.release(tokens);
                Err(refusal)
            }
        }
    }

    /// Counts an answer's tokens (0 for a request that got none) against the key's
    /// quotas and releases what its request held: in Redis when the quotas are shared
    /// (in the background: the answer has gone), here otherwise or when Redis does not
    /// take them. A hold in this process is released here at once.
    pub fn spend(&self, tokens: u64, hold: Option<&QuotaHold>) {
        if let Some(held) = hold.filter(|h| h.local) {
            self.quota.release(held.tokens);
        }
        let counts = !self.quota.quotas.is_none() && tokens > 0;
        let shared_hold = hold.and_then(|h| Some((h.shared.clone()?, h.tokens)));
        if !counts && shared_hold.is_none() {
            return;
        }
        let calendar = self.calendar.now();
        // A record may end outside a runtime (a run dropped at shutdown): counted here.
        let runtime = tokio::runtime::Handle::try_current();
        let (Some(shared), Ok(runtime)) = (self.shared.clone(), runtime) else {
            if counts {
                self.quota.spend(tokens, 0, &calendar);
            }
            return;
        };
        let tokens = if counts { tokens } else { 0 };
        let (key_id, quota) = (self.key_id.clone(), Arc::clone(&self.quota));
        runtime.spawn(async move {
            let (hold_id, held) = shared_hold.unwrap_or_default();
            // What was counted here while Redis did not take it goes with this answer.
            let backlog = quota.take_backlog(&calendar);
            let counted = backlog.map(|b| b.saturating_add(tokens));
            let spent = shared
                .spend(&key_id, &quota.quotas, &calendar, counted, (&hold_id, held))
                .await;
            match spent {
                // A call that may have run is taken as run: sent again, it could count
                // the tokens twice (at most once, rather than at least once).
                Ok(()) | Err(Unanswered { maybe_ran: true }) => {
                    quota.saw_spent(tokens, &calendar);
                }
                Err(Unanswered { maybe_ran: false }) => {
                    // Counted here, for Redis later; the hold there ends by itself
                    // (`hold_for`).
                    quota.give_back(backlog, &calendar);
                    if tokens > 0 {
                        quota.spend(tokens, 0, &calendar);
                    }
                }
            }
        });
    }

    /// Each of the key's quotas with what is used and held of it, for `/stats`.
    pub async fn quota_uses(&self) -> Vec<quota::QuotaUse> {
        let quotas = self.quota.quotas;
        let calendar = self.calendar.now();
        let shared_use = match &self.shared {
            Some(shared) if !quotas.is_none() => {
                shared.quota_used(&self.key_id, &calendar).await.ok()
            }
            _ => None,
        };
        let held = match shared_use {
            Some([.., held]) => held,
            None => self.quota.held(),
        };
        let used = |period| match (shared_use, period) {
            (Some([day, ..]), Period::Day) => day,
            (Some([_, month, _]), Period::Month) => month,
            (None, period) => self.quota.used(period, &calendar),
        };
        quota::uses(&quotas, &calendar, used, held)
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
        if let Some(caller) = self.0.caller_by_id(id) {
            caller.spend(record.quota_tokens(), record.quota_hold.as_ref());
        }
    }
}

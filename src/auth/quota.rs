//! Per-key token quotas: tokens a key may use in a day and in a month, counted from each
//! answer's `usage` (prompt and completion), in the operator's time zone (UTC unless
//! `server.quota_time_zone` names another).
//!
//! A request is checked before it is charged to the rate limits: with a quota spent it is
//! refused with OpenAI's 429 `insufficient_quota`, and `x-should-retry: false` so that
//! the OpenAI SDKs do not retry what only the next period cures.
//!
//! An admitted request holds its prompt and the most it may answer
//! ([`crate::record::QuotaHold`]) until it ends, when its usage is counted and the hold
//! released. A request passes only while what is used and what is held stay under the
//! quota, so requests in flight together pass it by less than one request's hold; one
//! that finds the rest held is refused with a 429 to retry in a second
//! (`quota_held`), since the holds may end below the quota. One gateway counts in its
//! process ([`KeyQuota`]); gateways sharing Redis count there (the `state` module),
//! checked and held in the same call as the rate limits.

use std::num::NonZeroU64;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;

/// A key's quotas; `None` is none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quotas {
    pub tokens_per_day: Option<NonZeroU64>,
    pub tokens_per_month: Option<NonZeroU64>,
}

impl Quotas {
    pub fn is_none(&self) -> bool {
        self.tokens_per_day.is_none() && self.tokens_per_month.is_none()
    }

    /// Each quota with its period.
    pub fn each(&self) -> impl Iterator<Item = (Period, NonZeroU64)> {
        [
            (Period::Day, self.tokens_per_day),
            (Period::Month, self.tokens_per_month),
        ]
        .into_iter()
        .filter_map(|(period, size)| Some((period, size?)))
    }
}

/// What a quota counts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Day,
    Month,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }
}

/// The day and the month a moment falls in, in the quotas' time zone, and when each
/// ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    /// `2026-12-05`.
    pub day: String,
    /// `2026-12`.
    pub month: String,
    pub day_ends_in: Duration,
    pub month_ends_in: Duration,
}

impl Calendar {
    pub fn at(now: SystemTime, zone: Tz) -> Self {
        let utc: DateTime<Utc> = now.into();
        let local = utc.with_timezone(&zone);
        let date = local.date_naive();
        let next_day = date.succ_opt().unwrap_or(date);
        let first_of_month = date.with_day(1).unwrap_or(date);
        let next_month = if date.month() == 12 {
            NaiveDate::from_ymd_opt(date.year() + 1, 1, 1)
        } else {
            NaiveDate::from_ymd_opt(date.year(), date.month() + 1, 1)
        }
        .unwrap_or(first_of_month);
        let until = |d: NaiveDate| {
            // Midnight may not exist (a zone that moves its clocks then): the first hour
            // of the day that does.
            (0..24)
                .filter_map(|hour| d.and_hms_opt(hour, 0, 0))
                .find_map(|m| zone.from_local_datetime(&m).earliest())
                .map(|at| (at.with_timezone(&Utc) - utc).to_std().unwrap_or_default())
                .unwrap_or(Duration::from_secs(86_400))
        };
        Self {
            day: date.format("%Y-%m-%d").to_string(),
            month: date.format("%Y-%m").to_string(),
            day_ends_in: until(next_day),
            month_ends_in: until(next_month),
        }
    }

    pub fn name(&self, period: Period) -> &str {
        match period {
            Period::Day => &self.day,
            Period::Month => &self.month,
        }
    }

    pub fn ends_in(&self, period: Period) -> Duration {
        match period {
            Period::Day => self.day_ends_in,
            Period::Month => self.month_ends_in,
        }
    }
}

/// A quota that is spent, or spoken for by the requests in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spent {
    pub period: Period,
    pub limit: u64,
    pub used: u64,
    /// Held by the key's requests in flight.
    pub held: u64,
    /// Until the period ends.
    pub resets_in: Duration,
}

impl Spent {
    /// Used up, not only held: only the next period cures it.
    pub fn is_used_up(&self) -> bool {
        self.used >= self.limit
    }
}

/// One quota as `/stats` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QuotaUse {
    pub period: &'static str,
    /// The day or month counted (`2026-12-05`, `2026-12`).
    pub current: String,
    pub limit: u64,
    pub used: u64,
    /// Held by the key's requests in flight.
    pub held: u64,
    pub resets_in_secs: u64,
}

/// The first quota whose `used` (by period) reaches its size, or else the first whose
/// `used` and `held` together do: a month used up is said before a day only held.
pub fn first_spent(
    quotas: &Quotas,
    calendar: &Calendar,
    used: impl Fn(Period) -> u64,
    held: u64,
) -> Option<Spent> {
    let over = |held: u64| {
        quotas
            .each()
            .find(|&(period, size)| used(period).saturating_add(held) >= size.get())
    };
    over(0).or_else(|| over(held)).map(|(period, size)| {
        let used = used(period);
        Spent {
            period,
            limit: size.get(),
            used,
            held,
            resets_in: calendar.ends_in(period),
        }
    })
}

/// Each quota's use, for `/stats`.
pub fn uses(
    quotas: &Quotas,
    calendar: &Calendar,
    used: impl Fn(Period) -> u64,
    held: u64,
) -> Vec<QuotaUse> {
    quotas
        .each()
        .map(|(period, size)| QuotaUse {
            period: period.as_str(),
            current: calendar.name(period).to_owned(),
            limit: size.get(),
            used: used(period),
            held,
            resets_in_secs: calendar.ends_in(period).as_secs(),
        })
        .collect()
}

/// What one key has used in this process, by period; kept while its quotas stay.
#[derive(Debug, Default)]
pub struct KeyQuota {
    pub quotas: Quotas,
    counted: Mutex<Counted>,
}

#[derive(Debug, Default)]
struct Counted {
    /// The day and the month counted, and the tokens in each: all of them for one
    /// gateway; with shared quotas, those counted here while Redis did not take them,
    /// and not yet handed to it ([`KeyQuota::take_backlog`]).
    used: [(String, u64); 2],
    /// With shared quotas, what Redis last said the key had used of the day and the
    /// month: a gateway that falls back to its own count (`fail_open`) starts from it,
    /// not from nothing.
    seen: [(String, u64); 2],
    /// Tokens held by the key's requests in flight here.
    held: u64,
}

/// The tokens in `counts`' slot for `period`, if it counts the period `calendar` is in.
fn in_period(counts: &[(String, u64); 2], period: Period, calendar: &Calendar) -> u64 {
    let (name, tokens) = &counts[KeyQuota::slot(period)];
    if name == calendar.name(period) {
        *tokens
    } else {
        0
    }
}

/// Adds `tokens` to `counts`' slot for `period`, starting it afresh in a new period.
fn add_in_period(
    counts: &mut [(String, u64); 2],
    period: Period,
    calendar: &Calendar,
    tokens: u64,
) {
    let (name, used) = &mut counts[KeyQuota::slot(period)];
    if name != calendar.name(period) {
        *name = calendar.name(period).to_owned();
        *used = 0;
    }
    *used = used.saturating_add(tokens);
}

impl Counted {
    fn used(&self, period: Period, calendar: &Calendar) -> u64 {
        in_period(&self.seen, period, calendar)
            .saturating_add(in_period(&self.used, period, calendar))
    }
}

impl KeyQuota {
    pub fn new(quotas: Quotas) -> Self {
        Self {
            quotas,
            counted: Mutex::default(),
        }
    }

    fn counted(&self) -> std::sync::MutexGuard<'_, Counted> {
        self.counted.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(period: Period) -> usize {
        match period {
            Period::Day => 0,
            Period::Month => 1,
        }
    }

    /// Tokens used in the period `calendar` is in.
    pub fn used(&self, period: Period, calendar: &Calendar) -> u64 {
        self.counted().used(period, calendar)
    }

    /// Tokens held by the key's requests in flight here.
    pub fn held(&self) -> u64 {
        self.counted().held
    }

    /// Admits a request that may use `tokens`, holding them, unless a quota is spent or
    /// held in full already.
    pub fn hold(&self, tokens: u32, calendar: &Calendar) -> Result<(), Spent> {
        let mut counted = self.counted();
        if let Some(spent) = first_spent(
            &self.quotas,
            calendar,
            |p| counted.used(p, calendar),
            counted.held,
        ) {
            return Err(spent);
        }
        counted.held = counted.held.saturating_add(u64::from(tokens));
        Ok(())
    }

    /// Counts here a hold the shared state granted (see [`crate::auth::caller`]):
    /// released by [`Self::release`] like one taken here.
    pub fn mirror(&self, tokens: u32) {
        let mut counted = self.counted();
        counted.held = counted.held.saturating_add(u64::from(tokens));
    }

    /// Releases what a request held here.
    pub fn release(&self, held: u32) {
        let mut counted = self.counted();
        counted.held = counted.held.saturating_sub(u64::from(held));
    }

    /// Adds an answer's tokens to the day and the month `calendar` is in, and releases
    /// what its request held here (`held`: 0 for a request that held nothing here).
    pub fn spend(&self, tokens: u64, held: u32, calendar: &Calendar) {
        let mut counted = self.counted();
        counted.held = counted.held.saturating_sub(u64::from(held));
        if tokens == 0 {
            return;
        }
        for period in [Period::Day, Period::Month] {
            add_in_period(&mut counted.used, period, calendar, tokens);
        }
    }

    /// Notes what Redis said the key has used of `period` (shared quotas).
    pub fn saw(&self, period: Period, calendar: &Calendar, used: u64) {
        let mut counted = self.counted();
        let slot = &mut counted.seen[Self::slot(period)];
        *slot = (calendar.name(period).to_owned(), used);
    }

    /// Adds an answer's tokens Redis took to what was seen there, so that a fallback
    /// between this answer and the next charge counts them.
    pub fn saw_spent(&self, tokens: u64, calendar: &Calendar) {
        let mut counted = self.counted();
        for period in [Period::Day, Period::Month] {
            add_in_period(&mut counted.seen, period, calendar, tokens);
        }
    }

    /// Takes the tokens counted here (while Redis did not take them) in the day and the
    /// month `calendar` is in, to hand to Redis; `[day, month]`. They count as seen
    /// meanwhile; [`KeyQuota::give_back`] puts them back should Redis not take them.
    pub fn take_backlog(&self, calendar: &Calendar) -> [u64; 2] {
        let mut counted = self.counted();
        let counted = &mut *counted;
        [Period::Day, Period::Month].map(|period| {
            let tokens = in_period(&counted.used, period, calendar);
            if tokens > 0 {
                counted.used[Self::slot(period)].1 = 0;
                add_in_period(&mut counted.seen, period, calendar, tokens);
            }
            tokens
        })
    }

    /// Puts back a backlog Redis did not take.
    pub fn give_back(&self, backlog: [u64; 2], calendar: &Calendar) {
        let mut counted = self.counted();
        for (period, tokens) in [Period::Day, Period::Month].into_iter().zip(backlog) {
            if tokens > 0 {
                let seen = &mut counted.seen[Self::slot(period)];
                if seen.0 == calendar.name(period) {
                    seen.1 = seen.1.saturating_sub(tokens);
                }
                add_in_period(&mut counted.used, period, calendar, tokens);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        DateTime::parse_from_rfc3339(rfc3339)
            .expect("a time")
            .with_timezone(&Utc)
            .into()
    }

    #[test]
    fn the_calendar_follows_the_time_zone() {
        let utc = Calendar::at(at("2026-12-31T23:30:00Z"), chrono_tz::UTC);
        assert_eq!(
            (utc.day.as_str(), utc.month.as_str()),
            ("2026-12-31", "2026-12")
        );
        assert_eq!(utc.day_ends_in, Duration::from_secs(30 * 60));
        assert_eq!(utc.month_ends_in, Duration::from_secs(30 * 60));
        // Already the new year in Shanghai (UTC+8).
        let shanghai = Calendar::at(at("2026-12-31T23:30:00Z"), chrono_tz::Asia::Shanghai);
        assert_eq!(
            (shanghai.day.as_str(), shanghai.month.as_str()),
            ("2027-01-01", "2027-01")
        );
        assert_eq!(
            shanghai.day_ends_in,
            Duration::from_secs(16 * 3600 + 30 * 60)
        );
    }

    #[test]
    fn a_day_whose_midnight_does_not_exist_resets_at_its_first_hour() {
        // Santiago moved its clocks from 00:00 to 01:00 on 2026-09-06.
        let before = Calendar::at(at("2026-09-06T03:30:00Z"), chrono_tz::America::Santiago);
        assert_eq!(before.day, "2026-09-05");
        assert_eq!(before.day_ends_in, Duration::from_secs(30 * 60));
    }

    #[test]
    fn a_quota_is_spent_at_its_size_and_a_new_day_starts_afresh() {
        let quota = KeyQuota::new(Quotas {
            tokens_per_day: NonZeroU64::new(1000),
            tokens_per_month: NonZeroU64::new(1500),
        });
        let monday = Calendar::at(at("2026-12-07T10:00:00Z"), chrono_tz::UTC);
        quota.spend(999, 0, &monday);
        assert_eq!(quota.hold(500, &monday), Ok(()), "999 < 1000 passes");
        quota.spend(120, 500, &monday);
        let spent = quota.hold(1, &monday).expect_err("the day is spent");
        assert!(spent.is_used_up());
        assert_eq!(
            (spent.period, spent.limit, spent.used, spent.held),
            (Period::Day, 1000, 1119, 0)
        );
        assert_eq!(spent.resets_in, Duration::from_secs(14 * 3600));
        let tuesday = Calendar::at(at("2026-12-08T10:00:00Z"), chrono_tz::UTC);
        assert_eq!(quota.hold(1, &tuesday), Ok(()), "a new day");
        quota.spend(400, 1, &tuesday);
        let spent = quota.hold(1, &tuesday).expect_err("the month is spent");
        assert_eq!((spent.period, spent.used), (Period::Month, 1519));
        let uses = uses(&quota.quotas, &tuesday, |p| quota.used(p, &tuesday), 0);
        assert_eq!(uses[0].used, 400);
        assert_eq!(uses[1].current, "2026-12");
    }

    #[test]
    fn a_fallback_starts_from_what_redis_said_and_hands_back_what_it_counted() {
        let quota = KeyQuota::new(Quotas {
            tokens_per_day: NonZeroU64::new(1000),
            tokens_per_month: None,
        });
        let monday = Calendar::at(at("2026-12-07T10:00:00Z"), chrono_tz::UTC);
        // Redis said 900 were used, then took an answer of 60.
        quota.saw(Period::Day, &monday, 900);
        quota.saw_spent(60, &monday);
        assert_eq!(quota.used(Period::Day, &monday), 960);
        // Redis gone: this gateway counts an answer of 50 itself, and is spent.
        quota.spend(50, 0, &monday);
        let spent = quota
            .hold(1, &monday)
            .expect_err("spent, counting what Redis said");
        assert_eq!(spent.used, 1010);
        // Back: the 50 go to Redis with the next answer; not taken, they stay here.
        assert_eq!(quota.take_backlog(&monday), [50, 50]);
        assert_eq!(quota.take_backlog(&monday), [0, 0], "taken once");
        assert_eq!(quota.used(Period::Day, &monday), 1010, "seen meanwhile");
        quota.give_back([50, 50], &monday);
        assert_eq!(quota.used(Period::Day, &monday), 1010);
        assert_eq!(quota.take_backlog(&monday), [50, 50], "given back");
        // A new day starts from nothing, whatever was seen the day before.
        let tuesday = Calendar::at(at("2026-12-08T10:00:00Z"), chrono_tz::UTC);
        assert_eq!(quota.used(Period::Day, &tuesday), 0);
        assert_eq!(quota.take_backlog(&tuesday), [0, 0]);
    }

    #[test]
    fn a_quota_used_up_is_said_before_one_only_held() {
        let quota = KeyQuota::new(Quotas {
            tokens_per_day: NonZeroU64::new(1000),
            tokens_per_month: NonZeroU64::new(1500),
        });
        let monday = Calendar::at(at("2026-12-07T10:00:00Z"), chrono_tz::UTC);
        quota.spend(900, 0, &monday);
        let tuesday = Calendar::at(at("2026-12-08T10:00:00Z"), chrono_tz::UTC);
        quota.spend(600, 0, &tuesday);
        // The day is only held (600 + 500), the month used up (1,500): no retry cures it.
        let spent = first_spent(&quota.quotas, &tuesday, |p| quota.used(p, &tuesday), 500)
            .expect("refused");
        assert_eq!(spent.period, Period::Month);
        assert!(spent.is_used_up());
    }

    #[test]
    fn requests_in_flight_hold_the_quota_and_release_it_when_they_end() {
        let quota = KeyQuota::new(Quotas {
            tokens_per_day: NonZeroU64::new(1000),
            tokens_per_month: None,
        });
        let monday = Calendar::at(at("2026-12-07T10:00:00Z"), chrono_tz::UTC);
        quota.spend(400, 0, &monday);
        // Each may use 600 tokens: the first passes with 400 used, and holds 600.
        assert_eq!(quota.hold(600, &monday), Ok(()));
        let held = quota.hold(600, &monday).expect_err("400 used + 600 held");
        assert!(!held.is_used_up(), "held, not used up: it may pass later");
        assert_eq!((held.used, held.held), (400, 600));
        // The first used 50 tokens: its hold is gone, its 50 are counted.
        quota.spend(50, 600, &monday);
        assert_eq!((quota.held(), quota.used(Period::Day, &monday)), (0, 450));
        assert_eq!(quota.hold(600, &monday), Ok(()));
        // One that failed before any token releases its hold and costs nothing.
        quota.spend(0, 600, &monday);
        assert_eq!((quota.held(), quota.used(Period::Day, &monday)), (0, 450));
    }
}

//! One replica of an upstream model: its address, what this gateway has in flight
//! there, and its health as the gateway has seen it.
//!
//! Health, passive and active:
//! - `eject_after` consecutive failures of its own (no connection, a 5xx, no first byte
//!   in time, a stream cut short, its key refused, another model answering) take it out
//!   of rotation for a cool-down, doubled on each repeat (up to 32 times the first), as
//!   Envoy's outlier detection does;
//! - a probe that cannot reach it, or has its key refused, takes it out at once; one
//!   that reaches it clears "unreachable" for `/ready`, but a cool-down still runs to
//!   its end;
//! - at most half a fleet's endpoints (one of a fleet of one or two) are out after
//!   failures at once (Envoy's `max_ejection_percent`): an overload, a blip of
//!   something they share or a request that fails everywhere cannot take them all out;
//!   the failing ones beyond it stay in rotation, and failover covers them;
//! - after the cool-down it is re-admitted gradually: its share of choices grows from a
//!   tenth to all over `readmit`, and one success ends the repeat count once it is fully
//!   back;
//! - a 429 keeps it out until its `Retry-After` has passed.
//!
//! Whatever the state, the fleet never has no endpoint to send to: when every one is
//! out, the one due back first is tried (`Fleet::pick`).

pub use crate::engine::backend::EndpointView;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::policy::ReplicaLoad;
use super::FleetConfig;
use crate::engine::upstream::fault::FaultKind;
use crate::engine::upstream::Fault;

/// How much a new measurement moves an endpoint's average (the rest is its past).
const DECAY: f64 = 0.3;
/// The share of choices a just re-admitted endpoint gets.
const READMIT_FLOOR: f64 = 0.1;
/// The longest cool-down, as a multiple of the first.
const MAX_BACKOFF: u32 = 32;

/// Where an endpoint stands, as `/ready`, `/stats` and the metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointState {
    /// In rotation.
    Up,
    /// Out for a cool-down after failures (or an unreachable probe).
    Ejected,
    /// Back after a cool-down, on a growing share of the traffic.
    Readmitting,
    /// Out until its `Retry-After` has passed.
    RateLimited,
}

impl EndpointState {
    pub const ALL: [EndpointState; 4] = [
        EndpointState::Up,
        EndpointState::Ejected,
        EndpointState::Readmitting,
        EndpointState::RateLimited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EndpointState::Up => "up",
            EndpointState::Ejected => "ejected",
            EndpointState::Readmitting => "readmitting",
            EndpointState::RateLimited => "rate_limited",
        }
    }
}

#[derive(Debug)]
pub struct Endpoint {
    /// The base URL requests go to (`http://10.0.0.3:8000/v1`); may hold credentials.
    pub url: String,
    /// The same without credentials: what logs, metrics and documents name.
    pub label: String,
    /// Its own connections (for a name resolved by the fleet, pinned to one address).
    pub client: reqwest::Client,
    outstanding: Arc<AtomicUsize>,
    health: Mutex<Health>,
}

#[derive(Debug, Default)]
struct Health {
    failures: u32,
    /// When the last failure counted toward ejection happened.
    failed_at: Option<Instant>,
    ejections: u32,
    /// Out until then (ejected).
    ejected_until: Option<Instant>,
    /// Re-admitted then, ramping up.
    readmitted_at: Option<Instant>,
    /// Out until then (429).
    limited_until: Option<Instant>,
    /// Why the last probe or request could not reach it (a fault's kind), while that
    /// stands.
    unreachable: Option<&'static str>,
    last_fault: Option<&'static str>,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    scraped: Option<Scraped>,
    scrape_failures: u64,
}

#[derive(Debug, Clone, Copy)]
struct Scraped {
    at: Instant,
    load: ReplicaLoad,
    /// What was in flight from here when it was taken.
    outstanding: usize,
}

/// Until when an endpoint is out of rotation, as one gateway sees it: after failures
/// (ejected) and after a 429 (limited). Gateways sharing a fleet's state exchange these
/// (the `state` module).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutUntil {
    pub ejected: Option<Instant>,
    pub limited: Option<Instant>,
}

/// How an attempt there went, for its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptHealth {
    /// It answered (whatever the answer): it is there and working.
    Answered,
    /// A failure that counts toward ejection.
    Failed,
    /// Neither (a refusal of the request, the client leaving).
    Neutral,
}

impl AttemptHealth {
    /// What a fault says of the endpoint: its own failure, or the request's.
    pub fn of(fault: &Fault) -> Self {
        match fault {
            Fault::Unreachable(_)
            | Fault::Timeout { .. }
            | Fault::Cut(_)
            | Fault::Stream(_)
            | Fault::Protocol(_)
            // A replica with another key, or of another model (a rollout's old pods).
            | Fault::Auth { .. }
            | Fault::ModelMismatch { .. } => AttemptHealth::Failed,
            Fault::Failed { status, .. } if *status >= 500 => AttemptHealth::Failed,
            Fault::Failed { .. } | Fault::Refused { .. } | Fault::RateLimited { .. } => {
                AttemptHealth::Neutral
            }
        }
    }
}

impl Endpoint {
    pub fn new(url: String, label: String, client: reqwest::Client) -> Self {
        Self {
            url,
            label,
            client,
            outstanding: Arc::default(),
            health: Mutex::default(),
        }
    }

    /// Requests in flight there, counted while the returned guard lives.
    pub fn outstanding(&self) -> &Arc<AtomicUsize> {
        &self.outstanding
    }

    pub fn in_flight(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where it stands at `now` (a cool-down that has passed is re-admission).
    pub fn state(&self, now: Instant, config: &FleetConfig) -> EndpointState {
        let mut h = self.health();
        h.settle(now, config);
        h.state(now)
    }

    /// Its share of the choices while re-admitted (1 when fully in), 0 while out.
    pub fn share(&self, now: Instant, config: &FleetConfig) -> f64 {
        let mut h = self.health();
        h.settle(now, config);
        match h.state(now) {
            EndpointState::Up => 1.0,
            EndpointState::Readmitting => {
                let since = h.readmitted_at.map_or(Duration::ZERO, |at| now - at);
                let ramp = since.as_secs_f64() / config.readmit.as_secs_f64().max(1e-3);
                (READMIT_FLOOR + (1.0 - READMIT_FLOOR) * ramp).min(1.0)
            }
            EndpointState::Ejected | EndpointState::RateLimited => 0.0,
        }
    }

    /// When it is due back in rotation (now, if it is in).
    pub fn back_at(&self, now: Instant) -> Instant {
        let h = self.health();
        [h.ejected_until, h.limited_until]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now)
    }

    /// Records an attempt's outcome there; a failure takes it out of rotation only when
    /// `may_eject` (the fleet keeps at least half its endpoints in: [`Fleet::attempted`]).
    ///
    /// [`Fleet::attempted`]: super::Fleet::attempted
    pub fn attempted(
        &self,
        outcome: AttemptHealth,
        fault: Option<&Fault>,
        now: Instant,
        config: &FleetConfig,
        may_eject: bool,
    ) {
        let mut h = self.heard(fault, now, config);
        if let Some(Fault::RateLimited { retry_after }) = fault {
            let wait = retry_after.unwrap_or(Duration::from_secs(1));
            h.limited_until = Some(now + wait);
        }
        match outcome {
            AttemptHealth::Answered => {
                h.failures = 0;
                if h.state(now) == EndpointState::Up {
                    h.ejections = 0;
                }
            }
            AttemptHealth::Failed => {
                h.failures += 1;
                h.failed_at = Some(now);
                if may_eject && h.failures >= config.eject_after && h.ejected_until.is_none() {
                    h.eject(now, config, &self.label);
                }
            }
            AttemptHealth::Neutral => {}
        }
    }

    /// What a probe found: `Some(fault)` when it could not reach the endpoint, or had
    /// the key refused (out at once, when `may_eject`).
    pub fn probed(
        &self,
        fault: Option<&Fault>,
        now: Instant,
        config: &FleetConfig,
        may_eject: bool,
    ) {
        let mut h = self.heard(fault, now, config);
        if let Some(fault) = fault {
            let out = fault.is_connect() || matches!(fault, Fault::Auth { .. });
            if may_eject && out && h.ejected_until.is_none() {
                h.eject(now, config, &self.label);
            }
        }
    }

    /// Its health once an attempt or probe has been heard from at `now`: settled to
    /// `now`, reached or not, and the fault's kind kept as the last one.
    fn heard(
        &self,
        fault: Option<&Fault>,
        now: Instant,
        config: &FleetConfig,
    ) -> std::sync::MutexGuard<'_, Health> {
        let mut h = self.health();
        h.settle(now, config);
        h.reached(fault, &self.label);
        if let Some(fault) = fault {
            h.last_fault = Some(fault.kind().as_str());
        }
        h
    }

    /// Whether it is failing at `now`: unreachable, out after failures, or with as many
    /// failures in a row as eject it, the last within a cool-down (an endpoint the fleet
    /// may not take out, because half the fleet is out already, still fails), or, when
    /// the last was a timeout, within a cool-down plus the time one attempt may take to
    /// fail (one that hangs fails only once per first-byte timeout). Without new
    /// failures that long it is given the benefit of the doubt again, so that a fleet
    /// nobody sends work to does not stay failed for ever.
    pub fn failing(&self, now: Instant, config: &FleetConfig) -> bool {
        let h = self.health();
        let hung = h.last_fault == Some(FaultKind::Timeout.as_str());
        let window = config.cool_down
            + if hung {
                config.failure_takes
            } else {
                Duration::ZERO
            };
        h.unreachable.is_some()
            || h.ejected_until.is_some_and(|until| until > now)
            || (h.failures >= config.eject_after
                && h.failed_at
                    .is_some_and(|at| now.saturating_duration_since(at) < window))
    }

    /// The kind of the last fault heard from it.
    pub fn last_fault(&self) -> Option<&'static str> {
        self.health().last_fault
    }

    /// Until when it is out, as this gateway sees it at `now`.
    pub fn out_until(&self, now: Instant) -> OutUntil {
        let h = self.health();
        OutUntil {
            ejected: h.ejected_until.filter(|&until| until > now),
            limited: h.limited_until.filter(|&until| until > now),
        }
    }

    /// Takes what another gateway saw: a later `Retry-After` always; a later ejection
    /// when `may_eject` (or it is out already), as if this gateway had ejected it, so it
    /// comes back the same way after the cool-down.
    pub fn adopt(&self, seen: OutUntil, now: Instant, config: &FleetConfig, may_eject: bool) {
        let mut h = self.health();
        h.settle(now, config);
        // Wall-clock milliseconds round-trip to within one: later by less is the same.
        let later = |mine: Option<Instant>, theirs: Instant| {
            mine.is_none_or(|until| until + Duration::from_millis(1) < theirs)
        };
        if let Some(limited) = seen.limited {
            if later(h.limited_until, limited) {
                h.limited_until = Some(limited);
            }
        }
        let Some(ejected) = seen.ejected else { return };
        match h.ejected_until {
            Some(_) if !later(h.ejected_until, ejected) => {}
            Some(_) => h.ejected_until = Some(ejected),
            None if may_eject => {
                h.ejected_until = Some(ejected);
                h.readmitted_at = None;
                tracing::warn!(
                    endpoint = %self.label,
                    back_in_s = (ejected - now).as_secs_f64(),
                    "Another gateway took an upstream endpoint out of rotation; so does this one."
                );
            }
            None => {}
        }
    }

    /// Whether it is out of rotation after failures at `now`.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.health().ejected_until.is_some_and(|until| until > now)
    }

    /// Why the last probe or request could not reach it (a fault's kind); `None` when
    /// it did.
    pub fn unreachable(&self) -> Option<&'static str> {
        self.health().unreachable
    }

    /// One answer's figures there, as this gateway measured them.
    pub fn measured(&self, ttft_ms: Option<f64>, tpot_ms: Option<f64>) {
        let mut h = self.health();
        let mix = |average: Option<f64>, sample: f64| {
            Some(average.map_or(sample, |a| a + DECAY * (sample - a)))
        };
        if let Some(t) = ttft_ms {
            h.ttft_ms = mix(h.ttft_ms, t);
        }
        if let Some(t) = tpot_ms {
            h.tpot_ms = mix(h.tpot_ms, t);
        }
    }

    /// Its averages, for the latency policy.
    pub fn averages(&self) -> (Option<f64>, Option<f64>) {
        let h = self.health();
        (h.ttft_ms, h.tpot_ms)
    }

    /// What its `/metrics` said just now.
    pub fn scraped(&self, load: ReplicaLoad, now: Instant) {
        let outstanding = self.in_flight();
        self.health().scraped = Some(Scraped {
            at: now,
            load,
            outstanding,
        });
    }

    /// A scrape of its `/metrics` failed or named no queue.
    pub fn scrape_failed(&self) {
        self.health().scrape_failures += 1;
    }

    /// Its engine's load as of the last scrape, when that is fresher than `stale`.
    pub fn engine_load(&self, now: Instant, stale: Duration) -> Option<ReplicaLoad> {
        let scraped = self.health().scraped?;
        (now.saturating_duration_since(scraped.at) <= stale).then(|| ReplicaLoad {
            sent_since: self.in_flight().saturating_sub(scraped.outstanding),
            ..scraped.load
        })
    }

    pub fn view(&self, now: Instant, config: &FleetConfig) -> EndpointView {
        let state = self.state(now, config);
        let h = self.health();
        let back = self.back_in(&h, now);
        EndpointView {
            endpoint: self.label.clone(),
            state: state.as_str(),
            reason: match state {
                EndpointState::Up | EndpointState::Readmitting => h.unreachable,
                EndpointState::Ejected | EndpointState::RateLimited => h.last_fault,
            }
            .map(str::to_owned),
            reachable: h.unreachable.is_none(),
            outstanding: self.in_flight(),
            ttft_ms: h.ttft_ms.map(round),
            tpot_ms: h.tpot_ms.map(round),
            ejections: h.ejections,
            back_in_secs: back,
            engine_waiting: h.scraped.map(|s| s.load.waiting),
            engine_kv_cache: h.scraped.and_then(|s| s.load.kv_cache),
            engine_metrics_age_secs: h
                .scraped
                .map(|s| round(now.saturating_duration_since(s.at).as_secs_f64())),
            scrape_failures: h.scrape_failures,
            canary: None,
        }
    }

    fn back_in(&self, h: &Health, now: Instant) -> Option<f64> {
        [h.ejected_until, h.limited_until]
            .into_iter()
            .flatten()
            .max()
            .filter(|&at| at > now)
            .map(|at| round((at - now).as_secs_f64()))
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

impl Health {
    /// What an attempt or probe says of reaching it: no connection or refused
    /// credentials make it unreachable; a timeout says nothing (a slow upstream is
    /// busy, not gone); any other answer is from a reachable one. Changes are logged.
    fn reached(&mut self, fault: Option<&Fault>, label: &str) {
        let now = match fault {
            Some(f @ (Fault::Unreachable(_) | Fault::Auth { .. })) => Some(f),
            Some(Fault::Timeout { .. }) => return,
            _ => None,
        };
        let kind = now.map(|fault| fault.kind().as_str());
        if kind == self.unreachable {
            return;
        }
        match now {
            Some(fault) => tracing::warn!(
                endpoint = %label,
                error = %fault,
                "An upstream endpoint cannot be reached; requests go to the others (if any) until it answers again."
            ),
            None => tracing::info!(endpoint = %label, "An upstream endpoint is reachable."),
        }
        self.unreachable = kind;
    }

    /// Moves on what time has ended: a passed cool-down is re-admission, a finished
    /// ramp is full health, a passed `Retry-After` is forgotten.
    fn settle(&mut self, now: Instant, config: &FleetConfig) {
        if self.ejected_until.is_some_and(|until| until <= now) {
            self.ejected_until = None;
            self.failures = 0;
            self.readmitted_at = Some(now);
            // Measured before it failed: measured again once back.
            self.ttft_ms = None;
            self.tpot_ms = None;
        }
        if self
            .readmitted_at
            .is_some_and(|at| now.saturating_duration_since(at) >= config.readmit)
        {
            self.readmitted_at = None;
        }
        if self.limited_until.is_some_and(|until| until <= now) {
            self.limited_until = None;
        }
    }

    fn state(&self, now: Instant) -> EndpointState {
        if self.ejected_until.is_some_and(|until| until > now) {
            EndpointState::Ejected
        } else if self.limited_until.is_some_and(|until| until > now) {
            EndpointState::RateLimited
        } else if self.readmitted_at.is_some() {
            EndpointState::Readmitting
        } else {
            EndpointState::Up
        }
    }

    fn eject(&mut self, now: Instant, config: &FleetConfig, label: &str) {
        let factor = 1u32 << self.ejections.min(MAX_BACKOFF.trailing_zeros());
        let cool_down = config.cool_down * factor;
        self.ejections += 1;
        self.ejected_until = Some(now + cool_down);
        self.readmitted_at = None;
        tracing::warn!(
            endpoint = %label,
            failures = self.failures,
            ejections = self.ejections,
            cool_down_s = cool_down.as_secs_f64(),
            last_fault = self.last_fault.unwrap_or_default(),
            "An upstream endpoint failed repeatedly; out of rotation for a cool-down."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> FleetConfig {
        FleetConfig {
            eject_after: 2,
            cool_down: Duration::from_secs(10),
            readmit: Duration::from_secs(20),
            ..FleetConfig::default()
        }
    }

    fn endpoint() -> Endpoint {
        Endpoint::new(
            "http://a/v1".into(),
            "http://a/v1".into(),
            reqwest::Client::new(),
        )
    }

    fn server_error() -> Fault {
        Fault::Failed {
            status: 503,
            retry_after: None,
            detail: String::new(),
        }
    }

    #[test]
    fn repeated_failures_eject_for_a_cool_down_that_doubles_and_readmits_gradually() {
        let (c, e, t0) = (config(), endpoint(), Instant::now());
        e.attempted(AttemptHealth::Failed, Some(&server_error()), t0, &c, true);
        assert_eq!(
            e.state(t0, &c),
            EndpointState::Up,
            "one failure is not enough"
        );
        e.attempted(AttemptHealth::Failed, Some(&server_error()), t0, &c, true);
        assert_eq!(e.state(t0, &c), EndpointState::Ejected);
        assert_eq!(e.share(t0, &c), 0.0);
        assert_eq!(e.view(t0, &c).reason.as_deref(), Some("upstream_error"));

        let back = t0 + Duration::from_secs(10);
        assert_eq!(e.state(back, &c), EndpointState::Readmitting);
        assert!((e.share(back, &c) - READMIT_FLOOR).abs() < 1e-9);
        let half = back + Duration::from_secs(10);
        assert!(
            (e.share(half, &c) - 0.55).abs() < 1e-9,
            "{}",
            e.share(half, &c)
        );

        // Failing again while re-admitted: out for twice as long.
        e.attempted(AttemptHealth::Failed, Some(&server_error()), half, &c, true);
        e.attempted(AttemptHealth::Failed, Some(&server_error()), half, &c, true);
        assert_eq!(
            e.state(half + Duration::from_secs(19), &c),
            EndpointState::Ejected
        );
        let again = half + Duration::from_secs(20);
        assert_eq!(e.state(again, &c), EndpointState::Readmitting);
        // Fully back and answering: the repeat count ends.
        let full = again + Duration::from_secs(20);
        e.attempted(AttemptHealth::Answered, None, full, &c, true);
        assert_eq!(e.state(full, &c), EndpointState::Up);
        assert_eq!(e.view(full, &c).ejections, 0);
    }

    #[test]
    fn a_success_between_failures_resets_the_count_and_refusals_do_not_count() {
        let (c, e, t0) = (config(), endpoint(), Instant::now());
        e.attempted(AttemptHealth::Failed, Some(&server_error()), t0, &c, true);
        e.attempted(AttemptHealth::Answered, None, t0, &c, true);
        e.attempted(AttemptHealth::Failed, Some(&server_error()), t0, &c, true);
        let refused = Fault::Refused {
            param: None,
            message: String::new(),
        };
        e.attempted(AttemptHealth::of(&refused), Some(&refused), t0, &c, true);
        assert_eq!(e.state(t0, &c), EndpointState::Up);
    }

    #[test]
    fn a_429_keeps_it_out_until_retry_after() {
        let (c, e, t0) = (config(), endpoint(), Instant::now());
        let limited = Fault::RateLimited {
            retry_after: Some(Duration::from_secs(7)),
        };
        e.attempted(AttemptHealth::of(&limited), Some(&limited), t0, &c, true);
        assert_eq!(e.state(t0, &c), EndpointState::RateLimited);
        assert_eq!(e.view(t0, &c).back_in_secs, Some(7.0));
        assert_eq!(e.state(t0 + Duration::from_secs(7), &c), EndpointState::Up);
    }

    #[test]
    fn an_unreachable_probe_ejects_at_once_and_a_good_one_clears_unreachable() {
        let (c, e, t0) = (config(), endpoint(), Instant::now());
        e.probed(Some(&Fault::Unreachable("refused".into())), t0, &c, true);
        assert_eq!(e.state(t0, &c), EndpointState::Ejected);
        assert!(!e.view(t0, &c).reachable);
        e.probed(None, t0 + Duration::from_secs(1), &c, true);
        let view = e.view(t0 + Duration::from_secs(1), &c);
        assert!(view.reachable);
        assert_eq!(view.state, "ejected", "the cool-down runs to its end");
    }

    #[test]
    fn averages_decay_toward_new_measurements() {
        let e = endpoint();
        e.measured(Some(100.0), None);
        e.measured(Some(200.0), Some(10.0));
        let (ttft, tpot) = e.averages();
        assert!((ttft.unwrap() - 130.0).abs() < 1e-9);
        assert_eq!(tpot, Some(10.0));
    }

    #[test]
    fn a_fresh_scrape_counts_what_was_sent_since() {
        let (e, t0) = (endpoint(), Instant::now());
        e.scraped(
            ReplicaLoad {
                waiting: 2.0,
                ..ReplicaLoad::default()
            },
            t0,
        );
        e.outstanding().fetch_add(3, Ordering::SeqCst);
        let load = e.engine_load(t0, Duration::from_secs(1)).unwrap();
        assert_eq!((load.waiting, load.sent_since), (2.0, 3));
        assert!(e
            .engine_load(t0 + Duration::from_secs(2), Duration::from_secs(1))
            .is_none());
    }
}

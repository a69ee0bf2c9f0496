//! The replicas of one upstream model: which endpoint each attempt goes to.
//!
//! A model's `urls` (or the addresses a DNS name resolves to, re-read every
//! `dns_refresh`) are its endpoints. Each attempt of a request picks one:
//! 1. the candidates are those in rotation that this request has not tried yet; one
//!    being re-admitted is a candidate on its growing share of draws
//!    ([`endpoint`]);
//! 2. the model's [`Policy`] picks among them ([`policy`]);
//! 3. when none is in rotation, the one due back first is tried, so a model whose
//!    replicas are all out still answers if one has recovered.
//!
//! - [`discovery`]: a DNS name's addresses, re-resolved;
//! - [`scrape`]: each endpoint's own `/metrics`, for `engine_metrics`.

pub mod canary;
pub mod discovery;
pub mod endpoint;
pub mod policy;
pub mod scrape;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand_chacha::rand_core::{RngCore, SeedableRng};

pub use crate::engine::backend::FleetView;
use crate::engine::{Prompt, Role};
pub use endpoint::{AttemptHealth, Endpoint, EndpointState, EndpointView, OutUntil};
pub use policy::Policy;

use policy::{Candidate, Choice};

/// The answer length the latency policy expects before the model has answered.
const FIRST_EXPECTED_TOKENS: f64 = 128.0;
/// How much one answer's length moves the expected length (the rest is its past).
const LENGTH_DECAY: f64 = 0.1;
/// The share of the latency policy's choices that try a random endpoint, so one whose
/// average is old (it was slow once) is measured again.
const EXPLORE: f64 = 0.05;

/// How a model's requests are spread over its endpoints, and how failing ones are
/// taken out.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    pub policy: Policy,
    /// Endpoints one request may be tried on, before its first byte reaches the client.
    pub max_attempts: u32,
    /// Re-resolve each URL's host to all its addresses this often (a Kubernetes
    /// headless Service); `None`: the URLs as they are.
    pub dns_refresh: Option<Duration>,
    /// Consecutive failures that take an endpoint out.
    pub eject_after: u32,
    /// The first cool-down; doubled on each repeat.
    pub cool_down: Duration,
    /// How long a re-admitted endpoint takes to get its full share.
    pub readmit: Duration,
    /// The longest one attempt may take to fail (the upstream's first-byte timeout): a
    /// replica that hangs reports a failure only that often.
    pub failure_takes: Duration,
    /// Characters of the prompt's leading part `prefix_affinity` hashes.
    pub prefix_chars: usize,
    /// How far over an even share `prefix_affinity` loads one endpoint.
    pub load_factor: f64,
    /// The path of each endpoint's Prometheus metrics, from its origin (vLLM, SGLang
    /// and llama.cpp's server serve `/metrics` beside `/v1`).
    pub metrics_path: String,
    /// How often `engine_metrics` scrapes them; a scrape older than three of these is
    /// stale.
    pub scrape_interval: Duration,
    /// The drift canary, when the operator asks for one.
    pub canary: Option<canary::CanaryConfig>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            max_attempts: 3,
            dns_refresh: None,
            eject_after: 3,
            cool_down: Duration::from_secs(10),
            readmit: Duration::from_secs(30),
            failure_takes: Duration::from_secs(60),
            prefix_chars: 1024,
            load_factor: 1.25,
            metrics_path: "/metrics".into(),
            scrape_interval: Duration::from_millis(500),
            canary: None,
        }
    }
}

/// What a request says about where it should go.
#[derive(Debug, Clone, Copy, Default)]
pub struct Routing {
    /// The hash of the prompt's leading part, for `prefix_affinity`.
    pub prefix: Option<u64>,
    /// The request's completion budget.
    pub max_tokens: u32,
}

impl Routing {
    /// The routing facts of a request: its prefix is the system messages and the first
    /// user turn (a text prompt: its start), up to `prefix_chars` characters.
    pub fn of(prompt: &Prompt, max_tokens: u32, prefix_chars: usize) -> Self {
        let mut lead = String::new();
        match prompt {
            Prompt::Chat(messages) => {
                for m in messages {
                    lead.push_str(m.role.as_str());
                    lead.push('\n');
                    lead.push_str(&m.content);
                    lead.push('\n');
                    if m.role == Role::User || lead.len() >= prefix_chars {
                        break;
                    }
                }
            }
            Prompt::Text(text) => lead.push_str(text),
            Prompt::Tokens(ids) => {
                for id in ids {
                    if lead.len() >= prefix_chars {
                        break;
                    }
                    lead.push_str(&id.to_string());
                    lead.push(' ');
                }
            }
        }
        let lead: String = lead.chars().take(prefix_chars).collect();
        let prefix = (!lead.trim().is_empty()).then(|| hash(&lead));
        Self { prefix, max_tokens }
    }
}

/// A hash every gateway computes alike, whatever Rust built it (std's `DefaultHasher`
/// may change between releases): gateways in front of one fleet then send a prefix to
/// the same replica (`prefix_affinity`).
fn hash(value: impl Hash) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    value.hash(&mut hasher);
    hasher.finish()
}

pub struct Fleet {
    pub config: FleetConfig,
    endpoints: RwLock<Vec<Arc<Endpoint>>>,
    turn: AtomicUsize,
    rng: Mutex<rand_chacha::ChaCha8Rng>,
    /// A decaying average of the answers' lengths in tokens: what the latency policy
    /// expects the next to cost at each endpoint's TPOT (a request's `max_tokens` is
    /// rarely used in full, and mostly unset).
    answer_tokens: Mutex<Option<f64>>,
    /// What the drift canary's last round found.
    pub canaries: canary::Canaries,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("policy", &self.config.policy)
            .field("endpoints", &self.labels())
            .finish_non_exhaustive()
    }
}

impl Fleet {
    pub fn new(config: FleetConfig, endpoints: Vec<Arc<Endpoint>>) -> Self {
        let mut seed = [0u8; 32];
        let _ = getrandom::fill(&mut seed);
        Self {
            config,
            endpoints: RwLock::new(endpoints),
            turn: AtomicUsize::new(0),
            rng: Mutex::new(rand_chacha::ChaCha8Rng::from_seed(seed)),
            answer_tokens: Mutex::new(None),
            canaries: canary::Canaries::default(),
        }
    }

    /// An answer of `tokens` tokens was read to its end.
    pub fn answered(&self, tokens: u32) {
        let mut average = self.answer_tokens.lock().unwrap_or_else(|e| e.into_inner());
        let sample = f64::from(tokens);
        *average = Some(average.map_or(sample, |a| a + LENGTH_DECAY * (sample - a)));
    }

    /// The tokens a request with budget `max_tokens` is expected to be answered with.
    fn expected_tokens(&self, max_tokens: u32) -> u32 {
        let average = *self.answer_tokens.lock().unwrap_or_else(|e| e.into_inner());
        let expected = average.unwrap_or(FIRST_EXPECTED_TOKENS).round().max(1.0) as u32;
        expected.min(max_tokens.max(1))
    }

    pub fn endpoints(&self) -> Vec<Arc<Endpoint>> {
        self.endpoints.read().map(|e| e.clone()).unwrap_or_default()
    }

    pub fn labels(&self) -> Vec<String> {
        self.endpoints().iter().map(|e| e.label.clone()).collect()
    }

    /// Replaces the endpoints with `fresh`, keeping the ones already known (with their
    /// health and averages) by label. Requests in flight at a dropped one finish there.
    pub fn replace(&self, fresh: Vec<Arc<Endpoint>>) {
        let Ok(mut endpoints) = self.endpoints.write() else {
            return;
        };
        let kept: Vec<Arc<Endpoint>> = fresh
            .into_iter()
            .map(|new| {
                endpoints
                    .iter()
                    .find(|old| old.label == new.label)
                    .cloned()
                    .unwrap_or(new)
            })
            .collect();
        let before: Vec<&str> = endpoints.iter().map(|e| e.label.as_str()).collect();
        let after: Vec<&str> = kept.iter().map(|e| e.label.as_str()).collect();
        if before != after {
            tracing::info!(before = ?before, after = ?after, "The upstream's endpoints changed.");
        }
        *endpoints = kept;
    }

    fn draw(&self) -> f64 {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The endpoint the next attempt of a request goes to, of those it has not `tried`;
    /// `None` when it has tried them all.
    pub fn pick(
        &self,
        routing: &Routing,
        tried: &[Arc<Endpoint>],
        now: Instant,
    ) -> Option<Arc<Endpoint>> {
        let untried: Vec<Arc<Endpoint>> = self
            .endpoints()
            .into_iter()
            .filter(|e| !tried.iter().any(|t| Arc::ptr_eq(t, e)))
            .collect();
        if untried.is_empty() {
            return None;
        }
        let config = &self.config;
        let mut open: Vec<&Arc<Endpoint>> = untried
            .iter()
            .filter(|e| {
                let share = e.share(now, config);
                share >= 1.0 || (share > 0.0 && self.draw() < share)
            })
            .collect();
        if open.is_empty() {
            // A re-admitted one lost its draw: it is still better than one that is out.
            open = untried
                .iter()
                .filter(|e| e.share(now, config) > 0.0)
                .collect();
        }
        if open.is_empty() {
            return untried.iter().min_by_key(|e| e.back_at(now)).cloned();
        }
        let stale = config.scrape_interval * 3;
        let candidates: Vec<Candidate> = open
            .iter()
            .map(|e| {
                let (ttft_ms, tpot_ms) = e.averages();
                Candidate {
                    outstanding: e.in_flight(),
                    ttft_ms,
                    tpot_ms,
                    engine: (config.policy == Policy::EngineMetrics)
                        .then(|| e.engine_load(now, stale))
                        .flatten(),
                    affinity: routing.prefix.map_or(0, |p| hash((p, &e.label))),
                }
            })
            .collect();
        let explore = (config.policy == Policy::Latency && self.draw() < EXPLORE)
            .then(|| (self.draw() * candidates.len() as f64) as usize);
        let choice = Choice {
            turn: self.turn.fetch_add(1, Ordering::Relaxed),
            expected_tokens: self.expected_tokens(routing.max_tokens),
            has_prefix: routing.prefix.is_some(),
            load_factor: config.load_factor,
            explore,
        };
        policy::choose(config.policy, &candidates, &choice).map(|i| Arc::clone(open[i]))
    }

    /// Records an attempt's outcome at `endpoint`, which may take it out of rotation
    /// only while fewer than half the endpoints are out (at least one may be).
    pub fn attempted(
        &self,
        endpoint: &Endpoint,
        outcome: AttemptHealth,
        fault: Option<&crate::engine::upstream::Fault>,
        now: Instant,
    ) {
        endpoint.attempted(outcome, fault, now, &self.config, self.may_eject(now));
    }

    /// What a probe of `endpoint` found (see [`Endpoint::probed`]), within the same
    /// bound as [`Fleet::attempted`].
    pub fn probed(
        &self,
        endpoint: &Endpoint,
        fault: Option<&crate::engine::upstream::Fault>,
        now: Instant,
    ) {
        endpoint.probed(fault, now, &self.config, self.may_eject(now));
    }

    /// Takes what another gateway saw of `endpoint` (through the `state` module).
    pub fn adopt(&self, endpoint: &Endpoint, seen: OutUntil, now: Instant) {
        let may_eject = endpoint.is_ejected(now) || self.may_eject(now);
        endpoint.adopt(seen, now, &self.config, may_eject);
    }

    /// Whether one more endpoint may be taken out: fewer than half are out now.
    fn may_eject(&self, now: Instant) -> bool {
        let endpoints = self.endpoints();
        let out = endpoints.iter().filter(|e| e.is_ejected(now)).count();
        out < (endpoints.len() / 2).max(1)
    }

    /// Every endpoint as `/ready` and `/stats` show it.
    pub fn views(&self, now: Instant) -> Vec<EndpointView> {
        self.endpoints()
            .iter()
            .map(|e| EndpointView {
                canary: self.canaries.of(&e.label),
                ..e.view(now, &self.config)
            })
            .collect()
    }

    /// `None` while any endpoint is not failing ([`Endpoint::failing`]); otherwise what
    /// failed last, for `/ready` and `llmgate_upstream_up`: a fleet whose every replica
    /// hangs or answers 500 is down, though each may still be reachable.
    pub fn all_failing(&self, now: Instant) -> Option<String> {
        let endpoints = self.endpoints();
        if endpoints.is_empty() || !endpoints.iter().all(|e| e.failing(now, &self.config)) {
            return None;
        }
        let last = endpoints
            .iter()
            .find_map(|e| e.last_fault())
            .unwrap_or("failing");
        Some(format!(
            "all {} endpoints are failing (last fault: {last})",
            endpoints.len()
        ))
    }

    /// `None` while any endpoint is reachable (the model is ready while one is);
    /// otherwise why the first is not.
    pub fn unreachable(&self) -> Option<&'static str> {
        let endpoints = self.endpoints();
        let mut reasons = endpoints.iter().map(|e| e.unreachable());
        let first = reasons.next().flatten()?;
        if reasons.any(|r| r.is_none()) {
            return None;
        }
        Some(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::upstream::Fault;
    use crate::engine::ChatMessage;

    fn fleet(policy: Policy, n: usize) -> Fleet {
        let endpoints = (0..n)
            .map(|i| {
                let url = format!("http://10.0.0.{i}:8000/v1");
                Arc::new(Endpoint::new(url.clone(), url, reqwest::Client::new()))
            })
            .collect();
        Fleet::new(
            FleetConfig {
                policy,
                eject_after: 1,
                ..FleetConfig::default()
            },
            endpoints,
        )
    }

    fn chat(system: &str, user: &str) -> Prompt {
        Prompt::Chat(vec![
            ChatMessage::new(Role::System, system),
            ChatMessage::new(Role::User, user),
            ChatMessage::new(Role::Assistant, "…"),
            ChatMessage::new(Role::User, "and then?"),
        ])
    }

    #[test]
    fn the_prefix_is_the_system_prompt_and_first_turn_only() {
        let a = Routing::of(&chat("You are terse.", "Hi"), 16, 1024);
        let later = Routing::of(&chat("You are terse.", "Hi"), 16, 1024);
        let other = Routing::of(&chat("You are verbose.", "Hi"), 16, 1024);
        assert_eq!(a.prefix, later.prefix);
        assert_ne!(a.prefix, other.prefix);
        // Cut to its first characters: a long shared system prompt decides alone.
        let long = "x".repeat(2000);
        let one = Routing::of(&chat(&long, "first"), 16, 1024);
        let two = Routing::of(&chat(&long, "second"), 16, 1024);
        assert_eq!(one.prefix, two.prefix);
        assert!(Routing::of(&Prompt::Text("  ".into()), 16, 1024)
            .prefix
            .is_none());
    }

    #[test]
    fn an_attempt_never_goes_where_the_request_was_tried() {
        let f = fleet(Policy::RoundRobin, 3);
        let now = Instant::now();
        let routing = Routing::default();
        let mut tried = Vec::new();
        while let Some(e) = f.pick(&routing, &tried, now) {
            assert!(!tried.iter().any(|t| Arc::ptr_eq(t, &e)));
            tried.push(e);
        }
        assert_eq!(tried.len(), 3);
    }

    #[test]
    fn ejected_endpoints_are_skipped_and_half_the_fleet_stays_in() {
        let f = fleet(Policy::LeastOutstanding, 2);
        let now = Instant::now();
        let [a, b] = <[Arc<Endpoint>; 2]>::try_from(f.endpoints()).unwrap();
        let down = Fault::Unreachable("refused".into());
        f.attempted(&a, AttemptHealth::Failed, Some(&down), now);
        for _ in 0..10 {
            let picked = f.pick(&Routing::default(), &[], now).unwrap();
            assert!(Arc::ptr_eq(&picked, &b));
        }
        assert_eq!(
            f.unreachable(),
            None,
            "one endpoint is reachable: the model is ready"
        );
        // b fails too, but one of two is out already: b stays in rotation (an overload
        // or a request that fails everywhere cannot take the whole fleet out).
        let later = now + Duration::from_secs(1);
        f.attempted(&b, AttemptHealth::Failed, Some(&down), later);
        assert!(!b.is_ejected(later));
        assert!(Arc::ptr_eq(
            &f.pick(&Routing::default(), &[], later).unwrap(),
            &b
        ));
        assert!(f.unreachable().is_some(), "neither was reached last");
    }

    #[test]
    fn with_every_endpoint_out_the_one_due_back_first_is_tried() {
        let f = fleet(Policy::RoundRobin, 2);
        let now = Instant::now();
        let [a, b] = <[Arc<Endpoint>; 2]>::try_from(f.endpoints()).unwrap();
        let limited = |secs| Fault::RateLimited {
            retry_after: Some(Duration::from_secs(secs)),
        };
        f.attempted(&a, AttemptHealth::Neutral, Some(&limited(9)), now);
        f.attempted(&b, AttemptHealth::Neutral, Some(&limited(3)), now);
        for _ in 0..4 {
            assert!(Arc::ptr_eq(
                &f.pick(&Routing::default(), &[], now).unwrap(),
                &b
            ));
        }
    }

    #[test]
    fn a_fleet_whose_every_endpoint_fails_is_down_until_one_answers_or_time_passes() {
        let f = fleet(Policy::RoundRobin, 3);
        let now = Instant::now();
        let error = Fault::Failed {
            status: 500,
            retry_after: None,
            detail: "boom".into(),
        };
        let [a, b, c] = <[Arc<Endpoint>; 3]>::try_from(f.endpoints()).unwrap();
        for e in [&a, &b] {
            f.attempted(e, AttemptHealth::Failed, Some(&error), now);
        }
        assert_eq!(f.all_failing(now), None, "one endpoint is not failing");
        f.attempted(&c, AttemptHealth::Failed, Some(&error), now);
        assert!(!c.is_ejected(now), "one of three out at most");
        let why = f.all_failing(now).expect("all three fail");
        assert!(
            why.contains("all 3 endpoints") && why.contains("upstream_"),
            "{why}"
        );
        f.attempted(&c, AttemptHealth::Answered, None, now);
        assert_eq!(f.all_failing(now), None, "one answered");
        f.attempted(&c, AttemptHealth::Failed, Some(&error), now);
        let cool_down = f.config.cool_down;
        assert_eq!(
            f.all_failing(now + cool_down),
            None,
            "no failure for a while"
        );
        // Replicas that hang fail once per first-byte timeout: the fleet stays down
        // between their failures, past the cool-downs.
        let hang = Fault::Timeout {
            waited: f.config.failure_takes,
            first_byte: true,
        };
        for e in [&a, &b, &c] {
            f.attempted(e, AttemptHealth::Failed, Some(&hang), now);
        }
        let window = cool_down + f.config.failure_takes;
        let between = now + window - Duration::from_secs(1);
        assert!(
            f.all_failing(between).is_some(),
            "down between hung attempts"
        );
        assert_eq!(f.all_failing(now + window), None, "no hang for a while");
    }

    #[test]
    fn at_most_half_a_fleet_is_ejected() {
        let f = fleet(Policy::RoundRobin, 5);
        let now = Instant::now();
        let down = Fault::Unreachable("refused".into());
        for e in f.endpoints() {
            f.attempted(&e, AttemptHealth::Failed, Some(&down), now);
        }
        let out = f.endpoints().iter().filter(|e| e.is_ejected(now)).count();
        assert_eq!(out, 2, "floor(5 / 2)");
        let solo = fleet(Policy::RoundRobin, 1);
        solo.attempted(
            &solo.endpoints()[0],
            AttemptHealth::Failed,
            Some(&down),
            now,
        );
        assert!(solo.endpoints()[0].is_ejected(now), "one of one may be out");
    }

    #[test]
    fn prefix_affinity_sends_one_prefix_to_one_endpoint_and_spreads_prefixes() {
        let f = fleet(Policy::PrefixAffinity, 4);
        let now = Instant::now();
        let mut homes = std::collections::HashSet::new();
        for system in 0..40 {
            let routing = Routing::of(&chat(&format!("system {system}"), "hi"), 16, 1024);
            let first = f.pick(&routing, &[], now).unwrap();
            for _ in 0..5 {
                assert!(Arc::ptr_eq(&f.pick(&routing, &[], now).unwrap(), &first));
            }
            homes.insert(first.label.clone());
        }
        assert_eq!(homes.len(), 4, "40 prefixes reach every endpoint");
    }

    #[test]
    fn the_expected_answer_follows_the_answers_within_the_budget() {
        let f = fleet(Policy::Latency, 1);
        assert_eq!(f.expected_tokens(4096), 128, "before any answer");
        assert_eq!(f.expected_tokens(16), 16, "never past the budget");
        f.answered(8);
        assert_eq!(f.expected_tokens(4096), 8);
        f.answered(108);
        assert_eq!(f.expected_tokens(4096), 18, "8 + 0.1 x (108 - 8)");
    }

    #[test]
    fn replacing_keeps_what_is_known_of_an_endpoint() {
        let f = fleet(Policy::LeastOutstanding, 2);
        let [a, _] = <[Arc<Endpoint>; 2]>::try_from(f.endpoints()).unwrap();
        a.measured(Some(42.0), None);
        let fresh = |url: &str| {
            Arc::new(Endpoint::new(
                url.into(),
                url.into(),
                reqwest::Client::new(),
            ))
        };
        f.replace(vec![fresh(&a.label), fresh("http://10.0.0.9:8000/v1")]);
        let now = f.endpoints();
        assert!(Arc::ptr_eq(&now[0], &a));
        assert_eq!(now[0].averages().0, Some(42.0));
        assert_eq!(now[1].label, "http://10.0.0.9:8000/v1");
    }
}

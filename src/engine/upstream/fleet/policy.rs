//! How one endpoint is chosen among a model's healthy ones: the routing policies, as
//! pure functions of a snapshot of each endpoint, so each can be tested on its own.
//!
//! | policy | picks | use it when |
//! |---|---|---|
//! | `least_outstanding` (default) | fewest requests this gateway has in flight there | replicas of one size behind one gateway (or a few): it follows load within a request, with no scrape |
//! | `round_robin` | each endpoint in turn | equal replicas and uniform requests; a baseline |
//! | `latency` | lowest decaying average of this gateway's own TTFT + TPOT there, times its in-flight load | replicas of different speed (mixed GPUs, a noisy neighbour) |
//! | `prefix_affinity` | the endpoint the prompt's leading part hashes to, unless it holds more than its share | long shared system prompts on engines with a prefix cache (vLLM, SGLang, llama.cpp's `cache_prompt`) |
//! | `engine_metrics` | shortest queue (and KV cache use) the endpoint's own `/metrics` reports | several gateways (or other clients) share the replicas, so no one gateway sees all their load |

use serde::{Deserialize, Serialize};

/// A model's routing policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Policy {
    #[default]
    LeastOutstanding,
    RoundRobin,
    Latency,
    PrefixAffinity,
    EngineMetrics,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::LeastOutstanding => "least_outstanding",
            Policy::RoundRobin => "round_robin",
            Policy::Latency => "latency",
            Policy::PrefixAffinity => "prefix_affinity",
            Policy::EngineMetrics => "engine_metrics",
        }
    }
}

/// What a policy knows of one candidate endpoint when it chooses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidate {
    /// Requests this gateway has in flight there.
    pub outstanding: usize,
    /// Decaying averages of this gateway's own measurements there; `None` before the
    /// first answer (or since it was re-admitted).
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    /// What its own `/metrics` said, when that is recent.
    pub engine: Option<ReplicaLoad>,
    /// Its rendezvous-hash score for the request's prefix (`prefix_affinity`).
    pub affinity: u64,
}

/// An engine's own account of its load, from its `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplicaLoad {
    /// Requests in its queue (vLLM's `num_requests_waiting`).
    pub waiting: f64,
    /// Requests it is running.
    pub running: f64,
    /// Share of its KV cache in use, 0..=1, where it says.
    pub kv_cache: Option<f64>,
    /// Requests this gateway has sent there since the scrape (the scrape's view is that
    /// old).
    pub sent_since: usize,
}

/// Everything about the request and the moment a choice may depend on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// A counter that moves on with every choice (round robin, and the start of the
    /// search for ties in the others, so ties spread).
    pub turn: usize,
    /// Tokens the answer may have, for the latency estimate (capped: a long budget is
    /// rarely used in full).
    pub expected_tokens: u32,
    /// Whether the request has a prefix to be affine to.
    pub has_prefix: bool,
    /// How far over an even share one endpoint may be loaded for its prefix (1.25: a
    /// quarter more).
    pub load_factor: f64,
    /// `Some(i)`: this choice explores, candidate `i` (the latency policy's
    /// exploration draw, made by the caller).
    pub explore: Option<usize>,
}

/// The index into `candidates` of the endpoint `policy` sends the request to. `None`
/// only for no candidates.
pub fn choose(policy: Policy, candidates: &[Candidate], choice: &Choice) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    Some(match policy {
        Policy::LeastOutstanding => least_outstanding(candidates, choice.turn),
        Policy::RoundRobin => choice.turn % candidates.len(),
        Policy::Latency => latency(candidates, choice),
        Policy::PrefixAffinity if choice.has_prefix => prefix_affinity(candidates, choice),
        Policy::PrefixAffinity => least_outstanding(candidates, choice.turn),
        Policy::EngineMetrics => engine_metrics(candidates, choice.turn),
    })
}

/// The candidate with the lowest `score`, ties going to the first found from `turn` on
/// (so equal endpoints share the load instead of the first taking it all).
fn lowest(candidates: &[Candidate], turn: usize, score: impl Fn(&Candidate) -> f64) -> usize {
    let n = candidates.len();
    (0..n)
        .map(|k| (turn + k) % n)
        .fold(None, |best: Option<(usize, f64)>, i| {
            let s = score(&candidates[i]);
            match best {
                Some((_, b)) if b <= s => best,
                _ => Some((i, s)),
            }
        })
        .map_or(0, |(i, _)| i)
}

fn least_outstanding(candidates: &[Candidate], turn: usize) -> usize {
    lowest(candidates, turn, |c| c.outstanding as f64)
}

/// The expected time of the answer there, if it were sent now: its TTFT plus its
/// tokens at its TPOT, for each request already in flight there and this one. An
/// endpoint without a measurement and nothing in flight is tried first (it is new, or
/// was re-admitted); one whose first answer is still on its way counts as the slowest
/// measured one until it is measured, so it is not sent everything meanwhile. With no
/// measurement at all: the least outstanding.
fn latency(candidates: &[Candidate], choice: &Choice) -> usize {
    if let Some(i) = choice.explore.filter(|&i| i < candidates.len()) {
        return i;
    }
    if let Some(unmeasured) = (0..candidates.len())
        .map(|k| (choice.turn + k) % candidates.len())
        .find(|&i| candidates[i].ttft_ms.is_none() && candidates[i].outstanding == 0)
    {
        return unmeasured;
    }
    let tokens = f64::from(choice.expected_tokens.max(1));
    let one = |c: &Candidate| {
        c.ttft_ms
            .map(|ttft| ttft + c.tpot_ms.unwrap_or(0.0) * tokens)
            .filter(|t| t.is_finite())
    };
    let Some(slowest) = candidates.iter().filter_map(one).reduce(f64::max) else {
        return least_outstanding(candidates, choice.turn);
    };
    lowest(candidates, choice.turn, |c| {
        one(c).unwrap_or(slowest) * (1 + c.outstanding) as f64
    })
}

/// Rendezvous hashing with bounded load: the candidate that scores highest for the
/// prefix, unless taking one more request would put it over `load_factor` times an
/// even share of what is in flight; then the next highest (Mirrokni, Thorup and
/// Zadimoghaddam's bound, on rendezvous rather than ring hashing). Adding or losing an
/// endpoint moves only the prefixes that hash to it.
fn prefix_affinity(candidates: &[Candidate], choice: &Choice) -> usize {
    let total: usize = candidates.iter().map(|c| c.outstanding).sum::<usize>() + 1;
    let share = (choice.load_factor.max(1.0) * total as f64 / candidates.len() as f64).ceil();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(candidates[i].affinity));
    order
        .iter()
        .copied()
        .find(|&i| (candidates[i].outstanding + 1) as f64 <= share)
        .unwrap_or_else(|| least_outstanding(candidates, choice.turn))
}

/// The shortest queue the engines report, then the least KV cache in use, counting
/// what this gateway sent since each scrape as queued; `least_outstanding` when any
/// candidate's scrape is missing or stale (a stale one could hide a queue).
fn engine_metrics(candidates: &[Candidate], turn: usize) -> usize {
    if candidates.iter().any(|c| c.engine.is_none()) {
        return least_outstanding(candidates, turn);
    }
    lowest(candidates, turn, |c| {
        let load = c.engine.unwrap_or_default();
        load.waiting + load.sent_since as f64 + load.kv_cache.unwrap_or(0.0)
            // Of equal queues and caches, the less busy one.
            + load.running * 1e-3
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(turn: usize) -> Choice {
        Choice {
            turn,
            expected_tokens: 64,
            has_prefix: true,
            load_factor: 1.25,
            explore: None,
        }
    }

    fn busy(outstanding: usize) -> Candidate {
        Candidate {
            outstanding,
            ..Candidate::default()
        }
    }

    #[test]
    fn least_outstanding_takes_the_idlest_and_spreads_ties() {
        let c = [busy(3), busy(1), busy(2)];
        assert_eq!(choose(Policy::LeastOutstanding, &c, &choice(0)), Some(1));
        let even = [busy(0), busy(0), busy(0)];
        let picks: Vec<_> = (0..3)
            .map(|t| choose(Policy::LeastOutstanding, &even, &choice(t)).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2], "ties rotate");
    }

    #[test]
    fn round_robin_takes_each_in_turn() {
        let c = [busy(9), busy(0)];
        let picks: Vec<_> = (0..4)
            .map(|t| choose(Policy::RoundRobin, &c, &choice(t)).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }

    #[test]
    fn latency_prefers_the_fast_one_until_it_is_loaded() {
        let measured = |ttft, outstanding| Candidate {
            outstanding,
            ttft_ms: Some(ttft),
            tpot_ms: Some(10.0),
            ..Candidate::default()
        };
        // 3x slower in both: 300 + 64 x 30 = 2,220 ms expected against 100 + 64 x 10 = 740.
        let fast = Candidate {
            tpot_ms: Some(10.0),
            ..measured(100.0, 0)
        };
        let slow = Candidate {
            tpot_ms: Some(30.0),
            ..measured(300.0, 0)
        };
        assert_eq!(
            choose(Policy::Latency, &[slow.clone(), fast.clone()], &choice(0)),
            Some(1)
        );
        // The fast one with three in flight expects 4 x 740 ms; the idle slow one 2,220.
        let loaded = Candidate {
            outstanding: 3,
            ..fast
        };
        assert_eq!(
            choose(Policy::Latency, &[slow, loaded], &choice(0)),
            Some(0)
        );
    }

    #[test]
    fn latency_tries_an_unmeasured_endpoint_and_explores_when_told() {
        let measured = Candidate {
            ttft_ms: Some(1.0),
            tpot_ms: Some(1.0),
            ..Candidate::default()
        };
        let c = [measured.clone(), Candidate::default()];
        assert_eq!(
            choose(Policy::Latency, &c, &choice(0)),
            Some(1),
            "re-admitted: tried"
        );
        let slow = Candidate {
            ttft_ms: Some(900.0),
            ..measured.clone()
        };
        let c = [measured, slow];
        let explore = Choice {
            explore: Some(1),
            ..choice(0)
        };
        assert_eq!(choose(Policy::Latency, &c, &explore), Some(1));
        assert_eq!(choose(Policy::Latency, &c, &choice(0)), Some(0));
    }

    #[test]
    fn an_unmeasured_endpoint_with_a_request_in_flight_is_not_sent_everything() {
        let fast = Candidate {
            ttft_ms: Some(100.0),
            tpot_ms: Some(10.0),
            ..Candidate::default()
        };
        // Just added (a new pod), its first answer on its way: as slow as the slowest
        // measured one, times its load.
        let new = busy(1);
        assert_eq!(
            choose(Policy::Latency, &[fast.clone(), new.clone()], &choice(0)),
            Some(0)
        );
        let loaded = Candidate {
            outstanding: 3,
            ..fast
        };
        assert_eq!(choose(Policy::Latency, &[loaded, new], &choice(0)), Some(1));
        // Nothing measured yet, all busy: the least outstanding.
        assert_eq!(
            choose(Policy::Latency, &[busy(2), busy(1), busy(3)], &choice(0)),
            Some(1)
        );
    }

    #[test]
    fn prefix_affinity_sticks_to_the_highest_score_within_its_share() {
        let scored = |affinity, outstanding| Candidate {
            affinity,
            outstanding,
            ..Candidate::default()
        };
        let c = [scored(5, 0), scored(9, 0), scored(1, 0)];
        assert_eq!(choose(Policy::PrefixAffinity, &c, &choice(0)), Some(1));
        // 6 in flight, 7 with this one: a share is ceil(1.25 * 7 / 3) = 3. The favourite
        // holds 3 already, so the next highest takes it.
        let c = [scored(5, 1), scored(9, 3), scored(1, 2)];
        assert_eq!(choose(Policy::PrefixAffinity, &c, &choice(0)), Some(0));
        // No prefix: the idlest.
        let none = Choice {
            has_prefix: false,
            ..choice(0)
        };
        assert_eq!(choose(Policy::PrefixAffinity, &c, &none), Some(0));
    }

    #[test]
    fn engine_metrics_reads_queues_and_falls_back_without_them() {
        let reported = |waiting, kv, sent_since, outstanding| Candidate {
            outstanding,
            engine: Some(ReplicaLoad {
                waiting,
                running: 4.0,
                kv_cache: Some(kv),
                sent_since,
            }),
            ..Candidate::default()
        };
        // The gateway has fewest in flight at the first, but its engine queues 5.
        let c = [reported(5.0, 0.1, 0, 0), reported(0.0, 0.9, 0, 4)];
        assert_eq!(choose(Policy::EngineMetrics, &c, &choice(0)), Some(1));
        // What was sent since the scrape counts as queued.
        let c = [reported(1.0, 0.1, 0, 0), reported(0.0, 0.1, 2, 2)];
        assert_eq!(choose(Policy::EngineMetrics, &c, &choice(0)), Some(0));
        // One scrape missing: least outstanding for all.
        let c = [reported(5.0, 0.1, 0, 0), busy(4)];
        assert_eq!(choose(Policy::EngineMetrics, &c, &choice(0)), Some(0));
    }

    #[test]
    fn names_round_trip_through_the_config() {
        for policy in [
            Policy::LeastOutstanding,
            Policy::RoundRobin,
            Policy::Latency,
            Policy::PrefixAffinity,
            Policy::EngineMetrics,
        ] {
            let text = serde_json::to_string(&policy).unwrap();
            assert_eq!(text, format!("\"{}\"", policy.as_str()));
        }
    }
}

//! The gateway's recent past, for the live view (`GET /stats`, the page's "Live" panel):
//! TTFT and TPOT percentiles, tokens per second and errors by type over the last
//! minutes, computed here from the request records, so that a page or a script reads a
//! handful of numbers instead of parsing Prometheus text or keeping histograms itself.
//!
//! The Prometheus histograms hold the same samples since the start; this holds only the
//! last [`WINDOW`] of them (at most [`MAX_SAMPLES`]), so its percentiles are exact and
//! follow what the gateway does now.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use utoipa::ToSchema;

use crate::record::{RequestRecord, Status};

/// How far back the percentiles and error counts look.
pub const WINDOW: Duration = Duration::from_secs(300);
/// How far back `tokens_per_second` looks: throughput now, not over five minutes.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Most samples held: under a heavy load the window is cut to the latest ones.
pub const MAX_SAMPLES: usize = 20_000;

/// One finished request, as the live view needs it.
#[derive(Debug, Clone)]
struct Sample {
    /// When it ended, on the gateway's clock.
    at: Duration,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    completion_tokens: u32,
    outcome: EndedAs,
    /// An upstream model's replica that answered it, if one did, with its own TTFT and
    /// TPOT (from that attempt's send).
    served_by: Option<Arc<str>>,
    served_ttft_ms: Option<f64>,
    served_tpot_ms: Option<f64>,
    /// The replicas it was tried at first, where the attempt failed (failover).
    failed_at: Vec<Arc<str>>,
    /// A shadow copy (the candidate's side of a shadowed request): no client waited for
    /// it, so it is counted apart from the client figures.
    copy: bool,
}

#[derive(Debug, Clone, Copy)]
enum EndedAs {
    Ok,
    /// Failed, or cancelled (`cancelled`, or the gateway's reason: `client_stalled`):
    /// the error kind it is counted under.
    Failed(&'static str),
}

/// The last minutes of finished requests.
#[derive(Debug, Default)]
pub struct Recent {
    samples: Mutex<VecDeque<Sample>>,
}

/// p50 and p95 of one figure, nearest-rank, over the requests that have it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    /// Requests the figures are over.
    pub count: usize,
}

/// What [`Recent`] says of the last minutes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct RecentFigures {
    /// Seconds the figures look back (300).
    pub window_secs: u64,
    /// Requests that ended in the window, answered or not.
    pub requests: usize,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    /// Completion tokens of the requests that ended in the last 60 s, per second.
    pub tokens_per_second: f64,
    /// Failed requests in the window by the error's kind (`invalid_value`, ...),
    /// `cancelled` for those the client left and `client_stalled` for those the gateway
    /// cut.
    pub errors: BTreeMap<String, usize>,
    /// Upstream models' replicas, by base URL: what each served in the window, shadow
    /// copies included.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, EndpointFigures>,
    /// Shadow copies that ended in the window (every figure above is clients' only): a
    /// candidate that fails shows here, not as errors a client saw.
    #[serde(skip_serializing_if = "ShadowFigures::is_empty")]
    pub shadow: ShadowFigures,
}

/// The shadow copies of the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct ShadowFigures {
    pub requests: usize,
    /// Failed copies by the error's kind.
    pub errors: BTreeMap<String, usize>,
}

impl ShadowFigures {
    fn is_empty(&self) -> bool {
        self.requests == 0
    }
}

/// What one replica of an upstream model served in the window; its TTFT and TPOT are
/// its own, from the attempt's send (a failover before it is not counted there).
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct EndpointFigures {
    /// Requests it answered.
    pub served: usize,
    /// Attempts that failed there and went to another replica (or to the client).
    pub failed_attempts: usize,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
}

impl Recent {
    /// Adds the record of a request that ended at `now`.
    pub fn observe(&self, record: &RequestRecord, now: Duration) {
        let outcome = match record.status {
            Status::Ok => EndedAs::Ok,
            Status::Error => EndedAs::Failed(record.error_kind.unwrap_or("error")),
            Status::Cancelled => EndedAs::Failed(record.error_kind.unwrap_or("cancelled")),
        };
        let attempts = record
            .upstream
            .as_ref()
            .map_or(&[][..], |u| &u.attempts[..]);
        let served = attempts.last().filter(|a| a.error_type.is_none());
        let sample = Sample {
            at: now,
            ttft_ms: record.timings.ttft_ms,
            tpot_ms: record.timings.tpot_ms,
            completion_tokens: record.usage.completion_tokens,
            outcome,
            served_by: served.map(|a| Arc::from(a.endpoint.as_str())),
            served_ttft_ms: served.and_then(|a| a.ttft_ms),
            served_tpot_ms: served.and_then(|a| a.tpot_ms),
            failed_at: attempts
                .iter()
                .filter(|a| a.error_type.is_some())
                .map(|a| Arc::from(a.endpoint.as_str()))
                .collect(),
            copy: record.is_shadow_copy(),
        };
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back(sample);
        while samples.len() > MAX_SAMPLES {
            samples.pop_front();
        }
        forget_before(&mut samples, now.saturating_sub(WINDOW));
    }

    /// The figures as of `now`.
    pub fn figures(&self, now: Duration) -> RecentFigures {
        // Copied out, so that requests ending now do not wait for the sorting below.
        let all: Vec<Sample> = {
            let mut held = self.samples.lock().unwrap_or_else(|e| e.into_inner());
            forget_before(&mut held, now.saturating_sub(WINDOW));
            held.iter().cloned().collect()
        };
        let endpoints = by_endpoint(&all);
        let (copies, samples): (Vec<Sample>, Vec<Sample>) = all.into_iter().partition(|s| s.copy);
        let rate_from = now.saturating_sub(RATE_WINDOW);
        let recent_tokens: u64 = samples
            .iter()
            .filter(|s| s.at >= rate_from)
            .map(|s| u64::from(s.completion_tokens))
            .sum();
        // Until the gateway has run a minute, the rate is over the time it has run.
        let rate_secs = RATE_WINDOW.min(now).as_secs_f64().max(1.0);
        RecentFigures {
            window_secs: WINDOW.as_secs(),
            requests: samples.len(),
            ttft_ms: percentiles(samples.iter().filter_map(|s| s.ttft_ms)),
            tpot_ms: percentiles(samples.iter().filter_map(|s| s.tpot_ms)),
            tokens_per_second: round(recent_tokens as f64 / rate_secs),
            errors: errors_of(&samples),
            endpoints,
            shadow: ShadowFigures {
                requests: copies.len(),
                errors: errors_of(&copies),
            },
        }
    }
}

/// Failed requests by the error's kind.
fn errors_of(samples: &[Sample]) -> BTreeMap<String, usize> {
    let mut errors = BTreeMap::new();
    for sample in samples {
        if let EndedAs::Failed(kind) = sample.outcome {
            *errors.entry(kind.to_owned()).or_insert(0) += 1;
        }
    }
    errors
}

/// Each replica's share of the samples: what it served, and the attempts it failed.
fn by_endpoint(samples: &[Sample]) -> BTreeMap<String, EndpointFigures> {
    let mut served: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    let mut failed: BTreeMap<&str, usize> = BTreeMap::new();
    for sample in samples {
        if let Some(endpoint) = &sample.served_by {
            served.entry(endpoint).or_default().push(sample);
        }
        for endpoint in &sample.failed_at {
            *failed.entry(endpoint).or_default() += 1;
        }
    }
    let mut figures: BTreeMap<String, EndpointFigures> = served
        .into_iter()
        .map(|(endpoint, samples)| {
            let figures = EndpointFigures {
                served: samples.len(),
                failed_attempts: 0,
                ttft_ms: percentiles(samples.iter().filter_map(|s| s.served_ttft_ms)),
                tpot_ms: percentiles(samples.iter().filter_map(|s| s.served_tpot_ms)),
            };
            (endpoint.to_owned(), figures)
        })
        .collect();
    for (endpoint, count) in failed {
        figures
            .entry(endpoint.to_owned())
            .or_default()
            .failed_attempts = count;
    }
    figures
}

fn forget_before(samples: &mut VecDeque<Sample>, from: Duration) {
    while samples.front().is_some_and(|s| s.at < from) {
        samples.pop_front();
    }
}

fn percentiles(values: impl Iterator<Item = f64>) -> Percentiles {
    let mut values: Vec<f64> = values.filter(|v| v.is_finite()).collect();
    values.sort_by(f64::total_cmp);
    let rank = |q: f64| {
        // Nearest rank: the smallest value with at least q of the values at or below it.
        let index = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
        round(values[index])
    };
    if values.is_empty() {
        return Percentiles::default();
    }
    Percentiles {
        p50: Some(rank(0.5)),
        p95: Some(rank(0.95)),
        count: values.len(),
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: Status, ttft_ms: Option<f64>, tokens: u32) -> RequestRecord {
        let mut r = crate::record::sample();
        r.status = status;
        r.error_kind = (status == Status::Error).then_some("engine_error");
        r.timings.ttft_ms = ttft_ms;
        r.timings.tpot_ms = ttft_ms.map(|t| t / 10.0);
        r.usage.completion_tokens = tokens;
        r
    }

    #[test]
    fn percentiles_rates_and_errors_over_the_window() {
        let recent = Recent::default();
        let at = |s: u64| Duration::from_secs(s);
        for i in 1..=20 {
            recent.observe(&record(Status::Ok, Some(f64::from(i) * 10.0), 6), at(100));
        }
        recent.observe(&record(Status::Error, None, 0), at(110));
        recent.observe(&record(Status::Cancelled, Some(5.0), 3), at(110));
        let now = recent.figures(at(120));
        assert_eq!(now.requests, 22);
        assert_eq!(now.ttft_ms.count, 21);
        assert_eq!(
            (now.ttft_ms.p50, now.ttft_ms.p95),
            (Some(100.0), Some(190.0))
        );
        assert_eq!(now.tpot_ms.p50, Some(10.0));
        assert_eq!(now.tokens_per_second, 2.05, "123 tokens in the last 60 s");
        assert_eq!(now.errors.get("engine_error"), Some(&1));
        assert_eq!(now.errors.get("cancelled"), Some(&1));
        assert_eq!(now.shadow, ShadowFigures::default(), "no copies");

        let later = recent.figures(at(110) + WINDOW + at(1));
        assert_eq!(
            later,
            RecentFigures {
                window_secs: 300,
                ..RecentFigures::default()
            },
            "the window has moved past them"
        );
    }

    #[test]
    fn each_replica_has_its_own_figures_and_failed_attempts() {
        let recent = Recent::default();
        let attempt = |endpoint: &str, error_type: Option<&'static str>| crate::engine::Attempt {
            endpoint: endpoint.into(),
            error_type,
            // The replica's own TTFT: the request's, less the failed attempts' time.
            ttft_ms: error_type.is_none().then_some(50.0),
            tpot_ms: None,
        };
        let upstream = |attempts| crate::record::UpstreamRecord {
            attempts,
            ..crate::record::UpstreamRecord::default()
        };
        let mut a = record(Status::Ok, Some(100.0), 4);
        a.upstream = Some(upstream(vec![attempt("http://a/v1", None)]));
        let mut failed_over = record(Status::Ok, Some(300.0), 4);
        failed_over.upstream = Some(upstream(vec![
            attempt("http://b/v1", Some("upstream_unreachable")),
            attempt("http://a/v1", None),
        ]));
        let mut lost = record(Status::Error, None, 0);
        lost.upstream = Some(upstream(vec![attempt(
            "http://b/v1",
            Some("upstream_error"),
        )]));
        for r in [&a, &failed_over, &lost] {
            recent.observe(r, Duration::from_secs(1));
        }
        let endpoints = recent.figures(Duration::from_secs(2)).endpoints;
        let a = &endpoints["http://a/v1"];
        assert_eq!((a.served, a.failed_attempts), (2, 0));
        assert_eq!(
            (a.ttft_ms.p50, a.ttft_ms.p95),
            (Some(50.0), Some(50.0)),
            "its own"
        );
        let b = &endpoints["http://b/v1"];
        assert_eq!((b.served, b.failed_attempts, b.ttft_ms.count), (0, 2, 0));
        assert!(Recent::default()
            .figures(Duration::ZERO)
            .endpoints
            .is_empty());
    }

    #[test]
    fn a_young_gateway_rates_over_the_time_it_has_run() {
        let recent = Recent::default();
        recent.observe(&record(Status::Ok, Some(1.0), 20), Duration::from_secs(2));
        assert_eq!(
            recent.figures(Duration::from_secs(4)).tokens_per_second,
            5.0
        );
    }

    #[test]
    fn shadow_copies_are_counted_apart_from_what_clients_saw() {
        let recent = Recent::default();
        let at = Duration::from_secs(100);
        recent.observe(&record(Status::Ok, Some(50.0), 4), at);
        let mut copy = record(Status::Error, None, 0);
        copy.shadow = Some(crate::record::ShadowLink {
            pair_id: "pair-1".into(),
            primary: "current".into(),
            candidate: "next".into(),
            side: crate::record::ShadowSide::Candidate,
        });
        recent.observe(&copy, at);
        let now = recent.figures(at);
        assert_eq!(now.requests, 1);
        assert!(now.errors.is_empty(), "a failed copy is no client's error");
        assert_eq!(now.shadow.requests, 1);
        assert_eq!(now.shadow.errors.get("engine_error"), Some(&1));
    }
}

//! Telemetry: metrics find the anomaly, traces locate it, logs explain it, and each
//! leads to the others through the trace id (exemplars on the latency histograms, the
//! `trace_id` field of every log line inside a request).
//!
//! - [`metrics`]: the Prometheus registry behind `GET /metrics`.
//! - [`trace`]: the `chat {model}` span of each request, exported over OTLP.
//! - [`sampler`]: tail sampling of those spans and the bounded export queue.
//! - [`logs`]: text or JSON log lines through a bounded, non-blocking writer.
//!
//! [`Telemetry::request_ended`] is the one hand-off when a request ends: metrics, then
//! the semantic-log hand-off (timed), then the trace.

pub mod answers;
pub mod config;
pub mod live;
pub mod logs;
pub mod metrics;
pub mod sampler;
pub mod trace;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::clock::Clock;
use crate::record::{RequestObserver, RequestRecord, Status};
use crate::telemetry::config::TelemetryConfig;
use metrics::{Metrics, Snapshot};
use sampler::{FinishedTrace, SamplingPolicy};
use trace::{RequestTrace, TraceSettings, Tracing};

impl From<&TelemetryConfig> for TraceSettings {
    fn from(c: &TelemetryConfig) -> Self {
        Self {
            policy: SamplingPolicy {
                ratio: c.trace_sample_ratio,
                slow_ttft: c.trace_slow_ttft,
                slow_e2e: c.trace_slow_e2e,
            },
            bounds: sampler::Bounds {
                max_held_spans: c.trace_max_held_spans,
                export_queue_spans: c.trace_export_queue,
            },
        }
    }
}

/// The `error_type` of a request that did not end well, as its metrics and its trace
/// name it: the kind its record gives, else `cancelled` (the client left) or
/// `engine_error`; `None` for a request that ended well.
pub fn error_type(record: &RequestRecord) -> Option<&'static str> {
    match record.status {
        Status::Ok => None,
        Status::Cancelled => Some(record.error_kind.unwrap_or(crate::names::CANCELLED)),
        Status::Error => Some(record.error_kind.unwrap_or(crate::names::ENGINE_ERROR)),
    }
}

/// The telemetry of one gateway, held in application state.
pub struct Telemetry {
    pub metrics: Arc<Metrics>,
    /// The OTLP pipeline; `None` when no endpoint is configured.
    tracing: Option<Tracing>,
    /// The same policy the tail sampler applies, asked again so that exemplars point
    /// only at exported traces.
    policy: SamplingPolicy,
    /// Receives every request's record: the request log line today, the semantic-log
    /// pipeline when it is configured.
    semlog: Arc<dyn RequestObserver>,
    /// Log lines dropped by the non-blocking writer, when the binary installed one.
    log_drops: Option<tracing_appender::non_blocking::ErrorCounter>,
    /// The last minutes of finished requests, for the live view (`GET /stats`).
    pub recent: live::Recent,
    /// The last requests' figures by id (`GET /stats/requests/{id}`).
    pub answers: answers::Answers,
    /// Shadowed requests' sides, paired and compared (`GET /stats`'s `shadows`).
    pub shadow_pairs: crate::shadow::Pairs,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("tracing", &self.tracing.is_some())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    pub fn new(
        metrics: Arc<Metrics>,
        tracing: Option<Tracing>,
        policy: SamplingPolicy,
        semlog: Arc<dyn RequestObserver>,
    ) -> Self {
        Self {
            metrics,
            tracing,
            policy,
            semlog,
            log_drops: None,
            recent: live::Recent::default(),
            answers: answers::Answers::default(),
            shadow_pairs: crate::shadow::Pairs::default(),
        }
    }

    /// Metrics and the record hand-off only: no traces (for tests and benchmarks).
    pub fn without_traces(model: &str, semlog: Arc<dyn RequestObserver>) -> Self {
        Self::new(
            Arc::new(Metrics::new(model)),
            None,
            SamplingPolicy {
                ratio: 0.0,
                slow_ttft: Duration::MAX,
                slow_e2e: Duration::MAX,
            },
            semlog,
        )
    }

    /// Counts the log lines the writer drops in `llmgate_log_lines_dropped_total`.
    pub fn with_log_drops(mut self, counter: tracing_appender::non_blocking::ErrorCounter) -> Self {
        self.log_drops = Some(counter);
        self
    }

    /// Starts a request's trace at `received` (the wall-clock time of `t_recv`).
    pub fn start_request(
        &self,
        headers: &actix_web::http::header::HeaderMap,
        received: SystemTime,
    ) -> RequestTrace {
        RequestTrace::start(self.tracing.as_ref(), headers, received)
    }

    /// The one hand-off when a request ends: metrics, the semantic log, the trace.
    /// Never blocks: each step is bounded in memory and gives up rather than waits.
    pub fn request_ended(&self, record: &RequestRecord, trace: RequestTrace, clock: &dyn Clock) {
        // The side of a shadowed request that ends second carries the pair's comparison.
        let compared;
        let record = match self.shadow_pairs.observe(record) {
            Some(comparison) => {
                self.metrics.observe_comparison(&comparison);
                compared = RequestRecord {
                    comparison: serde_json::to_value(&*comparison).ok().map(Arc::new),
                    ..record.clone()
                };
                &compared
            }
            None => record,
        };
        let exported = self.tracing.is_some()
            && self
                .policy
                .decide(&FinishedTrace {
                    trace_id: trace.ids.trace_id,
                    failed: record.status != Status::Ok,
                    ttft: record
                        .timings
                        .ttft_ms
                        .map(|ms| Duration::from_secs_f64(ms / 1000.0)),
                    e2e: Duration::from_secs_f64(record.timings.e2e_ms / 1000.0),
                    parent_sampled: trace.parent_sampled(),
                })
                .0;
        let trace_id = exported.then(|| trace.ids.trace_id.to_string());
        self.metrics.observe(record, trace_id.as_deref());
        self.recent.observe(record, clock.now());
        self.answers.observe(record);
        let handoff_start = clock.now();
        self.semlog.observe(record);
        let handoff_end = clock.now();
        trace.finish(record, (handoff_start, handoff_end));
    }

    /// The last semantic-log documents (redacted as they were sent), newest first, at
    /// most `most`, of requests whose API key id `keep` accepts.
    pub fn recent_documents(
        &self,
        keep: &dyn Fn(Option<&str>) -> bool,
        most: usize,
    ) -> Vec<serde_json::Value> {
        self.semlog.recent_documents(keep, most)
    }

    /// Copies the point-in-time readings into the gauges before a scrape.
    pub fn refresh(&self, models: &crate::engine::served::ServedModels, in_flight: usize) {
        let load = models.load();
        let upstreams = models
            .iter()
            .filter(|m| m.engine.model_info().is_some_and(|i| i.upstream.is_some()))
            .map(|m| {
                let up = m.engine.readiness() == crate::engine::Readiness::Ready;
                (m.id().to_owned(), up)
            })
            .collect();
        let endpoints = models
            .iter()
            .map(|m| (m.id().to_owned(), m.engine.endpoints()))
            .filter(|(_, views)| !views.is_empty())
            .collect();
        let backlog = self.semlog.backlog();
        self.metrics.refresh(&Snapshot {
            endpoints,
            semlog_queue_depth: backlog.queued,
            semlog_spooled_bytes: backlog.spooled_bytes,
            running: load.running,
            waiting: load.waiting,
            in_flight,
            resident_memory_bytes: metrics::resident_memory_bytes(),
            gpu_memory: crate::gpu::memory(),
            models: models.infos(),
            upstreams,
            kv_caches: models.kv_caches(),
            log_lines_dropped: self
                .log_drops
                .as_ref()
                .map_or(0, |c| c.dropped_lines() as u64),
        });
    }

    /// Sends the traces still queued (waiting a few seconds at most) and stops exporting.
    pub fn shutdown(&self) {
        if let Some(tracing) = &self.tracing {
            tracing.shutdown();
        }
    }
}

//! Prometheus metrics: one registry per gateway (in application state, never global),
//! fed once per request from its [`RequestRecord`] and refreshed with point-in-time
//! gauges (engine load, memory) at each scrape.
//!
//! Labels take a small fixed set of values: `model` is the configured model id or
//! `none`; `status`, `finish_reason` and `error_type` come from enums and the error
//! table. Nothing a client sends becomes a label value.
//!
//! Bucket lists follow vLLM's, extended down to the 20-60 ms per token a 2-core CPU
//! decodes at, so the histograms separate CPU and GPU deployments alike.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::names;
use families::*;
pub use families::{SemlogEvent, TraceReason, SEMLOG_DROP_REASONS, SEMLOG_FILE_KINDS};

mod endpoints;
mod exposition;
mod families;
mod observe;
pub use exposition::ExpositionFormat;

/// Point-in-time readings copied into gauges at each scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Sequences the engine is working on.
    pub running: usize,
    /// Requests admitted and waiting for an engine slot.
    pub waiting: usize,
    /// Requests admitted and not yet finished, whatever their stage.
    pub in_flight: usize,
    pub resident_memory_bytes: Option<u64>,
    /// Memory per GPU.
    pub gpu_memory: Vec<crate::gpu::GpuMemory>,
    /// The facts of each served model that is loaded.
    pub models: Vec<std::sync::Arc<crate::engine::ModelInfo>>,
    /// Each upstream model and whether its server is reachable.
    pub upstreams: Vec<(String, bool)>,
    /// Each upstream model's endpoints, as they stand.
    pub endpoints: Vec<(String, Vec<crate::engine::upstream::fleet::EndpointView>)>,
    /// The KV cache in use, for each model whose engine knows it.
    pub kv_caches: Vec<(String, crate::engine::KvCacheUse)>,
    /// Log lines the non-blocking writer dropped since start.
    pub log_lines_dropped: u64,
    /// Semantic-log documents in the spool not yet delivered.
    pub semlog_queue_depth: usize,
    /// Bytes in the semantic-log spool.
    pub semlog_spooled_bytes: u64,
}

pub struct Metrics {
    registry: Registry,
    /// The served model ids: the only `model` label values besides `none`.
    models: Vec<String>,
    ttft: ExemplarHistograms,
    upstream_ttft: Histograms,
    endpoints: endpoints::EndpointMetrics,
    tpot: ExemplarHistograms,
    e2e: ExemplarHistograms,
    itl: Histograms,
    queue: Histograms,
    repetition: Histograms,
    mean_logprob: Histograms,
    low_confidence: Histograms,
    requests: Family<RequestLabels, Counter>,
    prompt_tokens: Counters,
    generation_tokens: Counters,
    refusals: Counters,
    degenerations: Counters,
    repetition_basis: Family<BasisLabels, Counter>,
    upstream_up: Family<ModelLabel, Gauge>,
    kv_cache_usage: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    traces_sampled: Family<ReasonLabel, Counter>,
    traces_dropped: Family<ReasonLabel, Counter>,
    trace_spans_dropped: Family<ReasonLabel, Counter>,
    log_lines_dropped: Counter,
    /// The writer's cumulative drop count at the last scrape, to turn it into increments.
    log_lines_dropped_seen: AtomicU64,
    semlog: [Counter; 6],
    semlog_dropped: Family<ReasonLabel, Counter>,
    semlog_redactions: Family<KindLabel, Counter>,
    semlog_files_deleted: Family<KindLabel, Counter>,
    semlog_bulk_latency: Histogram,
    semlog_queue_depth: Gauge,
    semlog_spooled_bytes: Gauge,
    semlog_ready: Gauge,
    semlog_setup_problems: Family<StepLabel, Counter>,
    semlog_target: Family<TargetLabels, Gauge>,
    running: Gauge,
    waiting: Gauge,
    in_flight: Gauge,
    resident_memory: Gauge,
    gpu_memory: Family<GpuLabel, Gauge>,
    gpu_memory_total: Family<GpuLabel, Gauge>,
    build_info: Family<BuildLabels, Gauge>,
    model_info: Family<ModelLabels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("models", &self.models)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh registry for a gateway serving `model`.
    pub fn new(model: &str) -> Self {
        Self::for_models(&[model], &[])
    }

    /// A fresh registry for a gateway serving `models`, of which `upstreams` are served by
    /// upstream servers.
    pub fn for_models(models: &[&str], upstreams: &[&str]) -> Self {
        let mut registry = Registry::with_prefix(names::METRIC_PREFIX);
        let m = Self {
            models: models.iter().map(|m| (*m).to_owned()).collect(),
            ttft: exemplar_family(TTFT_BUCKETS),
            upstream_ttft: histogram_family(TTFT_BUCKETS),
            endpoints: endpoints::EndpointMetrics::register(&mut registry),
            tpot: exemplar_family(TOKEN_BUCKETS),
            e2e: exemplar_family(REQUEST_BUCKETS),
            itl: histogram_family(TOKEN_BUCKETS),
            queue: histogram_family(REQUEST_BUCKETS),
            repetition: histogram_family(RATE_BUCKETS),
            mean_logprob: histogram_family(SURPRISAL_BUCKETS),
            low_confidence: histogram_family(RATE_BUCKETS),
            requests: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            refusals: Family::default(),
            degenerations: Family::default(),
            repetition_basis: Family::default(),
            upstream_up: Family::default(),
            kv_cache_usage: Family::default(),
            traces_sampled: Family::default(),
            traces_dropped: Family::default(),
            trace_spans_dropped: Family::default(),
            log_lines_dropped: Counter::default(),
            log_lines_dropped_seen: AtomicU64::new(0),
            semlog: Default::default(),
            semlog_dropped: Family::default(),
            semlog_redactions: Family::default(),
            semlog_files_deleted: Family::default(),
            semlog_bulk_latency: Histogram::new(REQUEST_BUCKETS.iter().copied()),
            semlog_queue_depth: Gauge::default(),
            semlog_spooled_bytes: Gauge::default(),
            semlog_ready: Gauge::default(),
            semlog_setup_problems: Family::default(),
            semlog_target: Family::default(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            in_flight: Gauge::default(),
            resident_memory: Gauge::default(),
            gpu_memory: Family::default(),
            gpu_memory_total: Family::default(),
            build_info: Family::default(),
            model_info: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            names::TIME_TO_FIRST_TOKEN,
            "Time from receiving a request to handing its first content frame to the transport",
            m.ttft.clone(),
        );
        r.register(
            names::UPSTREAM_TIME_TO_FIRST_TOKEN,
            "Upstream models: time from sending a request upstream to its first content chunk arriving (the upstream's share of TTFT)",
            m.upstream_ttft.clone(),
        );
        r.register(
            names::TIME_PER_OUTPUT_TOKEN,
            "Mean time per output token after the first, per request",
            m.tpot.clone(),
        );
        r.register(
            names::INTER_TOKEN_LATENCY,
            "Every gap between consecutive content frames",
            m.itl.clone(),
        );
        r.register(
            names::E2E_REQUEST_LATENCY,
            "Time from receiving a request to handing its final frame to the transport",
            m.e2e.clone(),
        );
        r.register(
            names::REQUEST_QUEUE_TIME,
            "Time from receiving a request to the engine starting it",
            m.queue.clone(),
        );
        r.register(
            names::REPETITION_RATE,
            "seq-rep-n repetition rate of each answer (0 = no repeated n-gram)",
            m.repetition.clone(),
        );
        r.register(
            names::MEAN_TOKEN_SURPRISAL,
            "Mean surprisal of each answer's tokens: minus their mean log-probability, in nats (0 = certain)",
            m.mean_logprob.clone(),
        );
        r.register(
            names::LOW_CONFIDENCE_SHARE,
            "Share of each answer's tokens less likely than quality.low_confidence_prob",
            m.low_confidence.clone(),
        );
        r.register(
            names::REQUESTS,
            "Requests by outcome: status, finish reason and error type",
            m.requests.clone(),
        );
        r.register(
            names::PROMPT_TOKENS,
            "Prompt tokens processed (tokens in)",
            m.prompt_tokens.clone(),
        );
        r.register(
            names::GENERATION_TOKENS,
            "Completion tokens generated (tokens out)",
            m.generation_tokens.clone(),
        );
        r.register(
            names::REFUSALS,
            "Answers that declined the request",
            m.refusals.clone(),
        );
        r.register(
            names::DEGENERATIONS,
            "Answers stopped by the degeneration guard",
            m.degenerations.clone(),
        );
        r.register(
            names::REPETITION_BASIS,
            "Answers by what their repetition rate was computed over: token_ids (the engine's), logprob_tokens, tokenizer or words (an upstream's stand-ins)",
            m.repetition_basis.clone(),
        );
        r.register(
            names::UPSTREAM_UP,
            "1 while an upstream model's server answers (its last probe or request), 0 when it cannot be reached",
            m.upstream_up.clone(),
        );
        r.register(
            names::TRACES_SAMPLED,
            "Request traces kept by the tail sampler, by reason",
            m.traces_sampled.clone(),
        );
        r.register(
            names::TRACES_DROPPED,
            "Request traces not exported, by reason",
            m.traces_dropped.clone(),
        );
        r.register(
            names::TRACE_SPANS_DROPPED,
            "Spans dropped before their trace was decided, by reason",
            m.trace_spans_dropped.clone(),
        );
        r.register(
            names::LOG_LINES_DROPPED,
            "Log lines dropped because the log writer's queue was full",
            m.log_lines_dropped.clone(),
        );
        let semlog_help = [
            (
                names::SEMLOG_QUEUED,
                "Semantic-log documents written to the spool for the indexer",
            ),
            (
                names::SEMLOG_INDEXED,
                "Semantic-log documents accepted by the sink",
            ),
            (
                names::SEMLOG_DUPLICATES,
                "Semantic-log documents Elasticsearch already had (409)",
            ),
            (
                names::SEMLOG_RETRIED,
                "Semantic-log documents sent again after a 429 or 5xx",
            ),
            (
                names::SEMLOG_DEAD_LETTERED,
                "Semantic-log documents refused for good, in the dead-letter file",
            ),
            (
                names::SEMLOG_DEFERRED,
                "Semantic-log deliveries put off because the cluster was unavailable (per try)",
            ),
        ];
        for ((name, help), counter) in semlog_help.into_iter().zip(&m.semlog) {
            r.register(name, help, counter.clone());
        }
        r.register(
            names::SEMLOG_DROPPED,
            "Semantic-log documents lost, by reason (queue and spool both full, I/O error)",
            m.semlog_dropped.clone(),
        );
        r.register(
            names::SEMLOG_REDACTIONS,
            "Values redacted from semantic logs, by kind",
            m.semlog_redactions.clone(),
        );
        r.register(
            names::SEMLOG_FILES_DELETED,
            "NDJSON files deleted, oldest first, to keep semlog.files_max_bytes (kind: requests, dead_letter)",
            m.semlog_files_deleted.clone(),
        );
        r.register(
            names::SEMLOG_BULK_LATENCY,
            "Duration of each Elasticsearch bulk request",
            m.semlog_bulk_latency.clone(),
        );
        r.register(
            names::SEMLOG_QUEUE_DEPTH,
            "Semantic-log documents in the spool not yet delivered",
            m.semlog_queue_depth.clone(),
        );
        r.register(
            names::SEMLOG_READY,
            "1 while the semantic-log sink is set up and taking documents; 0 before its set-up and while it is degraded (/ready names the problem; documents wait in the spool)",
            m.semlog_ready.clone(),
        );
        r.register(
            names::SEMLOG_SETUP_PROBLEMS,
            "Semantic-log set-up steps the cluster refused for good, by step (documents are indexed anyway; the log says what to change)",
            m.semlog_setup_problems.clone(),
        );
        r.register(
            names::SEMLOG_TARGET_INFO,
            "The semantic log's cluster: product, version, the retention applied (none: nothing is deleted) and whether it is a data stream (value 1)",
            m.semlog_target.clone(),
        );
        r.register_with_unit(
            names::SEMLOG_SPOOLED_BYTES,
            "Bytes of semantic-log documents waiting in the disk spool",
            Unit::Bytes,
            m.semlog_spooled_bytes.clone(),
        );
        r.register(
            names::REQUESTS_RUNNING,
            "Sequences the engine is working on",
            m.running.clone(),
        );
        r.register(
            names::REQUESTS_WAITING,
            "Admitted requests waiting for an engine slot",
            m.waiting.clone(),
        );
        r.register(
            names::REQUESTS_IN_FLIGHT,
            "Admitted requests not yet finished",
            m.in_flight.clone(),
        );
        r.register(
            names::KV_CACHE_USAGE,
            "Share (0-1) of the engine's KV-cache positions the running sequences hold: prompt and output tokens over sequence slots times context length",
            m.kv_cache_usage.clone(),
        );
        r.register_with_unit(
            names::PROCESS_RESIDENT_MEMORY,
            "Resident memory of the gateway process",
            Unit::Bytes,
            m.resident_memory.clone(),
        );
        if cfg!(feature = "gpu-metrics") {
            r.register_with_unit(
                names::GPU_MEMORY_USED,
                "GPU memory in use, per device (NVML)",
                Unit::Bytes,
                m.gpu_memory.clone(),
            );
            r.register_with_unit(
                names::GPU_MEMORY_TOTAL,
                "GPU memory in all, per device (NVML)",
                Unit::Bytes,
                m.gpu_memory_total.clone(),
            );
        }
        r.register(
            names::BUILD_INFO,
            "This binary: version, commit, compiler, profile and CPU features (value 1)",
            m.build_info.clone(),
        );
        r.register(
            names::MODEL_INFO,
            "The served model: file hash, quantization, device and system_fingerprint (value 1)",
            m.model_info.clone(),
        );
        let b = crate::fingerprint::BUILD;
        m.build_info
            .get_or_create(&BuildLabels {
                version: b.version.to_owned(),
                commit: b.commit.to_owned(),
                rustc: b.rustc.to_owned(),
                profile: b.profile.to_owned(),
                target_features: b.target_features.to_owned(),
            })
            .set(1);
        m.create_zero_series(upstreams);
        Self { registry, ..m }
    }

    /// Creates every series whose labels are known up front, at zero, so that rates and
    /// alerts see a 0 rather than no data before the first event.
    fn create_zero_series(&self, upstreams: &[&str]) {
        for model in &self.models {
            let served = ModelLabel {
                model: model.clone(),
            };
            for counters in [
                &self.prompt_tokens,
                &self.generation_tokens,
                &self.refusals,
                &self.degenerations,
            ] {
                drop(counters.get_or_create(&served));
            }
            for histograms in [&self.ttft, &self.tpot, &self.e2e] {
                drop(histograms.get_or_create(&served));
            }
            for histograms in [
                &self.itl,
                &self.queue,
                &self.repetition,
                &self.mean_logprob,
                &self.low_confidence,
            ] {
                drop(histograms.get_or_create(&served));
            }
            let upstream = upstreams.contains(&model.as_str());
            if upstream {
                drop(self.upstream_ttft.get_or_create(&served));
                self.upstream_up.get_or_create(&served).set(1);
            }
            let bases = if upstream {
                &crate::tokens::RepetitionBasis::ALL[1..]
            } else {
                &crate::tokens::RepetitionBasis::ALL[..1]
            };
            for basis in bases {
                drop(self.repetition_basis.get_or_create(&BasisLabels {
                    model: model.clone(),
                    basis: basis.as_str(),
                }));
            }
        }
        use TraceReason as R;
        for reason in [R::Error, R::Slow, R::Parent, R::Ratio] {
            drop(self.traces_sampled.get_or_create(&reason.into()));
        }
        for reason in [R::SampledOut, R::QueueFull, R::ExportFailed] {
            drop(self.traces_dropped.get_or_create(&reason.into()));
        }
        for reason in [R::BufferFull, R::Late] {
            drop(self.trace_spans_dropped.get_or_create(&reason.into()));
        }
        for reason in SEMLOG_DROP_REASONS {
            drop(self.semlog_dropped.get_or_create(&ReasonLabel { reason }));
        }
        for kind in SEMLOG_FILE_KINDS {
            drop(self.semlog_files_deleted.get_or_create(&KindLabel { kind }));
        }
    }
}

/// Resident memory of this process from `/proc/self/status` (Linux); `None` elsewhere.
pub fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

//! Prometheus metrics: one registry per gateway (in application state, never global),
//! fed once per request from its [`RequestRecord`](crate::record::RequestRecord) and
//! refreshed with point-in-time gauges (engine load, memory) at each scrape.
//!
//! Labels take a small fixed set of values: `model` is the configured model id or
//! `none`; `status`, `finish_reason` and `error_type` come from enums and the error
//! table. Nothing a client sends becomes a label value.
//!
//! Bucket lists follow vLLM's, extended down to the 20-60 ms per token a 2-core CPU
//! decodes at, so the histograms separate CPU and GPU deployments alike.
//!
//! `table` declares each family once (name, help, unit, buckets), `families` holds
//! the label sets and bucket lists it uses, `observe` writes the families, `endpoints`
//! keeps the per-endpoint ones, and `exposition` encodes the registry.

use std::sync::atomic::AtomicU64;

use prometheus_client::registry::Registry;

use crate::names;
use families::*;
pub use families::{SemlogEvent, TraceReason, SEMLOG_DROP_REASONS, SEMLOG_FILE_KINDS};

mod endpoints;
mod exposition;
mod families;
mod observe;
mod table;
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

/// The registry and the metric families in it, with what turns readings into them.
pub struct Metrics {
    registry: Registry,
    /// The served model ids: the only `model` label values besides `none`.
    models: Vec<String>,
    /// The per-endpoint families of upstream models, with the endpoints they know.
    endpoints: endpoints::EndpointMetrics,
    /// Every other family, as `table` declares them.
    families: table::Families,
    /// The writer's cumulative drop count at the last scrape, to turn it into increments.
    log_lines_dropped_seen: AtomicU64,
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
        // The order of registration is the order of the exposition: endpoints first.
        let endpoints = endpoints::EndpointMetrics::register(&mut registry);
        let families = table::Families::register(&mut registry);
        let b = crate::fingerprint::BUILD;
        families
            .build_info
            .get_or_create(&BuildLabels {
                version: b.version.to_owned(),
                commit: b.commit.to_owned(),
                rustc: b.rustc.to_owned(),
                profile: b.profile.to_owned(),
                target_features: b.target_features.to_owned(),
            })
            .set(1);
        let metrics = Self {
            registry,
            models: models.iter().map(|m| (*m).to_owned()).collect(),
            endpoints,
            families,
            log_lines_dropped_seen: AtomicU64::new(0),
        };
        metrics.create_zero_series(upstreams);
        metrics
    }

    /// Creates every series whose labels are known up front, at zero, so that rates and
    /// alerts see a 0 rather than no data before the first event.
    fn create_zero_series(&self, upstreams: &[&str]) {
        let f = &self.families;
        for model in &self.models {
            let served = ModelLabel {
                model: model.clone(),
            };
            for counters in [
                &f.prompt_tokens,
                &f.generation_tokens,
                &f.refusals,
                &f.degenerations,
            ] {
                drop(counters.get_or_create(&served));
            }
            for histograms in [&f.ttft, &f.tpot, &f.e2e] {
                drop(histograms.get_or_create(&served));
            }
            for histograms in [
                &f.itl,
                &f.queue,
                &f.overhead,
                &f.repetition,
                &f.mean_logprob,
                &f.low_confidence,
            ] {
                drop(histograms.get_or_create(&served));
            }
            let upstream = upstreams.contains(&model.as_str());
            if upstream {
                drop(f.upstream_ttft.get_or_create(&served));
                f.upstream_up.get_or_create(&served).set(1);
            }
            let bases = if upstream {
                &crate::tokens::RepetitionBasis::ALL[1..]
            } else {
                &crate::tokens::RepetitionBasis::ALL[..1]
            };
            for basis in bases {
                drop(f.repetition_basis.get_or_create(&BasisLabels {
                    model: model.clone(),
                    basis: basis.as_str(),
                }));
            }
        }
        use TraceReason as R;
        for reason in [R::Error, R::Slow, R::Parent, R::Ratio] {
            drop(f.traces_sampled.get_or_create(&reason.into()));
        }
        for reason in [R::SampledOut, R::QueueFull, R::ExportFailed] {
            drop(f.traces_dropped.get_or_create(&reason.into()));
        }
        for reason in [R::BufferFull, R::Late] {
            drop(f.trace_spans_dropped.get_or_create(&reason.into()));
        }
        for reason in SEMLOG_DROP_REASONS {
            drop(f.semlog_dropped.get_or_create(&ReasonLabel { reason }));
        }
        for kind in SEMLOG_FILE_KINDS {
            drop(f.semlog_files_deleted.get_or_create(&KindLabel { kind }));
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

//! The vocabulary of the metrics: bucket lists, label sets (each a small fixed set of
//! values), the metric family types built from them, and the macros that declare label
//! sets and families.

use prometheus_client::encoding::EncodeLabelValue;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;

/// TTFT buckets (seconds): vLLM's list from 1 ms, plus 1.5 s and 3 s where CPU prefill lands.
pub(super) const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 3.0, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Gateway overhead buckets (seconds): 50 µs to 1 s, dense below 5 ms where a proxy's
/// share of a request lies.
pub(super) const OVERHEAD_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
    0.025, 0.05, 0.1, 0.25, 1.0,
];
/// TPOT and ITL buckets (seconds): vLLM's list from 10 ms, denser over 10-100 ms.
pub(super) const TOKEN_BUCKETS: &[f64] = &[
    0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// e2e and queue buckets (seconds): vLLM's request-latency list, reaching down to the
/// milliseconds a refused request takes.
pub(super) const REQUEST_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];
pub(super) const RATE_BUCKETS: &[f64] =
    &[0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
/// Mean token surprisal buckets (nats, minus the log-probability): a confident answer
/// sits near 0, one the model was unsure of above 2 (a typical token under 14% likely).
pub(super) const SURPRISAL_BUCKETS: &[f64] = &[
    0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0,
];

/// Declares label sets: each a struct whose fields are a series' labels, in order.
macro_rules! label_sets {
    ($(
        $(#[$meta:meta])*
        $set:ident { $( $(#[$field_meta:meta])* $label:ident: $ty:ty ),* $(,)? }
    )*) => {$(
        $(#[$meta])*
        #[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
        pub(super) struct $set {
            $( $(#[$field_meta])* pub(super) $label: $ty, )*
        }
    )*};
}
pub(super) use label_sets;

/// Declares a struct of metric families, one row each: the field and its type, how it
/// is made, its name (from `names`) and help text (also the field's doc), then
/// optionally its unit and the condition under which it is registered. `register`
/// makes every family and registers it in the order of the rows, which is the order of
/// the exposition.
macro_rules! declare_families {
    (@when () $registration:block) => { $registration };
    (@when ($condition:expr) $registration:block) => { if $condition $registration };
    (@register $registry:ident, $name:expr, $help:literal, (), $family:expr) => {
        $registry.register($name, $help, $family)
    };
    (@register $registry:ident, $name:expr, $help:literal, ($unit:ident), $family:expr) => {
        $registry.register_with_unit(
            $name,
            $help,
            prometheus_client::registry::Unit::$unit,
            $family,
        )
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $families:ident {$(
            $field:ident: $ty:ty = $make:expr,
                $name:expr, $help:literal $(, unit $unit:ident)? $(, if $condition:expr)?;
        )*}
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug)]
        $vis struct $families {
            $( #[doc = $help] pub(super) $field: $ty, )*
        }

        impl $families {
            /// Makes every family and registers each in `registry`, in the order declared.
            $vis fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
                let families = Self { $( $field: $make, )* };
                $(
                    declare_families!(@when ($($condition)?) {
                        let family = families.$field.clone();
                        declare_families!(@register registry, $name, $help, ($($unit)?), family);
                    });
                )*
                families
            }
        }
    };
}
pub(super) use declare_families;

label_sets! {
    ModelLabel { model: String }
    RequestLabels {
        model: String,
        status: &'static str,
        finish_reason: &'static str,
        error_type: &'static str,
        /// `client`, or `shadow` for a shadow copy no client waited for.
        traffic: &'static str,
    }
    BasisLabels { model: String, basis: &'static str }
    StepLabel { step: &'static str }
    TargetLabels {
        product: &'static str,
        version: String,
        lifecycle: &'static str,
        data_stream: &'static str,
    }
    ReasonLabel { reason: &'static str }
    KindLabel { kind: &'static str }
    BackendLabel { backend: &'static str }
    KeyLabel { api_key_id: String }
    PairLabels { primary: String, candidate: String }
    PairOutcomeLabels { primary: String, candidate: String, outcome: &'static str }
    PairReasonLabels { primary: String, candidate: String, reason: &'static str }
    GpuLabel { gpu: String }
    /// The exemplar attached to a latency observation: the trace that explains it.
    TraceExemplar { trace_id: String }
    BuildLabels {
        version: String,
        commit: String,
        rustc: String,
        profile: String,
        target_features: String,
    }
    ModelLabels {
        model: String,
        sha256: String,
        quant: String,
        context_length: String,
        device: String,
        gpu: String,
        driver: String,
        cuda: String,
        system_fingerprint: String,
        /// An upstream model's server (no credentials) and the name sent to it; empty in
        /// this process. Joins any series to the upstream that served it.
        upstream_url: String,
        upstream_model: String,
    }
}

/// What happened to semantic-log documents (one counter each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemlogEvent {
    /// Written to the spool (to the OS; made durable within `semlog.fsync_ms`).
    Queued,
    /// Accepted by Elasticsearch (or written to the files).
    Indexed,
    /// Already indexed: answered 409, or found in the data stream before a re-send.
    Duplicate,
    /// Could not go out (429, 5xx, a block, no answer) and waits to be sent again:
    /// counted with `/ready`'s `retried`, by [`crate::semlog::health::SinkHealth`].
    Retried,
    /// Refused for good and written to the dead-letter file.
    DeadLettered,
    /// Left in the spool for a later try: the cluster was unavailable. Counted per
    /// try, so a long outage counts a document more than once.
    Deferred,
}

/// The `reason` values of `llmgate_semlog_dropped_total`.
pub const SEMLOG_DROP_REASONS: [&str; 4] = [
    "spool_full",
    "spool_error",
    "encode_error",
    "dead_letter_error",
];

/// The `kind` values of `llmgate_semlog_files_deleted_total`.
pub const SEMLOG_FILE_KINDS: [&str; 2] = ["requests", "dead_letter"];

/// Why a trace was kept or dropped (the `reason` label of the trace counters).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum TraceReason {
    /// Kept: the request failed or was cancelled.
    Error,
    /// Kept: TTFT or e2e over the configured threshold.
    Slow,
    /// Kept: the caller's `traceparent` said it samples this trace.
    Parent,
    /// Kept: drawn by the sampling ratio.
    Ratio,
    /// Dropped: not drawn by the ratio.
    SampledOut,
    /// Dropped: the export queue was full.
    QueueFull,
    /// Dropped: the exporter reported an error.
    ExportFailed,
    /// Span dropped: the tail sampler already held its maximum of spans.
    BufferFull,
    /// Span dropped: it ended after its trace had been decided.
    Late,
}

/// Makes one histogram of a family with the family's bucket list.
#[derive(Clone, Copy)]
pub(super) struct Buckets(pub(super) &'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

impl MetricConstructor<HistogramWithExemplars<TraceExemplar>> for Buckets {
    fn new_metric(&self) -> HistogramWithExemplars<TraceExemplar> {
        HistogramWithExemplars::new(self.0.iter().copied())
    }
}

/// Candidate minus primary, in seconds, both ways from zero.
pub(super) const DELTA_BUCKETS: &[f64] = &[
    -5.0, -1.0, -0.5, -0.25, -0.1, -0.05, -0.025, -0.01, -0.005, -0.001, 0.0, 0.001, 0.005, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// A share from 0 to 1.
pub(super) const SHARE_BUCKETS: &[f64] = &[0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0];

pub(super) type PairHistograms = Family<PairLabels, Histogram, Buckets>;

pub(super) fn pair_family(buckets: &'static [f64]) -> PairHistograms {
    Family::new_with_constructor(Buckets(buckets))
}

pub(super) type ExemplarHistograms =
    Family<ModelLabel, HistogramWithExemplars<TraceExemplar>, Buckets>;
pub(super) type Histograms = Family<ModelLabel, Histogram, Buckets>;
pub(super) type Counters = Family<ModelLabel, Counter>;

pub(super) fn exemplar_family(buckets: &'static [f64]) -> ExemplarHistograms {
    Family::new_with_constructor(Buckets(buckets))
}

pub(super) fn histogram_family(buckets: &'static [f64]) -> Histograms {
    Family::new_with_constructor(Buckets(buckets))
}

impl ModelLabels {
    pub(super) fn of(m: &crate::engine::ModelInfo) -> Self {
        Self {
            model: m.id.clone(),
            sha256: m.sha256.clone(),
            quant: m.quant.clone(),
            context_length: m.context_length.to_string(),
            device: m.device.clone(),
            gpu: m.accelerator.gpu.clone(),
            driver: m.accelerator.driver.clone(),
            cuda: m.accelerator.cuda.clone(),
            system_fingerprint: m.system_fingerprint.clone(),
            upstream_url: m
                .upstream
                .as_ref()
                .map(|u| u.url.clone())
                .unwrap_or_default(),
            upstream_model: m
                .upstream
                .as_ref()
                .map(|u| u.model.clone())
                .unwrap_or_default(),
        }
    }
}

impl From<TraceReason> for ReasonLabel {
    fn from(reason: TraceReason) -> Self {
        let reason = match reason {
            TraceReason::Error => "error",
            TraceReason::Slow => "slow",
            TraceReason::Parent => "parent",
            TraceReason::Ratio => "ratio",
            TraceReason::SampledOut => "sampled_out",
            TraceReason::QueueFull => "queue_full",
            TraceReason::ExportFailed => "export_failed",
            TraceReason::BufferFull => "buffer_full",
            TraceReason::Late => "late",
        };
        ReasonLabel { reason }
    }
}

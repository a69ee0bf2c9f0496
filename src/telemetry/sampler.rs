//! Tail sampling inside the process, and the export queue behind it.
//!
//! [`TailSampler`] is an OpenTelemetry SDK span processor. It holds the spans of each
//! request until the request's local root span ends, then asks the [`SamplingPolicy`]:
//! failed and cancelled requests, requests over the TTFT or e2e threshold and requests
//! whose caller samples the trace are always kept; the rest are kept at the configured
//! ratio, drawn from the trace id so every process in the trace draws alike.
//!
//! Memory is bounded twice:
//! - at most `max_held_spans` spans wait for their root. When the bound is reached, a
//!   further child span is dropped on the spot and counted
//!   (`llmgate_trace_spans_dropped_total{reason="buffer_full"}`); the root span is never
//!   held, so its trace is still decided and, if kept, exported without that child.
//! - kept spans go through a bounded queue to an export thread. When the queue is full,
//!   the trace is dropped and counted (`llmgate_traces_dropped_total{reason="queue_full"}`);
//!   nothing on the request path ever waits for the exporter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry::trace::{SpanId, Status, TraceContextExt, TraceId};
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;

use super::metrics::{Metrics, TraceReason};
use crate::names;

/// Which finished requests keep their trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingPolicy {
    /// Share of ordinary (fast, successful) requests kept, 0 to 1.
    pub ratio: f64,
    /// Requests whose TTFT is above this are always kept.
    pub slow_ttft: Duration,
    /// Requests whose e2e latency is above this are always kept.
    pub slow_e2e: Duration,
}

/// What the policy looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedTrace {
    pub trace_id: TraceId,
    /// Failed or cancelled.
    pub failed: bool,
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    /// The caller's `traceparent` had the sampled flag.
    pub parent_sampled: bool,
}

impl SamplingPolicy {
    /// `(keep, reason)`. Deterministic: the same outcome always gets the same answer, so
    /// the metrics can attach exemplars only to traces that are exported.
    pub fn decide(&self, o: &FinishedTrace) -> (bool, TraceReason) {
        if o.failed {
            (true, TraceReason::Error)
        } else if o.ttft.is_some_and(|t| t > self.slow_ttft) || o.e2e > self.slow_e2e {
            (true, TraceReason::Slow)
        } else if o.parent_sampled {
            (true, TraceReason::Parent)
        } else if ratio_draw(o.trace_id, self.ratio) {
            (true, TraceReason::Ratio)
        } else {
            (false, TraceReason::SampledOut)
        }
    }
}

/// Keeps `ratio` of trace ids, judged on their low 64 bits as the W3C random part.
fn ratio_draw(trace_id: TraceId, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let bytes = trace_id.to_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&bytes[8..]);
    let threshold = (ratio * u64::MAX as f64) as u64;
    u64::from_be_bytes(low) < threshold
}

/// Reads the policy's inputs off a finished root span (see `trace::RequestTrace::finish`
/// for the attributes it sets).
fn outcome_of(root: &SpanData, parent_sampled: bool) -> FinishedTrace {
    let attribute = |key: &str| root.attributes.iter().find(|kv| kv.key.as_str() == key);
    let failed =
        matches!(root.status, Status::Error { .. }) || attribute(names::ERROR_TYPE).is_some();
    let ttft = attribute(names::ATTR_TTFT_MS).and_then(|kv| match kv.value {
        opentelemetry::Value::F64(ms) if ms >= 0.0 => Some(Duration::from_secs_f64(ms / 1000.0)),
        _ => None,
    });
    // The e2e the request reported, as the metrics path sees it; the span itself lasts a
    // little longer (it also covers the hand-off after the last frame).
    let e2e = match attribute(names::ATTR_E2E_MS).map(|kv| &kv.value) {
        Some(opentelemetry::Value::F64(ms)) if *ms >= 0.0 => Duration::from_secs_f64(ms / 1000.0),
        _ => root
            .end_time
            .duration_since(root.start_time)
            .unwrap_or_default(),
    };
    FinishedTrace {
        trace_id: root.span_context.trace_id(),
        failed,
        ttft,
        e2e,
        parent_sampled,
    }
}

#[derive(Debug, Default)]
struct Held {
    /// Local root span id -> spans of its request that have ended.
    traces: HashMap<SpanId, Pending>,
    /// Span id -> its local root, for every started span that is not a root.
    roots: HashMap<SpanId, SpanId>,
    /// Spans in `traces`.
    spans: usize,
}

#[derive(Debug, Default)]
struct Pending {
    parent_sampled: bool,
    spans: Vec<SpanData>,
}

pub struct TailSampler {
    policy: SamplingPolicy,
    max_held_spans: usize,
    held: Mutex<Held>,
    queue: Mutex<Option<mpsc::Sender<SpanData>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for TailSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailSampler")
            .field("policy", &self.policy)
            .field("max_held_spans", &self.max_held_spans)
            .finish_non_exhaustive()
    }
}

/// Sizes of the sampler's two bounded buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_held_spans: usize,
    pub export_queue_spans: usize,
}

impl TailSampler {
    /// Starts the export thread, which builds the exporter with `build` inside its own
    /// Tokio runtime (the gRPC client must be made inside one) and exports batches.
    pub fn start<E, B>(
        policy: SamplingPolicy,
        bounds: Bounds,
        resource: Resource,
        metrics: Arc<Metrics>,
        build: B,
    ) -> std::io::Result<Self>
    where
        E: SpanExporter + 'static,
        B: FnOnce() -> Result<E, String> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(bounds.export_queue_spans.max(1));
        let worker_metrics = Arc::clone(&metrics);
        let worker = std::thread::Builder::new()
            .name("llmgate-otlp".into())
            .spawn(move || export_loop(build, rx, resource, worker_metrics))?;
        Ok(Self {
            policy,
            max_held_spans: bounds.max_held_spans,
            held: Mutex::default(),
            queue: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
            metrics,
        })
    }

    fn enqueue(&self, spans: Vec<SpanData>) {
        let Ok(queue) = self.queue.lock() else { return };
        let Some(tx) = queue.as_ref() else { return };
        // Reserve the whole trace first, so a trace is exported whole or not at all.
        let permits = match tx.try_reserve_many(spans.len()) {
            Ok(permits) => permits,
            Err(_) => {
                self.metrics.trace_decided(TraceReason::QueueFull, false);
                return;
            }
        };
        for (permit, span) in permits.zip(spans) {
            permit.send(span);
        }
    }
}

fn is_local_root(parent: &Context) -> bool {
    let parent = parent.span();
    let sc = parent.span_context();
    !sc.is_valid() || sc.is_remote()
}

impl SpanProcessor for TailSampler {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        use opentelemetry::trace::Span as _;
        let id = span.span_context().span_id();
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        if is_local_root(cx) {
            let parent_sampled = {
                let parent = cx.span();
                let sc = parent.span_context();
                sc.is_valid() && sc.is_sampled()
            };
            held.traces.insert(
                id,
                Pending {
                    parent_sampled,
                    spans: Vec::new(),
                },
            );
        } else {
            let parent = cx.span().span_context().span_id();
            let root = held.roots.get(&parent).copied().unwrap_or(parent);
            held.roots.insert(id, root);
        }
    }

    fn on_end(&self, span: SpanData) {
        let id = span.span_context.span_id();
        let decided = {
            let Ok(mut held) = self.held.lock() else {
                return;
            };
            if let Some(root) = held.roots.remove(&id) {
                // A child: hold it until its root ends.
                let full = held.spans >= self.max_held_spans;
                match held.traces.get_mut(&root) {
                    Some(_) if full => self.metrics.span_dropped(TraceReason::BufferFull),
                    Some(pending) => {
                        pending.spans.push(span);
                        held.spans += 1;
                    }
                    None => self.metrics.span_dropped(TraceReason::Late),
                }
                return;
            }
            let Some(pending) = held.traces.remove(&id) else {
                return;
            };
            held.spans -= pending.spans.len();
            pending
        };
        let (keep, reason) = self
            .policy
            .decide(&outcome_of(&span, decided.parent_sampled));
        self.metrics.trace_decided(reason, keep);
        if keep {
            let mut spans = decided.spans;
            spans.push(span);
            self.enqueue(spans);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// Closes the queue and waits (up to `timeout`) for the export thread to send what
    /// it holds.
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        if let Ok(mut queue) = self.queue.lock() {
            queue.take();
        }
        let worker = self.worker.lock().ok().and_then(|mut w| w.take());
        if let Some(worker) = worker {
            let deadline = std::time::Instant::now() + timeout;
            while !worker.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if worker.is_finished() {
                let _ = worker.join();
            }
        }
        Ok(())
    }
}

/// Largest batch per export call, and how long a partial batch waits for company.
const MAX_BATCH: usize = 512;
const BATCH_DELAY: Duration = Duration::from_millis(100);

fn export_loop<E, B>(
    build: B,
    mut rx: mpsc::Receiver<SpanData>,
    resource: Resource,
    metrics: Arc<Metrics>,
) where
    E: SpanExporter + 'static,
    B: FnOnce() -> Result<E, String>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(error = %error, "Could not start the trace export runtime; traces are off.");
            return;
        }
    };
    runtime.block_on(async move {
        let mut exporter = match build() {
            Ok(exporter) => exporter,
            Err(error) => {
                tracing::error!(error = %error, "Could not build the OTLP exporter; traces are off.");
                return;
            }
        };
        exporter.set_resource(&resource);
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + BATCH_DELAY;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) | Err(_) => break,
                }
            }
            let traces = batch
                .iter()
                .filter(|s| s.parent_span_id == SpanId::INVALID || s.parent_span_is_remote)
                .count();
            if let Err(error) = exporter.export(batch).await {
                tracing::warn!(error = %error, traces, "Exporting traces failed; they are dropped.");
                for _ in 0..traces {
                    metrics.trace_decided(TraceReason::ExportFailed, false);
                }
            }
        }
        let _ = exporter.shutdown();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(trace: u128) -> FinishedTrace {
        FinishedTrace {
            trace_id: TraceId::from(trace),
            failed: false,
            ttft: Some(Duration::from_millis(100)),
            e2e: Duration::from_secs(1),
            parent_sampled: false,
        }
    }

    fn policy(ratio: f64) -> SamplingPolicy {
        SamplingPolicy {
            ratio,
            slow_ttft: Duration::from_secs(2),
            slow_e2e: Duration::from_secs(30),
        }
    }

    #[test]
    fn errors_slow_requests_and_sampled_parents_are_always_kept() {
        let p = policy(0.0);
        let failed = FinishedTrace {
            failed: true,
            ..outcome(1)
        };
        assert_eq!(p.decide(&failed), (true, TraceReason::Error));
        let slow_first = FinishedTrace {
            ttft: Some(Duration::from_secs(3)),
            ..outcome(1)
        };
        assert_eq!(p.decide(&slow_first), (true, TraceReason::Slow));
        let slow_end = FinishedTrace {
            e2e: Duration::from_secs(31),
            ..outcome(1)
        };
        assert_eq!(p.decide(&slow_end), (true, TraceReason::Slow));
        let parent = FinishedTrace {
            parent_sampled: true,
            ..outcome(1)
        };
        assert_eq!(p.decide(&parent), (true, TraceReason::Parent));
        assert_eq!(p.decide(&outcome(1)), (false, TraceReason::SampledOut));
    }

    /// An exporter that keeps what it is given.
    #[derive(Debug, Clone, Default)]
    struct Keep(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Keep {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().expect("lock").extend(batch);
            Ok(())
        }
    }

    /// Runs one request-shaped trace (root + `children` children, all fast and
    /// successful) through a sampler with the given bounds; returns the exported span
    /// names and the metrics exposition.
    fn run_trace(bounds: Bounds, children: usize) -> (Vec<String>, String) {
        use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
        let metrics = Arc::new(Metrics::new("m"));
        let kept = Keep::default();
        let exporter = kept.clone();
        let sampler = TailSampler::start(
            policy(1.0),
            bounds,
            Resource::builder_empty().build(),
            Arc::clone(&metrics),
            move || Ok(exporter),
        )
        .expect("sampler");
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(sampler)
            .build();
        let tracer = provider.tracer("test");
        let root = tracer.start("chat m");
        let cx = Context::new().with_span(root);
        for i in 0..children {
            let mut child = tracer.start_with_context(format!("child {i}"), &cx);
            child.end();
        }
        cx.span().end();
        let _ = provider.shutdown();
        let mut names: Vec<String> = kept
            .0
            .lock()
            .expect("lock")
            .iter()
            .map(|s| s.name.to_string())
            .collect();
        names.sort();
        let text = metrics
            .encode(super::super::metrics::ExpositionFormat::Prometheus)
            .expect("encode");
        (names, text)
    }

    #[test]
    fn held_spans_are_bounded_and_the_root_is_still_decided() {
        let bounds = Bounds {
            max_held_spans: 1,
            export_queue_spans: 100,
        };
        let (names, text) = run_trace(bounds, 3);
        assert_eq!(names, ["chat m", "child 0"]);
        assert!(
            text.contains("llmgate_trace_spans_dropped_total{reason=\"buffer_full\"} 2"),
            "{text}"
        );
        assert!(text.contains("llmgate_traces_sampled_total{reason=\"ratio\"} 1"));
    }

    #[test]
    fn a_trace_that_does_not_fit_the_export_queue_is_dropped_whole() {
        let bounds = Bounds {
            max_held_spans: 100,
            export_queue_spans: 2,
        };
        let (names, text) = run_trace(bounds, 2);
        assert!(names.is_empty(), "{names:?}");
        assert!(
            text.contains("llmgate_traces_dropped_total{reason=\"queue_full\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn the_ratio_keeps_about_its_share_of_random_trace_ids() {
        use rand_chacha::rand_core::{RngCore, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let p = policy(0.05);
        let kept = (0..20_000)
            .filter(|_| {
                let id = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
                p.decide(&outcome(id)).0
            })
            .count();
        assert!((800..1200).contains(&kept), "kept {kept} of 20000 at 5%");
        assert!(policy(1.0).decide(&outcome(u128::MAX)).0);
        assert!(!policy(0.0).decide(&outcome(0)).0);
    }
}

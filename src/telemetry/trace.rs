//! OpenTelemetry traces of requests: the W3C `traceparent` is extracted when a request
//! arrives, the `chat {model}` span starts at `t_recv`, and when the request ends its
//! GenAI attributes and child spans (queue, prefill, decode, semantic-log hand-off)
//! are written from the request's record, with the timestamps the request timer took.
//! The spans then pass through the [`TailSampler`] on their way to OTLP.
//!
//! Exporting is configured by the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL` = `grpc` or
//! `http/protobuf`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`...), and is off when no endpoint is set.
//!
//! Prompt and completion text never become span attributes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SdkTracerProvider, Tracer as SdkTracer,
};
use opentelemetry_sdk::Resource;

use super::metrics::Metrics;
use super::sampler::{Bounds, SamplingPolicy, TailSampler};
use crate::names;
use crate::record::{RequestRecord, Status as RecordStatus, TraceIds};

/// Sampling and buffer settings of the trace pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    pub policy: SamplingPolicy,
    pub bounds: Bounds,
}

/// The OTLP trace pipeline: SDK tracer, tail sampler and export thread.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").finish_non_exhaustive()
    }
}

/// Is an OTLP endpoint configured in the environment (and tracing not disabled)?
pub fn enabled_by_env() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

impl Tracing {
    /// The pipeline the standard `OTEL_*` variables describe.
    pub fn from_env(settings: &TraceSettings, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        Self::start(settings, metrics, || {
            opentelemetry_otlp::SpanExporter::builder()
                .build()
                .map_err(|e| e.to_string())
        })
    }

    /// Exports over OTLP/gRPC to `endpoint`, whatever the environment says (for tests).
    pub fn grpc(
        endpoint: &str,
        settings: &TraceSettings,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        use opentelemetry_otlp::WithExportConfig;
        let endpoint = endpoint.to_owned();
        Self::start(settings, metrics, move || {
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| e.to_string())
        })
    }

    fn start<E, B>(
        settings: &TraceSettings,
        metrics: Arc<Metrics>,
        build: B,
    ) -> std::io::Result<Self>
    where
        E: opentelemetry_sdk::trace::SpanExporter + 'static,
        B: FnOnce() -> Result<E, String> + Send + 'static,
    {
        let mut resource = Resource::builder()
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if std::env::var("OTEL_SERVICE_NAME").is_err() {
            resource = resource.with_service_name("llmgate");
        }
        let resource = resource.build();
        let sampler = TailSampler::start(
            settings.policy.clone(),
            settings.bounds,
            resource.clone(),
            metrics,
            build,
        )?;
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::AlwaysOn)
            .with_resource(resource)
            .with_span_processor(sampler)
            .build();
        let tracer = provider.tracer("llmgate");
        Ok(Self { provider, tracer })
    }

    /// Exports what is queued (waiting up to a few seconds) and stops the pipeline.
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(error = %error, "The trace pipeline did not shut down cleanly.");
        }
    }
}

/// Reads W3C trace-context headers from an actix-web header map.
struct Headers<'a>(&'a actix_web::http::header::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// One request's trace, from `t_recv` until its record is written.
pub struct RequestTrace {
    /// Holds the request's root span when traces are exported.
    cx: Context,
    tracer: Option<SdkTracer>,
    pub ids: TraceIds,
    parent_sampled: bool,
    /// Wall-clock time of `t_recv`: spans carry wall-clock timestamps.
    received: SystemTime,
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTrace")
            .field("ids", &self.ids)
            .finish_non_exhaustive()
    }
}

impl RequestTrace {
    /// Starts the request's span at `received`, continuing the caller's trace when the
    /// headers carry a valid `traceparent`. With `tracing` off, the ids are still made
    /// (or taken from the caller), so logs and semantic logs carry them.
    pub fn start(
        tracing: Option<&Tracing>,
        headers: &actix_web::http::header::HeaderMap,
        received: SystemTime,
    ) -> Self {
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let remote: SpanContext = parent.span().span_context().clone();
        let parent_sampled = remote.is_valid() && remote.is_sampled();
        match tracing {
            Some(t) => {
                let span = t
                    .tracer
                    .span_builder(names::OPERATION_CHAT)
                    .with_kind(SpanKind::Server)
                    .with_start_time(received)
                    .start_with_context(&t.tracer, &parent);
                let sc = span.span_context();
                let ids = TraceIds {
                    trace_id: sc.trace_id(),
                    span_id: sc.span_id(),
                };
                Self {
                    cx: parent.with_span(span),
                    tracer: Some(t.tracer.clone()),
                    ids,
                    parent_sampled,
                    received,
                }
            }
            None => {
                let ids = RandomIdGenerator::default();
                let trace_id = if remote.is_valid() {
                    remote.trace_id()
                } else {
                    ids.new_trace_id()
                };
                Self {
                    cx: Context::new(),
                    tracer: None,
                    ids: TraceIds {
                        trace_id,
                        span_id: ids.new_span_id(),
                    },
                    parent_sampled,
                    received,
                }
            }
        }
    }

    /// Wall-clock time of `t_recv`.
    pub fn received_at(&self) -> SystemTime {
        self.received
    }

    /// Did the caller's `traceparent` have the sampled flag?
    pub fn parent_sampled(&self) -> bool {
        self.parent_sampled
    }

    /// The W3C `traceparent` naming this request's span as the parent: what an upstream
    /// gets, so its spans join the request's trace. Sampled when this gateway exports
    /// traces (the tail sampler decides only at the end, so the upstream records) or the
    /// caller asked for it.
    pub fn traceparent(&self) -> String {
        let sampled = self.tracer.is_some() || self.parent_sampled;
        format!(
            "00-{}-{}-{}",
            self.ids.trace_id,
            self.ids.span_id,
            if sampled { "01" } else { "00" }
        )
    }

    /// Writes the record into the span, adds the child spans and ends it. `handoff` is
    /// when the semantic-log hand-off began and ended, on the request timer's clock.
    pub fn finish(self, r: &RequestRecord, handoff: (Duration, Duration)) {
        let Some(tracer) = &self.tracer else { return };
        let p = &r.phases;
        let wall = |t: Duration| self.received + t.saturating_sub(p.received);
        let root = self.cx.span();
        root.update_name(format!("{} {}", r.operation, r.model));
        root.set_attributes(attributes(r));
        if let Some(kind) = super::error_type(r) {
            root.set_attribute(KeyValue::new(names::ERROR_TYPE, kind));
            if r.status == RecordStatus::Error {
                root.set_status(Status::error(kind));
            }
        }

        let child = |name: &'static str, from: Duration, to: Duration, extra: Vec<KeyValue>| {
            let mut span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Internal)
                .with_start_time(wall(from))
                .with_attributes(extra)
                .start_with_context(tracer, &self.cx);
            span.end_with_timestamp(wall(to));
        };
        if let (Some(submitted), Some(prepared)) = (p.submitted, p.prepared) {
            let tokens = KeyValue::new(
                names::GEN_AI_USAGE_INPUT_TOKENS,
                i64::from(r.usage.prompt_tokens),
            );
            child(names::SPAN_TOKENIZE, submitted, prepared, vec![tokens]);
        }
        if let Some(started) = p.started {
            let queue = r
                .timings
                .queue_ms
                .map(|ms| KeyValue::new(names::ATTR_QUEUE_MS, ms));
            child(
                names::SPAN_QUEUE,
                p.prepared.or(p.submitted).unwrap_or(p.received),
                started,
                queue.into_iter().collect(),
            );
        }
        if let Some(first) = p.first_token {
            child(
                names::SPAN_PREFILL,
                p.started.or(p.submitted).unwrap_or(p.received),
                first,
                Vec::new(),
            );
            if let Some(last) = p.last_token.filter(|last| *last > first) {
                child(names::SPAN_DECODE, first, last, Vec::new());
            }
        }
        child(names::SPAN_SEMLOG_HANDOFF, handoff.0, handoff.1, Vec::new());
        root.end_with_timestamp(wall(p.ended.max(handoff.1)));
    }
}

/// The GenAI semantic-convention attributes of a request, plus llmgate's own.
fn attributes(r: &RequestRecord) -> Vec<KeyValue> {
    let mut a = Attributes(vec![
        KeyValue::new(names::GEN_AI_OPERATION_NAME, r.operation),
        KeyValue::new(names::GEN_AI_PROVIDER_NAME, names::PROVIDER),
        KeyValue::new(names::GEN_AI_REQUEST_MODEL, r.model.clone()),
        KeyValue::new(names::ATTR_REQUEST_ID, r.request_id.clone()),
        KeyValue::new(names::ATTR_STREAM, r.stream),
        KeyValue::new(names::ATTR_STATUS, r.status.as_str()),
        KeyValue::new(names::ATTR_E2E_MS, r.timings.e2e_ms),
    ]);
    a.set_some(names::ATTR_API_KEY_ID, r.api_key_id.clone());
    a.requested(r);
    if r.status != RecordStatus::Error || r.quality.is_some() {
        a.answered(r);
    }
    if let Some(reason) = r.finish_reason {
        let reasons = vec![opentelemetry::StringValue::from(reason.as_str())];
        a.set(
            names::GEN_AI_RESPONSE_FINISH_REASONS,
            opentelemetry::Value::Array(reasons.into()),
        );
    }
    a.set_some(names::ATTR_TTFT_MS, r.timings.ttft_ms);
    a.set_some(names::ATTR_UPSTREAM_TTFT_MS, r.timings.upstream_ttft_ms);
    a.set(names::ATTR_OVERHEAD_MS, r.timings.overhead_ms);
    a.set_some(names::ATTR_TPOT_MS, r.timings.tpot_ms);
    a.kinds(r);
    if let Some(upstream) = &r.upstream {
        a.set_some(names::ATTR_UPSTREAM_ENDPOINT, upstream.endpoint.clone());
        let attempts = i64::try_from(upstream.attempts.len()).ok();
        a.set_some(names::ATTR_UPSTREAM_ATTEMPTS, attempts);
    }
    if let Some(q) = &r.quality {
        a.quality(q);
    }
    a.0
}

/// A span's attributes as they are gathered.
struct Attributes(Vec<KeyValue>);

impl Attributes {
    /// Reasoning and tool calls: their times, and the tools called (names only; the
    /// arguments are the model's words, kept only redacted, in the semantic log).
    fn kinds(&mut self, r: &RequestRecord) {
        let k = &r.timings.kinds;
        self.set_some(names::ATTR_ANSWER_TTFT_MS, k.answer_ttft_ms);
        self.set_some(names::ATTR_REASONING_MS, k.reasoning_ms);
        self.set_some(
            names::ATTR_REASONING_TOKENS,
            k.reasoning_tokens.map(i64::from),
        );
        self.set_some(names::ATTR_TOOL_CALL_TTFT_MS, k.tool_call_ttft_ms);
        self.set_some(names::ATTR_TOOL_CALLS_DONE_MS, k.tool_calls_done_ms);
        let Some(calls) = r.agent.as_ref().map(|a| &a.calls).filter(|c| !c.is_empty()) else {
            return;
        };
        self.set(
            names::ATTR_TOOL_CALLS,
            i64::try_from(calls.len()).unwrap_or(i64::MAX),
        );
        let called: Vec<opentelemetry::StringValue> =
            calls.iter().map(|c| c.name.clone().into()).collect();
        self.set(
            names::ATTR_TOOLS_CALLED,
            opentelemetry::Value::Array(called.into()),
        );
    }

    /// Sets `key` to `value`.
    fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.0.push(KeyValue::new(key, value));
    }

    /// Sets `key` when there is a value.
    fn set_some<V: Into<opentelemetry::Value>>(&mut self, key: &'static str, value: Option<V>) {
        if let Some(value) = value {
            self.set(key, value);
        }
    }

    /// The sampling parameters the request asked for.
    fn requested(&mut self, r: &RequestRecord) {
        let seed = r.seed.map(|s| i64::try_from(s).unwrap_or(i64::MAX));
        self.set_some(names::GEN_AI_REQUEST_SEED, seed);
        let params = &r.params;
        self.set_some(
            names::GEN_AI_REQUEST_MAX_TOKENS,
            params.max_tokens.map(i64::from),
        );
        self.set_some(names::GEN_AI_REQUEST_TEMPERATURE, params.temperature);
        self.set_some(names::GEN_AI_REQUEST_TOP_P, params.top_p);
    }

    /// The response's id, model and usage.
    fn answered(&mut self, r: &RequestRecord) {
        self.set_some(names::GEN_AI_RESPONSE_ID, r.response_id.clone());
        self.set(names::GEN_AI_RESPONSE_MODEL, r.response_model().to_owned());
        let usage = &r.usage;
        self.set(
            names::GEN_AI_USAGE_INPUT_TOKENS,
            i64::from(usage.prompt_tokens),
        );
        self.set(
            names::GEN_AI_USAGE_OUTPUT_TOKENS,
            i64::from(usage.completion_tokens),
        );
    }

    /// What the quality checks found in the answer.
    fn quality(&mut self, q: &crate::quality::Quality) {
        self.set(names::ATTR_REPETITION_RATE, q.repetition_rate);
        self.set(names::ATTR_REPETITION_BASIS, q.repetition_basis.as_str());
        self.set(names::ATTR_DEGENERATED, q.degenerated);
        self.set(names::ATTR_REFUSAL, q.refusal);
        self.set(names::ATTR_INTENT, q.intent.clone());
        self.set(names::ATTR_LANGUAGE, q.language);
        self.set(names::ATTR_ANSWER_LANGUAGE, q.answer_language);
        self.set_some(names::ATTR_MEAN_LOGPROB, q.mean_logprob);
        self.set_some(names::ATTR_MIN_LOGPROB, q.min_logprob);
        self.set_some(names::ATTR_LOW_CONFIDENCE_SHARE, q.low_confidence_share);
    }
}

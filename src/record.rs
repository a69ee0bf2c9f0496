//! The one record each request leaves when it ends (finished, failed or cancelled), and
//! the observers it is handed to. `telemetry::Telemetry::request_ended` hands it to the
//! metrics, to the record observer (the request log line; the semantic log) and to the
//! request's trace.
//!
//! This module sits below `telemetry`: telemetry reads records, records know nothing of
//! telemetry (the trace ids they carry are plain OpenTelemetry ids).

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanId, TraceId};
use serde::Serialize;

use crate::quality::Quality;
use crate::timing::{Phases, Timings};
use crate::tokens::{FinishReason, Usage};

/// The ids one request is known by in traces and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceIds {
    pub trace_id: TraceId,
    /// The request's `chat {model}` span.
    pub span_id: SpanId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Failed after admission: the engine failed or refused the request.
    Error,
    /// The client went away before the response was complete.
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub request_id: String,
    /// The `id` the response carried (`chatcmpl-…`, `cmpl-…`); `None` for a request
    /// refused before it was answered.
    pub response_id: Option<String>,
    /// `gen_ai.operation.name`: `chat` or `text_completion` (see `names`).
    pub operation: &'static str,
    /// The id of the API key the request presented (never the key), when keys are on.
    pub api_key_id: Option<String>,
    pub model: String,
    pub stream: bool,
    pub status: Status,
    /// `ApiError::kind()` of a failed request; for a cancelled one, the reason when the
    /// gateway cancelled it (`client_stalled`), `None` when the client left.
    pub error_kind: Option<&'static str>,
    pub finish_reason: Option<FinishReason>,
    /// Engine-reported usage; for a request stopped early, the tokens seen until then.
    pub usage: Usage,
    pub timings: Timings,
    /// Absent for requests refused before they reached the engine.
    pub quality: Option<Quality>,
    /// sha256 of the canonicalised request (model, messages, sampling parameters).
    pub input_hash: Option<String>,
    /// sha256 of the answer text, for `llmgate replay`.
    pub output_hash: Option<String>,
    pub seed: Option<u64>,
    /// The served model's facts (fingerprint, file hash, quantization, device); absent
    /// for requests refused before the model was asked.
    pub served: Option<std::sync::Arc<crate::engine::ModelInfo>>,
    /// Sampling parameters as the request set them (absent when it was not parsed).
    pub params: RequestParams,
    pub trace: TraceIds,
    /// When each phase began on the gateway's clock: the timestamps of the trace.
    pub phases: Phases,
    /// Every gap between consecutive content frames: one ITL histogram sample each.
    pub itl_gaps: Vec<Duration>,
    /// Wall-clock time of `t_recv`: the document's `@timestamp`.
    pub received_at: SystemTime,
    /// The client's `user` field, unredacted: only `semlog` reads it, keyed-hashed.
    pub user: Option<String>,
    /// The last user message, unredacted: only `semlog` reads it, through the redactor.
    pub prompt: Option<String>,
    /// The answer, unredacted: only `semlog` reads it, through the redactor.
    pub response: Option<String>,
    /// What an upstream said of its answer; `None` for an engine in this process.
    pub upstream: Option<UpstreamRecord>,
    /// What the request held of its key's token quotas while it ran, released when its
    /// usage is counted; `None` for a key without quotas.
    pub quota_hold: Option<QuotaHold>,
    /// The pair it is one side of, when its model is shadowed (`crate::shadow`).
    pub shadow: Option<ShadowLink>,
    /// The A/B split it was sent to, and the variant that answered.
    pub split: Option<SplitLink>,
    /// The comparison of its pair, on the side that ended second, as the semantic log
    /// keeps it (`crate::shadow::compare::Comparison`, serialised).
    pub comparison: Option<std::sync::Arc<serde_json::Value>>,
    /// An agent's turn: the tools it offered and called, and the reasoning's length;
    /// `None` for a request with neither tools nor reasoning.
    pub agent: Option<AgentRecord>,
}

/// What a request with tools or reasoning held besides its answer. The arguments are
/// the model's words: a sink redacts them like any text before keeping them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentRecord {
    /// The names of the tools the request offered.
    pub offered: Vec<String>,
    /// The calls the answer made, in order.
    pub calls: Vec<crate::engine::ToolCall>,
    /// Characters of reasoning (`reasoning_content`) the answer had.
    pub reasoning_chars: usize,
}

/// The A/B split a request named (`[[splits]] id`) and the served model it went to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitLink {
    pub split: String,
    pub variant: String,
}

/// One side of a shadowed request: the client's request to the primary model, or the
/// copy sent to the candidate, whose answer the client never sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowLink {
    /// The client's request's id: both sides carry it.
    pub pair_id: String,
    pub primary: String,
    pub candidate: String,
    pub side: ShadowSide,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShadowSide {
    Primary,
    Candidate,
}

impl RequestRecord {
    /// A shadow copy: the candidate's side of a shadowed request, which no client waits
    /// for (its errors are no client's; metrics and `/stats` count it apart).
    pub fn is_shadow_copy(&self) -> bool {
        self.shadow
            .as_ref()
            .is_some_and(|link| link.side == ShadowSide::Candidate)
    }
}

impl ShadowSide {
    pub fn as_str(self) -> &'static str {
        match self {
            ShadowSide::Primary => "primary",
            ShadowSide::Candidate => "candidate",
        }
    }
}

/// Tokens a request holds against its key's quotas from the moment it is admitted until
/// it ends (its prompt and the most it may answer), so that requests in flight together
/// cannot pass a quota by more than one request's tokens (`crate::auth::quota`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaHold {
    pub tokens: u32,
    /// The hold's id in the shared state, when it was asked for there: released there
    /// when the request ends, even if the call that took it went unanswered (it may
    /// have run all the same) or the request ended while it waited.
    pub shared: Option<String>,
    /// Held in this process (one gateway, or Redis did not answer and `fail_open`), or
    /// granted by Redis and mirrored here so that a fallback counts it: released here
    /// when the request ends.
    pub local: bool,
}

/// Who sent a request and how it asked: what the handler knows before the engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Origin {
    pub request_id: String,
    /// `gen_ai.operation.name`: `chat` or `text_completion` (see `names`).
    pub operation: &'static str,
    /// The id of the API key the request presented, when keys are on.
    pub api_key_id: Option<String>,
    pub model: String,
    pub stream: bool,
    /// See [`RequestRecord::quota_hold`].
    pub quota_hold: Option<QuotaHold>,
    /// See [`RequestRecord::shadow`].
    pub shadow: Option<ShadowLink>,
    /// See [`RequestRecord::split`].
    pub split: Option<SplitLink>,
}

/// How and when a request ended: what every record has.
#[derive(Debug, Clone)]
pub struct Ended {
    pub status: Status,
    /// See [`RequestRecord::error_kind`].
    pub error_kind: Option<&'static str>,
    pub timings: Timings,
    pub phases: Phases,
    pub trace: TraceIds,
    /// Wall-clock time of `t_recv`.
    pub received_at: SystemTime,
    pub upstream: Option<UpstreamRecord>,
}

/// What the engine answered, as the record keeps it; the default is a request that
/// never reached it (refused, or cancelled while it waited).
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub response_id: Option<String>,
    pub finish_reason: Option<FinishReason>,
    pub usage: Usage,
    pub quality: Option<Quality>,
    pub input_hash: Option<String>,
    pub output_hash: Option<String>,
    pub seed: Option<u64>,
    pub served: Option<std::sync::Arc<crate::engine::ModelInfo>>,
    pub params: RequestParams,
    pub itl_gaps: Vec<Duration>,
    pub user: Option<String>,
    pub prompt: Option<String>,
    pub response: Option<String>,
    pub agent: Option<AgentRecord>,
}

impl RequestRecord {
    /// The one way a record is made: who asked, how it ended, what was answered.
    pub fn new(origin: Origin, ended: Ended, answer: Answer) -> Self {
        Self {
            request_id: origin.request_id,
            response_id: answer.response_id,
            operation: origin.operation,
            api_key_id: origin.api_key_id,
            model: origin.model,
            stream: origin.stream,
            status: ended.status,
            error_kind: ended.error_kind,
            finish_reason: answer.finish_reason,
            usage: answer.usage,
            timings: ended.timings,
            quality: answer.quality,
            input_hash: answer.input_hash,
            output_hash: answer.output_hash,
            seed: answer.seed,
            served: answer.served,
            params: answer.params,
            trace: ended.trace,
            phases: ended.phases,
            itl_gaps: answer.itl_gaps,
            received_at: ended.received_at,
            user: answer.user,
            prompt: answer.prompt,
            response: answer.response,
            upstream: ended.upstream,
            quota_hold: origin.quota_hold,
            shadow: origin.shadow,
            split: origin.split,
            comparison: None,
            agent: answer.agent,
        }
    }
}

/// An upstream's own account of one answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamRecord {
    /// The `model` its chunks named (`gen_ai.response.model`).
    pub model: Option<String>,
    pub system_fingerprint: Option<String>,
    /// The upstream sent no usage: the counts are the gateway's.
    pub usage_estimated: bool,
    /// The endpoint that served the answer (or failed last), without credentials.
    pub endpoint: Option<String>,
    /// Every attempt at an endpoint, in order; more than one when it failed over.
    pub attempts: Vec<crate::engine::Attempt>,
}

impl UpstreamRecord {
    /// What an upstream's account of one answer says, as the record keeps it.
    pub fn of(reported: &crate::engine::Reported) -> Self {
        let route = reported.route();
        Self {
            model: reported.model.get().cloned(),
            system_fingerprint: reported.system_fingerprint.get().cloned(),
            usage_estimated: reported.usage_estimated.get().copied().unwrap_or(false),
            endpoint: route.attempts.last().map(|a| a.endpoint.clone()),
            attempts: route.attempts,
        }
    }
}

/// The record's `output_hash` of an answer's text: sha256, hex. `llmgate replay` and
/// `llmgate compare` hash the answers they get back the same way, to match them.
pub fn output_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl RequestRecord {
    /// The tokens the request counts against its key's quotas: an answer, whole or cut
    /// short, counts its prompt and completion; a request refused or failed before any
    /// token (a fleet that is down, a client retrying) costs nothing.
    pub fn quota_tokens(&self) -> u64 {
        let usage = &self.usage;
        if usage.completion_tokens == 0 {
            return 0;
        }
        u64::from(usage.prompt_tokens) + u64::from(usage.completion_tokens)
    }

    /// The model that answered: the one an upstream named, else the served one.
    pub fn response_model(&self) -> &str {
        self.upstream
            .as_ref()
            .and_then(|u| u.model.as_deref())
            .unwrap_or(&self.model)
    }

    /// The `system_fingerprint` the answer carried.
    pub fn system_fingerprint(&self) -> Option<&str> {
        self.served
            .as_deref()
            .map(|m| m.system_fingerprint.as_str())
    }
}

/// The sampling parameters a request set, as the GenAI span attributes report them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestParams {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
}

/// The `timings` object of a response: latency figures and quality signals side by side.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = Timings)]
pub struct ResponseTimings {
    #[serde(flatten)]
    pub timings: Timings,
    #[serde(flatten)]
    pub quality: Quality,
    /// For an upstream model: the replica that answered and the fingerprint it reported
    /// (the response's own `system_fingerprint` is the gateway's).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub upstream: Option<Replica>,
}

/// The replica of an upstream model that answered a request, as the answer names it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Replica {
    /// Its base URL, without credentials.
    pub endpoint: Option<String>,
    /// The `system_fingerprint` it reported, if it did.
    pub system_fingerprint: Option<String>,
}

impl Replica {
    pub fn of(reported: &crate::engine::Reported) -> Self {
        Self {
            endpoint: reported.route().attempts.last().map(|a| a.endpoint.clone()),
            system_fingerprint: reported.system_fingerprint.get().cloned(),
        }
    }
}

/// Receives every finished request's record. Must not block: it runs on the response path.
pub trait RequestObserver: Send + Sync + 'static {
    fn observe(&self, record: &RequestRecord);

    /// What the observer holds but has not delivered yet (for the metrics).
    fn backlog(&self) -> Backlog {
        Backlog::default()
    }

    /// The last documents it wrote, newest first, at most `most` of them, of requests
    /// whose API key id `keep` accepts: what the live view shows of the last requests
    /// (the semantic log's redacted documents; nothing from an observer that writes
    /// none).
    fn recent_documents(
        &self,
        _keep: &dyn Fn(Option<&str>) -> bool,
        _most: usize,
    ) -> Vec<serde_json::Value> {
        Vec::new()
    }
}

/// Records an observer holds but has not delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Documents written but not yet delivered.
    pub queued: usize,
    /// Their bytes in the on-disk spool.
    pub spooled_bytes: u64,
}

/// Writes one structured log line per request.
#[derive(Debug, Default)]
pub struct LogObserver {
    /// The semantic log's hash key: the line's `input_hash` and `output_hash` are the
    /// documents' (keyed); without one they are left out, never plain.
    pub hashes: Option<crate::redact::HashKey>,
}

impl RequestObserver for LogObserver {
    fn observe(&self, r: &RequestRecord) {
        let keyed = |digest: Option<&String>| {
            let key = self.hashes.as_ref()?;
            digest.map(|d| key.hash(d))
        };
        let t = &r.timings;
        // request_id, trace_id and span_id come from the enclosing `request` span.
        tracing::info!(
            model = %r.model,
            stream = r.stream,
            status = r.status.as_str(),
            error_type = r.error_kind,
            finish_reason = r.finish_reason.map(FinishReason::as_str),
            prompt_tokens = r.usage.prompt_tokens,
            completion_tokens = r.usage.completion_tokens,
            ttft_ms = t.ttft_ms,
            engine_ttft_ms = t.engine_ttft_ms,
            tpot_ms = t.tpot_ms,
            queue_ms = t.queue_ms,
            client_wait_ms = t.client_wait_ms,
            e2e_ms = t.e2e_ms,
            repetition_rate = r.quality.as_ref().map(|q| q.repetition_rate),
            degenerated = r.quality.as_ref().map(|q| q.degenerated),
            refusal = r.quality.as_ref().map(|q| q.refusal),
            intent = r.quality.as_ref().map(|q| q.intent.as_str()),
            seed = r.seed,
            input_hash = keyed(r.input_hash.as_ref()),
            output_hash = keyed(r.output_hash.as_ref()),
            system_fingerprint = r.system_fingerprint(),
            "Request finished."
        );
    }
}

/// Hands each record to several observers, in order.
pub struct FanOut(pub Vec<std::sync::Arc<dyn RequestObserver>>);

impl RequestObserver for FanOut {
    fn observe(&self, record: &RequestRecord) {
        for observer in &self.0 {
            observer.observe(record);
        }
    }

    fn backlog(&self) -> Backlog {
        self.0.iter().fold(Backlog::default(), |sum, o| {
            let b = o.backlog();
            Backlog {
                queued: sum.queued + b.queued,
                spooled_bytes: sum.spooled_bytes + b.spooled_bytes,
            }
        })
    }

    /// Those of the first observer that keeps any (the semantic log).
    fn recent_documents(
        &self,
        keep: &dyn Fn(Option<&str>) -> bool,
        most: usize,
    ) -> Vec<serde_json::Value> {
        self.0
            .iter()
            .map(|o| o.recent_documents(keep, most))
            .find(|documents| !documents.is_empty())
            .unwrap_or_default()
    }
}

/// Keeps every record; for tests.
#[derive(Debug, Default)]
pub struct CollectingObserver {
    records: Mutex<Vec<RequestRecord>>,
}

impl CollectingObserver {
    pub fn records(&self) -> Vec<RequestRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl RequestObserver for CollectingObserver {
    fn observe(&self, record: &RequestRecord) {
        if let Ok(mut records) = self.records.lock() {
            records.push(record.clone());
        }
    }
}

/// A finished streamed chat request with every field set (unit tests).
#[cfg(test)]
pub(crate) fn sample() -> RequestRecord {
    use crate::quality::Quality;
    use crate::timing::{ItlStats, Phases, Timings};
    use crate::tokens::{FinishReason, Usage};
    use opentelemetry::trace::{SpanId, TraceId};
    use std::time::{Duration, UNIX_EPOCH};

    RequestRecord {
        response_id: Some("chatcmpl-req-1".into()),
        operation: crate::names::OPERATION_CHAT,
        request_id: "req-1".into(),
        api_key_id: Some("ci-bot".into()),
        model: "smollm2".into(),
        stream: true,
        status: Status::Ok,
        error_kind: None,
        finish_reason: Some(FinishReason::Length),
        usage: Usage {
            prompt_tokens: 12,
            completion_tokens: 3,
            cached_tokens: None,
            reasoning_tokens: None,
        },
        timings: Timings {
            ttft_ms: Some(120.5),
            engine_ttft_ms: Some(118.25),
            tpot_ms: Some(21.0),
            e2e_ms: 170.5,
            queue_ms: Some(1.5),
            itl_ms: Some(ItlStats {
                p50: 21.0,
                p95: 22.0,
                max: 22.0,
            }),
            tokens_per_second: Some(17.595),
            output_tokens: 3,
            chunks: 3,
            delivery_ms: Some(ItlStats {
                p50: 0.05,
                p95: 0.08,
                max: 0.08,
            }),
            client_wait_ms: Some(0.25),
            upstream_ttft_ms: None,
            overhead_ms: 0.0,
            kinds: Default::default(),
        },
        quality: Some(Quality {
            repetition_rate: 0.0,
            degenerated: false,
            refusal: false,
            intent: "general".into(),
            language: "eng",
            answer_language: "eng",
            mean_logprob: Some(-0.42),
            min_logprob: Some(-2.5),
            low_confidence_share: Some(0.0),
            repetition_basis: Default::default(),
        }),
        input_hash: Some("in".into()),
        output_hash: Some("out".into()),
        seed: Some(42),
        served: Some(std::sync::Arc::new(crate::engine::ModelInfo {
            id: "smollm2".into(),
            context_length: 8192,
            system_fingerprint: "fp_1".into(),
            sha256: "0c1d".into(),
            quant: "Q8_0".into(),
            device: "cpu/quantized".into(),
            accelerator: Default::default(),
            upstream: None,
            loaded_at: 1_767_225_600,
        })),
        params: RequestParams {
            max_tokens: Some(3),
            temperature: Some(0.5),
            top_p: None,
        },
        trace: TraceIds {
            trace_id: TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128),
            span_id: SpanId::from(0x00f0_67aa_0ba9_02b7_u64),
        },
        phases: Phases::default(),
        itl_gaps: Vec::new(),
        received_at: UNIX_EPOCH + Duration::from_millis(1_764_460_800_123),
        user: Some("jane@example.com".into()),
        prompt: Some("Mail me at jane@example.com".into()),
        response: Some("Sure.".into()),
        upstream: None,
        quota_hold: None,
        shadow: None,
        split: None,
        comparison: None,
        agent: None,
    }
}

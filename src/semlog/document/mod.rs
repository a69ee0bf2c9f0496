//! The semantic-log document: one per request, redacted, in the shape Elasticsearch
//! stores it. ECS fields where ECS has them (`@timestamp`, `event.*`, `trace.id`,
//! `span.id`, `service.*`, `error.*`, `data_stream.*`), ECS `gen_ai.*` (the OpenTelemetry
//! GenAI names) for model, usage and finish reasons, and `llm.*` for what no standard has.
//!
//! [`RedactedLog::build`] is the only way to make one, and it sends every piece of free
//! text through the [`Redactor`]: the encoder and every sink take a `RedactedLog`, so
//! nothing unredacted can reach them.

pub(crate) mod agent;
mod excerpts;

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::redact::{Redacted, RedactionCounts, Redactor};
use crate::engine::ModelInfo;
use crate::fingerprint::BUILD;
use crate::names;
use crate::record::{RequestRecord, Status, UpstreamRecord};
use excerpts::Excerpts;

/// The data stream's dataset: `logs-llmgate.requests-<namespace>`.
pub const DATASET: &str = "llmgate.requests";

/// Where the documents of one gateway go and how long excerpts may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentSettings {
    /// The `<namespace>` of the data stream (`default` unless configured).
    pub namespace: String,
    /// Characters of the prompt and of the response kept, after redaction.
    pub excerpt_chars: usize,
    /// Keep no excerpt at all (redactions are still counted).
    pub stats_only: bool,
}

/// A request's semantic log, redacted. Serialises to the Elasticsearch document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedactedLog {
    #[serde(rename = "@timestamp")]
    timestamp: String,
    event: Event,
    service: Service,
    trace: Id,
    span: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Error>,
    /// ECS `user.hash`: the client's `user` field, keyed-hashed (only with a redaction key).
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<User>,
    gen_ai: GenAi,
    llm: Llm,
    data_stream: DataStream,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Event {
    /// Unique per document: the `_id` it is indexed under. Made by the gateway, never
    /// taken from the client (whose `x-request-id` is in `llm.request_id`), so no client
    /// can collide with or overwrite another request's document.
    id: String,
    kind: &'static str,
    category: [&'static str; 1],
    #[serde(rename = "type")]
    kind_type: [&'static str; 1],
    dataset: &'static str,
    outcome: &'static str,
    /// Nanoseconds, as ECS wants: the request's e2e latency.
    duration: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Service {
    name: &'static str,
    version: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Id {
    id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct User {
    hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Error {
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct GenAi {
    operation: Name,
    provider: Name,
    request: GenAiRequest,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<GenAiResponse>,
    usage: Usage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Name {
    name: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct GenAiRequest {
    model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct GenAiResponse {
    id: String,
    model: String,
    finish_reasons: Vec<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Usage {
    input_tokens: u32,
    output_tokens: u32,
}

/// What the answer was made with: the served model file and device, and this build.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct ModelFacts {
    sha256: String,
    quant: String,
    device: String,
    context_length: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    gpu: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    driver: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    cuda: String,
    /// An upstream model's server and the name sent to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_model: Option<String>,
}

/// What an upstream said of its answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Upstream {
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<String>,
    /// It sent no usage: `gen_ai.usage.*` are the gateway's counts.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    usage_estimated: bool,
    /// The replica that served the answer (or failed last).
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    /// Endpoints tried (more than 1: it failed over).
    attempts: usize,
    /// The attempts that failed before one answered (or before it gave up), in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failed_attempts: Vec<FailedAttempt>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct FailedAttempt {
    endpoint: String,
    error_type: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct BuildFacts {
    commit: &'static str,
    target_features: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Llm {
    request_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key_id: Option<String>,
    status: &'static str,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tpot_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_ttft_ms: Option<f64>,
    e2e_ms: f64,
    overhead_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_wait_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    itl: Option<Itl>,
    /// Chunks with text (below the output tokens: they came bunched).
    chunks: u32,
    /// Engine stamp -> the gateway's stream taking each chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    delivery: Option<Itl>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repetition_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repetition_basis: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mean_logprob: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_logprob: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    low_confidence_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    degenerated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    intent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    language: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer_language: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<ModelFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<Upstream>,
    /// The pair this request is one side of, when its model is shadowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<Shadow>,
    /// The A/B split the request named and the variant that answered it.
    #[serde(skip_serializing_if = "Option::is_none")]
    split: Option<Split>,
    /// Both sides of the pair and how far they differ, on the side that ended second.
    #[serde(skip_serializing_if = "Option::is_none")]
    comparison: Option<serde_json::Value>,
    build: BuildFacts,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_excerpt: Option<Redacted>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_excerpt: Option<Redacted>,
    /// Reasoning and tool calls: the times of each kind of output.
    #[serde(flatten)]
    kinds: agent::KindFields,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<agent::Tools>,
    redactions: RedactionCounts,
    redactions_total: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Shadow {
    pair_id: String,
    side: &'static str,
    primary: String,
    candidate: String,
}

impl From<&crate::record::ShadowLink> for Shadow {
    fn from(link: &crate::record::ShadowLink) -> Self {
        Self {
            pair_id: link.pair_id.clone(),
            side: link.side.as_str(),
            primary: link.primary.clone(),
            candidate: link.candidate.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Split {
    id: String,
    variant: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Itl {
    p50_ms: f64,
    p95_ms: f64,
    max_ms: f64,
}

impl From<&crate::timing::ItlStats> for Itl {
    fn from(i: &crate::timing::ItlStats) -> Self {
        Self {
            p50_ms: i.p50,
            p95_ms: i.p95,
            max_ms: i.max,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct DataStream {
    #[serde(rename = "type")]
    kind: &'static str,
    dataset: &'static str,
    namespace: String,
}

impl RedactedLog {
    /// The document of `r`, with its prompt and response excerpts redacted. `id` is the
    /// document id (see `event.id`); `received` the wall-clock time of `t_recv`.
    pub fn build(
        r: &RequestRecord,
        id: String,
        received: SystemTime,
        redactor: &Redactor,
        settings: &DocumentSettings,
    ) -> Self {
        Self {
            timestamp: rfc3339(received),
            event: Event::of(r, id),
            service: Service {
                name: "llmgate",
                version: env!("CARGO_PKG_VERSION"),
            },
            trace: Id {
                id: r.trace.trace_id.to_string(),
            },
            span: Id {
                id: r.trace.span_id.to_string(),
            },
            error: Error::of(r),
            user: r
                .user
                .as_deref()
                .and_then(|user| redactor.keyed_hash(user))
                .map(|hash| User { hash }),
            gen_ai: GenAi::of(r),
            llm: Llm {
                // The request's and the answer's digests, keyed (HMAC): a plain SHA-256
                // of the unredacted text is reversed by guessing what the excerpt leaves
                // out (a phone number around which the excerpt gives the words).
                input_hash: r.input_hash.as_deref().and_then(|h| redactor.keyed_hash(h)),
                output_hash: r
                    .output_hash
                    .as_deref()
                    .and_then(|h| redactor.keyed_hash(h)),
                ..Llm::of(r, Excerpts::redacted(r, redactor, settings))
            },
            data_stream: DataStream {
                kind: "logs",
                dataset: DATASET,
                namespace: settings.namespace.clone(),
            },
        }
    }

    pub fn id(&self) -> &str {
        &self.event.id
    }

    pub fn redactions(&self) -> &RedactionCounts {
        &self.llm.redactions
    }
}

impl Event {
    /// ECS `event.*` of `r`, indexed under `id`.
    fn of(r: &RequestRecord, id: String) -> Self {
        Self {
            id,
            kind: "event",
            category: ["web"],
            kind_type: ["access"],
            dataset: DATASET,
            outcome: match r.status {
                Status::Ok => "success",
                Status::Error | Status::Cancelled => "failure",
            },
            duration: u64::try_from(
                Duration::from_secs_f64(r.timings.e2e_ms.max(0.0) / 1000.0).as_nanos(),
            )
            .unwrap_or(u64::MAX),
        }
    }
}

impl Error {
    /// ECS `error.type` of a request that did not end well.
    fn of(r: &RequestRecord) -> Option<Self> {
        match r.status {
            Status::Ok => None,
            Status::Cancelled => Some(Error {
                kind: r.error_kind.unwrap_or(names::CANCELLED),
            }),
            Status::Error => Some(Error {
                kind: r.error_kind.unwrap_or("engine_error"),
            }),
        }
    }
}

impl GenAi {
    /// `gen_ai.*`: what was asked of which model, what it answered and the tokens used.
    fn of(r: &RequestRecord) -> Self {
        Self {
            operation: Name { name: r.operation },
            provider: Name {
                name: names::PROVIDER,
            },
            request: GenAiRequest {
                model: r.model.clone(),
                max_tokens: r.params.max_tokens,
                temperature: r.params.temperature,
                top_p: r.params.top_p,
                seed: r.seed,
            },
            response: r.quality.is_some().then(|| GenAiResponse {
                id: r.response_id.clone().unwrap_or_default(),
                model: r.response_model().to_owned(),
                finish_reasons: r.finish_reason.iter().map(|f| f.as_str()).collect(),
            }),
            usage: Usage {
                input_tokens: r.usage.prompt_tokens,
                output_tokens: r.usage.completion_tokens,
            },
        }
    }
}

impl Llm {
    /// `llm.*`: the gateway's own facts of `r`: timings, quality signals, the model and
    /// upstream that answered, and the redacted excerpts.
    fn of(r: &RequestRecord, excerpts: Excerpts) -> Self {
        let t = &r.timings;
        let quality = r.quality.as_ref();
        Self {
            request_id: r.request_id.clone(),
            api_key_id: r.api_key_id.clone(),
            status: r.status.as_str(),
            stream: r.stream,
            ttft_ms: t.ttft_ms,
            engine_ttft_ms: t.engine_ttft_ms,
            tpot_ms: t.tpot_ms,
            upstream_ttft_ms: t.upstream_ttft_ms,
            e2e_ms: t.e2e_ms,
            overhead_ms: t.overhead_ms,
            queue_ms: t.queue_ms,
            client_wait_ms: t.client_wait_ms,
            itl: t.itl_ms.as_ref().map(Itl::from),
            chunks: t.chunks,
            delivery: t.delivery_ms.as_ref().map(Itl::from),
            tokens_per_second: t.tokens_per_second,
            repetition_rate: quality.map(|q| q.repetition_rate),
            // Said only where it is not the engine's own ids (an upstream).
            repetition_basis: quality
                .filter(|q| !q.repetition_basis.is_token_ids())
                .map(|q| q.repetition_basis.as_str()),
            mean_logprob: quality.and_then(|q| q.mean_logprob),
            min_logprob: quality.and_then(|q| q.min_logprob),
            low_confidence_share: quality.and_then(|q| q.low_confidence_share),
            degenerated: quality.map(|q| q.degenerated),
            refusal: quality.map(|q| q.refusal),
            intent: quality.map(|q| q.intent.clone()),
            language: quality.map(|q| q.language),
            answer_language: quality.map(|q| q.answer_language),
            // Keyed by RedactedLog::build: never the plain digests.
            input_hash: None,
            output_hash: None,
            system_fingerprint: r.system_fingerprint().map(str::to_owned),
            model: r.served.as_deref().map(ModelFacts::from),
            upstream: r.upstream.as_ref().map(Upstream::from),
            shadow: r.shadow.as_ref().map(Shadow::from),
            split: r.split.as_ref().map(|s| Split {
                id: s.split.clone(),
                variant: s.variant.clone(),
            }),
            comparison: r.comparison.as_deref().cloned(),
            build: BuildFacts {
                commit: BUILD.commit,
                target_features: BUILD.target_features,
            },
            prompt_excerpt: excerpts.prompt,
            response_excerpt: excerpts.response,
            kinds: agent::KindFields::of(r),
            tools: agent::Tools::of(r, excerpts.tool_calls),
            redactions_total: excerpts.counts.total(),
            redactions: excerpts.counts,
        }
    }
}

impl From<&ModelInfo> for ModelFacts {
    fn from(m: &ModelInfo) -> Self {
        Self {
            sha256: m.sha256.clone(),
            quant: m.quant.clone(),
            device: m.device.clone(),
            context_length: m.context_length,
            gpu: m.accelerator.gpu.clone(),
            driver: m.accelerator.driver.clone(),
            cuda: m.accelerator.cuda.clone(),
            upstream_url: m.upstream.as_ref().map(|u| u.url.clone()),
            upstream_model: m.upstream.as_ref().map(|u| u.model.clone()),
        }
    }
}

impl From<&UpstreamRecord> for Upstream {
    fn from(u: &UpstreamRecord) -> Self {
        Self {
            model: u.model.clone(),
            system_fingerprint: u.system_fingerprint.clone(),
            usage_estimated: u.usage_estimated,
            endpoint: u.endpoint.clone(),
            attempts: u.attempts.len(),
            failed_attempts: u
                .attempts
                .iter()
                .filter_map(|a| {
                    a.error_type.map(|error_type| FailedAttempt {
                        endpoint: a.endpoint.clone(),
                        error_type,
                    })
                })
                .collect(),
        }
    }
}

/// One document ready for `_bulk`: its id and the two NDJSON lines (action, source),
/// each ending in `\n`. The same bytes go to Elasticsearch, the spool and the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub id: String,
    pub lines: bytes::Bytes,
}

impl Encoded {
    /// When the document was made (its `@timestamp`, ms since the epoch), read from its
    /// source line: for the age of the oldest queued document.
    pub fn created_ms(&self) -> Option<i64> {
        let source = self.lines.split(|b| *b == b'\n').nth(1)?;
        // `@timestamp` is the first field; read only as far as it.
        let text = std::str::from_utf8(&source[..source.len().min(64)]).ok()?;
        let at = text.split("\"@timestamp\":\"").nth(1)?.split('"').next()?;
        chrono::DateTime::parse_from_rfc3339(at)
            .ok()
            .map(|t| t.timestamp_millis())
    }
}

/// The bulk action line of a document: `create` (a data stream accepts only `create`),
/// with the document's own id.
fn action_line(id: &str) -> String {
    let action = serde_json::json!({"create": {"_id": id}});
    format!("{action}\n")
}

impl RedactedLog {
    /// Encodes the document as a bulk pair.
    pub fn encode(&self) -> Result<Encoded, serde_json::Error> {
        let mut out = action_line(self.id()).into_bytes();
        serde_json::to_writer(&mut out, self)?;
        out.push(b'\n');
        Ok(Encoded {
            id: self.id().to_owned(),
            lines: out.into(),
        })
    }
}

/// RFC 3339 UTC with milliseconds, as ECS `@timestamp` wants.
fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests;

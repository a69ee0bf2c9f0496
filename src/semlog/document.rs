//! The semantic-log document: one per request, redacted, in the shape Elasticsearch
//! stores it. ECS fields where ECS has them (`@timestamp`, `event.*`, `trace.id`,
//! `span.id`, `service.*`, `error.*`, `data_stream.*`), ECS `gen_ai.*` (the OpenTelemetry
//! GenAI names) for model, usage and finish reasons, and `llm.*` for what no standard has.
//!
//! [`RedactedLog::build`] is the only way to make one, and it sends every piece of free
//! text through the [`Redactor`]: the encoder and every sink take a `RedactedLog`, so
//! nothing unredacted can reach them.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::redact::{Redacted, RedactionCounts, Redactor};
use crate::fingerprint::BUILD;
use crate::record::{RequestRecord, Status};
use crate::telemetry::names;

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
    e2e_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_wait_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    itl: Option<Itl>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repetition_rate: Option<f64>,
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
    input_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<ModelFacts>,
    build: BuildFacts,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_excerpt: Option<Redacted>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_excerpt: Option<Redacted>,
    redactions: RedactionCounts,
    redactions_total: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Itl {
    p50_ms: f64,
    p95_ms: f64,
    max_ms: f64,
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
        let mut counts = RedactionCounts::default();
        // Only the start of a long prompt is redacted: the excerpt comes from it, and a
        // megabyte prompt must not cost the request path a megabyte of regex work. The
        // window is wide enough that a value cut by it lies wholly beyond the excerpt.
        let window = settings.excerpt_chars.saturating_mul(4).max(4096);
        let mut excerpt = |text: &Option<String>| {
            text.as_deref().map(|t| {
                let head = t.char_indices().nth(window).map_or(t, |(i, _)| &t[..i]);
                redactor.excerpt(head, settings.excerpt_chars, &mut counts)
            })
        };
        let prompt_excerpt = excerpt(&r.prompt);
        let response_excerpt = excerpt(&r.response);
        let (prompt_excerpt, response_excerpt) = if settings.stats_only {
            (None, None)
        } else {
            (prompt_excerpt, response_excerpt)
        };
        let t = &r.timings;
        let answered = r.quality.is_some();
        Self {
            timestamp: rfc3339(received),
            event: Event {
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
                    Duration::from_secs_f64(t.e2e_ms.max(0.0) / 1000.0).as_nanos(),
                )
                .unwrap_or(u64::MAX),
            },
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
            error: match r.status {
                Status::Ok => None,
                Status::Cancelled => Some(Error {
                    kind: r.error_kind.unwrap_or(names::CANCELLED),
                }),
                Status::Error => Some(Error {
                    kind: r.error_kind.unwrap_or("engine_error"),
                }),
            },
            user: r
                .user
                .as_deref()
                .and_then(|user| redactor.keyed_hash(user))
                .map(|hash| User { hash }),
            gen_ai: GenAi {
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
                response: answered.then(|| GenAiResponse {
                    id: format!("chatcmpl-{}", r.request_id),
                    model: r.model.clone(),
                    finish_reasons: r.finish_reason.iter().map(|f| f.as_str()).collect(),
                }),
                usage: Usage {
                    input_tokens: r.usage.prompt_tokens,
                    output_tokens: r.usage.completion_tokens,
                },
            },
            llm: Llm {
                request_id: r.request_id.clone(),
                api_key_id: r.api_key_id.clone(),
                status: r.status.as_str(),
                stream: r.stream,
                ttft_ms: t.ttft_ms,
                engine_ttft_ms: t.engine_ttft_ms,
                tpot_ms: t.tpot_ms,
                e2e_ms: t.e2e_ms,
                queue_ms: t.queue_ms,
                client_wait_ms: t.client_wait_ms,
                itl: t.itl_ms.as_ref().map(|i| Itl {
                    p50_ms: i.p50,
                    p95_ms: i.p95,
                    max_ms: i.max,
                }),
                tokens_per_second: t.tokens_per_second,
                repetition_rate: r.quality.as_ref().map(|q| q.repetition_rate),
                mean_logprob: r.quality.as_ref().and_then(|q| q.mean_logprob),
                min_logprob: r.quality.as_ref().and_then(|q| q.min_logprob),
                low_confidence_share: r.quality.as_ref().and_then(|q| q.low_confidence_share),
                degenerated: r.quality.as_ref().map(|q| q.degenerated),
                refusal: r.quality.as_ref().map(|q| q.refusal),
                intent: r.quality.as_ref().map(|q| q.intent.clone()),
                language: r.quality.as_ref().map(|q| q.language),
                input_hash: r.input_hash.clone(),
                output_hash: r.output_hash.clone(),
                system_fingerprint: r.system_fingerprint().map(str::to_owned),
                model: r.served.as_deref().map(|m| ModelFacts {
                    sha256: m.sha256.clone(),
                    quant: m.quant.clone(),
                    device: m.device.clone(),
                    context_length: m.context_length,
                    gpu: m.accelerator.gpu.clone(),
                    driver: m.accelerator.driver.clone(),
                    cuda: m.accelerator.cuda.clone(),
                }),
                build: BuildFacts {
                    commit: BUILD.commit,
                    target_features: BUILD.target_features,
                },
                prompt_excerpt,
                response_excerpt,
                redactions_total: counts.total(),
                redactions: counts,
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

/// One document ready for `_bulk`: its id and the two NDJSON lines (action, source),
/// each ending in `\n`. The same bytes go to Elasticsearch, the spool and the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub id: String,
    pub lines: bytes::Bytes,
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
mod tests {
    use std::time::UNIX_EPOCH;

    use opentelemetry::trace::{SpanId, TraceId};

    use super::*;
    use crate::engine::{FinishReason, Usage};
    use crate::quality::Quality;
    use crate::record::RequestParams;
    use crate::record::TraceIds;
    use crate::semlog::redact::Mode;
    use crate::timing::{ItlStats, Phases, Timings};

    fn record() -> RequestRecord {
        RequestRecord {
            operation: names::OPERATION_CHAT,
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
                client_wait_ms: Some(0.25),
            },
            quality: Some(Quality {
                repetition_rate: 0.0,
                degenerated: false,
                refusal: false,
                intent: "general".into(),
                language: "eng",
                mean_logprob: Some(-0.42),
                min_logprob: Some(-2.5),
                low_confidence_share: Some(0.0),
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
        }
    }

    #[test]
    fn encodes_a_bulk_pair_byte_for_byte() {
        let settings = DocumentSettings {
            namespace: "default".into(),
            excerpt_chars: 512,
            stats_only: false,
        };
        let doc = RedactedLog::build(
            &record(),
            "0123abcd".into(),
            record().received_at,
            &Redactor::default(),
            &settings,
        );
        let encoded = doc.encode().expect("encode");
        let expected = concat!(
            r#"{"create":{"_id":"0123abcd"}}"#,
            "\n",
            r#"{"@timestamp":"2025-11-30T00:00:00.123Z","#,
            r#""event":{"id":"0123abcd","kind":"event","category":["web"],"type":["access"],"dataset":"llmgate.requests","outcome":"success","duration":170500000},"#,
            r#""service":{"name":"llmgate","version":""#,
            env!("CARGO_PKG_VERSION"),
            r#""},"trace":{"id":"4bf92f3577b34da6a3ce929d0e0e4736"},"span":{"id":"00f067aa0ba902b7"},"#,
            r#""gen_ai":{"operation":{"name":"chat"},"provider":{"name":"llmgate"},"#,
            r#""request":{"model":"smollm2","max_tokens":3,"temperature":0.5,"seed":42},"#,
            r#""response":{"id":"chatcmpl-req-1","model":"smollm2","finish_reasons":["length"]},"#,
            r#""usage":{"input_tokens":12,"output_tokens":3}},"#,
            r#""llm":{"request_id":"req-1","api_key_id":"ci-bot","status":"ok","stream":true,"ttft_ms":120.5,"engine_ttft_ms":118.25,"#,
            r#""tpot_ms":21.0,"e2e_ms":170.5,"queue_ms":1.5,"client_wait_ms":0.25,"itl":{"p50_ms":21.0,"p95_ms":22.0,"max_ms":22.0},"#,
            r#""tokens_per_second":17.595,"repetition_rate":0.0,"mean_logprob":-0.42,"min_logprob":-2.5,"low_confidence_share":0.0,"degenerated":false,"refusal":false,"#,
            r#""intent":"general","language":"eng","input_hash":"in","output_hash":"out","system_fingerprint":"fp_1","#,
            r#""model":{"sha256":"0c1d","quant":"Q8_0","device":"cpu/quantized","context_length":8192},"#,
            r#""build":{"commit":""#,
            env!("LLMGATE_GIT_COMMIT"),
            r#"","target_features":""#,
            env!("LLMGATE_TARGET_FEATURES"),
            r#""},"#,
            r#""prompt_excerpt":"Mail me at <EMAIL>","response_excerpt":"Sure.","#,
            r#""redactions":{"email":1},"redactions_total":1},"#,
            r#""data_stream":{"type":"logs","dataset":"llmgate.requests","namespace":"default"}}"#,
            "\n"
        );
        assert_eq!(
            std::str::from_utf8(&encoded.lines).expect("utf-8"),
            expected
        );
        assert_eq!(encoded.id, "0123abcd");
    }

    #[test]
    fn stats_only_keeps_no_excerpt_but_counts_and_hashes() {
        let settings = DocumentSettings {
            namespace: "default".into(),
            excerpt_chars: 512,
            stats_only: true,
        };
        let doc = RedactedLog::build(
            &record(),
            "id".into(),
            record().received_at,
            &Redactor::default(),
            &settings,
        );
        let json = serde_json::to_value(&doc).expect("json");
        let llm = &json["llm"];
        assert!(llm.get("prompt_excerpt").is_none() && llm.get("response_excerpt").is_none());
        assert_eq!(llm["redactions"]["email"], 1, "still counted");
        assert_eq!(llm["input_hash"], "in");
        assert_eq!(llm["repetition_rate"], 0.0);
        let text = String::from_utf8(doc.encode().expect("encode").lines.to_vec()).expect("utf-8");
        assert!(
            !text.contains("Mail me") && !text.contains("Sure."),
            "{text}"
        );
    }

    #[test]
    fn the_user_field_is_kept_only_as_a_keyed_hash() {
        let settings = DocumentSettings {
            namespace: "default".into(),
            excerpt_chars: 512,
            stats_only: false,
        };
        let build = |redactor: &Redactor| {
            let doc = RedactedLog::build(&record(), "x".into(), UNIX_EPOCH, redactor, &settings);
            serde_json::to_value(&doc).expect("json")
        };
        // Without a key, nothing: an unkeyed hash of an address is reversed by guessing.
        assert!(build(&Redactor::default()).get("user").is_none());
        let keyed = Redactor::new(Mode::KeyedHash(b"a-redaction-key-of-16+".to_vec()));
        let value = build(&keyed);
        let hash = value["user"]["hash"].as_str().expect("user.hash");
        assert_eq!(hash.len(), 64);
        assert!(!value.to_string().contains("jane@example.com"));
        // The same address inside the prompt gets the hash's first 12 digits as its token.
        let excerpt = value["llm"]["prompt_excerpt"].as_str().expect("excerpt");
        assert_eq!(excerpt, format!("Mail me at <EMAIL:{}>", &hash[..12]));
    }

    #[test]
    fn failed_requests_carry_their_error_type_and_no_response() {
        let mut r = record();
        r.status = Status::Error;
        r.error_kind = Some("context_length_exceeded");
        r.quality = None;
        r.finish_reason = None;
        let settings = DocumentSettings {
            namespace: "prod".into(),
            excerpt_chars: 8,
            stats_only: false,
        };
        let doc = RedactedLog::build(
            &r,
            "x".into(),
            r.received_at,
            &Redactor::default(),
            &settings,
        );
        let value = serde_json::to_value(&doc).expect("json");
        assert_eq!(value["error"]["type"], "context_length_exceeded");
        assert_eq!(value["event"]["outcome"], "failure");
        assert!(value["gen_ai"].get("response").is_none());
        assert_eq!(value["data_stream"]["namespace"], "prod");
        // Redacted first, then cut to 8 characters, the ellipsis included.
        assert_eq!(value["llm"]["prompt_excerpt"], "Mail me…");
        assert_eq!(value["llm"]["redactions"]["email"], 1);
    }
}

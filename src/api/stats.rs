//! `GET /stats`: the live view of the gateway, for the built-in page and for a person
//! with curl. Requests running and waiting now, the last five minutes' TTFT and TPOT
//! percentiles, tokens per second and errors by kind (`telemetry::live`), and the last
//! requests, from their semantic-log documents.
//!
//! The records show only what the page needs: outcome, tokens, TTFT, TPOT, finish
//! reason. Text, the redacted prompt and response excerpts, only to the API key whose
//! request it was: without keys anyone who reaches the port may read `/stats`, so no
//! excerpt is shown at all, and under `semlog.stats_only` there is none to show.

use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::responses::KeyedGetErrors;
use super::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::telemetry::answers::RequestFigures;
use crate::telemetry::live::RecentFigures;

/// What the gateway is doing now and did in the last minutes.
#[derive(Debug, Serialize, ToSchema)]
pub struct Stats {
    /// Seconds since the gateway started.
    pub uptime_secs: f64,
    /// Requests admitted and not yet answered (all models), and the most admitted.
    pub in_flight: usize,
    pub max_in_flight: usize,
    /// Sequences the engines are prefilling or decoding now.
    pub running: usize,
    /// Requests waiting for an engine slot.
    pub waiting: usize,
    #[serde(flatten)]
    pub recent: RecentFigures,
    /// The replicas of each upstream model: their routing state and load now (the
    /// window's figures are under `endpoints`, by the same base URL).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(required = false)]
    pub upstreams: Vec<UpstreamStats>,
    /// The caller's token quotas (with keys on, a key that has one): each period's size,
    /// what is used of it and when it resets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>, required = false)]
    pub quotas: Vec<crate::auth::quota::QuotaUse>,
    /// Each shadowed model and its candidate: the last comparisons' counts and, per
    /// figure, the candidate's difference with a 95% interval and the verdict (see
    /// docs/shadow.md). The newest comparison only without keys (it names requests).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(required = false)]
    pub shadows: Vec<crate::shadow::PairView>,
    /// The last requests, newest first (at most 20), in the semantic log's field names:
    /// with keys on the caller's own, with their redacted excerpts; without keys
    /// everyone's, without text.
    #[schema(value_type = Vec<Object>)]
    pub records: Vec<Value>,
}

/// One upstream model's replicas, as the live view shows them.
#[derive(Debug, Serialize, ToSchema)]
pub struct UpstreamStats {
    pub model: String,
    /// `least_outstanding`, `round_robin`, `latency`, `prefix_affinity` or
    /// `engine_metrics`.
    pub policy: &'static str,
    #[schema(value_type = Vec<Object>)]
    pub endpoints: Vec<crate::engine::upstream::fleet::EndpointView>,
}

/// Records listed.
pub const RECORDS: usize = 20;

/// The fields of a semantic-log document the live view shows (see the module's docs).
fn projected(doc: &Value, with_text: bool) -> Value {
    let llm = &doc["llm"];
    let gen_ai = &doc["gen_ai"];
    let mut record = json!({
        "@timestamp": doc["@timestamp"],
        "gen_ai": {
            "request": {"model": gen_ai["request"]["model"]},
            "response": {"finish_reasons": gen_ai["response"]["finish_reasons"]},
            "usage": gen_ai["usage"],
        },
        "llm": {
            "status": llm["status"],
            "ttft_ms": llm["ttft_ms"],
            "tpot_ms": llm["tpot_ms"],
            "e2e_ms": llm["e2e_ms"],
        },
    });
    if let Some(kind) = doc["error"]["type"].as_str() {
        record["error"] = json!({ "type": kind });
    }
    if with_text {
        for field in ["prompt_excerpt", "response_excerpt"] {
            if let Some(text) = llm.get(field) {
                record["llm"][field] = text.clone();
            }
        }
    }
    record
}

#[utoipa::path(
    get,
    path = "/stats",
    tag = "operations",
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The live view", body = Stats),
        KeyedGetErrors,
    ),
)]
pub async fn stats(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let now = state.clock.now();
    let keys_on = state.guard.keys.is_some();
    let presented = req.extensions().get::<Caller>().cloned();
    let quotas = match &presented {
        Some(caller) => caller.quota_uses().await,
        None => Vec::new(),
    };
    let caller = presented.map(|c| c.key_id);
    let own = |key_id: Option<&str>| !keys_on || (caller.is_some() && key_id == caller.as_deref());
    let records = state
        .telemetry
        .recent_documents(&own, RECORDS)
        .iter()
        .map(|doc| projected(doc, keys_on))
        .collect();
    let load = state.models.load();
    // Bootstraps over each pair's window: off the worker that streams answers.
    let telemetry = std::sync::Arc::clone(&state.telemetry);
    let shadows = web::block(move || telemetry.shadow_pairs.views())
        .await
        .unwrap_or_default()
        .into_iter();
    HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(Stats {
            uptime_secs: (now.as_secs_f64() * 10.0).round() / 10.0,
            in_flight: state.admission.in_flight(),
            max_in_flight: state.admission.limit(),
            running: load.running,
            waiting: load.waiting,
            recent: state.telemetry.recent.figures(now),
            upstreams: state
                .models
                .iter()
                .filter_map(|m| {
                    Some(UpstreamStats {
                        model: m.id().to_owned(),
                        policy: m.engine.routing_policy()?,
                        endpoints: m.engine.endpoints(),
                    })
                })
                .collect(),
            quotas,
            shadows: shadows
                .map(|view| crate::shadow::PairView {
                    last: view.last.filter(|_| !keys_on),
                    ..view
                })
                .collect(),
            records,
        })
}

/// One finished request's figures, by the `x-request-id` its response carried or by its
/// `id`: for a client behind a proxy that drops the streamed `timings` (LiteLLM's). With
/// keys on, only the key that sent it may read it; to anyone else it does not exist.
#[utoipa::path(
    get,
    path = "/stats/requests/{id}",
    tag = "operations",
    params(("id" = String, Path, description = "The response's x-request-id, or its id (chatcmpl-…)")),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The request's figures, under the keys of the timings object", body = RequestFigures),
        (status = 404, description = "Not among the last requests kept (or another key's)", body = crate::error::ErrorBody),
        KeyedGetErrors,
    ),
)]
pub async fn request(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let keys_on = state.guard.keys.is_some();
    let caller = req.extensions().get::<Caller>().map(|c| c.key_id.clone());
    // With keys on, only the caller's own (a request without a key is no one's).
    let owner = if keys_on { caller.as_deref() } else { None };
    let answer = state
        .telemetry
        .answers
        .get(owner, &id)
        .filter(|_| !keys_on || owner.is_some())
        .ok_or(ApiError::RequestNotFound(id))?;
    Ok(HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(&*answer))
}

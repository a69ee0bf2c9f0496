//! `GET /stats`: the live view of the gateway, for the built-in page and for a person
//! with curl. Requests running and waiting now, the last five minutes' TTFT and TPOT
//! percentiles, tokens per second and errors by type (`telemetry::live`), and the last
//! requests' semantic-log documents exactly as they were sent: redacted, with no excerpt
//! at all under `semlog.stats_only`. With API keys on, a key sees the documents of its
//! own requests only; the figures are the gateway's.

use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use crate::auth::Caller;
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
    /// The last requests' semantic-log documents, newest first (at most 20): redacted
    /// excerpts, or none under `stats_only`; the caller's own only when keys are on.
    #[schema(value_type = Vec<Object>)]
    pub records: Vec<serde_json::Value>,
}

#[utoipa::path(
    get,
    path = "/stats",
    tag = "operations",
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The live view", body = Stats),
        (status = 401, description = "A key is needed or is not valid", body = crate::error::ErrorBody),
        (status = 405, description = "Only GET and HEAD", body = crate::error::ErrorBody),
    ),
)]
pub async fn stats(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let now = state.clock.now();
    let caller = req.extensions().get::<Caller>().map(|c| c.key_id.clone());
    let keys_on = state.guard.keys.is_some();
    let records = state
        .telemetry
        .recent_documents()
        .into_iter()
        .filter(|(key_id, _)| !keys_on || key_id.is_some() && *key_id == caller)
        .map(|(_, document)| document)
        .collect();
    let load = state.models.load();
    HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(Stats {
            uptime_secs: (now.as_secs_f64() * 10.0).round() / 10.0,
            in_flight: state.admission.in_flight(),
            max_in_flight: state.admission.limit(),
            running: load.running,
            waiting: load.waiting,
            recent: state.telemetry.recent.figures(now),
            records,
        })
}

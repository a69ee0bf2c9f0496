//! Model listing, the probes (`/health` says the process is up, `/ready` says the model
//! is loaded and requests will be served) and the Prometheus scrape endpoint.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::AppState;
use crate::error::ApiError;
use crate::telemetry::metrics::ExpositionFormat;

pub async fn list_models(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [model_object(&state)],
    }))
}

pub async fn get_model(
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    if *id != state.limits.served_model {
        return Err(ApiError::ModelNotFound(id.into_inner()));
    }
    Ok(HttpResponse::Ok().json(model_object(&state)))
}

fn model_object(state: &AppState) -> serde_json::Value {
    let info = state.engine.model_info();
    json!({
        "id": state.limits.served_model,
        "object": "model",
        "created": 0,
        "owned_by": "llmgate",
        "ready": info.is_some(),
        "context_length": info.map(|i| i.context_length),
    })
}

pub async fn health() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn ready(state: web::Data<AppState>) -> HttpResponse {
    if state.lifecycle.is_draining() {
        return HttpResponse::ServiceUnavailable().json(json!({"status": "stopping"}));
    }
    match state.engine.model_info() {
        // The facts of llmgate_model_info and llmgate_build_info, for a probe or a person.
        Some(info) => HttpResponse::Ok().json(json!({
            "status": "ready",
            "model": info.id,
            "context_length": info.context_length,
            "system_fingerprint": info.system_fingerprint,
            "sha256": info.sha256,
            "quant": info.quant,
            "device": info.device,
            "accelerator": info.accelerator,
            "build": crate::fingerprint::BUILD,
        })),
        None => HttpResponse::ServiceUnavailable().json(json!({"status": "loading"})),
    }
}

/// `GET /metrics`: OpenMetrics (with exemplars) when the scraper asks for it, the
/// classic Prometheus text format otherwise.
pub async fn metrics(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let load = state.engine.load();
    state.telemetry.refresh(
        load.running,
        load.waiting,
        state.admission.in_flight(),
        state.engine.model_info(),
    );
    let format = ExpositionFormat::negotiate(
        req.headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let body = state.telemetry.metrics.encode(format).map_err(|error| {
        tracing::error!(error = %error, "Could not encode the metrics.");
        ApiError::Internal
    })?;
    Ok(HttpResponse::Ok()
        .content_type(format.content_type())
        .body(body))
}

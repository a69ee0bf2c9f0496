//! Model listing, the probes (`/health` says the process is up, `/ready` says the model
//! is loaded and requests will be served) and the Prometheus scrape endpoint.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::AppState;
use crate::engine::served::ServedModel;
use crate::engine::Readiness;
use crate::error::ApiError;
use crate::telemetry::metrics::ExpositionFormat;

pub async fn list_models(state: web::Data<AppState>) -> HttpResponse {
    let data: Vec<serde_json::Value> = state.models.iter().map(model_object).collect();
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": data,
    }))
}

pub async fn get_model(
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let model = state
        .models
        .get(&id)
        .ok_or_else(|| ApiError::ModelNotFound(id.into_inner()))?;
    Ok(HttpResponse::Ok().json(model_object(model)))
}

/// OpenAI's model object, with whether it serves now and its context length (0 for an
/// upstream whose context the config does not give).
fn model_object(model: &ServedModel) -> serde_json::Value {
    let info = model.engine.model_info();
    json!({
        "id": model.id(),
        "object": "model",
        "created": 0,
        "owned_by": "llmgate",
        "ready": model.engine.readiness() == Readiness::Ready,
        "context_length": info.as_ref().map(|i| i.context_length),
        "upstream": info.as_ref().and_then(|i| i.upstream.as_ref().map(|u| &u.model)),
    })
}

pub async fn health() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// 200 while any served model can take requests; each model's own state is in
/// `models` (an upstream that cannot be reached, with why), so one down upstream leaves
/// the gateway ready for the others. The top-level fields are the default model's.
pub async fn ready(state: web::Data<AppState>) -> HttpResponse {
    if state.lifecycle.is_draining() {
        return HttpResponse::ServiceUnavailable().json(json!({"status": "stopping"}));
    }
    let models: Vec<serde_json::Value> = state.models.iter().map(model_state).collect();
    let ready = state.models.any_ready();
    let status = match (ready, state.models.default_model().engine.model_info()) {
        (true, _) => "ready",
        (false, None) => "loading",
        (false, Some(_)) => "unreachable",
    };
    let mut body = json!({"status": status, "models": models, "semlog": state.semlog.to_json()});
    // The facts of llmgate_model_info and llmgate_build_info, for a probe or a person:
    // the default model's, while it serves.
    let default = &state.models.default_model().engine;
    if let (Readiness::Ready, Some(info)) = (default.readiness(), default.model_info()) {
        body["model"] = json!(info.id);
        body["context_length"] = json!(info.context_length);
        body["system_fingerprint"] = json!(info.system_fingerprint);
        body["sha256"] = json!(info.sha256);
        body["quant"] = json!(info.quant);
        body["device"] = json!(info.device);
        body["accelerator"] = json!(info.accelerator);
        body["build"] = json!(crate::fingerprint::BUILD);
    }
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// One model in `/ready`: ready, loading or unreachable (and the fault's kind). `/ready`
/// needs no key, so an upstream's URL and its error's words (addresses, resolver, TLS)
/// stay in `/metrics`' `llmgate_model_info` and the log.
fn model_state(model: &ServedModel) -> serde_json::Value {
    let info = model.engine.model_info();
    let (status, reason) = match model.engine.readiness() {
        Readiness::Ready => ("ready", None),
        Readiness::Loading => ("loading", None),
        Readiness::Unreachable(why) => ("unreachable", Some(why)),
    };
    json!({
        "id": model.id(),
        "status": status,
        "reason": reason,
        "system_fingerprint": info.as_ref().map(|i| i.system_fingerprint.clone()),
        "device": info.as_ref().map(|i| i.device.clone()),
        "upstream_model": info.as_ref().and_then(|i| i.upstream.as_ref().map(|u| u.model.clone())),
    })
}

/// `GET /metrics`: OpenMetrics (with exemplars) when the scraper asks for it, the
/// classic Prometheus text format otherwise.
pub async fn metrics(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state
        .telemetry
        .refresh(&state.models, state.admission.in_flight());
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

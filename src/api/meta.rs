//! Model listing, the probes (`/health` says the process is up, `/ready` says the model
//! is loaded and requests will be served) and the Prometheus scrape endpoint.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::responses::{GetErrors, KeyedGetErrors};
use super::AppState;
use crate::engine::served::ServedModel;
use crate::engine::Readiness;
use crate::error::{ApiError, ErrorBody};
use crate::telemetry::metrics::ExpositionFormat;

/// OpenAI's model object, with whether it serves now, its context length (0 for an
/// upstream whose context the config does not give) and the upstream's model name.
#[derive(Serialize, ToSchema)]
#[schema(as = Model)]
pub struct ModelObject<'a> {
    id: &'a str,
    /// `model`.
    object: &'static str,
    /// When this gateway loaded the model (an upstream: when it set it up), in Unix
    /// seconds; 0 while it is still loading.
    created: u64,
    owned_by: &'static str,
    ready: bool,
    /// `null` until the model has loaded (or the upstream answered).
    context_length: Option<u32>,
    /// An upstream's own name for the model; `null` in process.
    upstream: Option<String>,
    /// What a request that leaves these out gets (docs/defaults.md); `null` for one the
    /// engine decides (an upstream's own default, or the context's room for max_tokens).
    defaults: Defaults,
}

/// The served model's defaults.
#[derive(Serialize, ToSchema)]
pub struct Defaults {
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_tokens: Option<u32>,
    /// The seed of a request that sets none; absent: each such answer is random.
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    /// The degeneration guard watches the model's answers.
    degeneration_guard: bool,
}

#[derive(Serialize, ToSchema)]
pub struct ModelList<'a> {
    /// `list`.
    object: &'static str,
    data: Vec<ModelObject<'a>>,
}

#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    status: &'static str,
}

/// `/ready`'s body. The model facts are the default model's, once it serves: those of
/// `llmgate_model_info` and `llmgate_build_info`, for a probe or a person.
#[derive(Default, Serialize, ToSchema)]
pub struct Ready<'a> {
    /// `ready`, `loading`, `unreachable`, `down` or `stopping`.
    status: &'static str,
    /// The default model's engine (each model's is in `models`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    engine: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(required = false)]
    models: Vec<ModelState<'a>>,
    /// Where semantic logs go and what the cluster's set-up found.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, required = false)]
    semlog: Option<serde_json::Value>,
    /// The shared state (per-key limits across gateways), when one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, required = false)]
    state: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = u32, required = false)]
    context_length: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    system_fingerprint: Option<String>,
    /// Of the model file.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    quant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, required = false)]
    accelerator: Option<crate::fingerprint::Accelerator>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, required = false)]
    build: Option<crate::fingerprint::Build>,
}

/// One model in `/ready`: ready, loading or unreachable (and the fault's kind). `/ready`
/// needs no key, so an upstream's URL and its error's words (addresses, resolver, TLS)
/// stay in `/metrics`' `llmgate_model_info` and the log.
#[derive(Serialize, ToSchema)]
pub struct ModelState<'a> {
    id: &'a str,
    /// The engine that serves it: `llamacpp` or `mistral` in this process, or `upstream`.
    engine: &'static str,
    /// `ready`, `loading`, `unreachable` (an upstream) or `down` (an in-process engine
    /// that stopped).
    status: &'static str,
    /// Why it is unreachable or down: an upstream's fault kind, an engine's reason.
    reason: Option<String>,
    system_fingerprint: Option<String>,
    device: Option<String>,
    upstream_model: Option<String>,
    /// An upstream's replicas, in its order: ready while one of them is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(required = false)]
    endpoints: Vec<EndpointState>,
}

/// One replica of an upstream model in `/ready`: its routing state and whether the
/// gateway reaches it, not its address (`/stats` and `/metrics` name it).
#[derive(Serialize, ToSchema)]
pub struct EndpointState {
    /// `up`, `ejected`, `readmitting` or `rate_limited`.
    state: &'static str,
    reachable: bool,
    /// Why it is out or unreachable: the last fault's kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Its answers to the drift canary differ from the majority's (`/stats` has the
    /// text).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    drifting: bool,
}

#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "models",
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "Every served model", body = ModelList),
        KeyedGetErrors,
    ),
)]
pub async fn list_models(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(ModelList {
        object: "list",
        data: state.models.iter().map(model_object).collect(),
    })
}

#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    tag = "models",
    params(("id" = String, Path, description = "A served model's id")),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The model", body = ModelObject),
        (status = 404, description = "Not served", body = ErrorBody),
        KeyedGetErrors,
    ),
)]
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

fn model_object(model: &ServedModel) -> ModelObject<'_> {
    let info = model.engine.model_info();
    ModelObject {
        id: model.id(),
        object: "model",
        created: info.as_ref().map_or(0, |i| i.loaded_at),
        owned_by: "llmgate",
        ready: model.engine.readiness() == Readiness::Ready,
        context_length: info.as_ref().map(|i| i.context_length),
        upstream: info.and_then(|i| i.upstream.as_ref().map(|u| u.model.clone())),
        defaults: Defaults {
            temperature: model.policy.default_temperature,
            top_p: model.policy.default_top_p,
            max_tokens: model.policy.default_max_tokens,
            seed: model.policy.default_seed,
            degeneration_guard: model.policy.degeneration_guard,
        },
    }
}

#[utoipa::path(
    get,
    path = "/health",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "The process is up", body = Health),
        GetErrors,
    ),
)]
pub async fn health() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// 200 while any served model can take requests; each model's own state is in
/// `models` (an upstream that cannot be reached, with why), so one down upstream leaves
/// the gateway ready for the others. The top-level fields are the default model's.
#[utoipa::path(
    get,
    path = "/ready",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "A served model takes requests", body = Ready),
        (status = 503, description = "Loading, unreachable or stopping", body = Ready),
        GetErrors,
    ),
)]
pub async fn ready(state: web::Data<AppState>) -> HttpResponse {
    if state.lifecycle.is_draining() {
        return HttpResponse::ServiceUnavailable().json(Ready {
            status: "stopping",
            ..Ready::default()
        });
    }
    let shared = state.shared_state.as_deref();
    // Refusing every request is not ready; answering on local limits is.
    // Keys are what fail_closed refuses without Redis (their limits and quotas).
    let state_refuses = state.guard.keys.is_some()
        && shared.is_some_and(|s| {
            !s.answering() && s.on_failure() == crate::state::OnFailure::FailClosed
        });

    let ready = state.models.any_ready() && !state_refuses;
    let default = &state.models.default_model().engine;
    let status = match (ready, default.readiness()) {
        (true, _) => "ready",
        (false, _) if state_refuses => "state_unavailable",
        (false, Readiness::Down(_)) => "down",
        (false, _) if default.model_info().is_none() => "loading",
        (false, _) => "unreachable",
    };
    let mut body = Ready {
        status,
        engine: Some(default.name()),
        models: state.models.iter().map(model_state).collect(),
        semlog: Some(state.semlog.to_json()),
        state: shared.map(crate::state::SharedState::to_json),
        ..Ready::default()
    };
    if let (Readiness::Ready, Some(info)) = (default.readiness(), default.model_info()) {
        body.model = Some(info.id.clone());
        body.context_length = Some(info.context_length);
        body.system_fingerprint = Some(info.system_fingerprint.clone());
        body.sha256 = Some(info.sha256.clone());
        body.quant = Some(info.quant.clone());
        body.device = Some(info.device.clone());
        body.accelerator = Some(info.accelerator.clone());
        body.build = Some(crate::fingerprint::BUILD);
    }
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

fn model_state(model: &ServedModel) -> ModelState<'_> {
    let info = model.engine.model_info();
    let (status, reason) = match model.engine.readiness() {
        Readiness::Ready => ("ready", None),
        Readiness::Loading => ("loading", None),
        Readiness::Unreachable(why) => ("unreachable", Some(why)),
        Readiness::Down(why) => ("down", Some(why)),
    };
    ModelState {
        id: model.id(),
        engine: model.engine.name(),
        status,
        reason: reason.map(|r| r.to_string()),
        system_fingerprint: info.as_ref().map(|i| i.system_fingerprint.clone()),
        device: info.as_ref().map(|i| i.device.clone()),
        upstream_model: info.and_then(|i| i.upstream.as_ref().map(|u| u.model.clone())),
        endpoints: model
            .engine
            .endpoints()
            .into_iter()
            .map(|e| EndpointState {
                state: e.state,
                reachable: e.reachable,
                reason: e.reason,
                drifting: e.canary.is_some_and(|c| c.drifting),
            })
            .collect(),
    }
}

/// `GET /metrics`: OpenMetrics (with exemplars) when the scraper asks for it, the
/// classic Prometheus text format otherwise.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "Prometheus text, or OpenMetrics when `Accept` asks for it", content_type = "text/plain", body = String),
        (status = 401, description = "With `--metrics-auth`: a key is needed", body = ErrorBody),
        (status = 500, description = "The metrics could not be encoded", body = ErrorBody),
        GetErrors,
    ),
)]
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

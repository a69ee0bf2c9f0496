//! `GET /props` and `GET /slots` in llama.cpp's server's shapes, read-only, for the
//! default model: what its clients read to size their requests (the context each slot
//! has, how many slots, the defaults) and to see whether the server is busy.

use actix_web::{web, HttpResponse};
use serde_json::{json, Value};

use super::RANDOM_SEED;
use crate::api::AppState;
use crate::error::ApiError;

/// `{"default_generation_settings", "total_slots", "model_alias", "build_info", ...}`;
/// `total_slots` is null for a model with no slots here (an upstream), a default left
/// null is the engine's own.
#[utoipa::path(
    get,
    path = "/props",
    tag = "llama.cpp",
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "llama.cpp's server properties of the default model: `default_generation_settings` (`n_ctx` per slot, `params`), `total_slots`, `model_alias`, `build_info` (the system fingerprint)", body = Object),
        crate::api::responses::KeyedGetErrors,
    ),
)]
pub async fn props(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let served = state.models.default_model();
    let info = served.engine.model_info().ok_or(ApiError::NotReady)?;
    let policy = &served.policy;
    Ok(HttpResponse::Ok().json(json!({
        "default_generation_settings": {
            "id": 0,
            "n_ctx": info.context_length,
            "is_processing": false,
            "params": {
                "n_predict": policy.default_max_tokens.map_or(-1, i64::from),
                "seed": policy.default_seed.unwrap_or(RANDOM_SEED),
                "temperature": policy.default_temperature,
                "top_p": policy.default_top_p,
            },
        },
        "total_slots": served.engine.sequences(),
        "model_alias": served.id(),
        "model_path": Value::Null,
        "build_info": info.system_fingerprint,
        "modalities": {"vision": false, "audio": false},
    })))
}

/// One entry per sequence slot of the default model: `id`, `n_ctx`, `is_processing`;
/// none for a model with no slots here. The gateway's slots are interchangeable: the
/// first `running` are shown busy.
#[utoipa::path(
    get,
    path = "/slots",
    tag = "llama.cpp",
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "llama.cpp's slot list of the default model, read-only", body = [Object]),
        crate::api::responses::KeyedGetErrors,
    ),
)]
pub async fn slots_list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let served = state.models.default_model();
    let info = served.engine.model_info().ok_or(ApiError::NotReady)?;
    // None for a model with no slots in this process (an upstream keeps its own).
    let sequences = served.engine.sequences().unwrap_or(0);
    let running = served.engine.load().running;
    let list: Vec<Value> = (0..sequences)
        .map(|id| {
            json!({
                "id": id,
                "n_ctx": info.context_length,
                "is_processing": id < running,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(list))
}

//! `POST /tokenize` and `POST /detokenize`, in vLLM's request and response shapes, so
//! clients written for vLLM can count and inspect tokens. `/tokenize` with its defaults
//! counts a prompt exactly as a generation does: its `count` is the `prompt_tokens` a
//! chat or completions request with the same messages or prompt reports.
//!
//! Both need a key when keys are on (they reveal the model's vocabulary and cost engine
//! time), and both answer 503 while the model loads.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::body::{json_content_type, read_body};
use super::request::{
    parse_detokenize_request, parse_tokenize_request, WireDetokenize, WireTokenize,
};
use super::responses::TokenErrors;
use super::AppState;
use crate::engine::served::ServedModel;
use crate::error::ApiError;

#[derive(Serialize, ToSchema)]
pub struct TokenizeResponse {
    /// The prompt's tokens: a generation's `prompt_tokens` for the same input.
    count: usize,
    /// The model's context length.
    max_model_len: u32,
    tokens: Vec<u32>,
    /// How the vocabulary spells each token, with `return_token_strs`.
    token_strs: Option<Vec<String>>,
}

#[derive(Serialize, ToSchema)]
pub struct DetokenizeResponse {
    /// The text of the ids.
    prompt: String,
}

/// The served model a token request names, or the default one.
fn model<'a>(state: &'a AppState, id: Option<&str>) -> Result<&'a ServedModel, ApiError> {
    match id {
        Some(id) => state
            .models
            .get(id)
            .ok_or_else(|| ApiError::ModelNotFound(id.to_owned())),
        None => Ok(state.models.default_model()),
    }
}

/// The body of a token request, within the size limit and the body deadline.
async fn body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<bytes::BytesMut, ApiError> {
    json_content_type(req)?;
    let limit = state.timeouts.body;
    tokio::time::timeout(limit, read_body(req, payload, state.max_body_bytes))
        .await
        .map_err(|_| ApiError::BodyTimeout { limit })?
}

/// `{"count", "max_model_len", "tokens", "token_strs"}`.
#[utoipa::path(
    post,
    path = "/tokenize",
    tag = "tokens",
    request_body(content = WireTokenize, content_type = "application/json"),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The ids, as a generation counts them", body = TokenizeResponse),
        TokenErrors,
    ),
)]
pub async fn tokenize(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = body(&req, payload, &state).await?;
    let parsed = parse_tokenize_request(&body, &state.limits)?;
    let engine = &model(&state, parsed.model.as_deref())?.engine;
    let info = engine.model_info().ok_or(ApiError::NotReady)?;
    let tokenized = engine.tokenize(parsed.request).await?;
    let ids = tokenized.ids;
    let token_strs = if parsed.return_token_strs {
        Some(tokenized.spellings.ok_or_else(|| {
            ApiError::unsupported(
                "return_token_strs",
                "this engine does not know its vocabulary",
            )
        })?)
    } else {
        None
    };
    Ok(HttpResponse::Ok().json(TokenizeResponse {
        count: ids.len(),
        max_model_len: info.context_length,
        tokens: ids,
        token_strs,
    }))
}

/// `{"prompt"}`: the text of the ids.
#[utoipa::path(
    post,
    path = "/detokenize",
    tag = "tokens",
    request_body(content = WireDetokenize, content_type = "application/json"),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The text of the ids", body = DetokenizeResponse),
        TokenErrors,
    ),
)]
pub async fn detokenize(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = body(&req, payload, &state).await?;
    let parsed = parse_detokenize_request(&body, &state.limits)?;
    let engine = &model(&state, parsed.model.as_deref())?.engine;
    engine.model_info().ok_or(ApiError::NotReady)?;
    let text = engine
        .detokenize(parsed.tokens, parsed.skip_special_tokens)
        .await?;
    Ok(HttpResponse::Ok().json(DetokenizeResponse { prompt: text }))
}

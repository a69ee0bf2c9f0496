//! `POST /tokenize` and `POST /detokenize`, in vLLM's request and response shapes (and
//! llama.cpp's server's: `content`, `with_pieces`), so clients written for either can
//! count and inspect tokens. `/tokenize` with its defaults
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
    parse_apply_template_request, parse_detokenize_request, parse_tokenize_request, WireDetokenize,
    WireTokenize,
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
    /// The ids; with `with_pieces`, `{"id", "piece"}` objects.
    #[schema(schema_with = tokens_schema)]
    tokens: Tokens,
    /// How the vocabulary spells each token, with `return_token_strs`.
    token_strs: Option<Vec<String>>,
}

/// Ids, or pieces: `anyOf`, since an empty list is both.
fn tokens_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, Type};
    AnyOfBuilder::new()
        .item(
            ArrayBuilder::new().items(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0)),
            ),
        )
        .item(ArrayBuilder::new().items(utoipa::openapi::RefOr::Ref(
            utoipa::openapi::Ref::from_schema_name("Piece"),
        )))
        .build()
        .into()
}

#[derive(Serialize)]
#[serde(untagged)]
enum Tokens {
    Ids(Vec<u32>),
    Pieces(Vec<Piece>),
}

/// A token and its text, as llama.cpp's server answers `with_pieces`: a string, or the
/// bytes where they are not whole UTF-8 (part of a character).
#[derive(Serialize, ToSchema)]
pub struct Piece {
    id: u32,
    #[schema(schema_with = piece_schema)]
    piece: serde_json::Value,
}

/// The token's text, or its bytes.
fn piece_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(
            ArrayBuilder::new().items(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0))
                    .maximum(Some(255)),
            ),
        )
        .build()
        .into()
}

impl Piece {
    fn new(id: u32, bytes: Vec<u8>) -> Self {
        let piece = match String::from_utf8(bytes) {
            Ok(text) => serde_json::Value::String(text),
            Err(e) => serde_json::Value::from(e.into_bytes()),
        };
        Self { id, piece }
    }
}

#[derive(Serialize, ToSchema)]
pub struct DetokenizeResponse {
    /// The text of the ids.
    prompt: String,
    /// The same text, under llama.cpp's server's name.
    content: String,
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
    let count = ids.len();
    let tokens = if parsed.with_pieces {
        let pieces = tokenized.pieces.ok_or_else(|| {
            ApiError::unsupported("with_pieces", "this engine does not know its vocabulary")
        })?;
        Tokens::Pieces(
            ids.into_iter()
                .zip(pieces)
                .map(|(id, p)| Piece::new(id, p))
                .collect(),
        )
    } else {
        Tokens::Ids(ids)
    };
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
        count,
        max_model_len: info.context_length,
        tokens,
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
    Ok(HttpResponse::Ok().json(DetokenizeResponse {
        content: text.clone(),
        prompt: text,
    }))
}

/// The rendered prompt (llama.cpp's server's `POST /apply-template`).
#[derive(Serialize, ToSchema)]
pub struct AppliedTemplate {
    /// The conversation as the default model's chat template writes it, ending with the
    /// assistant's turn opening: what a generation of it reads.
    prompt: String,
}

/// `{"prompt"}`: `messages` rendered with the default model's chat template, as a
/// generation renders them (tokenized, then read back with the special tokens' text).
#[utoipa::path(
    post,
    path = "/apply-template",
    tag = "llama.cpp",
    request_body(content = Object, content_type = "application/json", description = "`{\"messages\": [...]}`, as in a chat request"),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The rendered prompt", body = AppliedTemplate),
        TokenErrors,
    ),
)]
pub async fn apply_template(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = body(&req, payload, &state).await?;
    let request = parse_apply_template_request(&body, &state.limits)?;
    let engine = &state.models.default_model().engine;
    engine.model_info().ok_or(ApiError::NotReady)?;
    let ids = engine.tokenize(request).await?.ids;
    let prompt = engine.detokenize(ids, false).await?;
    Ok(HttpResponse::Ok().json(AppliedTemplate { prompt }))
}

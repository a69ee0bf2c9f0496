//! `POST /v1/chat/completions`.
//!
//! receive (t_recv) -> read the body within the size limit -> validate -> admit ->
//! engine -> stream SSE frames or gather one JSON body. A request refused before it
//! reaches the engine still leaves a record, so rejected traffic is visible too.

use std::convert::Infallible;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::request::parse_chat_request;
use super::{AppState, RequestId};
use crate::engine::Role;
use crate::error::ApiError;
use crate::quality::QualityTracker;
use crate::record::{RequestRecord, Status};
use crate::stream::chunks::{ChunkAssembler, ResponseMeta};
use crate::stream::{producer, Run, RunInfo};
use crate::timing::RequestTimer;

/// SSE frames buffered between the producer and the socket. Small on purpose: a slow
/// client pushes back on the producer instead of piling up memory.
const SSE_BUFFER_FRAMES: usize = 16;

pub async fn chat_completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let t_recv = state.clock.now();
    let request_id = RequestId::of(&req);
    match handle(
        &req,
        payload,
        &state,
        &request_id,
        RequestTimer::start(t_recv),
    )
    .await
    {
        Ok(response) => response,
        Err(Failure::Recorded(error)) => error.error_response(),
        Err(Failure::Refused(error)) => {
            let timer = RequestTimer::start(t_recv);
            state.observer.observe(&RequestRecord {
                request_id,
                model: state.limits.served_model.clone(),
                stream: false,
                status: Status::Error,
                error_kind: Some(error.kind()),
                finish_reason: None,
                usage: Default::default(),
                timings: timer.finish(state.clock.now(), 0, None),
                quality: None,
                input_hash: None,
                output_hash: None,
                seed: None,
                system_fingerprint: None,
            });
            error.error_response()
        }
    }
}

/// Why a request got an error answer instead of a completion.
enum Failure {
    /// Refused before reaching the engine: the handler records it.
    Refused(ApiError),
    /// Failed in the engine, after its [`Run`] recorded it.
    Recorded(ApiError),
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Failure::Refused(error)
    }
}

async fn handle(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    request_id: &str,
    mut timer: RequestTimer,
) -> Result<HttpResponse, Failure> {
    let body = read_body(req, payload, state.max_body_bytes).await?;
    let chat = parse_chat_request(&body, &state.limits, request_id)?;
    let permit = state.admission.try_admit().ok_or(ApiError::Overloaded {
        limit: state.admission.limit(),
        retry_after: std::time::Duration::from_secs(1),
    })?;
    let info = state.engine.model_info().ok_or(ApiError::NotReady)?;

    let prompt = chat
        .generation
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map_or("", |m| m.content.as_str());
    let quality = QualityTracker::new(&state.quality, prompt);
    let seed = chat.generation.sampling.seed;

    timer.engine_submitted(state.clock.now());
    let generation = state
        .engine
        .generate(chat.generation)
        .await
        .map_err(|error| {
            tracing::warn!(request_id, error = %error, "The engine refused the request.");
            ApiError::from(error)
        })?;
    let info = RunInfo {
        request_id: request_id.to_owned(),
        model: chat.model.clone(),
        stream: chat.stream,
        input_hash: chat.input_hash,
        seed,
        system_fingerprint: info.system_fingerprint,
        prompt_tokens: generation.prompt_tokens,
    };
    let meta = ResponseMeta {
        id: format!("chatcmpl-{request_id}"),
        created: state.clock.unix_seconds(),
        model: chat.model,
        system_fingerprint: info.system_fingerprint.clone(),
    };
    let run = Run::new(
        info,
        state.clock.clone(),
        timer,
        quality,
        state.observer.clone(),
        permit,
    );
    let events = generation.events;

    if !chat.stream {
        let body = producer::collect_json(run, &meta, events)
            .await
            .map_err(Failure::Recorded)?;
        return Ok(HttpResponse::Ok()
            .content_type("application/json")
            .body(body));
    }
    let (tx, mut rx) = mpsc::channel::<Bytes>(SSE_BUFFER_FRAMES);
    let assembler = ChunkAssembler::new(meta, chat.include_usage);
    tokio::spawn(producer::stream_sse(
        run,
        assembler,
        events,
        tx,
        state.keepalive,
    ));
    let body = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|f| f.map(Ok::<_, Infallible>))
    });
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}

/// Reads the body, refusing it with 413 as soon as it is known to be over `limit`.
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<BytesMut, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(1024).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::InvalidJson(format!("the body could not be read: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

//! OpenAI's `n` > 1: one request answered with several choices.
//!
//! Each choice is a request of its own inside: admitted, charged to the key, started,
//! timed, scored and recorded as any other, so every figure the gateway keeps (TTFT,
//! TPOT, the quality signals, the semantic log) is a choice's own. The first choice is
//! the client's request itself; choice `i` after it has the request id `<id>-<i>`, and
//! when the request is seeded, the seed `seed + i` (so the choices differ, and the same
//! request gets the same choices again). The engine decodes them as sequences side by
//! side (the llama.cpp engine in one batch); an upstream is sent one request per choice.
//!
//! The answers are merged into one response, in OpenAI's shape: the choices in `index`
//! order, `usage` with the prompt counted once and the completions summed, and the first
//! choice's `timings` and headers. Streamed, the choices' chunks are interleaved as they
//! come, each with its `index`, under the first choice's `id`; one usage chunk (with
//! `include_usage`) and one `[DONE]` end the stream. A choice that cannot start (its key's
//! limit, a full gateway) fails the request; the others are then cancelled.

use std::cell::RefCell;
use std::convert::Infallible;
use std::rc::Rc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::{stream, Stream, StreamExt};
use serde_json::{json, Value};

use super::{respond, Charged, Failure, GenerationRoute, Handling, Unanswered};
use crate::api::request::{input_hash, ValidatedRequest};
use crate::api::AppState;
use crate::auth::limits::RateHeaders;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::stream::producer::Deadline;
use crate::timing::RequestTimer;

/// Answers `parsed` (`n` > 1) with its choices, `first` being the client's request.
pub(super) async fn answer(
    first: Handling<'_>,
    parsed: ValidatedRequest,
    req: &HttpRequest,
) -> Result<HttpResponse, Failure> {
    let n = parsed.choices;
    let stream = parsed.stream;
    let others: Vec<ValidatedRequest> = (1..n)
        .map(|index| choice(&parsed, index, first.request_id))
        .collect();
    let (route, app, request_id) = (first.route, first.state, first.request_id);
    let state = first.pending.state.clone();
    let caller = first.charged.caller;
    let id = format!("{}{}", route.shape().id_prefix(), request_id);
    let deadline = first.deadline.clone();
    let own = async move {
        let mut first = first;
        let admitted = first.admit(parsed)?;
        let started = first.start(admitted).await?;
        respond::respond(started, app, deadline).await
    };
    let siblings = others
        .into_iter()
        .enumerate()
        .map(|(k, parsed)| sibling(route, &state, caller, request_id, k as u32 + 1, parsed, req));
    let (own, siblings) =
        futures_util::future::join(own, futures_util::future::join_all(siblings)).await;
    let mut responses = vec![own?];
    for answered in siblings {
        // The answers taken so far are dropped with the error: their streams stop.
        responses.push(answered.map_err(Failure::Recorded)?);
    }
    if stream {
        Ok(merge_streams(responses, id))
    } else {
        merge_bodies(responses).await
    }
}

/// Choice `index` of `parsed`: its own request id and, when seeded, the seed `seed +
/// index` (its input hash with it).
fn choice(parsed: &ValidatedRequest, index: u32, request_id: &str) -> ValidatedRequest {
    let mut choice = parsed.clone();
    let generation = &mut choice.generation;
    generation.request_id = format!("{request_id}-{index}");
    if let Some(seed) = generation.sampling.seed.as_mut() {
        *seed = seed.wrapping_add(u64::from(index));
    }
    choice.input_hash = input_hash(&choice.model, &choice.generation);
    choice
}

/// One choice after the first, along the client's request's path under its own request
/// id and record, charged to the same key.
async fn sibling(
    route: GenerationRoute,
    state: &web::Data<AppState>,
    caller: Option<&Caller>,
    client_id: &str,
    index: u32,
    parsed: ValidatedRequest,
    req: &HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let t_recv = state.clock.now();
    let request_id = format!("{client_id}-{index}");
    let deadline = Deadline::from_now(state.timeouts.request, state.lifecycle.cut_off());
    let trace = state
        .telemetry
        .start_request(req.headers(), state.clock.system_time());
    let mut pending = Unanswered {
        operation: route.operation(),
        state: state.clone(),
        request_id: request_id.clone(),
        api_key_id: caller.map(|c| c.key_id.clone()),
        model: Some(parsed.model.clone()),
        stream: parsed.stream,
        t_recv,
        trace: Some(trace),
        reported: None,
        quota_hold: None,
        shadow: None,
        split: None,
        variant: None,
    };
    // The client gets the first choice's rate headers.
    let mut rate = RateHeaders::default();
    let mut handling = Handling {
        route,
        state,
        request_id: &request_id,
        charged: Charged {
            caller,
            headers: &mut rate,
        },
        timer: RequestTimer::start(t_recv),
        deadline: deadline.clone(),
        pending: &mut pending,
    };
    let answered = async {
        let admitted = handling.admit(parsed)?;
        let started = handling.start(admitted).await?;
        respond::respond(started, state, deadline).await
    };
    match answered.await {
        Ok(response) => Ok(response),
        Err(Failure::Refused(error)) => {
            pending.record(Some(&error));
            Err(error)
        }
        Err(Failure::Recorded(error)) => Err(error),
    }
}

/// The first response's headers on a new answer, less those of its body.
fn answer_with_headers_of(first: &HttpResponse) -> actix_web::HttpResponseBuilder {
    let mut builder = HttpResponse::build(first.status());
    for (name, value) in first.headers() {
        if name != header::CONTENT_LENGTH {
            builder.append_header((name.clone(), value.clone()));
        }
    }
    builder
}

/// Whole answers merged: every choice's, its `index` set, the usage summed.
async fn merge_bodies(responses: Vec<HttpResponse>) -> Result<HttpResponse, Failure> {
    let mut builder = answer_with_headers_of(&responses[0]);
    let mut merged: Option<Value> = None;
    let mut choices = Vec::with_capacity(responses.len());
    let mut completion_tokens = 0;
    for (index, response) in responses.into_iter().enumerate() {
        let bytes = actix_web::body::to_bytes(response.into_body())
            .await
            .map_err(|_| Failure::Recorded(ApiError::Internal))?;
        let mut body: Value =
            serde_json::from_slice(&bytes).map_err(|_| Failure::Recorded(ApiError::Internal))?;
        let mut choice = body["choices"][0].take();
        choice["index"] = json!(index);
        choices.push(choice);
        completion_tokens += body["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        merged.get_or_insert(body);
    }
    let mut merged = merged.ok_or(Failure::Recorded(ApiError::Internal))?;
    merged["choices"] = Value::Array(choices);
    sum_usage(&mut merged["usage"], completion_tokens);
    let body = serde_json::to_vec(&merged).map_err(|_| Failure::Recorded(ApiError::Internal))?;
    Ok(builder.body(body))
}

/// `usage` with the choices' completions: the prompt is counted once.
fn sum_usage(usage: &mut Value, completion_tokens: u64) {
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    usage["completion_tokens"] = json!(completion_tokens);
    usage["total_tokens"] = json!(prompt + completion_tokens);
}

/// Streams merged: each choice's frames as they come, re-indexed, one usage chunk and
/// one `[DONE]` at the end.
fn merge_streams(responses: Vec<HttpResponse>, id: String) -> HttpResponse {
    let mut builder = answer_with_headers_of(&responses[0]);
    let n = responses.len();
    let merge = Rc::new(RefCell::new(Merge {
        id,
        created: None,
        left: n,
        usage: Vec::new(),
    }));
    let streams = responses.into_iter().enumerate().map(|(index, response)| {
        frames(response.into_body())
            .map(move |f| (index, f))
            .boxed_local()
    });
    let merged = stream::select_all(streams).flat_map(move |(index, frame)| {
        stream::iter(merge.borrow_mut().frame(index, frame)).map(Ok::<_, Infallible>)
    });
    builder.streaming(merged)
}

/// The merge of streamed choices, frame by frame.
struct Merge {
    /// The first choice's response id, which every chunk carries.
    id: String,
    /// The `created` every chunk carries: the first chunk's.
    created: Option<Value>,
    /// Choices whose `[DONE]` has not come yet.
    left: usize,
    /// The usage chunks held back, one per choice that sent one.
    usage: Vec<Value>,
}

impl Merge {
    /// What to send for choice `index`'s `frame`.
    fn frame(&mut self, index: usize, frame: Bytes) -> Vec<Bytes> {
        let Some(data) = frame.strip_prefix(b"data: ") else {
            // A keep-alive comment.
            return vec![frame];
        };
        if data.starts_with(b"[DONE]") {
            self.left = self.left.saturating_sub(1);
            return if self.left == 0 {
                self.end()
            } else {
                Vec::new()
            };
        }
        let Ok(mut chunk) = serde_json::from_slice::<Value>(data) else {
            return vec![frame];
        };
        if chunk.get("error").is_some() {
            return vec![frame];
        }
        chunk["id"] = json!(self.id);
        // Each choice stamped its own second: the stream keeps the first it saw.
        let created = self.created.get_or_insert_with(|| chunk["created"].clone());
        chunk["created"] = created.clone();
        match chunk["choices"].as_array_mut() {
            Some(choices) if !choices.is_empty() => {
                for choice in choices {
                    choice["index"] = json!(index);
                }
            }
            // The usage chunk (`include_usage`): one for all, at the end.
            _ => {
                self.usage.push(chunk);
                return Vec::new();
            }
        }
        vec![sse(&chunk)]
    }

    /// The usage chunk (the first choice's, its usage summed) and `[DONE]`.
    fn end(&mut self) -> Vec<Bytes> {
        let mut frames = Vec::with_capacity(2);
        let completion_tokens = self
            .usage
            .iter()
            .map(|c| c["usage"]["completion_tokens"].as_u64().unwrap_or(0))
            .sum();
        if let Some(mut last) = self.usage.first().cloned() {
            sum_usage(&mut last["usage"], completion_tokens);
            frames.push(sse(&last));
        }
        frames.push(Bytes::from_static(crate::stream::chunks::DONE_FRAME));
        frames
    }
}

fn sse(chunk: &Value) -> Bytes {
    Bytes::from(format!("data: {chunk}\n\n"))
}

/// A streamed body as its SSE frames (each ends with a blank line).
fn frames(body: BoxBody) -> impl Stream<Item = Bytes> {
    stream::unfold(
        (Box::pin(body), BytesMut::new()),
        |(mut body, mut buffer)| async move {
            loop {
                if let Some(at) = buffer.windows(2).position(|w| w == b"\n\n") {
                    let frame = buffer.split_to(at + 2).freeze();
                    return Some((frame, (body, buffer)));
                }
                match std::future::poll_fn(|cx| body.as_mut().poll_next(cx)).await {
                    Some(Ok(bytes)) => buffer.extend_from_slice(&bytes),
                    _ => return None,
                }
            }
        },
    )
}

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
//! `include_usage`) and one `[DONE]` end the stream. A whole answer waits for every choice,
//! and the first refusal (its key's limit, a full gateway) is the answer, the others
//! cancelled. A stream starts once the first choice has, and starts the others as it goes
//! (a started choice's frames must drain, or its write timeout cuts it); one that cannot
//! start is an error frame in the stream.

use std::cell::RefCell;
use std::convert::Infallible;
use std::rc::Rc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::http::header::{self, HeaderMap};
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::stream::LocalBoxStream;
use futures_util::{stream, Stream, StreamExt};
use serde_json::{json, Value};

use super::{respond, Charged, Failure, GenerationRoute, Handling, Unanswered};
use crate::api::request::{input_hash, ValidatedRequest};
use crate::api::AppState;
use crate::auth::limits::RateHeaders;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::record::SplitLink;
use crate::stream::chunks::sse_json;
use crate::stream::producer::Deadline;
use crate::timing::RequestTimer;

/// Answers `parsed` (`n` > 1) with its choices, `first` being the client's request.
pub(super) async fn answer(
    first: Handling<'_>,
    parsed: ValidatedRequest,
    req: &HttpRequest,
) -> Result<HttpResponse, Failure> {
    let n = parsed.choices;
    let limit = first.state.admission.limit();
    if n as usize > limit {
        // It could never be taken whole: each choice holds a place of its own.
        return Err(ApiError::invalid(
            "n",
            format!("{n} choices are more than the {limit} requests this gateway takes at once"),
        )
        .into());
    }
    let stream = parsed.stream;
    let others: Vec<Sibling> = (1..n)
        .map(|index| Sibling {
            route: first.route,
            state: first.pending.state.clone(),
            caller: first.charged.caller.cloned(),
            client_id: first.request_id.to_owned(),
            index,
            parsed: choice(&parsed, index, first.request_id),
            headers: req.headers().clone(),
            t_recv: first.pending.t_recv,
            split: first.pending.split.clone(),
        })
        .collect();
    let (app, id) = (
        first.state,
        format!("{}{}", first.route.shape().id_prefix(), first.request_id),
    );
    let deadline = first.deadline.clone();
    let own = async move {
        let mut first = first;
        let admitted = first.admit(parsed)?;
        let started = first.start(admitted).await?;
        respond::respond(started, app, deadline).await
    };
    if !stream {
        // The first refusal drops the rest: their runs are recorded as cancelled.
        let (own, others) = futures_util::future::try_join(
            own,
            futures_util::future::try_join_all(others.into_iter().map(Sibling::answer)),
        )
        .await?;
        return merge_bodies(std::iter::once(own).chain(others).collect()).await;
    }
    // A request the gateway refuses outright is an HTTP error; the other choices start
    // as the answer streams, so no started choice waits on another's start (its frames
    // would fill its channel and time out).
    let own = own.await?;
    let others = others
        .into_iter()
        .map(|sibling| {
            stream::once(sibling.answer())
                .flat_map(|answered| match answered {
                    Ok(response) => frames(response.into_body()).boxed_local(),
                    // Streamed, a choice that cannot start ends with an error frame.
                    Err(Failure::Refused(error) | Failure::Recorded(error)) => stream::iter([
                        sse_json(&error.body()),
                        Bytes::from_static(crate::stream::chunks::DONE_FRAME),
                    ])
                    .boxed_local(),
                })
                .boxed_local()
        })
        .collect();
    Ok(merge_streams(own, others, id))
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

/// One choice after the first: it goes along the client's request's path under its own
/// request id and record, charged to the same key. Owned, so that a stream can start it.
struct Sibling {
    route: GenerationRoute,
    state: web::Data<AppState>,
    caller: Option<Caller>,
    client_id: String,
    index: u32,
    parsed: ValidatedRequest,
    /// The client's headers, whose `traceparent` its span continues.
    headers: HeaderMap,
    /// When the client's request arrived.
    t_recv: std::time::Duration,
    split: Option<SplitLink>,
}

impl Sibling {
    async fn answer(self) -> Result<HttpResponse, Failure> {
        let Sibling {
            route,
            state,
            caller,
            client_id,
            index,
            parsed,
            headers,
            t_recv,
            split,
        } = self;
        let request_id = format!("{client_id}-{index}");
        let deadline = Deadline::from_now(state.timeouts.request, state.lifecycle.cut_off());
        let trace = state
            .telemetry
            .start_request(&headers, state.clock.system_time());
        let mut pending = Unanswered::new(
            route.operation(),
            state.clone(),
            request_id.clone(),
            caller.as_ref().map(|c| c.key_id.clone()),
            t_recv,
            trace,
        );
        pending.model = Some(parsed.model.clone());
        pending.stream = parsed.stream;
        pending.split = split;
        // The client gets the first choice's rate headers.
        let mut rate = RateHeaders::default();
        let handling = Handling {
            route,
            state: &state,
            request_id: &request_id,
            charged: Charged {
                caller: caller.as_ref(),
                headers: &mut rate,
            },
            timer: RequestTimer::start(t_recv),
            deadline: deadline.clone(),
            pending: &mut pending,
        };
        let answered = async {
            let mut handling = handling;
            let admitted = handling.admit(parsed)?;
            let started = handling.start(admitted).await?;
            respond::respond(started, &state, deadline).await
        };
        match answered.await {
            Ok(response) => Ok(response),
            Err(Failure::Refused(error)) => {
                pending.record(Some(&error));
                Err(Failure::Recorded(error))
            }
            Err(recorded) => Err(recorded),
        }
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
/// one `[DONE]` at the end. `others`: the frames of choices 1 and on.
fn merge_streams(
    first: HttpResponse,
    others: Vec<LocalBoxStream<'static, Bytes>>,
    id: String,
) -> HttpResponse {
    let mut builder = answer_with_headers_of(&first);
    let merge = Rc::new(RefCell::new(Merge {
        id,
        created: None,
        left: 1 + others.len(),
        usage: Vec::new(),
    }));
    let streams = std::iter::once(frames(first.into_body()).boxed_local())
        .chain(others)
        .enumerate()
        .map(|(index, frames)| frames.map(move |f| (index, f)).boxed_local());
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
    /// The usage chunks held back, each with its choice's index.
    usage: Vec<(usize, Value)>,
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
                self.usage.push((index, chunk));
                return Vec::new();
            }
        }
        vec![sse_json(&chunk)]
    }

    /// The usage chunk (the first choice's, with its timings, the usage summed) and
    /// `[DONE]`.
    fn end(&mut self) -> Vec<Bytes> {
        let mut frames = Vec::with_capacity(2);
        let completion_tokens = self
            .usage
            .iter()
            .map(|(_, c)| c["usage"]["completion_tokens"].as_u64().unwrap_or(0))
            .sum();
        let first = self.usage.iter().min_by_key(|(index, _)| *index);
        if let Some(mut last) = first.map(|(_, chunk)| chunk.clone()) {
            sum_usage(&mut last["usage"], completion_tokens);
            frames.push(sse_json(&last));
        }
        frames.push(Bytes::from_static(crate::stream::chunks::DONE_FRAME));
        frames
    }
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

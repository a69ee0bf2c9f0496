//! OpenAI's `n` > 1 and `/v1/completions`' batch of prompts (and `/completion`'s, in
//! llama.cpp's shape): one request answered with several parts, each prompt's `n`
//! choices.
//!
//! Each part is a request of its own inside: admitted, charged to the key, started,
//! timed, scored and recorded as any other, so every figure the gateway keeps (TTFT,
//! TPOT, the quality signals, the semantic log) is a part's own. Part `i` is prompt `i /
//! n`'s choice `i % n`, as OpenAI numbers a batch's choices. The first part is the
//! client's request itself; part `i` after it has the request id `<id>-<i>`, and when the
//! request is seeded, its choice `c` the seed `seed + c` (so a prompt's choices differ,
//! and the same request gets the same answers again). The engine decodes them as
//! sequences side by side (the llama.cpp engine in one batch); an upstream is sent one
//! request per part.
//!
//! The answers are merged into one response, in OpenAI's shape: the choices in `index`
//! order, `usage` with each prompt counted once and the completions summed, and the first
//! part's `timings` and headers. Streamed, the parts' chunks are interleaved as they
//! come, each with its `index`, under the first part's `id`; one usage chunk (with
//! `include_usage`) and one `[DONE]` end the stream. In llama.cpp's shape (`/completion`
//! with several prompts) the answer is a list of its answers, each with its `index`, and
//! a stream interleaves their frames, each with its `index`, as llama-server's does.
//!
//! A whole answer waits for every part, and the first refusal (its key's limit, a full
//! gateway) is the answer, the others cancelled. A stream starts once the first part has,
//! and starts the others as it goes (a started part's frames must drain, or its write
//! timeout cuts it); one that cannot start is an error frame in the stream.

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
use crate::engine::Prompt;
use crate::error::ApiError;
use crate::record::SplitLink;
use crate::stream::chunks::sse_json;
use crate::stream::producer::Deadline;
use crate::timing::RequestTimer;

/// Answers `parsed` (`n` > 1, or several prompts) with its parts, `first` being the
/// client's request.
pub(super) async fn answer(
    first: Handling<'_>,
    parsed: ValidatedRequest,
    req: &HttpRequest,
) -> Result<HttpResponse, Failure> {
    let n = parsed.choices as usize;
    let prompts = 1 + parsed.more_prompts.len();
    let parts = prompts * n;
    let limit = first.state.admission.limit();
    if parts > limit {
        // It could never be taken whole: each part holds a place of its own.
        let (param, what) = if prompts > 1 && n <= limit {
            (
                "prompt",
                format!("{prompts} prompts with n = {n} make {parts} answers, "),
            )
        } else {
            ("n", format!("{n} choices are "))
        };
        return Err(ApiError::invalid(
            param,
            format!("{what}more than the {limit} requests this gateway takes at once"),
        )
        .into());
    }
    let merged = Merged {
        id: format!("{}{}", first.route.shape().id_prefix(), first.request_id),
        choices: n,
        native: parsed.native.is_some(),
    };
    let stream = parsed.stream;
    // Each part clones the request: the batch's other prompts go with none of them.
    let mut parsed = parsed;
    let more_prompts = std::mem::take(&mut parsed.more_prompts);
    let more_texts = parsed
        .native
        .as_mut()
        .map(|native| std::mem::take(&mut native.more_prompts))
        .unwrap_or_default();
    let others: Vec<Sibling> = (1..parts)
        .map(|index| Sibling {
            route: first.route,
            state: first.pending.state.clone(),
            caller: first.charged.caller.cloned(),
            client_id: first.request_id.to_owned(),
            index,
            parsed: part(
                &parsed,
                (&more_prompts, &more_texts),
                index,
                n,
                first.request_id,
            ),
            headers: req.headers().clone(),
            t_recv: first.pending.t_recv,
            split: first.pending.split.clone(),
        })
        .collect();
    let app = first.state;
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
        return merged
            .bodies(std::iter::once(own).chain(others).collect())
            .await;
    }
    // A request the gateway refuses outright is an HTTP error; the other parts start as
    // the answer streams, so no started part waits on another's start (its frames would
    // fill its channel and time out).
    let own = own.await?;
    let others = others
        .into_iter()
        .map(|sibling| {
            stream::once(sibling.answer())
                .flat_map(|answered| match answered {
                    Ok(response) => frames(response.into_body()).boxed_local(),
                    // Streamed, a part that cannot start ends with an error frame.
                    Err(Failure::Refused(error) | Failure::Recorded(error)) => stream::iter([
                        sse_json(&error.body()),
                        Bytes::from_static(crate::stream::chunks::DONE_FRAME),
                    ])
                    .boxed_local(),
                })
                .boxed_local()
        })
        .collect();
    Ok(merged.streams(own, others))
}

/// Part `index` of `parsed` (`n` choices per prompt; `more`: the batch's prompts after
/// the first, and their texts for llama.cpp's answer): its prompt, its own request id
/// and, when seeded, the seed `seed + c` for choice `c` (its input hash with them).
fn part(
    parsed: &ValidatedRequest,
    more: (&[Prompt], &[String]),
    index: usize,
    n: usize,
    request_id: &str,
) -> ValidatedRequest {
    let mut part = parsed.clone();
    let (prompt, choice) = (index / n, index % n);
    if let Some(other) = prompt.checked_sub(1) {
        part.generation.prompt = more.0.get(other).cloned().unwrap_or_default();
        if let Some(native) = part.native.as_mut() {
            native.prompt = more.1.get(other).cloned().unwrap_or_default();
        }
    }
    let generation = &mut part.generation;
    generation.request_id = format!("{request_id}-{index}");
    if let Some(seed) = generation.sampling.seed.as_mut() {
        *seed = seed.wrapping_add(choice as u64);
    }
    part.input_hash = input_hash(&part.model, &part.generation);
    part
}

/// One part after the first: it goes along the client's request's path under its own
/// request id and record, charged to the same key. Owned, so that a stream can start it.
struct Sibling {
    route: GenerationRoute,
    state: web::Data<AppState>,
    caller: Option<Caller>,
    client_id: String,
    index: usize,
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
        // The client gets the first part's rate headers.
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

/// How the parts' answers are merged into one.
struct Merged {
    /// The first part's response id, which every OpenAI chunk carries.
    id: String,
    /// Choices per prompt (`n`).
    choices: usize,
    /// llama.cpp's shape (`/completion`): a list of answers, not a list of choices.
    native: bool,
}

impl Merged {
    /// Whole answers merged: every part's, its `index` set, the usage summed.
    async fn bodies(self, responses: Vec<HttpResponse>) -> Result<HttpResponse, Failure> {
        let mut builder = answer_with_headers_of(&responses[0]);
        let mut bodies = Vec::with_capacity(responses.len());
        for (index, response) in responses.into_iter().enumerate() {
            let bytes = actix_web::body::to_bytes(response.into_body())
                .await
                .map_err(|_| Failure::Recorded(ApiError::Internal))?;
            let mut body: Value = serde_json::from_slice(&bytes)
                .map_err(|_| Failure::Recorded(ApiError::Internal))?;
            if self.native {
                body["index"] = json!(index);
            }
            bodies.push(body);
        }
        let merged = if self.native {
            Value::Array(bodies)
        } else {
            let usage = self.usage(bodies.iter().map(|b| &b["usage"]).enumerate());
            let mut choices = Vec::with_capacity(bodies.len());
            for (index, body) in bodies.iter_mut().enumerate() {
                let mut choice = body["choices"][0].take();
                choice["index"] = json!(index);
                choices.push(choice);
            }
            let mut merged = bodies.swap_remove(0);
            merged["choices"] = Value::Array(choices);
            merged["usage"] = usage;
            merged
        };
        let body =
            serde_json::to_vec(&merged).map_err(|_| Failure::Recorded(ApiError::Internal))?;
        Ok(builder.body(body))
    }

    /// The parts' `usage` as one, the first part's with the sums: each prompt's tokens
    /// (and those read from the cache) counted once, by the first of its choices that
    /// reported usage, and every part's completion.
    fn usage<'u>(&self, parts: impl Iterator<Item = (usize, &'u Value)>) -> Value {
        let count = |usage: &Value, pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
        let mut parts: Vec<(usize, &Value)> = parts.collect();
        parts.sort_by_key(|(index, _)| *index);
        let (mut prompt, mut cached, mut completion) = (0, None::<u64>, 0);
        let mut counted_prompt = None;
        for &(index, usage) in &parts {
            completion += count(usage, "/completion_tokens").unwrap_or(0);
            if counted_prompt != Some(index / self.choices) {
                counted_prompt = Some(index / self.choices);
                prompt += count(usage, "/prompt_tokens").unwrap_or(0);
                if let Some(tokens) = count(usage, "/prompt_tokens_details/cached_tokens") {
                    *cached.get_or_insert(0) += tokens;
                }
            }
        }
        let mut usage = parts
            .first()
            .map(|(_, u)| (*u).clone())
            .unwrap_or(Value::Null);
        if usage.is_object() {
            usage["prompt_tokens"] = json!(prompt);
            usage["completion_tokens"] = json!(completion);
            usage["total_tokens"] = json!(prompt + completion);
            if let Some(cached) = cached {
                usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
            }
        }
        usage
    }

    /// Streams merged: each part's frames as they come, re-indexed; in OpenAI's shape one
    /// usage chunk and one `[DONE]` at the end. `others`: the frames of parts 1 and on.
    fn streams(
        self,
        first: HttpResponse,
        others: Vec<LocalBoxStream<'static, Bytes>>,
    ) -> HttpResponse {
        let mut builder = answer_with_headers_of(&first);
        let merge = Rc::new(RefCell::new(Merge {
            left: 1 + others.len(),
            merged: self,
            created: None,
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
}

/// The merge of streamed parts, frame by frame.
struct Merge {
    merged: Merged,
    /// The `created` every OpenAI chunk carries: the first chunk's.
    created: Option<Value>,
    /// Parts whose `[DONE]` has not come yet.
    left: usize,
    /// The usage chunks held back, each with its part's index.
    usage: Vec<(usize, Value)>,
}

impl Merge {
    /// What to send for part `index`'s `frame`.
    fn frame(&mut self, index: usize, frame: Bytes) -> Vec<Bytes> {
        let Some(data) = frame.strip_prefix(b"data: ") else {
            // A keep-alive comment.
            return vec![frame];
        };
        if data.starts_with(b"[DONE]") {
            self.left = self.left.saturating_sub(1);
            return if self.left == 0 && !self.merged.native {
                self.end()
            } else {
                Vec::new()
            };
        }
        let Ok(mut chunk) = serde_json::from_slice::<Value>(data) else {
            return vec![frame];
        };
        if chunk.get("error").is_some() {
            if self.merged.native {
                // Which answer of the batch failed.
                chunk["index"] = json!(index);
                return vec![sse_json(&chunk)];
            }
            return vec![frame];
        }
        if self.merged.native {
            // llama.cpp's frames: each names its answer, and the stream has no `[DONE]`.
            chunk["index"] = json!(index);
            return vec![sse_json(&chunk)];
        }
        chunk["id"] = json!(self.merged.id);
        // Each part stamped its own second: the stream keeps the first it saw.
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

    /// The usage chunk (the first part's, with its timings, the usage summed) and
    /// `[DONE]`.
    fn end(&mut self) -> Vec<Bytes> {
        let mut frames = Vec::with_capacity(2);
        let usage = self.merged.usage(
            self.usage
                .iter()
                .map(|(index, chunk)| (*index, &chunk["usage"])),
        );
        let first = self.usage.iter().min_by_key(|(index, _)| *index);
        if let Some(mut last) = first.map(|(_, chunk)| chunk.clone()) {
            last["usage"] = usage;
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

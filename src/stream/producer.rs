//! Drives one request's engine events to the client.
//!
//! Streaming: a spawned task writes SSE frames into a bounded channel that the HTTP
//! response body drains. A frame counts as "handed to the transport" when the channel
//! accepts it; that is the moment the timer stamps (TTFT, e2e). Token times come from
//! the engine's own stamps, and the time a frame waits for room in a full channel (the
//! client is slower than the engine) is added up as the request's client wait. A closed channel
//! means the client left: the task returns, dropping the engine stream (which cancels the
//! generation) and the [`Run`] (which records the request as cancelled). A channel that
//! stays full for [`Pacing::write_timeout`] means the client stopped reading: the stream
//! is cut off the same way and recorded as cancelled with the reason `client_stalled`.
//! The engine does not wait for this task (the mistral.rs forwarder buffers a request's
//! events and frees its engine slot when the sequence ends), so a stalled client holds
//! no engine slot.
//! When the degeneration guard trips, the engine stream is dropped the same way and the
//! answer ends with `finish_reason: "stop"`.
//!
//! Non-streaming: the same events are gathered into one `chat.completion` body.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::chunks::{native, ChunkAssembler, Completion, ResponseMeta, SideParts, KEEPALIVE_FRAME};
use super::logprobs::TextLogprobs;
use super::{Arrival, Ending, Run};
use crate::engine::{EngineError, EngineEvent, TokenStream};
use crate::error::ApiError;
use crate::names;
use crate::record::ResponseTimings;
use crate::timing::{OutputKind, Timings};
use crate::tokens::TokenLogprob;
use tokio_util::sync::CancellationToken;

/// How a streamed response paces its writes.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// Silence after which an SSE comment is sent so proxies keep the stream open.
    pub keepalive: Duration,
    /// How long one frame may wait for the client to make room before the stream is cut.
    pub write_timeout: Duration,
}

/// What ends a request from outside: its deadline (arrival plus the request timeout), or
/// the server's drain running out of time.
#[derive(Debug, Clone)]
pub struct Deadline {
    pub at: tokio::time::Instant,
    pub limit: Duration,
    /// Cancelled when a draining server ends the requests still running.
    pub cut_off: CancellationToken,
}

impl Deadline {
    /// A request's deadline: `limit` from now, or sooner when `cut_off` is cancelled.
    pub fn from_now(limit: std::time::Duration, cut_off: CancellationToken) -> Self {
        Self {
            at: tokio::time::Instant::now() + limit,
            limit,
            cut_off,
        }
    }

    /// Resolves when the request must end, with the error it ends with. Create it once
    /// per request, not per token: it holds a timer.
    async fn passed(&self) -> ApiError {
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(self.at) => {
                tracing::warn!(
                    request_timeout_s = self.limit.as_secs_f64(),
                    "The request ran past the request timeout; generation stopped."
                );
                ApiError::RequestTimeout { limit: self.limit }
            }
            () = self.cut_off.cancelled() => ApiError::ShuttingDown,
        }
    }
}

/// Why a frame could not be handed over.
enum Lost {
    /// The client closed the connection.
    Left,
    /// The client accepted nothing for the write timeout.
    Stalled,
}

/// The channel to the HTTP body, with the client's write deadline.
struct Wire {
    tx: mpsc::Sender<Bytes>,
    write_timeout: Duration,
}

impl Wire {
    /// Hands `frame` over; when the channel is full, waits for the client (at most the
    /// write timeout) and tells `run` how long.
    async fn send(&self, run: &mut Run, frame: Bytes) -> Result<(), Lost> {
        let frame = match self.tx.try_send(frame) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(Lost::Left),
            Err(mpsc::error::TrySendError::Full(frame)) => frame,
        };
        let since = run.now();
        let sent = tokio::time::timeout(self.write_timeout, self.tx.send(frame)).await;
        run.client_waited(run.now().saturating_sub(since));
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Lost::Left),
            Err(_) => Err(Lost::Stalled),
        }
    }
}

/// Streams a response into `tx` until the engine finishes, fails or the client leaves
/// or stalls.
pub async fn stream_sse(
    mut run: Run,
    mut assembler: ChunkAssembler,
    events: TokenStream,
    tx: mpsc::Sender<Bytes>,
    pacing: Pacing,
    deadline: Deadline,
) {
    let wire = Wire {
        tx,
        write_timeout: pacing.write_timeout,
    };
    match drive(
        &mut run,
        &mut assembler,
        events,
        &wire,
        pacing.keepalive,
        deadline,
    )
    .await
    {
        Ok(ending) => {
            run.finish(ending);
        }
        // Dropping the run records it as cancelled by the client.
        Err(Lost::Left) => drop(run),
        Err(Lost::Stalled) => {
            tracing::warn!(
                write_timeout_s = pacing.write_timeout.as_secs_f64(),
                "The client accepted no bytes within the stream write timeout; stream cut off."
            );
            run.cancel(names::CLIENT_STALLED);
        }
    }
}

/// The streaming loop: how the answer ended, once its last frame ([DONE]) is handed over.
async fn drive(
    run: &mut Run,
    assembler: &mut ChunkAssembler,
    mut events: TokenStream,
    wire: &Wire,
    keepalive: Duration,
    deadline: Deadline,
) -> Result<Ending, Lost> {
    run.client_waited(Duration::ZERO);
    if let Some(first) = assembler.first_frame() {
        wire.send(run, first).await?;
    }
    // The keep-alive timer is armed for the first frame's silence and moved only when
    // it fires (to `keepalive` after the last frame), not at every frame.
    let idle = tokio::time::sleep(keepalive);
    let mut last_frame = tokio::time::Instant::now();
    let passed = deadline.passed();
    let left = wire.tx.closed();
    tokio::pin!(idle, passed, left);
    // Tokens waiting for a frame: their text is empty (part of a character) or held back
    // for a stop sequence.
    let mut unsent: Vec<TokenLogprob> = Vec::new();
    loop {
        let event = tokio::select! {
            biased;
            () = &mut left => return Err(Lost::Left),
            error = &mut passed => {
                events.close();
                return end_with_error(run, assembler, wire, error).await;
            }
            event = events.recv() => event,
            () = &mut idle => {
                let quiet_until = last_frame + keepalive;
                if tokio::time::Instant::now() >= quiet_until {
                    wire.send(run, Bytes::from_static(KEEPALIVE_FRAME)).await?;
                    last_frame = tokio::time::Instant::now();
                }
                idle.as_mut().reset(last_frame + keepalive);
                continue;
            }
        };
        let ending = match event {
            Some(EngineEvent::Token {
                text,
                ids,
                logprobs,
                at,
            }) => {
                let arrival = run.token_arrived(&text, &ids, &logprobs, at);
                assembler.tokens_arrived(&ids, &text);
                unsent.extend(logprobs);
                if arrival.cut {
                    assembler.drop_cut_tokens(&mut unsent, run.text());
                }
                if send_text(run, assembler, wire, &arrival.text, &mut unsent).await? {
                    last_frame = tokio::time::Instant::now();
                }
                let Some(ending) = arrival.end else {
                    continue;
                };
                // Closing the engine stream stops the generation now, before the last
                // frames are sent.
                events.close();
                ending
            }
            Some(EngineEvent::Finished { reason, usage }) => {
                run.engine_done();
                let rest = run.release_held_text();
                send_text(run, assembler, wire, &rest, &mut unsent).await?;
                Ending::Finished { reason, usage }
            }
            Some(
                event @ (EngineEvent::Progress { .. }
                | EngineEvent::Reasoning { .. }
                | EngineEvent::ToolCall { .. }),
            ) => {
                if let Some((frame, kind)) = side_frame(run, assembler, event) {
                    wire.send(run, frame).await?;
                    if let Some(kind) = kind {
                        run.frame_sent(kind);
                    }
                    last_frame = tokio::time::Instant::now();
                }
                continue;
            }
            Some(EngineEvent::Failed(error)) => return fail(run, assembler, wire, error).await,
            // Sent only for an answer given in one body; a stream's client has its text.
            Some(EngineEvent::Restarted) => {
                let error = EngineError::Internal("a streamed answer cannot start over".into());
                return fail(run, assembler, wire, error).await;
            }
            None => {
                let error = EngineError::Internal("the engine dropped the request".into());
                return fail(run, assembler, wire, error).await;
            }
        };
        return end_stream(run, assembler, wire, &unsent, ending).await;
    }
}

/// Sends the frames that end an answer (the finish, the usage and timings, `[DONE]`);
/// `unsent`: the tokens no content frame carried. e2e ends when `[DONE]` has been
/// handed over, a moment after the chunk that carried the timings was built.
async fn end_stream(
    run: &mut Run,
    assembler: &ChunkAssembler,
    wire: &Wire,
    unsent: &[TokenLogprob],
    ending: Ending,
) -> Result<Ending, Lost> {
    let (reason, usage) = run.reason_and_usage(&ending);
    let word = run.stop_word().map(str::to_owned);
    let stop = (native::stop_type(&ending, word.as_deref()), word.as_deref());
    let report = run.report(&ending);
    for frame in assembler.finish_frames(reason, usage, &report, unsent, stop) {
        wire.send(run, frame).await?;
    }
    Ok(ending)
}

/// The frame for an event beside the answer's text (the prompt's progress, reasoning, a
/// piece of a tool call) and the kind of output it carries, once the run has taken it;
/// `None` where the answer's shape has no place for it.
fn side_frame(
    run: &mut Run,
    assembler: &mut ChunkAssembler,
    event: EngineEvent,
) -> Option<(Bytes, Option<OutputKind>)> {
    match event {
        EngineEvent::Progress {
            total,
            cached,
            processed,
        } => Some((assembler.progress_frame(total, cached, processed), None)),
        EngineEvent::Reasoning { text, tokens, at } => {
            run.reasoning_arrived(&text, tokens, at);
            let frame = assembler.reasoning_frame(&text)?;
            Some((frame, Some(OutputKind::Reasoning)))
        }
        EngineEvent::ToolCall { delta, tokens, at } => {
            run.tool_call_arrived(&delta, tokens, at);
            let frame = assembler.tool_call_frame(&delta)?;
            Some((frame, Some(OutputKind::ToolCall)))
        }
        _ => None,
    }
}

/// Sends a content frame for `text` with those of the waiting tokens it completes;
/// nothing for no text. Whether a frame went out.
async fn send_text(
    run: &mut Run,
    assembler: &mut ChunkAssembler,
    wire: &Wire,
    text: &str,
    unsent: &mut Vec<TokenLogprob>,
) -> Result<bool, Lost> {
    assembler.count(run.usage_so_far());
    if assembler.wants_timings() {
        if let Some(so_far) = run.llama_timings_so_far() {
            assembler.timed(so_far);
        }
    }
    let Some(frame) = assembler.token_frame(text, unsent) else {
        return Ok(false);
    };
    wire.send(run, frame).await?;
    run.content_sent();
    Ok(true)
}

async fn fail(
    run: &mut Run,
    assembler: &ChunkAssembler,
    wire: &Wire,
    error: EngineError,
) -> Result<Ending, Lost> {
    tracing::error!(error = %error, "The engine failed mid-stream.");
    end_with_error(run, assembler, wire, ApiError::from(error)).await
}

/// Ends a stream that has begun with an error frame (and `[DONE]`).
async fn end_with_error(
    run: &mut Run,
    assembler: &ChunkAssembler,
    wire: &Wire,
    api_error: ApiError,
) -> Result<Ending, Lost> {
    for frame in assembler.error_frames(&api_error) {
        wire.send(run, frame).await?;
    }
    Ok(Ending::Failed {
        kind: api_error.kind(),
    })
}

/// Gathers a whole response for a non-streamed request and serialises it.
pub async fn collect_json(
    mut run: Run,
    meta: &ResponseMeta,
    mut events: TokenStream,
    deadline: Deadline,
    with_logprobs: bool,
    timings_per_token: bool,
) -> Result<Collected, ApiError> {
    let passed = deadline.passed();
    tokio::pin!(passed);
    let mut gathered = Gathered::default();
    let ending = loop {
        let event = tokio::select! {
            event = events.recv() => event,
            error = &mut passed => {
                drop(events);
                return Err(ended_with(run, error));
            }
        };
        match event {
            Some(EngineEvent::Token {
                text,
                ids,
                logprobs,
                at,
            }) => {
                let arrival = run.token_arrived(&text, &ids, &logprobs, at);
                gathered.took(&run, meta, &arrival, (&text, &ids), logprobs, with_logprobs);
                if !arrival.text.is_empty() {
                    run.content_sent();
                }
                if let Some(ending) = arrival.end {
                    drop(events);
                    break ending;
                }
            }
            Some(EngineEvent::Finished { reason, usage }) => {
                run.engine_done();
                if !run.release_held_text().is_empty() {
                    run.content_sent();
                }
                break Ending::Finished { reason, usage };
            }
            // Reasoning and tool calls reach the client in the body's message; each piece
            // counts as handed over when it reaches the gateway.
            Some(EngineEvent::Reasoning { text, tokens, at }) => {
                run.reasoning_arrived(&text, tokens, at);
                run.frame_sent(OutputKind::Reasoning);
            }
            Some(EngineEvent::ToolCall { delta, tokens, at }) => {
                run.tool_call_arrived(&delta, tokens, at);
                run.frame_sent(OutputKind::ToolCall);
            }
            Some(EngineEvent::Failed(error)) => return Err(failed(run, error)),
            Some(EngineEvent::Restarted) => {
                run.restart();
                gathered = Gathered::default();
            }
            // A whole answer has no frames to carry it.
            Some(EngineEvent::Progress { .. }) => {}
            None => {
                return Err(failed(
                    run,
                    EngineError::Internal("the engine dropped the request".into()),
                ))
            }
        }
    };
    let report = run.report(&ending);
    let shape = BodyShape {
        meta,
        with_logprobs,
        timings_per_token,
    };
    let body = gathered.body(&run, &ending, &report, &shape);
    let timings = run.finish(ending);
    let body = body.map(Bytes::from).map_err(|_| ApiError::Internal)?;
    Ok(Collected {
        body,
        timings,
        replica: report.upstream,
    })
}

/// What a whole answer keeps of its tokens as they come: their log-probabilities (when
/// asked for) and, for llama.cpp's shape, their ids, each with where its engine text
/// began (characters): a stop sequence cuts those after it off, as their text.
#[derive(Default)]
struct Gathered {
    tokens: Vec<TokenLogprob>,
    answer_ids: Vec<(u32, usize)>,
    engine_chars: usize,
}

impl Gathered {
    /// Keeps what a token event brought (`text` and `ids`), less what a stop sequence
    /// cut off.
    fn took(
        &mut self,
        run: &Run,
        meta: &ResponseMeta,
        arrival: &Arrival<'_>,
        (text, ids): (&str, &[u32]),
        logprobs: Vec<TokenLogprob>,
        with_logprobs: bool,
    ) {
        let answer = || run.text().chars().count();
        if meta.native.is_some() {
            let at = self.engine_chars;
            self.answer_ids.extend(ids.iter().map(|&id| (id, at)));
            self.engine_chars += text.chars().count();
            if arrival.cut {
                let answer = answer();
                self.answer_ids.retain(|&(_, at)| at < answer);
            }
        }
        if with_logprobs {
            self.tokens.extend(logprobs);
            if arrival.cut {
                let lp = TextLogprobs {
                    tokens: &self.tokens,
                    start: 0,
                };
                let keep = lp.begun_before(answer());
                self.tokens.truncate(keep);
            }
        }
    }

    /// The whole answer's body, in the shape the client asked for.
    fn body(
        &self,
        run: &Run,
        ending: &Ending,
        report: &ResponseTimings,
        shape: &BodyShape<'_>,
    ) -> serde_json::Result<Vec<u8>> {
        let BodyShape {
            meta,
            with_logprobs,
            timings_per_token,
        } = *shape;
        let (reason, usage) = run.reason_and_usage(ending);
        let logprobs = with_logprobs.then_some(self.tokens.as_slice());
        match &meta.native {
            Some(native) => {
                let ids: Vec<u32> = self.answer_ids.iter().map(|&(id, _)| id).collect();
                serde_json::to_vec(&native::body(
                    native,
                    &native::Final {
                        model: &meta.model,
                        content: run.text(),
                        has_new_line: run.text().contains('\n'),
                        ids: &ids,
                        stop_type: native::stop_type(ending, run.stop_word()),
                        stopping_word: run.stop_word(),
                        usage,
                        report,
                        logprobs,
                    },
                ))
            }
            None => {
                let side = SideParts {
                    reasoning: run.reasoning(),
                    tool_calls: run.tool_calls(),
                };
                serde_json::to_vec(
                    &Completion::new(meta, run.text(), reason, usage, report, logprobs)
                        .with_side(side, meta.legacy_functions)
                        .with_llama_timings(timings_per_token, usage),
                )
            }
        }
    }
}

/// How a whole answer is written: its response's identity and shape, and what the
/// client asked to have in it.
struct BodyShape<'a> {
    meta: &'a ResponseMeta,
    with_logprobs: bool,
    timings_per_token: bool,
}

/// A non-streamed response's body, and the request's timings as recorded once it was
/// serialised (for the `Server-Timing` header).
pub struct Collected {
    pub body: Bytes,
    pub timings: Timings,
    /// For an upstream model, the replica that answered.
    pub replica: Option<crate::record::Replica>,
}

fn failed(run: Run, error: EngineError) -> ApiError {
    tracing::error!(error = %error, "The engine failed.");
    ended_with(run, ApiError::from(error))
}

/// Records a non-streamed request as failed with `api_error`, and returns it.
fn ended_with(run: Run, api_error: ApiError) -> ApiError {
    run.finish(Ending::Failed {
        kind: api_error.kind(),
    });
    api_error
}

//! Drives one request's engine events to the client.
//!
//! Streaming: a spawned task writes SSE frames into a bounded channel that the HTTP
//! response body drains. A frame counts as "handed to the transport" when the channel
//! accepts it; that is the moment the timer stamps (TTFT, ITL, e2e). A closed channel
//! means the client left: the task returns, dropping the engine stream (which cancels the
//! generation) and the [`Run`] (which records the request as cancelled).
//!
//! Non-streaming: the same events are gathered into one `chat.completion` body.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::chunks::{ChunkAssembler, Completion, ResponseMeta, KEEPALIVE_FRAME};
use super::{Ending, Run};
use crate::engine::{EngineError, EngineEvent, TokenStream};
use crate::error::ApiError;

/// Streams a response into `tx` until the engine finishes, fails or the client leaves.
pub async fn stream_sse(
    mut run: Run,
    assembler: ChunkAssembler,
    mut events: TokenStream,
    tx: mpsc::Sender<Bytes>,
    keepalive: Duration,
) {
    if tx.send(assembler.role_frame()).await.is_err() {
        return;
    }
    let idle = tokio::time::sleep(keepalive);
    tokio::pin!(idle);
    loop {
        let event = tokio::select! {
            biased;
            () = tx.closed() => return,
            event = events.recv() => event,
            () = &mut idle => {
                if tx.send(Bytes::from_static(KEEPALIVE_FRAME)).await.is_err() {
                    return;
                }
                idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
                continue;
            }
        };
        match event {
            Some(EngineEvent::Token { text }) => {
                run.timer.engine_token(run.clock.now());
                run.tokens_seen += 1;
                if let Some(frame) = assembler.token_frame(&text) {
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                    run.timer.content_sent(run.clock.now());
                }
                idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
            }
            Some(EngineEvent::Finished {
                reason,
                usage,
                prefill,
            }) => {
                let tokens = usage.completion_tokens;
                let timings = run.timer.finish(run.clock.now(), tokens, prefill);
                for frame in assembler.finish_frames(reason, usage, &timings) {
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                }
                // e2e ends when [DONE] has been handed over, a moment after the chunk
                // that carried the timings was built.
                let timings = run.timer.finish(run.clock.now(), tokens, prefill);
                run.finish(Ending::Finished {
                    reason,
                    usage,
                    timings,
                });
                return;
            }
            Some(EngineEvent::Failed(error)) => return fail(run, &tx, error).await,
            None => {
                let error = EngineError::Internal("the engine dropped the request".into());
                return fail(run, &tx, error).await;
            }
        }
    }
}

async fn fail(run: Run, tx: &mpsc::Sender<Bytes>, error: EngineError) {
    tracing::error!(request_id = %run.request_id, error = %error, "The engine failed mid-stream.");
    let api_error = ApiError::from(error);
    for frame in ChunkAssembler::error_frames(&api_error) {
        if tx.send(frame).await.is_err() {
            return;
        }
    }
    let timings = run.timings_now();
    run.finish(Ending::Failed {
        kind: api_error.kind(),
        timings,
    });
}

/// Gathers a whole response for a non-streamed request and serialises it.
pub async fn collect_json(
    mut run: Run,
    meta: &ResponseMeta,
    mut events: TokenStream,
) -> Result<Bytes, ApiError> {
    let mut content = String::new();
    loop {
        match events.recv().await {
            Some(EngineEvent::Token { text }) => {
                let now = run.clock.now();
                run.timer.engine_token(now);
                run.tokens_seen += 1;
                if !text.is_empty() {
                    content.push_str(&text);
                    run.timer.content_sent(now);
                }
            }
            Some(EngineEvent::Finished {
                reason,
                usage,
                prefill,
            }) => {
                let timings = run
                    .timer
                    .finish(run.clock.now(), usage.completion_tokens, prefill);
                let body =
                    serde_json::to_vec(&Completion::new(meta, &content, reason, usage, &timings))
                        .map_err(|_| ApiError::Internal)?;
                run.finish(Ending::Finished {
                    reason,
                    usage,
                    timings,
                });
                return Ok(Bytes::from(body));
            }
            Some(EngineEvent::Failed(error)) => return Err(failed(run, error)),
            None => {
                return Err(failed(
                    run,
                    EngineError::Internal("the engine dropped the request".into()),
                ))
            }
        }
    }
}

fn failed(run: Run, error: EngineError) -> ApiError {
    tracing::error!(request_id = %run.request_id, error = %error, "The engine failed.");
    let api_error = ApiError::from(error);
    let timings = run.timings_now();
    run.finish(Ending::Failed {
        kind: api_error.kind(),
        timings,
    });
    api_error
}

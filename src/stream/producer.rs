//! Drives one request's engine events to the client.
//!
//! Streaming: a spawned task writes SSE frames into a bounded channel that the HTTP
//! response body drains. A frame counts as "handed to the transport" when the channel
//! accepts it; that is the moment the timer stamps (TTFT, ITL, e2e). A closed channel
//! means the client left: the task returns, dropping the engine stream (which cancels the
//! generation) and the [`Run`] (which records the request as cancelled). When the
//! degeneration guard trips, the engine stream is dropped the same way and the answer
//! ends with `finish_reason: "stop"`.
//!
//! Non-streaming: the same events are gathered into one `chat.completion` body.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::chunks::{ChunkAssembler, Completion, ResponseMeta, KEEPALIVE_FRAME};
use super::{Ending, Run};
use crate::engine::{EngineError, EngineEvent, FinishReason, TokenStream};
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
        let ending = match event {
            Some(EngineEvent::Token { text, ids }) => {
                let degenerated = run.token_arrived(&text, &ids);
                if let Some(frame) = assembler.token_frame(&text) {
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                    run.content_sent();
                    idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
                }
                if !degenerated {
                    continue;
                }
                // Closing the engine stream stops the generation now, before the last
                // frames are sent.
                events.close();
                Ending::Degenerated
            }
            Some(EngineEvent::Finished {
                reason,
                usage,
                prefill,
            }) => Ending::Finished {
                reason,
                usage,
                prefill,
            },
            Some(EngineEvent::Failed(error)) => return fail(run, &tx, error).await,
            None => {
                let error = EngineError::Internal("the engine dropped the request".into());
                return fail(run, &tx, error).await;
            }
        };
        let (reason, usage) = match &ending {
            Ending::Finished { reason, usage, .. } => (*reason, *usage),
            _ => (FinishReason::Stop, run.usage_so_far()),
        };
        for frame in assembler.finish_frames(reason, usage, &run.report(&ending)) {
            if tx.send(frame).await.is_err() {
                return;
            }
        }
        // e2e ends when [DONE] has been handed over, a moment after the chunk that
        // carried the timings was built.
        run.finish(ending);
        return;
    }
}

async fn fail(run: Run, tx: &mpsc::Sender<Bytes>, error: EngineError) {
    tracing::error!(error = %error, "The engine failed mid-stream.");
    let api_error = ApiError::from(error);
    for frame in ChunkAssembler::error_frames(&api_error) {
        if tx.send(frame).await.is_err() {
            return;
        }
    }
    run.finish(Ending::Failed {
        kind: api_error.kind(),
    });
}

/// Gathers a whole response for a non-streamed request and serialises it.
pub async fn collect_json(
    mut run: Run,
    meta: &ResponseMeta,
    mut events: TokenStream,
) -> Result<Bytes, ApiError> {
    let ending = loop {
        match events.recv().await {
            Some(EngineEvent::Token { text, ids }) => {
                let degenerated = run.token_arrived(&text, &ids);
                if !text.is_empty() {
                    run.content_sent();
                }
                if degenerated {
                    drop(events);
                    break Ending::Degenerated;
                }
            }
            Some(EngineEvent::Finished {
                reason,
                usage,
                prefill,
            }) => {
                break Ending::Finished {
                    reason,
                    usage,
                    prefill,
                }
            }
            Some(EngineEvent::Failed(error)) => return Err(failed(run, error)),
            None => {
                return Err(failed(
                    run,
                    EngineError::Internal("the engine dropped the request".into()),
                ))
            }
        }
    };
    let (reason, usage) = match &ending {
        Ending::Finished { reason, usage, .. } => (*reason, *usage),
        _ => (FinishReason::Stop, run.usage_so_far()),
    };
    let report = run.report(&ending);
    let body = serde_json::to_vec(&Completion::new(meta, run.text(), reason, usage, &report));
    run.finish(ending);
    body.map(Bytes::from).map_err(|_| ApiError::Internal)
}

fn failed(run: Run, error: EngineError) -> ApiError {
    tracing::error!(error = %error, "The engine failed.");
    let api_error = ApiError::from(error);
    run.finish(Ending::Failed {
        kind: api_error.kind(),
    });
    api_error
}

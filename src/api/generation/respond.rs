//! The answer of a started request, and the wait for the engine to start it.

use std::convert::Infallible;

use actix_web::http::header;
use actix_web::HttpResponse;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Failure, Started, SSE_BUFFER_FRAMES};
use crate::api::AppState;
use crate::engine::{Front, Generation, Prepared};
use crate::error::ApiError;
use crate::stream::chunks::ChunkAssembler;
use crate::stream::producer::{self, Deadline};

/// The answer: one JSON body gathered from the events, or a stream of SSE frames.
pub(super) async fn respond(
    started: Started,
    state: &AppState,
    deadline: Deadline,
) -> Result<HttpResponse, Failure> {
    let Started {
        run,
        meta,
        events,
        stream,
        with_logprobs,
        include_usage,
        continuous_usage,
        timings_per_token,
        prompt_tokens,
    } = started;
    if !stream {
        let collected = producer::collect_json(
            run,
            &meta,
            events,
            deadline,
            with_logprobs,
            timings_per_token,
        )
        .await
        .map_err(Failure::Recorded)?;
        let mut response = HttpResponse::Ok();
        response
            .content_type("application/json")
            .insert_header(server_timing(&collected.timings));
        // The replica that answered, and its own fingerprint: a stream's headers go
        // before the replica is settled, so a stream names it in its last chunk's
        // `timings.upstream` only.
        let replica = collected.replica.unwrap_or(crate::record::Replica {
            endpoint: None,
            system_fingerprint: None,
        });
        for (name, value) in [
            ("x-llmgate-replica", replica.endpoint),
            ("x-llmgate-upstream-fingerprint", replica.system_fingerprint),
        ] {
            if let Some(value) = value.and_then(|v| header::HeaderValue::from_str(&v).ok()) {
                response.insert_header((name, value));
            }
        }
        return Ok(response.body(collected.body));
    }
    let (tx, mut rx) = mpsc::channel::<Bytes>(SSE_BUFFER_FRAMES);
    let assembler = ChunkAssembler::new(meta, include_usage)
        .with_logprobs(with_logprobs)
        .with_continuous_usage(continuous_usage, prompt_tokens)
        .with_timings_per_token(timings_per_token);
    tokio::spawn(
        producer::stream_sse(run, assembler, events, tx, state.pacing, deadline).in_current_span(),
    );
    let body = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|f| f.map(Ok::<_, Infallible>))
    });
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}

/// The W3C `Server-Timing` header of a non-streamed answer (browsers' developer tools
/// show it): the gateway's own share (`overhead`, see `timings.overhead_ms`) and the whole
/// (`total`), both measured once the body is serialised. A stream's headers go before its
/// timings are known: its final chunk carries them.
fn server_timing(timings: &crate::timing::Timings) -> (&'static str, String) {
    (
        "Server-Timing",
        format!(
            "overhead;dur={:.3};desc=\"llmgate\", total;dur={:.3}",
            timings.overhead_ms, timings.e2e_ms
        ),
    )
}

/// Hands the request to the engine and waits for it to start: at most the queue
/// timeout, and not past a draining server's cut-off.
pub(super) async fn start_in_engine(
    state: &AppState,
    engine: &Front,
    request: Prepared,
    cut_off: &CancellationToken,
) -> Result<Generation, ApiError> {
    // An engine with no queue of the gateway's (an upstream) bounds its own wait.
    let limit = if engine.waits_in_queue() {
        state.timeouts.queue
    } else {
        std::time::Duration::MAX
    };
    let started = tokio::select! {
        started = tokio::time::timeout(limit, engine.start(request)) => started,
        () = cut_off.cancelled() => return Err(ApiError::ShuttingDown),
    };
    match started {
        Ok(Ok(generation)) => Ok(generation),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "The engine refused the request.");
            Err(ApiError::from(error))
        }
        Err(_) => {
            tracing::warn!(
                queue_timeout_s = limit.as_secs_f64(),
                "The engine did not start the request within the queue timeout."
            );
            Err(ApiError::QueueTimeout { limit })
        }
    }
}

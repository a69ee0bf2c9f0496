//! llmgate: an OpenAI-compatible LLM serving gateway that measures every token.
//!
//! One request flows through the modules in this order:
//!
//! ```text
//! client --HTTP--> api (actix-web) --parse+validate--> engine::GenerationRequest
//!   ^                                                        |
//!   | SSE frames                                             v
//!   +-- stream::producer <-- stream::chunks <-- engine (mistral.rs) token events
//!            |   every frame stamped by an injected clock::Clock
//!            v
//!      timing::RequestTimer (TTFT, TPOT, ITL, e2e, queue)
//!      quality (repetition rate, refusal, intent, degeneration guard), per token
//!            | once, when the request ends (done, error, cancel): record::RequestRecord
//!            v
//!      telemetry: Prometheus metrics, the request's span (OTLP, tail-sampled),
//!                 record::RequestObserver (request log line)
//!      semlog:    RequestRecord --redact--> RedactedLog --append--> disk spool
//!                 --indexer--> Elasticsearch _bulk, or NDJSON files
//! ```
//!
//! - [`api`]: the handlers (chat and legacy completions, tokenize, models, probes,
//!   metrics), request validation, the request-id middleware, CORS; [`routes`]: the
//!   route table of both listeners, the page's routes with the API's.
//! - [`auth`]: API keys (a file of hashes, re-read on change), the middleware that
//!   checks them on `/v1/*`, and per-key rate limits.
//! - [`engine`]: the [`engine::Front`] every engine sits behind (the budget fitted to the
//!   context, the post-fit checks, grammar, the slot queue) and the narrow
//!   [`engine::Backend`] trait of each engine: llama.cpp, mistral.rs (with its replicas
//!   and process-wide CPU settings), upstream servers and a scripted engine; the seeded
//!   sampler and structured output (grammar masks from the model's vocabulary); what
//!   agents send (`engine::tools`) and tool calls on an engine in this process, in
//!   llama.cpp's generic format held by a grammar, or the format of a template that
//!   renders tools: Hermes, Llama 3, Mistral, DeepSeek R1 (`engine::toolcall`); `<think>`
//!   sections split out as reasoning in process (`engine::reasoning`).
//! - [`stream`]: engine events (content, reasoning, pieces of tool calls) to OpenAI chunks
//!   and SSE frames, with timing and cancellation.
//! - [`timing`] and [`clock`]: the latency definitions (each kind of output apart:
//!   `timing::kinds`) and the time source.
//! - [`tokens`]: what every layer says about generated text (tokens, log-probabilities,
//!   finish reasons, usage); a leaf.
//! - [`quality`]: per-answer signals computed while it streams: seq-rep-n repetition
//!   rate, the degeneration guard, refusal phrases, intent rules.
//! - [`admission`]: the in-flight limit behind 429s.
//! - [`lifecycle`]: the drain on SIGTERM (not ready, refuse new work, let running
//!   requests finish, then end the rest).
//! - [`error`]: every client-visible error and its one HTTP table.
//! - [`config`]: flags, environment and TOML file, each setting declared once, validated
//!   at start-up.
//! - [`record`]: the per-request record and its observers.
//! - [`telemetry`]: `/metrics`, OpenTelemetry traces with tail sampling, log set-up.
//! - [`semlog`]: the semantic log: one redacted ECS document per request, bulk-indexed
//!   into Elasticsearch (or written to NDJSON files), with a disk spool and dead letters.
//! - [`bench`]: `llmgate bench`, the load generator, with an engine-direct mode.
//! - [`compare`]: `llmgate compare`, two gateways (or two fingerprints of the semantic
//!   log) on one prompt set: agreement and the deltas of latency and quality.
//! - [`replay`]: re-sends logged requests and checks the answers are reproduced.
//! - [`shadow`]: a share of a model's live requests also sent to a candidate model, the
//!   two answers compared request by request, with a verdict per figure.
//! - [`fingerprint`]: the `system_fingerprint` of a response; [`gpu`]: the GPUs through
//!   NVML (`gpu-metrics` builds).
//! - [`names`]: every metric, label, span attribute and document field name exported, in
//!   one place (a leaf: records, engines and the semantic log name things the same way).
//! - [`secret`]: secrets (keys, passwords) read from files, never printed.
//!
//! [`serve`] builds the HTTP server on a listener the caller binds, so tests bind
//! `127.0.0.1:0` and drive the real server.

pub mod admission;
pub mod api;
pub mod auth;
pub mod bench;
pub mod clock;
pub mod compare;
pub mod config;
pub mod engine;
pub mod error;
pub mod fingerprint;
pub mod gpu;
pub mod lifecycle;
pub mod names;
pub mod page;
pub mod quality;
pub mod record;
pub mod redact;
pub mod replay;
pub mod routes;
pub mod secret;
pub mod semlog;
pub mod shadow;
pub mod state;
pub mod stream;
pub mod telemetry;
pub mod timing;
pub mod tokens;

use std::net::TcpListener;

use actix_web::dev::Server;
use actix_web::{middleware, web, App, HttpServer};

pub use api::AppState;

/// Builds the HTTP server on `listener`. Await the returned server to run it; its handle
/// stops it gracefully. `workers == 0` means one worker per CPU core.
pub fn serve(
    state: web::Data<AppState>,
    listener: TcpListener,
    workers: usize,
) -> std::io::Result<Server> {
    serve_on(state, vec![listener], workers)
}

/// [`serve`] on several listeners at once (`server.listen` with several addresses): the
/// same app, workers and limits on each.
pub fn serve_on(
    state: web::Data<AppState>,
    listeners: Vec<TcpListener>,
    workers: usize,
) -> std::io::Result<Server> {
    let send_buffer = state.send_buffer_bytes;
    let mut server = HttpServer::new(move || {
        let metrics = state.metrics_on_api;
        App::new()
            .app_data(state.clone())
            // Outermost last: every answer, a 401 included, carries its request id, and
            // CORS answers preflights before any key is asked for.
            .wrap(middleware::from_fn(auth::authenticate))
            .wrap(middleware::from_fn(api::request_id))
            .wrap(middleware::Condition::new(
                !state.cors_origins.is_empty(),
                api::cors(&state.cors_origins),
            ))
            .configure(|cfg| routes::configure(cfg, metrics))
    })
    // A client that closes its side of the connection has left: actix then drops the
    // handler, which cancels the generation (the default keeps generating for nobody).
    .h1_allow_half_closed(false)
    // Each SSE frame is a small write: with Nagle's algorithm on (actix keeps the OS
    // default), a frame waits for the client's delayed ACK of the one before, up to
    // 40 ms, and token times bunch up on the client's side.
    .tcp_nodelay(true)
    // A client that stops reading must fill a buffer the write timeout can watch: left
    // to autotuning, the kernel holds megabytes and a whole answer vanishes into it.
    .on_connect(move |conn, _| {
        if send_buffer == 0 {
            return;
        }
        if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
            if let Err(error) = socket2::SockRef::from(tcp).set_send_buffer_size(send_buffer) {
                tracing::debug!(%error, "Could not bound the connection's send buffer.");
            }
        }
    })
    // The caller owns SIGTERM and SIGINT and drains first ([`lifecycle`]); by the time
    // it stops the server, nothing is left to wait for.
    .disable_signals()
    .shutdown_timeout(5);
    for listener in listeners {
        server = server.listen(listener)?;
    }
    if workers > 0 {
        server = server.workers(workers);
    }
    Ok(server.run())
}

/// Builds the metrics listener (`server.metrics_listen`): `/metrics` and `/health` only,
/// one worker; `/metrics` needs a key there too with `--metrics-auth`.
pub fn serve_metrics(state: web::Data<AppState>, listener: TcpListener) -> std::io::Result<Server> {
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(middleware::from_fn(auth::authenticate))
            .configure(routes::configure_metrics)
    })
    .disable_signals()
    .shutdown_timeout(1)
    .workers(1)
    .listen(listener)?
    .run())
}

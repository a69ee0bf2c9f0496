//! A scripted OpenAI-compatible server: the zero-model-time upstream of the proxy
//! benchmark (`llmgate scripted-upstream`) and the faulty one of the upstream tests.
//!
//! It streams `tokens` one-token chunks at `interval` (chat or legacy shape, with
//! log-probabilities when asked, a usage chunk and `[DONE]`), answers `GET /v1/models`,
//! and keeps every request it was sent (headers and body) for tests to check what the
//! gateway forwarded. A request whose last message (or prompt) is `fault:<name>` gets
//! that fault instead (see [`ScriptedFault`]), so one server plays every failure.
//!
//! - [`agent`]: reasoning chunks and tool calls, as vLLM serving an agentic model sends
//!   them, so tests can drive an agent loop through the gateway.

mod agent;

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::stream::chunks::Shape;

/// How the scripted upstream answers.
#[derive(Debug, Clone)]
pub struct UpstreamScript {
    /// The `model` its chunks name.
    pub model: String,
    /// Content chunks per answer (one token each), unless `max_tokens` is fewer.
    pub tokens: u32,
    /// Between two chunks (zero: as fast as the socket takes them).
    pub interval: Duration,
    /// Before the first chunk (a prefill's time).
    pub first_delay: Duration,
    /// Keep every request received (tests); off for long benchmark runs.
    pub record: bool,
    /// Send every chunk whatever `max_tokens` says (a hostile upstream, for tests).
    pub ignore_max_tokens: bool,
    /// A fault this replica answers with, whatever the prompt, on `fault_rate` of its
    /// requests (a failing replica of a fleet).
    pub fault: Option<ScriptedFault>,
    /// The share of requests that get `fault`, spread evenly (0.2: the 5th, 10th, ...).
    pub fault_rate: f64,
    /// Answers streamed at once, as an engine's batch (0: no limit); the others wait in
    /// its queue, which `GET /metrics` reports as vLLM does.
    pub slots: usize,
    /// The words its tokens say, in turn (`["la"]`: a looping answer); empty: `tok0
    /// tok1 ...`.
    pub words: Vec<String>,
    /// Reasoning chunks (one token each) before a chat answer's content or calls, as a
    /// reasoning model thinks first.
    pub reasoning: u32,
    /// The delta key of those chunks: vLLM's `reasoning_content`, or `reasoning` as
    /// newer vLLM names it, for clients written against either.
    pub reasoning_field: String,
    /// Call every offered tool not yet called at once, rather than one a turn, unless
    /// the request sets `parallel_tool_calls: false`.
    pub parallel_calls: bool,
}

impl Default for UpstreamScript {
    fn default() -> Self {
        Self {
            model: "scripted".into(),
            tokens: 8,
            interval: Duration::ZERO,
            first_delay: Duration::ZERO,
            record: true,
            ignore_max_tokens: false,
            fault: None,
            fault_rate: 1.0,
            slots: 0,
            words: Vec::new(),
            reasoning: 0,
            reasoning_field: "reasoning_content".into(),
            parallel_calls: false,
        }
    }
}

/// A request the scripted upstream received.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What tests ask the scripted upstream to do instead of answering, by sending
/// `fault:<name>` as the last message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptedFault {
    /// 401 with a message that echoes a key.
    Unauthorized,
    /// 429 with `Retry-After: 7`.
    RateLimited,
    /// 500.
    ServerError,
    /// 400 naming `top_k`.
    BadRequest,
    /// Headers only after 30 s.
    NoFirstByte,
    /// Two chunks, then silence.
    Idle,
    /// Two chunks, then the body ends (no finish, no `[DONE]`).
    Cut,
    /// A data line that is not JSON.
    BadJson,
    /// Bytes that are not UTF-8.
    BadSse,
    /// Chunks that name another model.
    OtherModel,
    /// No usage chunk.
    NoUsage,
    /// An error object mid-stream.
    ErrorEvent,
    /// vLLM's refusal of a request it only checks once the stream is open: a 200 stream
    /// whose first event is an error object with code 400 naming `stop_token_ids`.
    RefusedInStream,
    /// A JSON body instead of an event stream.
    NotAStream,
    /// 400 when log-probabilities are asked for, else a normal answer.
    NoLogprobs,
    /// The stream's headers, then nothing at all.
    Silent,
    /// Keep-alive comments every 100 ms, never a chunk.
    Pings,
    /// A 300 KiB line without an end.
    HugeLine,
    /// Headers only after 1.5 s, then a normal answer.
    LateHeaders,
}

impl ScriptedFault {
    /// The fault of `fault:<name>` (`500`, `429`, `cut`, ...).
    pub fn named(name: &str) -> Option<Self> {
        Some(match name {
            "401" => ScriptedFault::Unauthorized,
            "429" => ScriptedFault::RateLimited,
            "500" => ScriptedFault::ServerError,
            "400" => ScriptedFault::BadRequest,
            "no-first-byte" => ScriptedFault::NoFirstByte,
            "idle" => ScriptedFault::Idle,
            "cut" => ScriptedFault::Cut,
            "bad-json" => ScriptedFault::BadJson,
            "bad-sse" => ScriptedFault::BadSse,
            "other-model" => ScriptedFault::OtherModel,
            "no-usage" => ScriptedFault::NoUsage,
            "error-event" => ScriptedFault::ErrorEvent,
            "refused-in-stream" => ScriptedFault::RefusedInStream,
            "not-a-stream" => ScriptedFault::NotAStream,
            "no-logprobs" => ScriptedFault::NoLogprobs,
            "silent" => ScriptedFault::Silent,
            "pings" => ScriptedFault::Pings,
            "huge-line" => ScriptedFault::HugeLine,
            "late-headers" => ScriptedFault::LateHeaders,
            _ => return None,
        })
    }
}

struct State {
    script: UpstreamScript,
    received: Arc<Mutex<Vec<Received>>>,
    abandoned: Arc<AtomicUsize>,
    /// Requests answered so far, for the even spread of `fault_rate`.
    answered: AtomicUsize,
    /// Tool calls made so far, for their ids (`call_<n>`), unique in the server's life.
    calls: AtomicUsize,
    batch: Batch,
}

/// The engine's batch: the answers streaming and those waiting for a place in it.
#[derive(Clone, Default)]
struct Batch {
    /// Its places, when `slots` limits it.
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Answers waiting for a place, and streaming in one.
    waiting: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
}

impl Batch {
    /// A place in the batch, once one is free: counted as running while it is held.
    async fn enter(self) -> Running {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let slot = match &self.slots {
            Some(slots) => Arc::clone(slots).acquire_owned().await.ok(),
            None => None,
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        self.running.fetch_add(1, Ordering::SeqCst);
        Running {
            count: self.running,
            _slot: slot,
        }
    }
}

impl State {
    /// The replica's own fault for its next request, on `fault_rate` of them.
    fn own_fault(&self) -> Option<ScriptedFault> {
        let fault = self.script.fault?;
        let n = self.answered.fetch_add(1, Ordering::SeqCst) as f64;
        let rate = self.script.fault_rate.clamp(0.0, 1.0);
        (((n + 1.0) * rate).floor() > (n * rate).floor()).then_some(fault)
    }
}

/// A running scripted upstream.
pub struct ScriptedUpstream {
    pub server: Server,
    /// Every request it got, in order.
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Answers whose reader went away before the end (the gateway dropped them).
    pub abandoned: Arc<AtomicUsize>,
}

/// Serves `script` on `listener` with `workers` threads (0: one per core). Await
/// `server` to run it.
pub fn serve(
    listener: TcpListener,
    script: UpstreamScript,
    workers: usize,
) -> std::io::Result<ScriptedUpstream> {
    let received = Arc::new(Mutex::new(Vec::new()));
    let abandoned = Arc::new(AtomicUsize::new(0));
    let slots = (script.slots > 0).then(|| Arc::new(tokio::sync::Semaphore::new(script.slots)));
    let state = web::Data::new(State {
        script,
        received: Arc::clone(&received),
        abandoned: Arc::clone(&abandoned),
        answered: AtomicUsize::new(0),
        calls: AtomicUsize::new(0),
        batch: Batch {
            slots,
            ..Batch::default()
        },
    });
    let mut server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(state.clone())
            .app_data(web::JsonConfig::default().limit(8 << 20))
            .route("/v1/models", web::get().to(models))
            .route("/metrics", web::get().to(metrics))
            .route("/v1/chat/completions", web::post().to(chat))
            .route("/v1/completions", web::post().to(completions))
    })
    .disable_signals()
    .tcp_nodelay(true)
    .shutdown_timeout(1)
    .listen(listener)?;
    if workers > 0 {
        server = server.workers(workers);
    }
    Ok(ScriptedUpstream {
        server: server.run(),
        received,
        abandoned,
    })
}

async fn models(state: web::Data<State>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [{"id": state.script.model, "object": "model", "owned_by": "scripted"}],
    }))
}

/// Its queue and batch under vLLM's names, for the `engine_metrics` policy.
async fn metrics(state: web::Data<State>) -> HttpResponse {
    let gauge = |name: &str, value: usize| {
        format!(
            "# TYPE vllm:{name} gauge\nvllm:{name}{{model_name=\"{}\"}} {value}\n",
            state.script.model
        )
    };
    let batch = &state.batch;
    let text = gauge("num_requests_waiting", batch.waiting.load(Ordering::SeqCst))
        + &gauge("num_requests_running", batch.running.load(Ordering::SeqCst));
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(text)
}

async fn chat(req: HttpRequest, body: web::Json<Value>, state: web::Data<State>) -> HttpResponse {
    answer(req, body.into_inner(), state, Shape::Chat).await
}

async fn completions(
    req: HttpRequest,
    body: web::Json<Value>,
    state: web::Data<State>,
) -> HttpResponse {
    answer(req, body.into_inner(), state, Shape::Text).await
}

/// The text the answer is about: the last message, or the prompt.
fn prompt_of(body: &Value) -> &str {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .or_else(|| body["prompt"].as_str())
        .unwrap_or_default()
}

/// Answers one request: a fault instead of an answer where the prompt or the script
/// says so, else the answer streamed once the batch has a place for it.
async fn answer(
    req: HttpRequest,
    body: Value,
    state: web::Data<State>,
    shape: Shape,
) -> HttpResponse {
    state.keep(&req, &body);
    let fault = prompt_of(&body)
        .strip_prefix("fault:")
        .and_then(|name| ScriptedFault::named(name.trim()))
        .or_else(|| state.own_fault());
    let logprobs = match shape {
        Shape::Chat => body["logprobs"].as_bool().unwrap_or(false),
        Shape::Text => body["logprobs"].as_u64().is_some(),
    };
    if let Some(refusal) = fault.and_then(|fault| refusal(fault, logprobs)) {
        return refusal;
    }
    match fault {
        Some(ScriptedFault::NoFirstByte) => tokio::time::sleep(Duration::from_secs(30)).await,
        Some(ScriptedFault::LateHeaders) => tokio::time::sleep(Duration::from_millis(1500)).await,
        _ => {}
    }
    let script = &state.script;
    let max_tokens = body["max_tokens"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(u32::MAX);
    let streamed = Streamed {
        shape,
        model: if fault == Some(ScriptedFault::OtherModel) {
            "someone-else".to_owned()
        } else {
            script.model.clone()
        },
        tokens: if script.ignore_max_tokens {
            script.tokens
        } else {
            script.tokens.min(max_tokens)
        },
        logprobs,
        fault,
        calls: state.tool_calls(&body, shape, fault),
        script: script.clone(),
        abandoned: Arc::clone(&state.abandoned),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let batch = state.batch.clone();
    tokio::spawn(async move {
        // A place in the batch first: the queue's wait is part of the TTFT.
        let _running = batch.enter().await;
        streamed.send(&tx).await;
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(body)
}

impl State {
    /// Keeps the request (its path, headers and body), when the script records them.
    fn keep(&self, req: &HttpRequest, body: &Value) {
        if !self.script.record {
            return;
        }
        let headers = req
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        if let Ok(mut received) = self.received.lock() {
            received.push(Received {
                path: req.path().to_owned(),
                headers,
                body: body.clone(),
            });
        }
    }
}

/// The answer a fault gives instead of a stream, if it is one of those.
fn refusal(fault: ScriptedFault, logprobs: bool) -> Option<HttpResponse> {
    let error = |status: u16, message: &str, param: Value| {
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap_or_default())
            .json(json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": null}}))
    };
    Some(match fault {
        ScriptedFault::Unauthorized => error(
            401,
            "Incorrect API key provided: sk-upstream-secret",
            Value::Null,
        ),
        ScriptedFault::RateLimited => HttpResponse::TooManyRequests()
            .insert_header(("retry-after", "7"))
            .json(json!({"error": {"message": "Rate limit reached", "type": "requests"}})),
        ScriptedFault::ServerError => error(500, "internal: stack trace at 0xdead", Value::Null),
        ScriptedFault::BadRequest => error(400, "top_k must be a positive integer", json!("top_k")),
        ScriptedFault::NoLogprobs if logprobs => error(
            400,
            "logprobs is not supported by this server",
            json!("logprobs"),
        ),
        ScriptedFault::NotAStream => {
            HttpResponse::Ok().json(json!({"choices": [{"message": {"content": "hi"}}]}))
        }
        _ => return None,
    })
}

/// Where an answer's chunks go: the SSE body's channel.
type Tx = tokio::sync::mpsc::Sender<Bytes>;

/// The answer's pace between chunks (none: as fast as the socket takes them).
type Pace = Option<tokio::time::Interval>;

/// One streamed answer, as the script and the request make it.
struct Streamed {
    shape: Shape,
    /// The model its chunks name.
    model: String,
    /// Content chunks to send: the script's, within the request's `max_tokens` (unless
    /// the script ignores it).
    tokens: u32,
    logprobs: bool,
    fault: Option<ScriptedFault>,
    /// The tool calls it makes instead of content (empty: content).
    calls: Vec<agent::ToolCall>,
    script: UpstreamScript,
    /// Counted when the reader goes away before the end.
    abandoned: Arc<AtomicUsize>,
}

impl Streamed {
    /// Sends the answer's chunks to `tx`, as its fault allows.
    async fn send(self, tx: &Tx) {
        if self.without_content(tx).await {
            return;
        }
        if !self.script.first_delay.is_zero() {
            tokio::time::sleep(self.script.first_delay).await;
        }
        // One pace for the whole answer: reasoning, then content or calls.
        let mut pace = agent::pace(self.script.interval);
        if !self.reasoning(tx, &mut pace).await {
            return;
        }
        if !self.calls.is_empty() {
            if self.tool_calls(tx, &mut pace).await {
                self.close(tx).await;
            }
        } else if self.content(tx, &mut pace).await {
            self.ending(tx).await;
        }
    }

    /// The faults whose stream has no content at all; whether this is one.
    async fn without_content(&self, tx: &Tx) -> bool {
        match self.fault {
            Some(ScriptedFault::Silent) => tokio::time::sleep(Duration::from_secs(3600)).await,
            Some(ScriptedFault::Pings) => {
                while tx.send(Bytes::from_static(b": ping\n\n")).await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Some(ScriptedFault::HugeLine) => {
                let _ = tx.send(Bytes::from(vec![b'x'; 300 << 10])).await;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Some(ScriptedFault::RefusedInStream) => {
                let refusal = json!({"error": {"message": "Token id 999999 is out of vocabulary",
                    "type": "BadRequestError", "param": "stop_token_ids", "code": 400}});
                let _ = tx.send(frame(refusal)).await;
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            }
            _ => return false,
        }
        true
    }

    /// The content chunks, at the script's pace, broken where the fault breaks them;
    /// whether the answer goes on to its end.
    async fn content(&self, tx: &Tx, pace: &mut Pace) -> bool {
        for i in 0..self.tokens {
            agent::tick(pace).await;
            let broken = match self.fault {
                Some(ScriptedFault::BadJson) if i == 1 => {
                    Some(Bytes::from_static(b"data: {not json\n\n"))
                }
                Some(ScriptedFault::BadSse) if i == 1 => {
                    Some(Bytes::from_static(b"data: \xff\xfe\n\n"))
                }
                Some(ScriptedFault::ErrorEvent) if i == 1 => Some(frame(
                    json!({"error": {"message": "CUDA error: out of memory", "code": 500}}),
                )),
                _ => None,
            };
            if let Some(bytes) = broken {
                let _ = tx.send(bytes).await;
                return false;
            }
            if i == 2 && matches!(self.fault, Some(ScriptedFault::Cut)) {
                return false;
            }
            if i == 2 && matches!(self.fault, Some(ScriptedFault::Idle)) {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return false;
            }
            let word = match self.script.words.len() {
                0 => format!("tok{i}"),
                n => self.script.words[i as usize % n].clone(),
            };
            let text = if i == 0 { word } else { format!(" {word}") };
            let chunk = content(self.shape, &self.model, &text, self.logprobs, None);
            if !self.sent(tx, frame(chunk)).await {
                return false;
            }
        }
        true
    }

    /// The content's finish, then [`Self::close`].
    async fn ending(&self, tx: &Tx) {
        let reason = if self.tokens < self.script.tokens {
            "length"
        } else {
            "stop"
        };
        let finish = content(self.shape, &self.model, "", false, Some(reason));
        let _ = tx.send(frame(finish)).await;
        self.close(tx).await;
    }

    /// The usage (unless the fault leaves it out) and `[DONE]`.
    async fn close(&self, tx: &Tx) {
        if self.fault != Some(ScriptedFault::NoUsage) {
            let _ = tx.send(frame(self.usage())).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }
}

/// One SSE event of `value`.
fn frame(value: Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Counts an answer as running, and holds its slot, while it lives.
struct Running {
    count: Arc<AtomicUsize>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `object` its streamed chunks of `shape` carry.
fn object(shape: Shape) -> &'static str {
    match shape {
        Shape::Chat => "chat.completion.chunk",
        Shape::Text => "text_completion",
    }
}

/// One chunk: `text` (with its log-probability, -0.5, when asked), or the finish.
fn content(shape: Shape, model: &str, text: &str, logprobs: bool, finish: Option<&str>) -> Value {
    let choice = match shape {
        Shape::Chat => json!({
            "index": 0,
            "delta": if finish.is_some() { json!({}) } else { json!({"content": text}) },
            "logprobs": logprobs.then(|| json!({"content": [{
                "token": text, "logprob": -0.5, "bytes": text.as_bytes(), "top_logprobs": []
            }]})),
            "finish_reason": finish,
        }),
        Shape::Text => json!({
            "index": 0,
            "text": text,
            "logprobs": logprobs.then(|| json!({
                "tokens": [text], "token_logprobs": [-0.5], "top_logprobs": [{text: -0.5}], "text_offset": [0]
            })),
            "finish_reason": finish,
        }),
    };
    envelope(shape, model, choice)
}

/// A streamed chunk of `shape` whose one choice is `choice`.
fn envelope(shape: Shape, model: &str, choice: Value) -> Value {
    json!({
        "id": "scripted-1",
        "object": object(shape),
        "created": 0,
        "model": model,
        "system_fingerprint": "fp_scripted",
        "choices": [choice],
    })
}

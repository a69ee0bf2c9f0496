//! One request's attempts at a model's endpoints, from the first send to the end of
//! the answer, in a task of its own.
//!
//! Each attempt goes where the fleet picks ([`super::fleet`]). An attempt that fails
//! before anything of the answer reached the gateway's stream — no connection, a
//! reset, a 5xx, a 429, no first byte in time, an error frame before any content — is
//! tried again at another endpoint, up to `max_attempts` and never past the request's
//! deadline. Once content is on its way to the client, a failure is the stream's
//! error frame, never a second answer; a request answered in one body (`stream: false`)
//! has had nothing yet, so its answer starts over at another endpoint
//! ([`EngineEvent::Restarted`]) as if it had not begun. A refusal of the request itself
//! (a 4xx about it) is asked of one other endpoint first: if that one answers, the
//! refusal was the replica's (a smaller context than its peers') and counts as its
//! failure; if not, the client gets the first refusal.
//!
//! The gateway's status line waits for the first attempt's opening, at most
//! [`super::opening::OPENING_WINDOW`]: a refusal within it is the HTTP error it stands for; after it
//! the client has its 200 and keep-alive comments while the attempts go on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use tokio::sync::mpsc;

use super::fault::{self, Fault};
use super::fleet::{AttemptHealth, Endpoint, Fleet, Routing};
use super::opening::Opening;
use super::stream::{self, Answered, AttemptEnd, OnAnswered, Patience, Reading, Terms};
use super::tokens::TokenReader;
use super::wire::{self, Asks};
use super::Shared;
use crate::engine::{Attempt, Counted, EngineError, EngineEvent, GenerationRequest, Reported};

/// Most bytes of an error answer read (its message is all the gateway needs).
const ERROR_BODY_BYTES: usize = 16 << 10;

/// Everything one request's attempts need; moved into their task.
pub(crate) struct RequestAttempts {
    pub shared: Arc<Shared>,
    pub request: GenerationRequest,
    pub prompt_tokens: u32,
    pub reported: Arc<Reported>,
    pub tx: mpsc::Sender<EngineEvent>,
    pub opening: Opening,
}

/// Whether another endpoint may succeed where this one failed, before any content: any
/// fault of the replica's own (one pod with a wrong key, of another model version in a
/// rollout, behind a proxy that answers HTML), not the request's (a 400 about it).
fn worth_another(fault: &Fault) -> bool {
    match fault {
        Fault::Unreachable(_)
        | Fault::RateLimited { .. }
        | Fault::Timeout { .. }
        | Fault::Cut(_)
        | Fault::Stream(_)
        | Fault::Auth { .. }
        | Fault::Protocol(_)
        | Fault::ModelMismatch { .. } => true,
        Fault::Failed { status, .. } => *status >= 500,
        Fault::Refused { .. } => false,
    }
}

/// A refusal of the request (a 4xx about it), which a replica may also give alone (a
/// smaller `max_model_len` than its peers', a model it has not loaded): one other
/// endpoint is asked before the client gets it ([`RequestAttempts::try_endpoints`]).
fn is_refusal(fault: &Fault) -> bool {
    match fault {
        Fault::Refused { .. } => true,
        Fault::Failed { status, .. } => (400..500).contains(status),
        _ => false,
    }
}

/// Runs the request's attempts until one answers, or none is left to try; then the
/// last failure is the request's.
pub(crate) async fn run(mut job: RequestAttempts) {
    let Err(fault) = job.try_endpoints().await else {
        return;
    };
    let fault = gateways_own(fault, &job.request);
    if let Some(fault) = job.opening.failed(fault) {
        tracing::warn!(error = %fault, error_type = fault.kind().as_str(), "The upstream's stream failed.");
        let _ = job
            .tx
            .send(EngineEvent::Failed(EngineError::Upstream(fault)))
            .await;
    }
}

/// How one attempt ended, for the next step.
enum Attempted {
    /// The answer reached its end.
    Answered,
    /// The request is over without an answer to try again: the client left, or the
    /// answer failed after content was handed on (the stream's error frame ends it).
    Over,
    /// It failed before anything was handed on.
    Failed(Fault),
}

/// The endpoints a request has been tried at, and what the last attempt left.
#[derive(Default)]
struct Tried {
    /// Each endpoint tried, once, in the order first tried.
    endpoints: Vec<Arc<Endpoint>>,
    /// The one endpoint was tried once more after it could not be connected to.
    retried_connect: bool,
    /// The last attempt's fault, once one failed.
    last: Option<Fault>,
}

impl Tried {
    /// Where the next attempt goes: where the fleet picks, or, with one endpoint that
    /// could not be connected to, once more there after a moment, as a single upstream
    /// always was. None when nowhere is left.
    async fn next(&mut self, fleet: &Fleet, routing: &Routing) -> Option<Arc<Endpoint>> {
        let endpoint = match fleet.pick(routing, &self.endpoints, Instant::now()) {
            Some(endpoint) => endpoint,
            None if !self.retried_connect
                && self.endpoints.len() == 1
                && self.last.as_ref().is_some_and(Fault::is_connect) =>
            {
                self.retried_connect = true;
                tokio::time::sleep(Duration::from_millis(100)).await;
                Arc::clone(&self.endpoints[0])
            }
            None => return None,
        };
        if !self.endpoints.iter().any(|t| Arc::ptr_eq(t, &endpoint)) {
            self.endpoints.push(Arc::clone(&endpoint));
        }
        Some(endpoint)
    }

    /// The fault the request ends with when no attempt is left.
    fn last_fault(self) -> Fault {
        self.last
            .unwrap_or_else(|| Fault::Unreachable("no endpoint could be tried".into()))
    }
}

impl RequestAttempts {
    /// Attempts at the fleet's endpoints until one answers (or the client leaves): the
    /// fault the request ends with when none does.
    async fn try_endpoints(&mut self) -> Result<(), Fault> {
        let fleet = Arc::clone(&self.shared.fleet);
        let request = &self.request;
        let routing = Routing::of(
            &request.prompt,
            request.budget.tokens(),
            fleet.config.prefix_chars,
        );
        let mut tried = Tried::default();
        // The first refusal, while a second opinion is asked.
        let mut refused: Option<(Arc<Endpoint>, Fault)> = None;
        loop {
            let Some(endpoint) = tried.next(&fleet, &routing).await else {
                return Err(refused.map_or_else(|| tried.last_fault(), |(_, fault)| fault));
            };
            let Some(first_byte) = self.first_byte_wait() else {
                return Err(refused.map_or_else(|| tried.last_fault(), |(_, fault)| fault));
            };
            let fault = match self.attempt(&endpoint, first_byte, refused.clone()).await {
                Attempted::Answered | Attempted::Over => return Ok(()),
                Attempted::Failed(fault) => fault,
            };
            let attempts = attempts_made(&self.reported);
            if let Some((_, refusal)) = &refused {
                // Refused again: the request's own fault, the client gets the refusal. A
                // replica failing on its own (down, 5xx, silent) gives no opinion: the
                // next is asked, within max_attempts.
                if is_refusal(&fault)
                    || !worth_another(&fault)
                    || attempts >= fleet.config.max_attempts as usize
                {
                    return Err(refusal.clone());
                }
                tried.last = Some(fault);
                continue;
            }
            if attempts >= fleet.config.max_attempts as usize {
                return Err(fault);
            }
            if is_refusal(&fault) && fleet.endpoints().len() > 1 {
                refused = Some((Arc::clone(&endpoint), fault));
                continue;
            }
            if !worth_another(&fault) {
                return Err(fault);
            }
            tracing::info!(endpoint = %endpoint.label, error = %fault, error_type = fault.kind().as_str(), "An upstream endpoint failed before the answer began.");
            tried.last = Some(fault);
        }
    }

    /// How long the next attempt may wait for its first byte: no attempt past the
    /// request's deadline (None), one before it waits at most until then.
    fn first_byte_wait(&self) -> Option<Duration> {
        let first_byte = self.shared.config.first_byte_timeout;
        match self.request.deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                (!left.is_zero()).then(|| left.min(first_byte))
            }
            None => Some(first_byte),
        }
    }

    /// One attempt at `endpoint`, recorded on the route and settled at the fleet; when
    /// it answers, `blame` (an endpoint that refused what it answers) is held to fail.
    async fn attempt(
        &mut self,
        endpoint: &Arc<Endpoint>,
        first_byte: Duration,
        blame: Option<(Arc<Endpoint>, Fault)>,
    ) -> Attempted {
        let attempt = attempts_made(&self.reported);
        if attempt > 0 {
            tracing::info!(endpoint = %endpoint.label, attempt = attempt + 1, "Trying the request at another upstream endpoint.");
        }
        record_attempt(&self.reported, &endpoint.label);
        // A client that leaves while the attempt waits for the answer's head ends it
        // (dropping the call tells the upstream), and with it any further attempt.
        let tx = self.tx.clone();
        let ended = tokio::select! {
            ended = self.attempt_at(endpoint, first_byte, blame) => ended,
            () = tx.closed() => AttemptEnd::Left,
        };
        let fleet = &self.shared.fleet;
        let fault = match ended {
            // Settled at the endpoint by `settle`, before the client had its end.
            AttemptEnd::Answered => return Attempted::Answered,
            AttemptEnd::Left => return Attempted::Over,
            AttemptEnd::FailedMidway(fault) => {
                failed_attempt(&self.reported, &fault);
                fleet.attempted(
                    endpoint,
                    AttemptHealth::of(&fault),
                    Some(&fault),
                    Instant::now(),
                );
                return Attempted::Over;
            }
            AttemptEnd::Unsent(fault) => fault,
            AttemptEnd::FailedUnseen(fault) => {
                // The client has none of it: what came goes, and the request fails over
                // like one that has not begun.
                if self.tx.send(EngineEvent::Restarted).await.is_err() {
                    return Attempted::Over;
                }
                fault
            }
        };
        failed_attempt(&self.reported, &fault);
        // Waiting only as long as the request's deadline left is no fault of the
        // replica's: a timeout then is the request's own.
        let own_timeout = first_byte < self.shared.config.first_byte_timeout;
        let outcome = match &fault {
            Fault::Timeout { .. } if own_timeout => AttemptHealth::Neutral,
            fault => AttemptHealth::of(fault),
        };
        fleet.attempted(endpoint, outcome, Some(&fault), Instant::now());
        // A first byte that never came is the latency policy's worst measurement (a
        // 408, which says nothing of the wait, is none).
        if let Fault::Timeout { waited, .. } = &fault {
            if !waited.is_zero() && !own_timeout {
                endpoint.measured(Some(waited.as_secs_f64() * 1000.0), None);
            }
        }
        Attempted::Failed(fault)
    }

    /// One attempt at `endpoint`: sent, its answer checked and read to its end. The
    /// endpoint counts it in flight until then.
    async fn attempt_at(
        &mut self,
        endpoint: &Arc<Endpoint>,
        first_byte: Duration,
        blame: Option<(Arc<Endpoint>, Fault)>,
    ) -> AttemptEnd {
        let on_answered = settle(&self.shared, endpoint, &self.reported, blame);
        let (response, sent) = match self.opened(endpoint, first_byte).await {
            Ok(opened) => opened,
            Err(fault) => return AttemptEnd::Unsent(fault),
        };
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        if !content_type.starts_with("text/event-stream") {
            return AttemptEnd::Unsent(Fault::Protocol(format!(
                "the answer is '{content_type}', not an event stream"
            )));
        }
        let (shared, request) = (&self.shared, &self.request);
        let config = &shared.config;
        let reading = Reading {
            body: Box::pin(response.bytes_stream().map_err(|e| e.to_string())),
            sent,
            clock: Arc::clone(&shared.clock),
            patience: Patience {
                first_byte,
                idle: config.idle_timeout,
            },
            terms: Terms {
                expected_model: config.check_model.then(|| config.model.clone()),
                top_logprobs: usize::from(request.top_logprobs.unwrap_or(0)),
                // The budget holds whether or not the upstream was sent it: an upstream
                // that ignores `max_tokens` is cut at it (without one sent, the cap
                // applies here and the upstream's own default there).
                budget: request.budget,
                prompt_tokens: self.prompt_tokens,
            },
            reported: Arc::clone(&self.reported),
            tokens: TokenReader::new(shared.tokenizer.clone()),
            tx: self.tx.clone(),
            on_answered: Some(on_answered),
            whole: request.whole,
        };
        stream::read(reading, &mut self.opening).await
    }

    /// The request sent to `endpoint` and a 2xx answer's head, and when it was sent;
    /// sent once more without the gateway's own ask for log-probabilities where the
    /// upstream refuses them.
    async fn opened(
        &self,
        endpoint: &Endpoint,
        first_byte: Duration,
    ) -> Result<(reqwest::Response, Instant), Fault> {
        let shared = &self.shared;
        // Not for a request with tools: the quality signals score the answer, not a
        // call's JSON, and llama.cpp's server refuses log-probabilities with tools in a
        // stream (a 400 that would read as "never any" and cost every later answer its
        // confidence figures).
        let mut asks = Asks {
            logprobs: shared.config.logprobs
                && !shared.logprobs_refused.load(Ordering::Relaxed)
                && self.request.tools.is_none(),
        };
        loop {
            let (response, sent) = send(shared, endpoint, &self.request, asks, first_byte).await?;
            if response.status().is_success() {
                return Ok((response, sent));
            }
            let fault = refusal(response, first_byte).await;
            if asks.logprobs && self.request.top_logprobs.is_none() && refuses_logprobs(&fault) {
                tracing::warn!(model = %shared.info.id, error = %fault, "The upstream does not return log-probabilities; asking no more (no confidence figures for this model).");
                shared.logprobs_refused.store(true, Ordering::Relaxed);
                asks.logprobs = false;
                continue;
            }
            return Err(fault);
        }
    }
}

/// What an answer read to its end settles at its endpoint: its in-flight count (held
/// by the closure until then), its averages, its health, and the fleet's expected
/// answer length.
fn settle(
    shared: &Shared,
    endpoint: &Arc<Endpoint>,
    reported: &Arc<Reported>,
    blame: Option<(Arc<Endpoint>, Fault)>,
) -> OnAnswered {
    let outstanding = Counted::new(endpoint.outstanding());
    let (endpoint, fleet) = (Arc::clone(endpoint), Arc::clone(&shared.fleet));
    let reported = Arc::clone(reported);
    Box::new(move |answered: Answered| {
        drop(outstanding);
        if let Some((refuser, refusal)) = blame {
            // A peer served what it refused: the refusal was the replica's own.
            tracing::warn!(endpoint = %refuser.label, error = %refusal, "An upstream endpoint refused a request that another one answered; it counts as a failure of the endpoint.");
            fleet.attempted(
                &refuser,
                AttemptHealth::Failed,
                Some(&refusal),
                Instant::now(),
            );
        }
        endpoint.measured(answered.ttft_ms, answered.tpot_ms);
        fleet.answered(answered.tokens);
        fleet.attempted(&endpoint, AttemptHealth::Answered, None, Instant::now());
        // The replica's own figures, from its attempt's send: the request's TTFT also
        // holds the attempts that failed before it.
        if let Some(last) = route(&reported).attempts.last_mut() {
            last.ttft_ms = answered.ttft_ms;
            last.tpot_ms = answered.tpot_ms;
        }
    })
}

fn headers(shared: &Shared, request: &GenerationRequest) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(key) = &shared.config.api_key {
        if let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", key.expose())) {
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
    }
    if let Some(traceparent) = request
        .traceparent
        .as_deref()
        .and_then(|t| HeaderValue::from_str(t).ok())
    {
        headers.insert("traceparent", traceparent);
    }
    // Only a UUID: llama.cpp's server refuses any other X-Request-ID with a 400.
    if let Ok(id) = uuid::Uuid::parse_str(&request.request_id) {
        if let Ok(value) = HeaderValue::from_str(&id.hyphenated().to_string()) {
            headers.insert("x-request-id", value);
        }
    }
    headers
}

/// Sends the request and waits for the answer's head, within `first_byte`.
async fn send(
    shared: &Shared,
    endpoint: &Endpoint,
    request: &GenerationRequest,
    asks: Asks,
    first_byte: Duration,
) -> Result<(reqwest::Response, Instant), Fault> {
    let (route, body) = wire::request_body(request, &shared.config, asks);
    let url = format!("{}{route}", endpoint.url);
    let sent = Instant::now();
    let call = endpoint
        .client
        .post(&url)
        .headers(headers(shared, request))
        .json(&body)
        .send();
    match tokio::time::timeout(first_byte, call).await {
        Ok(Ok(response)) => Ok((response, sent)),
        Ok(Err(error)) => Err(Fault::from_transport(&error, sent.elapsed())),
        Err(_) => Err(Fault::Timeout {
            waited: first_byte,
            first_byte: true,
        }),
    }
}

/// The fault an answer that is not a 2xx stream stands for.
/// Its body is read for 5 s at most, and never longer than `patience`.
async fn refusal(response: reqwest::Response, patience: Duration) -> Fault {
    use futures_util::StreamExt;
    let status = response.status();
    let retry_after = fault::retry_after(response.headers());
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            body.extend_from_slice(&chunk);
            if body.len() >= ERROR_BODY_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(patience.min(Duration::from_secs(5)), read).await;
    Fault::from_answer(status, retry_after, &body)
}

/// A refusal of what the gateway added to the client's request (streaming, usage, its
/// own ask for log-probabilities) is no mistake of the client's: it is the upstream
/// failing the gateway, a 502, not a 400 naming a parameter the client never sent.
pub(crate) fn gateways_own(fault: Fault, request: &GenerationRequest) -> Fault {
    let Fault::Refused { param, message } = &fault else {
        return fault;
    };
    let named = |p: &str| param.as_deref().is_some_and(|named| named.starts_with(p));
    let added = named("stream")
        || (request.top_logprobs.is_none() && (named("logprobs") || named("top_logprobs")));
    if added {
        return Fault::Failed {
            status: 400,
            retry_after: None,
            detail: format!("it refused what the gateway asks of every request: {message}"),
        };
    }
    fault
}

/// Whether a refusal is the upstream not doing log-probabilities.
fn refuses_logprobs(fault: &Fault) -> bool {
    match fault {
        Fault::Refused { param, message } => {
            param.as_deref().is_some_and(|p| p.contains("logprobs"))
                || message.to_ascii_lowercase().contains("logprobs")
        }
        _ => false,
    }
}

fn route(reported: &Reported) -> std::sync::MutexGuard<'_, crate::engine::Route> {
    reported.route.lock().unwrap_or_else(|e| e.into_inner())
}

fn record_attempt(reported: &Reported, endpoint: &str) {
    route(reported).attempts.push(Attempt {
        endpoint: endpoint.to_owned(),
        error_type: None,
        ttft_ms: None,
        tpot_ms: None,
    });
}

fn failed_attempt(reported: &Reported, fault: &Fault) {
    if let Some(last) = route(reported).attempts.last_mut() {
        last.error_type = Some(fault.kind().as_str());
    }
}

fn attempts_made(reported: &Reported) -> usize {
    route(reported).attempts.len()
}

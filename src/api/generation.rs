//! The two generation routes: `POST /v1/chat/completions` and the legacy
//! `POST /v1/completions`. They differ only in how the body is parsed and how the answer
//! is shaped ([`GenerationRoute`]); timings, limits, metrics, traces and the semantic log are the
//! same code.
//!
//! receive (t_recv) -> read the body within the size limit -> validate -> admit ->
//! count the prompt -> charge the key -> engine -> stream SSE frames or gather one JSON
//! body. A request refused before it reaches the engine still leaves a record, so
//! rejected traffic is visible too.

mod choices;
mod respond;
mod shadow;
mod unanswered;

use unanswered::Unanswered;

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use tracing::Instrument;

use super::body::{json_content_type, read_body};
use super::request::schema::{ChatCompletionRequest, CompletionRequest};
use super::request::{
    input_hash, parse_chat_request, parse_completion_request, RequestLimits, ValidatedRequest,
};
use super::responses::{GenerationErrors, ServerSentEvent};
use super::{AppState, RequestId};
use crate::admission::Permit;
use crate::auth::limits::{RateHeaders, Refusal};
use crate::auth::Caller;
use crate::engine::served::ServedModel;
use crate::engine::{Front, GenerationRequest, ModelInfo, Prepared};
use crate::error::ApiError;
use crate::names;
use crate::quality::QualityTracker;
use crate::record::{Origin, QuotaHold, RequestParams, SplitLink};
use crate::stream::chunks::{Completion, ResponseMeta, Shape};
use crate::stream::producer::Deadline;
use crate::stream::{Run, RunInfo};
use crate::timing::RequestTimer;

/// SSE frames buffered between the producer and the socket. Small on purpose: a slow
/// client pushes back on the producer instead of piling up memory.
const SSE_BUFFER_FRAMES: usize = 16;

/// Which generation route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationRoute {
    Chat,
    Completions,
    /// llama.cpp's `POST /completion`: read as `/v1/completions`, answered in its shape.
    Native,
}

impl GenerationRoute {
    fn parse(
        self,
        body: &[u8],
        limits: &RequestLimits,
        request_id: &str,
    ) -> Result<ValidatedRequest, ApiError> {
        match self {
            GenerationRoute::Chat => parse_chat_request(body, limits, request_id),
            GenerationRoute::Completions | GenerationRoute::Native => {
                parse_completion_request(body, limits, request_id)
            }
        }
    }

    fn shape(self) -> Shape {
        match self {
            GenerationRoute::Chat => Shape::Chat,
            GenerationRoute::Completions | GenerationRoute::Native => Shape::Text,
        }
    }

    /// `gen_ai.operation.name` of its requests.
    fn operation(self) -> &'static str {
        match self {
            GenerationRoute::Chat => names::OPERATION_CHAT,
            GenerationRoute::Completions | GenerationRoute::Native => {
                names::OPERATION_TEXT_COMPLETION
            }
        }
    }
}

/// `POST /v1/chat/completions`.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "generation",
    request_body(content = ChatCompletionRequest, content_type = "application/json"),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The answer, with its `timings`; a stream of `CompletionChunk` frames with `stream: true`, the last one with `timings` and then `data: [DONE]`", content(
            (Completion = "application/json"),
            (ServerSentEvent = "text/event-stream"),
        )),
        GenerationErrors,
    ),
)]
pub async fn chat_completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    generate(GenerationRoute::Chat, req, payload, state).await
}

/// `POST /v1/completions`.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "generation",
    request_body(content = CompletionRequest, content_type = "application/json"),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The legacy `text_completion`, with its `timings`; frames of `CompletionChunk` with `stream: true`", content(
            (Completion = "application/json"),
            (ServerSentEvent = "text/event-stream"),
        )),
        GenerationErrors,
    ),
)]
pub async fn completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    generate(GenerationRoute::Completions, req, payload, state).await
}

/// `POST /completion`: llama.cpp's server's own completion (`api::llamacpp`).
#[utoipa::path(
    post,
    path = "/completion",
    tag = "llama.cpp",
    request_body(content = Object, content_type = "application/json", description = "llama.cpp's server's completion body: `prompt`, `n_predict`, `n_probs`, `json_schema`, `logit_bias`, `return_tokens`, `response_fields` and the common sampling parameters"),
    security((), ("api_key" = [])),
    responses(
        (status = 200, description = "llama.cpp's answer: `content`, `tokens`, `stop`, `stop_type`, `generation_settings`, llama.cpp's `timings` and the gateway's (`llmgate`); with `stream: true`, frames of it, the last with `stop: true`", content(
            (Object = "application/json"),
            (ServerSentEvent = "text/event-stream"),
        )),
        GenerationErrors,
    ),
)]
pub async fn native_completion(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    generate(GenerationRoute::Native, req, payload, state).await
}

async fn generate(
    route: GenerationRoute,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let t_recv = super::Arrived::of(&req, &state.clock);
    let deadline = Deadline::from_now(state.timeouts.request, state.lifecycle.cut_off());
    let trace = state
        .telemetry
        .start_request(req.headers(), state.clock.system_time());
    let request_id = RequestId::of(&req);
    let caller = caller_of(&req);
    let api_key_id = caller.as_ref().map(|c| c.key_id.clone());
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        trace_id = %trace.ids.trace_id,
        span_id = %trace.ids.span_id,
        api_key_id = tracing::field::Empty,
    );
    if let Some(id) = &api_key_id {
        span.record("api_key_id", id.as_str());
    }
    async move {
        let mut pending = Unanswered::new(
            route.operation(),
            state.clone(),
            request_id.clone(),
            api_key_id,
            t_recv,
            trace,
        );
        let mut rate = RateHeaders::default();
        let request = Handling {
            route,
            state: &state,
            request_id: &request_id,
            charged: Charged {
                caller: caller.as_ref(),
                headers: &mut rate,
            },
            timer: RequestTimer::start(t_recv),
            deadline,
            pending: &mut pending,
        };
        let mut response = match request.handle(&req, payload).await {
            Ok(response) => response,
            Err(Failure::Recorded(error)) => error.error_response(),
            Err(Failure::Refused(error)) => {
                pending.record(Some(&error));
                error.error_response()
            }
        };
        rate.apply(response.headers_mut());
        if let Some(variant) = pending
            .variant
            .as_deref()
            .and_then(|v| header::HeaderValue::from_str(v).ok())
        {
            response.headers_mut().insert(
                header::HeaderName::from_static("x-llmgate-variant"),
                variant,
            );
        }
        response
    }
    .instrument(span)
    .await
}

/// Why a request got an error answer instead of a completion.
enum Failure {
    /// Refused before reaching the engine: the handler records it.
    Refused(ApiError),
    /// Failed in the engine, after its [`Run`] recorded it.
    Recorded(ApiError),
}

impl Failure {
    /// The same failure, its error naming each parameter as the client sent it.
    fn renamed(self, renamed: &[(&'static str, &'static str)]) -> Self {
        match self {
            Failure::Refused(e) => Failure::Refused(e.renamed_all(renamed)),
            Failure::Recorded(e) => Failure::Recorded(e.renamed_all(renamed)),
        }
    }
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Failure::Refused(error)
    }
}

/// The caller a request is charged to, and where the outcome's headers go.
struct Charged<'a> {
    caller: Option<&'a Caller>,
    headers: &'a mut RateHeaders,
}

impl Charged<'_> {
    /// Charges the request's token budget to its key, and says what it holds of the
    /// key's quotas (for at most `hold_for`); every answer carries the headers, a refusal
    /// included.
    async fn charge(
        &mut self,
        prepared: &Prepared,
        hold_for: std::time::Duration,
        hold: &mut Option<QuotaHold>,
    ) -> Result<(), ApiError> {
        let Some(caller) = self.caller else {
            return Ok(());
        };
        match caller.charge(prepared.token_budget(), hold_for, hold).await {
            Ok(headers) => {
                *self.headers = headers;
                Ok(())
            }
            Err(refusal) => {
                *self.headers = refusal.headers();
                let tokens = prepared.token_budget();
                match &refusal {
                    Refusal::Unavailable => tracing::warn!("Refused: the shared rate limits could not be checked (state.on_failure = fail_closed)."),
                    Refusal::QuotaSpent(spent) if spent.is_used_up() => tracing::info!(
                        tokens,
                        period = spent.period.as_str(),
                        limit = spent.limit,
                        used = spent.used,
                        "Refused: the key's token quota is used up."
                    ),
                    Refusal::QuotaSpent(spent) => tracing::info!(
                        tokens,
                        period = spent.period.as_str(),
                        limit = spent.limit,
                        used = spent.used,
                        held = spent.held,
                        "Refused: the key's token quota is held by its requests in flight."
                    ),
                    Refusal::Exhausted { .. } | Refusal::TooLarge { .. } => {
                        tracing::info!(tokens, "Refused: the key's rate limit is reached.")
                    }
                }
                Err(refusal.into())
            }
        }
    }
}

/// One request on its way through the handler: parse, admit, start, respond.
struct Handling<'a> {
    route: GenerationRoute,
    state: &'a AppState,
    request_id: &'a str,
    charged: Charged<'a>,
    timer: RequestTimer,
    deadline: Deadline,
    /// Its record, should it end before a [`Run`] takes it over.
    pending: &'a mut Unanswered,
}

/// A parsed request, admitted: its model found and a place among those in flight held.
struct Admitted<'a> {
    parsed: ValidatedRequest,
    served: &'a ServedModel,
    info: Arc<ModelInfo>,
    permit: Permit,
}

/// A request the engine has started, with what its answer's [`Run`] needs.
struct Started {
    run: Run,
    meta: ResponseMeta,
    events: crate::engine::TokenStream,
    stream: bool,
    with_logprobs: bool,
    include_usage: bool,
    continuous_usage: bool,
    timings_per_token: bool,
    prompt_tokens: u32,
}

impl<'a> Handling<'a> {
    async fn handle(
        mut self,
        req: &HttpRequest,
        payload: web::Payload,
    ) -> Result<HttpResponse, Failure> {
        let parsed = self.parse(req, payload).await?;
        if parsed.choices > 1 || !parsed.more_prompts.is_empty() {
            // Each choice, and each prompt of a batch, is a request of its own; none is
            // copied to a shadow.
            return choices::answer(self, parsed, req).await;
        }
        let copy = shadow::pick(&self.pending.state, &parsed);
        let admitted = self.admit(parsed)?;
        // Only a request the gateway takes is copied: admitted, then charged and started.
        let copy = copy.and_then(|copy| copy.reserve(self.route, self.pending));
        let state = self.state;
        let deadline = self.deadline.clone();
        // Refused there, the copy is not sent (and the request's record names no pair).
        let started = self.start(admitted).await?;
        if let Some(copy) = copy {
            copy.launch();
        }
        respond::respond(started, state, deadline).await
    }

    /// Reads the body within its size and time limits and validates it.
    async fn parse(
        &mut self,
        req: &HttpRequest,
        payload: web::Payload,
    ) -> Result<ValidatedRequest, Failure> {
        let state = self.state;
        if state.lifecycle.is_draining() {
            return Err(ApiError::ShuttingDown.into());
        }
        json_content_type(req)?;
        let limit = state.timeouts.body;
        let body = tokio::time::timeout(limit, read_body(req, payload, state.max_body_bytes))
            .await
            .map_err(|_| ApiError::BodyTimeout { limit })??;
        let body = self.choose_variant(req, body.freeze());
        let parsed = if self.route == GenerationRoute::Native {
            let read = super::llamacpp::read_completion(&body, state).await?;
            let mut parsed = self
                .route
                .parse(&read.body, &state.limits, self.request_id)
                .map_err(|e| e.renamed_all(&read.renamed))?;
            // Engine errors (a schema that cannot compile) name the client's parameters too.
            parsed.renamed.extend(read.renamed);
            if read.meta.random_seed && parsed.generation.sampling.seed.take().is_some() {
                parsed.input_hash = input_hash(&parsed.model, &parsed.generation);
            }
            parsed.native = Some(Box::new(read.meta));
            parsed
        } else {
            self.route.parse(&body, &state.limits, self.request_id)?
        };
        self.pending.model = Some(parsed.model.clone());
        self.pending.stream = parsed.stream;
        Ok(parsed)
    }

    /// A body that names an A/B split, sent on to the split's variant for this caller
    /// (its `model` rewritten); any other body as it came. A body that is not JSON is
    /// left for the parser to refuse.
    fn choose_variant(&mut self, req: &HttpRequest, body: web::Bytes) -> web::Bytes {
        use crate::shadow::split::Sticky;
        let splits = &self.state.splits;
        if splits.is_empty() {
            return body;
        }
        #[derive(serde::Deserialize)]
        struct Named {
            model: Option<String>,
            user: Option<String>,
            safety_identifier: Option<String>,
        }
        let Ok(named) = serde_json::from_slice::<Named>(&body) else {
            return body;
        };
        let Some(split) = named
            .model
            .as_deref()
            .and_then(|m| splits.iter().find(|s| s.id == m))
        else {
            return body;
        };
        let sticky = match &split.sticky {
            Sticky::ApiKey => self.charged.caller.map(|c| c.key_id.clone()),
            Sticky::User => named.user.or(named.safety_identifier),
            Sticky::Header(name) => req
                .headers()
                .get(name.as_str())
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        };
        let variant = split.pick(sticky.as_deref(), self.request_id).to_owned();
        // Only `model` changes: the other fields stay as the client wrote them, their
        // keys in order (a JSON schema's properties order its answer's fields).
        type Fields = std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>;
        let Ok(mut fields) = serde_json::from_slice::<Fields>(&body) else {
            return body;
        };
        let Ok(model) = serde_json::value::to_raw_value(&variant) else {
            return body;
        };
        fields.insert("model".to_owned(), model);
        self.pending.split = Some(SplitLink {
            split: split.id.clone(),
            variant: variant.clone(),
        });
        self.pending.variant = Some(variant);
        serde_json::to_vec(&fields).map_or(body, web::Bytes::from)
    }

    /// Finds the model and takes a place among the requests in flight: refused at once
    /// when they are full, or while the model loads.
    fn admit(&mut self, parsed: ValidatedRequest) -> Result<Admitted<'a>, Failure> {
        let state = self.state;
        if state.models.get(&parsed.model).is_none() {
            return Err(ApiError::ModelNotFound(parsed.model.clone()).into());
        }
        let permit = state.admission.try_admit().ok_or(ApiError::Overloaded {
            limit: state.admission.limit(),
            retry_after: std::time::Duration::from_secs(1),
        })?;
        self.admitted(parsed, permit)
    }

    /// The request, holding `permit`, on its way to its model, once the model is ready.
    fn admitted(
        &mut self,
        mut parsed: ValidatedRequest,
        permit: Permit,
    ) -> Result<Admitted<'a>, Failure> {
        let state = self.state;
        let served = state
            .models
            .get(&parsed.model)
            .ok_or_else(|| ApiError::ModelNotFound(parsed.model.clone()))?;
        let info = served.engine.model_info().ok_or(ApiError::NotReady)?;
        // An engine that continues the trace (an upstream) gets the request span as parent.
        parsed.generation.traceparent = self.pending.trace.as_ref().map(|t| t.traceparent());
        parsed.generation.deadline = Some(self.deadline.at.into_std());
        tracing::debug!(
            stream = parsed.stream,
            max_tokens = parsed.generation.budget.tokens(),
            "Request admitted."
        );
        Ok(Admitted {
            parsed,
            served,
            info,
            permit,
        })
    }

    /// Counts the prompt and fits the budget in the engine, then charges the budget to
    /// the key.
    async fn prepare(
        &mut self,
        engine: &Front,
        generation: GenerationRequest,
        upstream: bool,
    ) -> Result<Prepared, Failure> {
        let clock = &self.state.clock;
        self.timer.engine_submitted(clock.now());
        let prepared = engine.prepare(generation).await.map_err(ApiError::from)?;
        self.timer.prompt_prepared(clock.now());
        if upstream {
            self.pending.reported = Some(Arc::clone(&prepared.reported));
        }
        // Held until the request's record: a minute past its deadline, should this gateway
        // stop without one.
        let hold_for = self.deadline.limit + std::time::Duration::from_secs(60);
        self.charged
            .charge(&prepared, hold_for, &mut self.pending.quota_hold)
            .await?;
        Ok(prepared)
    }

    /// Prepares the request in the engine, charges its budget to the key and starts it.
    async fn start(mut self, admitted: Admitted<'a>) -> Result<Started, Failure> {
        let Admitted {
            mut parsed,
            served,
            info,
            permit,
        } = admitted;
        if parsed.native.is_some() {
            let settings = super::llamacpp::generation_settings(&parsed, served);
            if let Some(native) = parsed.native.as_mut() {
                native.generation_settings = settings;
            }
        }
        let state = self.state;
        let engine = &served.engine;
        let prompt = parsed.generation.prompt.last_user_text().to_owned();
        let quality = QualityTracker::new(&state.quality, &prompt, guarded(served, &parsed));
        let stop = engine.stops_to_screen(&parsed.generation.sampling);
        let seed = parsed.generation.sampling.seed;
        let with_logprobs = parsed.generation.top_logprobs.is_some();
        let tools = parsed.generation.tools.as_ref();
        let (tools_offered, offers_tools) = (tools.map(|t| t.names()), tools.is_some());
        let legacy_functions = tools.is_some_and(|t| t.legacy);

        let upstream = info.upstream.is_some();
        let prepared = self
            .prepare(engine, parsed.generation, upstream)
            .await
            .map_err(|failure| failure.renamed(&parsed.renamed))?;
        let params = params_of(&prepared);
        let generation =
            respond::start_in_engine(state, engine, prepared, &self.deadline.cut_off).await?;
        self.timer
            .engine_started(state.clock.at(generation.started));
        if upstream {
            self.timer.engine_is_upstream();
        }
        let response_id = format!("{}{}", self.route.shape().id_prefix(), self.request_id);
        let meta = ResponseMeta {
            id: response_id.clone(),
            shape: self.route.shape(),
            created: state.clock.unix_seconds(),
            model: parsed.model.clone(),
            system_fingerprint: info.system_fingerprint.clone(),
            echo: parsed.echo.then(|| prompt.clone()),
            native: parsed.native.map(|mut native| {
                native.prompt_tokens = generation.prompt_tokens;
                native
            }),
            legacy_functions,
            offers_tools,
        };
        let info = RunInfo {
            origin: Origin {
                request_id: self.request_id.to_owned(),
                operation: self.route.operation(),
                api_key_id: self.charged.caller.map(|c| c.key_id.clone()),
                model: parsed.model,
                stream: parsed.stream,
                quota_hold: self.pending.quota_hold.take(),
                shadow: self.pending.shadow.take(),
                split: self.pending.split.take(),
            },
            response_id,
            input_hash: parsed.input_hash,
            seed,
            served: info,
            prompt_tokens: generation.prompt_tokens,
            params,
            prompt,
            user: parsed.user,
            stop,
            reported: upstream.then(|| Arc::clone(&generation.reported)),
            tools_offered: tools_offered.unwrap_or_default(),
        };
        // Taken only here, so a refusal above still finds it for its record.
        let Some(trace) = self.pending.trace.take() else {
            return Err(Failure::Refused(ApiError::Internal));
        };
        let run = Run::new(
            info,
            state.clock.clone(),
            self.timer,
            quality,
            state.telemetry.clone(),
            trace,
            permit,
        );
        Ok(Started {
            run,
            meta,
            events: generation.events,
            stream: parsed.stream,
            with_logprobs,
            include_usage: parsed.include_usage,
            continuous_usage: parsed.continuous_usage,
            timings_per_token: parsed.timings_per_token,
            prompt_tokens: generation.prompt_tokens,
        })
    }
}

/// The parameters the record reports. After `prepare`: an unset budget has been fitted
/// to what the context leaves, and that is the most this answer can have.
fn params_of(prepared: &Prepared) -> RequestParams {
    RequestParams {
        max_tokens: Some(prepared.request.budget.tokens()),
        temperature: prepared.request.sampling.temperature,
        top_p: prepared.request.sampling.top_p,
    }
}

/// Whether the degeneration guard watches the answer. It does not cut a request that
/// asks for a length (`ignore_eos`, as benchmark clients send, or `min_tokens`), nor
/// JSON, whose similar array items repeat by nature: cut, it would be invalid yet end
/// as `stop`.
fn guarded(served: &ServedModel, parsed: &ValidatedRequest) -> bool {
    let sampling = &parsed.generation.sampling;
    served.policy.degeneration_guard
        && !sampling.ignore_eos
        && sampling.min_tokens == 0
        && parsed.generation.response_format == crate::engine::ResponseFormat::Text
}

/// Who the request is, when keys are on.
fn caller_of(req: &HttpRequest) -> Option<Caller> {
    use actix_web::HttpMessage;
    req.extensions().get::<Caller>().cloned()
}

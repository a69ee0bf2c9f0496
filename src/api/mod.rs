//! The HTTP surface (actix-web): routes, shared state and the request-id middleware.
//!
//! - [`generation`]: `POST /v1/chat/completions` and `POST /v1/completions`, streamed
//!   and not.
//! - [`tokens`]: `POST /tokenize` and `POST /detokenize` (vLLM's shapes).
//! - [`meta`]: `GET /v1/models`, `/health`, `/ready`, `/metrics`.
//! - [`stats`]: `GET /stats`, the live view the page shows.
//! - [`request`]: the wire request and its validation into a domain request.
//! - [`openapi`]: `GET /openapi.json`, derived from the types above; [`responses`]: the
//!   error statuses and stream event the handlers' annotations name.
//! - [`body`]: reading a request body (JSON only, within the size limit).
//!
//! The route table is [`crate::routes`], with the page's.

pub mod body;
pub mod generation;
pub mod llamacpp;
pub mod meta;
pub mod openapi;
pub mod request;
pub mod responses;
pub mod stats;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest};

use crate::admission::Admission;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::engine::served::{ModelPolicy, ServedModels};
use crate::lifecycle::Lifecycle;
use crate::quality::QualitySettings;
use crate::stream::producer::Pacing;
use crate::telemetry::Telemetry;
use request::RequestLimits;

pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The deadlines of one chat request (see [`crate::config::ServerConfig`]).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub body: Duration,
    pub queue: Duration,
    pub request: Duration,
}

/// Everything a handler needs, shared by all workers.
pub struct AppState {
    /// Every served model and its engine.
    pub models: ServedModels,
    pub clock: SharedClock,
    /// Metrics, traces and the record hand-off of every request when it ends.
    pub telemetry: Arc<Telemetry>,
    pub admission: Admission,
    pub limits: RequestLimits,
    pub max_body_bytes: usize,
    /// Keep-alive and client write deadline of streamed responses.
    pub pacing: Pacing,
    pub timeouts: Timeouts,
    /// Draining on shutdown, and the signal that ends requests still running.
    pub lifecycle: Lifecycle,
    pub quality: QualitySettings,
    /// API keys (none: open) and what they guard; set after the keys file is read.
    pub guard: crate::auth::Guard,
    /// Origins allowed to call the API from a browser; empty: no CORS headers at all.
    pub cors_origins: Vec<String>,
    /// Whether the API listener serves `/metrics` (not when it has a listener of its own).
    pub metrics_on_api: bool,
    /// Where semantic logs go and what the cluster's set-up found, for `/ready`.
    pub semlog: crate::semlog::SemlogStatus,
    /// SO_SNDBUF of client connections (0: the OS's).
    pub send_buffer_bytes: usize,
    /// `/openapi.json`'s body, made on its first request (it depends only on `limits`).
    pub openapi: std::sync::OnceLock<bytes::Bytes>,
    /// Serve the built-in page at `/` (`crate::page`).
    pub page: bool,
    /// Where state is shared with other gateways (Redis), for `/ready`.
    pub shared_state: Option<Arc<crate::state::SharedState>>,
    /// The served models' shadows (`crate::shadow`).
    pub shadows: crate::shadow::Shadows,
    /// A/B splits: model names answered by one of several served models.
    pub splits: Vec<crate::shadow::split::SplitPolicy>,
}

impl AppState {
    /// A gateway serving `engine` as the config's first model (one engine; tests and
    /// benchmarks).
    pub fn new(
        config: &Config,
        engine: impl Into<crate::engine::Front>,
        clock: SharedClock,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let limits = config.models.first().map_or_else(
            || ModelPolicy {
                default_max_tokens: config.engine.default_max_tokens,
                ..ModelPolicy::plain(&config.engine.model_id, config.engine.max_tokens_cap)
            },
            ModelPolicy::from,
        );
        Self::with_models(
            config,
            ServedModels::single(limits, engine),
            clock,
            telemetry,
        )
    }

    /// A gateway serving `models`.
    pub fn with_models(
        config: &Config,
        models: ServedModels,
        clock: SharedClock,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        Self {
            shadows: shadows_of(config, &telemetry),
            splits: config.splits.clone(),
            limits: RequestLimits {
                models: models.policies(),
                strict_params: config.server.strict_params,
                any_name: config.server.serve_any_model,
            },
            models,
            clock,
            telemetry,
            admission: Admission::new(config.server.max_in_flight),
            max_body_bytes: config.server.max_body_bytes,
            pacing: Pacing {
                keepalive: config.server.keepalive,
                write_timeout: config.server.stream_write_timeout,
            },
            lifecycle: Lifecycle::default(),
            timeouts: Timeouts {
                body: config.server.body_timeout,
                queue: config.server.queue_timeout,
                request: config.server.request_timeout,
            },
            quality: config.quality.settings.clone(),
            guard: crate::auth::Guard::default(),
            cors_origins: config.server.cors_origins.clone(),
            metrics_on_api: config.server.metrics_listen.is_none(),
            semlog: crate::semlog::SemlogStatus::default(),
            send_buffer_bytes: config.server.send_buffer_bytes,
            openapi: std::sync::OnceLock::new(),
            page: config.server.page,
            shared_state: None,
        }
    }
}

/// The shadows the config's models name, their counters at zero.
fn shadows_of(config: &Config, telemetry: &Telemetry) -> crate::shadow::Shadows {
    let policies: Vec<(&str, &crate::config::shadow::ShadowPolicy)> = config
        .models
        .iter()
        .filter_map(|m| Some((m.id.as_str(), m.shadow.as_ref()?)))
        .collect();
    for (primary, policy) in &policies {
        telemetry.metrics.shadow_pair(primary, &policy.candidate);
    }
    crate::shadow::Shadows::new(policies)
}

/// `http(s)://localhost`, `127.0.0.1` or `[::1]`, with or without a port.
fn is_local_origin(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    ["localhost", "127.0.0.1", "[::1]"].iter().any(|host| {
        rest.strip_prefix(host).is_some_and(|port| {
            port.is_empty()
                || port
                    .strip_prefix(':')
                    .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// CORS for `origins`: browsers on those pages may call the API with a key; preflights
/// are answered before authentication (they carry no key). No credentials (cookies):
/// the key travels in `Authorization`.
pub fn cors(origins: &[String]) -> actix_cors::Cors {
    let cors = origins
        .iter()
        .filter(|o| *o != crate::config::LOCAL_ORIGINS)
        .fold(actix_cors::Cors::default(), |cors, origin| {
            cors.allowed_origin(origin)
        });
    let cors = if origins.iter().any(|o| o == crate::config::LOCAL_ORIGINS) {
        cors.allowed_origin_fn(|origin, _| origin.to_str().is_ok_and(is_local_origin))
    } else {
        cors
    };
    cors.allowed_methods(["GET", "POST"])
        // The OpenAI SDKs send their own x-stainless-* headers; the origin is the gate.
        .allow_any_header()
        .expose_headers([
            "x-request-id",
            "retry-after",
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ])
        .max_age(3600)
}

/// The request's id, set by [`request_id`] for every request.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

impl RequestId {
    pub fn of(req: &HttpRequest) -> String {
        req.extensions()
            .get::<RequestId>()
            .map_or_else(new_request_id, |id| id.0.clone())
    }
}

fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A client-supplied id is kept when it is a short token of safe characters (so it can
/// go into logs, headers and documents as is) in which the redactor finds nothing: an
/// id is stored unredacted in `llm.request_id`, so `4539-1488-0343-6467` (a card
/// number) or `13812345678` (a phone) is replaced by a new id, as is anything else.
fn acceptable_id(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?;
    let token = !text.is_empty()
        && text.len() <= MAX_REQUEST_ID_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    (token && crate::redact::shared().find(text).is_empty()).then(|| text.to_owned())
}

/// The longest client request id kept: a UUID is 36, a W3C trace id 32, a ULID 26.
const MAX_REQUEST_ID_LEN: usize = 64;

/// When the request reached the gateway's own code, on its clock: stamped by
/// [`request_id`], the outermost of its middleware, so that `timings.overhead_ms`
/// counts the key check and the routing too, not only the handler.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub std::time::Duration);

impl Arrived {
    /// The request's arrival, or now where no middleware stamped it.
    pub fn of(req: &HttpRequest, clock: &SharedClock) -> std::time::Duration {
        req.extensions()
            .get::<Arrived>()
            .map_or_else(|| clock.now(), |a| a.0)
    }
}

/// Middleware: give every request an id and every response the `x-request-id` header.
pub async fn request_id(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = req
        .headers()
        .get(&REQUEST_ID_HEADER)
        .and_then(acceptable_id)
        .unwrap_or_else(new_request_id);
    let header = HeaderValue::from_str(&id).ok();
    let arrived = req
        .app_data::<actix_web::web::Data<AppState>>()
        .map(|state| Arrived(state.clock.now()));
    {
        let mut extensions = req.extensions_mut();
        extensions.insert(RequestId(id));
        if let Some(arrived) = arrived {
            extensions.insert(arrived);
        }
    }
    let mut response = next.call(req).await?;
    if let Some(value) = header {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    Ok(response)
}

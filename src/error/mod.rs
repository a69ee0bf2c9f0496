//! Every error a client can see, and the one table that maps each to an HTTP status and
//! OpenAI's error shape: `{"error":{"message","type","param","code"}}`.
//!
//! `ApiError::kind()` is the stable snake_case label shared by the response body (`code`)
//! and, later, the `error_type` metric label: a bounded set, never user input.

use std::time::Duration;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::engine::upstream::fault::FaultKind;
use crate::engine::upstream::Fault;
use crate::engine::EngineError;
use messages::{context_message, rate_message, reason_suffix, reset_text, upstream_message};

pub mod messages;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error("We could not parse the JSON body of your request: {0}")]
    InvalidJson(String),
    /// A parameter has the wrong type or an out-of-range value.
    #[error("Invalid value for '{param}': {message}")]
    InvalidParameter { param: String, message: String },
    #[error("'{param}' is not supported by this server{}", reason_suffix(.reason))]
    UnsupportedParameter { param: String, reason: String },
    #[error("Unrecognized request argument supplied: {0}")]
    UnknownParameter(String),
    #[error("The model '{0}' does not exist")]
    ModelNotFound(String),
    #[error("{}", context_message(*.prompt_tokens, *.max_tokens, *.context_length, .prompt_param))]
    ContextLengthExceeded {
        prompt_tokens: u32,
        max_tokens: Option<u32>,
        context_length: u32,
        /// `messages` or `prompt`: the parameter to shorten.
        prompt_param: &'static str,
    },
    #[error("The request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("The server is at capacity ({limit} requests in flight); retry after {} s", .retry_after.as_secs())]
    Overloaded { limit: usize, retry_after: Duration },
    #[error("The request body did not arrive within {} s", .limit.as_secs())]
    BodyTimeout { limit: Duration },
    #[error("The request waited {} s for the engine without starting; retry shortly", .limit.as_secs())]
    QueueTimeout { limit: Duration },
    #[error("The request did not finish within {} s", .limit.as_secs())]
    RequestTimeout { limit: Duration },
    #[error("The model is still loading; retry shortly")]
    NotReady,
    #[error("The server is shutting down; retry on another instance or shortly")]
    ShuttingDown,
    /// Limits are shared across gateways, their store did not answer, and the operator
    /// chose to refuse rather than guess (`state.on_failure = "fail_closed"`).
    #[error("The gateway cannot check your rate limits right now (its shared state did not answer); retry shortly")]
    StateUnavailable,
    #[error("The engine failed while generating; the error was logged with the request id")]
    Engine,
    #[error("Not found")]
    NotFound,
    /// `/stats/requests/{id}`: no finished request of this id is kept (or it is another
    /// key's).
    #[error("No finished request '{0}' is known here: the gateway keeps the figures of its last {kept} requests, each only for the key that sent it", kept = crate::telemetry::answers::KEPT)]
    RequestNotFound(String),
    #[error("Method not allowed; this route takes {allow}")]
    MethodNotAllowed { allow: &'static str },
    #[error("You didn't provide an API key. Provide it in the Authorization header with Bearer auth (Authorization: Bearer YOUR_KEY)")]
    MissingApiKey,
    #[error("Incorrect API key provided")]
    InvalidApiKey,
    #[error("Content-Type must be application/json; got {0}")]
    UnsupportedMediaType(String),
    /// A key's limit is spent for now (`retry_after`), or the request alone is more than
    /// the limit (`None`: it never passes).
    #[error("{}", rate_message(*.unit, *.limit, *.requested, *.retry_after))]
    RateLimited {
        unit: RateUnit,
        limit: u32,
        requested: u32,
        retry_after: Option<Duration>,
    },
    /// The key's token quota for the day or the month is used up.
    #[error("You exceeded your current quota: this API key has used {used} of its {limit} tokens for the {period}. It resets in {}.", reset_text(*.resets_in))]
    InsufficientQuota {
        period: &'static str,
        limit: u64,
        used: u64,
        resets_in: Duration,
    },
    /// What the key has used and what its requests in flight hold fill a quota: they may
    /// end below it, so it is worth a retry.
    #[error("This API key's token quota for the {period} is held by its requests in flight: {used} of {limit} tokens used and {held} held until they end. Retry when they do.")]
    QuotaHeld {
        period: &'static str,
        limit: u64,
        used: u64,
        held: u64,
    },
    #[error("The server had an error while processing your request")]
    Internal,
    /// The upstream refused the request as the client sent it (a 400 or 422 there); its
    /// own explanation, which is about the client's request.
    #[error("The upstream model server refused the request: {message}")]
    UpstreamRefused {
        param: Option<String>,
        message: String,
    },
    /// The upstream could not give the answer; `kind` is its `Fault::kind()`. The
    /// upstream's own words stay in the log (they may carry credentials or internals).
    #[error("{}", upstream_message(.kind))]
    Upstream {
        kind: FaultKind,
        retry_after: Option<Duration>,
    },
}

/// Where an error kind lands: status, OpenAI `type`, and our stable `code`.
struct Entry {
    status: StatusCode,
    error_type: &'static str,
    code: &'static str,
}

impl Entry {
    fn new(status: StatusCode, error_type: &'static str, code: &'static str) -> Self {
        Self {
            status,
            error_type,
            code,
        }
    }

    /// A fault of the client's request: OpenAI's `invalid_request_error`.
    fn invalid_request(status: StatusCode, code: &'static str) -> Self {
        Self::new(status, "invalid_request_error", code)
    }

    /// A failure of the server's (or of the upstream's): OpenAI's `server_error`.
    fn server_error(status: StatusCode, code: &'static str) -> Self {
        Self::new(status, "server_error", code)
    }
}

/// What a rate limit counts (`auth::limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateUnit {
    Requests,
    Tokens,
}

impl RateUnit {
    /// OpenAI's error `type` for a refusal of this unit.
    pub fn as_str(self) -> &'static str {
        match self {
            RateUnit::Requests => "requests",
            RateUnit::Tokens => "tokens",
        }
    }
}

impl ApiError {
    /// The one table from error kind to HTTP.
    fn entry(&self) -> Entry {
        use ApiError as E;
        use StatusCode as S;
        let invalid = Entry::invalid_request;
        let server = Entry::server_error;
        match self {
            E::InvalidJson(_) => invalid(S::BAD_REQUEST, "invalid_json"),
            E::InvalidParameter { .. } => invalid(S::BAD_REQUEST, "invalid_value"),
            E::UnsupportedParameter { .. } => invalid(S::BAD_REQUEST, "unsupported_parameter"),
            E::UnknownParameter(_) => invalid(S::BAD_REQUEST, "unknown_parameter"),
            E::ModelNotFound(_) => invalid(S::NOT_FOUND, "model_not_found"),
            E::ContextLengthExceeded { .. } => invalid(S::BAD_REQUEST, "context_length_exceeded"),
            E::PayloadTooLarge { .. } => invalid(S::PAYLOAD_TOO_LARGE, "payload_too_large"),
            E::Overloaded { .. } => Entry::new(
                S::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "server_overloaded",
            ),
            E::BodyTimeout { .. } => invalid(S::REQUEST_TIMEOUT, "body_timeout"),
            E::QueueTimeout { .. } => server(S::SERVICE_UNAVAILABLE, "queue_timeout"),
            E::RequestTimeout { .. } => server(S::GATEWAY_TIMEOUT, "request_timeout"),
            E::NotReady => server(S::SERVICE_UNAVAILABLE, "model_not_ready"),
            E::ShuttingDown => server(S::SERVICE_UNAVAILABLE, "server_shutting_down"),
            E::StateUnavailable => server(S::SERVICE_UNAVAILABLE, "state_unavailable"),
            E::Engine => server(S::INTERNAL_SERVER_ERROR, "engine_error"),
            E::NotFound => invalid(S::NOT_FOUND, "not_found"),
            E::RequestNotFound(_) => invalid(S::NOT_FOUND, "request_not_found"),
            E::MethodNotAllowed { .. } => invalid(S::METHOD_NOT_ALLOWED, "method_not_allowed"),
            // OpenAI answers both with this code; its SDKs raise AuthenticationError.
            E::MissingApiKey | E::InvalidApiKey => invalid(S::UNAUTHORIZED, "invalid_api_key"),
            E::UnsupportedMediaType(_) => {
                invalid(S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            // OpenAI's `type` says which limit: "requests" or "tokens".
            E::RateLimited { unit, .. } => {
                Entry::new(S::TOO_MANY_REQUESTS, unit.as_str(), "rate_limit_exceeded")
            }
            // OpenAI's shape for a spent quota: both `type` and `code`.
            E::InsufficientQuota { .. } => Entry::new(
                S::TOO_MANY_REQUESTS,
                "insufficient_quota",
                "insufficient_quota",
            ),
            E::QuotaHeld { .. } => Entry::new(S::TOO_MANY_REQUESTS, "tokens", "quota_held"),
            E::Internal => server(S::INTERNAL_SERVER_ERROR, "internal_error"),
            E::UpstreamRefused { .. } => {
                invalid(S::BAD_REQUEST, FaultKind::InvalidRequest.as_str())
            }
            E::Upstream { kind, .. } => match kind {
                FaultKind::RateLimited => {
                    Entry::new(S::TOO_MANY_REQUESTS, "rate_limit_error", kind.as_str())
                }
                FaultKind::Timeout => server(S::GATEWAY_TIMEOUT, kind.as_str()),
                _ => server(S::BAD_GATEWAY, kind.as_str()),
            },
        }
    }

    /// Whole seconds a client should wait before it tries again (`Retry-After`), for the
    /// errors that passing time can cure.
    fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ApiError::Overloaded { retry_after, .. } => Some(retry_after.as_secs().max(1)),
            // Rounded up: a client that waits this long passes.
            ApiError::RateLimited {
                retry_after: Some(wait),
                ..
            } => Some((wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)),
            ApiError::Upstream {
                retry_after: Some(wait),
                ..
            } => Some(wait.as_secs().max(1)),
            ApiError::QueueTimeout { .. }
            | ApiError::StateUnavailable
            | ApiError::QuotaHeld { .. } => Some(1),
            ApiError::InsufficientQuota { resets_in, .. } => Some(resets_in.as_secs().max(1)),
            ApiError::NotReady | ApiError::ShuttingDown => Some(5),
            _ => None,
        }
    }

    /// Stable snake_case label of this kind of error (the `code` in the body).
    pub fn kind(&self) -> &'static str {
        self.entry().code
    }

    /// The same error, naming `theirs` where it named `ours` (or a path under it): a
    /// route that takes the parameter under another name (llama.cpp's `/completion`).
    pub fn renamed(self, ours: &str, theirs: &str) -> Self {
        let rename = |param: String| match param.strip_prefix(ours) {
            Some(rest) if rest.is_empty() || rest.starts_with(['.', '[']) => {
                format!("{theirs}{rest}")
            }
            _ => param,
        };
        match self {
            ApiError::InvalidParameter { param, message } => ApiError::InvalidParameter {
                param: rename(param),
                message,
            },
            ApiError::UnsupportedParameter { param, reason } => ApiError::UnsupportedParameter {
                param: rename(param),
                reason,
            },
            other => other,
        }
    }

    /// [`ApiError::renamed`] for each pair of `renamed`, in order.
    pub fn renamed_all(self, renamed: &[(&str, &str)]) -> Self {
        renamed
            .iter()
            .fold(self, |e, (ours, theirs)| e.renamed(ours, theirs))
    }

    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidParameter { param, .. }
            | ApiError::UnsupportedParameter { param, .. }
            | ApiError::UnknownParameter(param) => Some(param),
            ApiError::ModelNotFound(_) => Some("model"),
            ApiError::RequestNotFound(_) => Some("id"),
            ApiError::UpstreamRefused { param, .. } => param.as_deref(),
            ApiError::ContextLengthExceeded { prompt_param, .. } => Some(prompt_param),
            _ => None,
        }
    }

    /// The body as OpenAI shapes it.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                error_type: self.entry().error_type,
                param: self.param(),
                code: self.kind(),
            },
        }
    }

    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidParameter {
            param: param.into(),
            message: message.into(),
        }
    }

    pub fn unsupported(param: impl Into<String>, reason: impl Into<String>) -> Self {
        ApiError::UnsupportedParameter {
            param: param.into(),
            reason: reason.into(),
        }
    }
}

/// OpenAI's error shape: every 4xx and 5xx answer has it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ErrorResponse)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub struct ErrorDetail<'a> {
    pub message: String,
    #[serde(rename = "type")]
    pub error_type: &'static str,
    pub param: Option<&'a str>,
    pub code: &'static str,
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.entry().status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if let Some(secs) = self.retry_after_secs() {
            response.insert_header((header::RETRY_AFTER, secs));
        }
        if let ApiError::MethodNotAllowed { allow } = self {
            response.insert_header((header::ALLOW, HeaderValue::from_static(allow)));
        }
        if matches!(self, ApiError::InsufficientQuota { .. }) {
            // The OpenAI SDKs retry a 429 unless told not to; only the next day or month
            // cures this one.
            response.insert_header(("x-should-retry", HeaderValue::from_static("false")));
        }
        if matches!(self, ApiError::MissingApiKey | ApiError::InvalidApiKey) {
            response.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
        }
        response.json(self.body())
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::NotReady => ApiError::NotReady,
            EngineError::ContextLengthExceeded {
                prompt_tokens,
                max_tokens,
                context_length,
                prompt_param,
            } => ApiError::ContextLengthExceeded {
                prompt_tokens,
                max_tokens,
                context_length,
                prompt_param,
            },
            EngineError::InvalidParameter { param, message } => {
                ApiError::InvalidParameter { param, message }
            }
            EngineError::Unsupported { param, reason } => {
                ApiError::UnsupportedParameter { param, reason }
            }
            // The engine's own message can carry internals: it is logged, not sent.
            EngineError::Rejected(_) | EngineError::Internal(_) => ApiError::Engine,
            EngineError::Upstream(Fault::Refused { param, message }) => {
                ApiError::UpstreamRefused { param, message }
            }
            EngineError::Upstream(fault) => ApiError::Upstream {
                kind: fault.kind(),
                retry_after: match fault {
                    Fault::RateLimited { retry_after } | Fault::Failed { retry_after, .. } => {
                        retry_after
                    }
                    _ => None,
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Retry-After` header of `response`, as sent.
    fn retry_after(response: &HttpResponse) -> Option<&[u8]> {
        response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.as_bytes())
    }

    #[test]
    fn body_has_openai_shape() {
        let error = ApiError::unsupported("n", "only n = 1 is served");
        let json = serde_json::to_value(error.body()).expect("serialise");
        assert_eq!(
            json,
            serde_json::json!({"error": {
                "message": "'n' is not supported by this server: only n = 1 is served",
                "type": "invalid_request_error",
                "param": "n",
                "code": "unsupported_parameter"
            }})
        );
    }

    #[test]
    fn table_statuses() {
        assert_eq!(
            ApiError::ModelNotFound("x".into()).status_code(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            ApiError::PayloadTooLarge { limit: 1 }.status_code(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        let overloaded = ApiError::Overloaded {
            limit: 4,
            retry_after: Duration::from_secs(1),
        };
        assert_eq!(overloaded.status_code(), StatusCode::TOO_MANY_REQUESTS);
        let response = overloaded.error_response();
        assert_eq!(retry_after(&response), Some(&b"1"[..]));
    }

    #[test]
    fn each_deadline_has_its_status_and_code() {
        let limit = Duration::from_secs(30);
        let cases = [
            (ApiError::BodyTimeout { limit }, 408, "body_timeout"),
            (ApiError::QueueTimeout { limit }, 503, "queue_timeout"),
            (ApiError::RequestTimeout { limit }, 504, "request_timeout"),
        ];
        for (error, status, code) in cases {
            assert_eq!(error.status_code().as_u16(), status);
            assert_eq!(error.kind(), code);
            assert!(error.to_string().contains("30 s"), "{error}");
            let retry_after = error
                .error_response()
                .headers()
                .contains_key(header::RETRY_AFTER);
            assert_eq!(retry_after, code == "queue_timeout", "{code}");
        }
    }

    #[test]
    fn rate_limits_answer_like_openai() {
        let spent = ApiError::RateLimited {
            unit: RateUnit::Tokens,
            limit: 600,
            requested: 200,
            retry_after: Some(Duration::from_millis(4200)),
        };
        let json = serde_json::to_value(spent.body()).expect("serialise");
        assert_eq!(json["error"]["type"], "tokens");
        assert_eq!(json["error"]["code"], "rate_limit_exceeded");
        assert!(json["error"]["message"].as_str().is_some_and(|m| m
            .contains("TPM): Limit 600, Requested 200")
            && m.ends_with("in 4.2s.")));
        let response = spent.error_response();
        assert_eq!(response.status().as_u16(), 429);
        assert_eq!(retry_after(&response), Some(&b"5"[..]), "rounded up");
        let never = ApiError::RateLimited {
            unit: RateUnit::Tokens,
            limit: 600,
            requested: 900,
            retry_after: None,
        };
        assert!(!never
            .error_response()
            .headers()
            .contains_key(header::RETRY_AFTER));
        assert!(never.to_string().starts_with("Request too large"));
    }

    #[test]
    fn upstream_faults_answer_in_openai_shape_without_their_words() {
        let refused = ApiError::from(EngineError::Upstream(Fault::Refused {
            param: Some("top_k".into()),
            message: "top_k must be at least 1".into(),
        }));
        let body = serde_json::to_value(refused.body()).expect("serialise");
        assert_eq!(refused.status_code(), StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["param"], "top_k");
        assert_eq!(body["error"]["code"], "upstream_invalid_request");
        assert!(body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("top_k must be at least 1")));

        let limited = ApiError::from(EngineError::Upstream(Fault::RateLimited {
            retry_after: Some(Duration::from_secs(9)),
        }));
        let response = limited.error_response();
        assert_eq!(response.status().as_u16(), 429);
        assert_eq!(retry_after(&response), Some(&b"9"[..]));
        for (fault, status) in [
            (Fault::Unreachable("refused by 10.9.8.7".into()), 502),
            (Fault::Auth { status: 401 }, 502),
            (
                Fault::Timeout {
                    waited: Duration::from_secs(60),
                    first_byte: true,
                },
                504,
            ),
            (Fault::Cut("eof at 10.9.8.7".into()), 502),
            (Fault::Protocol("bad json from 10.9.8.7".into()), 502),
        ] {
            let kind = fault.kind();
            let error = ApiError::from(EngineError::Upstream(fault));
            assert_eq!(error.status_code().as_u16(), status, "{kind}");
            assert_eq!(error.kind(), kind.as_str());
        }
    }

    #[test]
    fn engine_internals_are_not_sent() {
        let error = ApiError::from(EngineError::Internal("CUDA OOM at 0xdeadbeef".into()));
        assert!(!error.to_string().contains("deadbeef"));
        assert_eq!(error.kind(), "engine_error");
    }
}

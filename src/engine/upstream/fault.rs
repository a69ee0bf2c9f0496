//! What can go wrong with an upstream, and how each fault is told apart: from the
//! transport's error, or from the status and body of an answer that is not a stream.
//!
//! The client sees a fault as an OpenAI-shaped error (`error::ApiError::Upstream*`),
//! the metrics count it by its [`Fault::kind`] ([`FaultKind`]), and the semantic log
//! records that kind.
//! An upstream's own words reach the client only where they are about the client's
//! request (a 400 naming a parameter); an authentication failure or a server error may
//! echo credentials or internals, so those are logged and replaced by a fixed sentence.
//! Every text a fault carries is scrubbed ([`Fault::scrubbed`]) where it is made: no
//! secret the gateway holds, and nothing the redactor finds, is in it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

/// Longest upstream message passed to a client (a 400's explanation).
const MAX_MESSAGE_CHARS: usize = 500;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fault {
    /// No connection: refused, DNS, TLS, or the connect timeout.
    #[error("could not reach the upstream: {0}")]
    Unreachable(String),
    /// 401 or 403: the gateway's credentials are wrong or lack access.
    #[error("the upstream refused the gateway's credentials (HTTP {status})")]
    Auth { status: u16 },
    /// 429: passed on with the upstream's `Retry-After`.
    #[error("the upstream is rate-limiting the gateway")]
    RateLimited { retry_after: Option<Duration> },
    /// 5xx, or another status no client can fix.
    #[error("the upstream failed (HTTP {status}): {detail}")]
    Failed {
        status: u16,
        retry_after: Option<Duration>,
        /// For the log only.
        detail: String,
    },
    /// 400 or 422: the upstream refused this request; its reason is for the client.
    #[error("the upstream refused the request: {message}")]
    Refused {
        param: Option<String>,
        message: String,
    },
    /// Nothing arrived for `waited`: before the first byte, or between two.
    #[error("the upstream sent nothing for {} s{}", .waited.as_secs(), if *.first_byte { " (no first byte)" } else { " mid-stream" })]
    Timeout { waited: Duration, first_byte: bool },
    /// The stream ended before the answer did (no finish, no `[DONE]`).
    #[error("the upstream's stream ended before the answer did: {0}")]
    Cut(String),
    /// Bytes that are not OpenAI's streaming format: bad SSE, bad JSON, another shape.
    #[error("the upstream sent something that is not OpenAI's streaming format: {0}")]
    Protocol(String),
    /// The answer says another model made it than the one asked for.
    #[error("the upstream answered as model '{got}', not '{expected}'")]
    ModelMismatch { expected: String, got: String },
    /// An error event in the middle of a stream.
    #[error("the upstream reported an error mid-stream: {0}")]
    Stream(String),
}

/// The stable `error_type` of a fault: the label of its metrics, the kind its
/// records and attempts carry, the `code` of the client's error body. Each is spelled
/// once, in [`FaultKind::as_str`], and serialized as that spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(into = "&'static str")]
pub enum FaultKind {
    Unreachable,
    AuthFailed,
    RateLimited,
    /// A failure of the upstream's own (a 5xx, an error mid-stream).
    Error,
    InvalidRequest,
    Timeout,
    StreamCut,
    ProtocolError,
    ModelMismatch,
}

impl FaultKind {
    /// Every kind, so each series exists at zero.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Unreachable,
        FaultKind::AuthFailed,
        FaultKind::RateLimited,
        FaultKind::Error,
        FaultKind::InvalidRequest,
        FaultKind::Timeout,
        FaultKind::StreamCut,
        FaultKind::ProtocolError,
        FaultKind::ModelMismatch,
    ];

    /// The kind's one spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Unreachable => "upstream_unreachable",
            FaultKind::AuthFailed => "upstream_auth_failed",
            FaultKind::RateLimited => "upstream_rate_limited",
            FaultKind::Error => "upstream_error",
            FaultKind::InvalidRequest => "upstream_invalid_request",
            FaultKind::Timeout => "upstream_timeout",
            FaultKind::StreamCut => "upstream_stream_cut",
            FaultKind::ProtocolError => "upstream_protocol_error",
            FaultKind::ModelMismatch => "upstream_model_mismatch",
        }
    }
}

impl From<FaultKind> for &'static str {
    fn from(kind: FaultKind) -> Self {
        kind.as_str()
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Fault {
    /// The kind of this fault (metrics, semantic log, the body's `code`).
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Unreachable(_) => FaultKind::Unreachable,
            Fault::Auth { .. } => FaultKind::AuthFailed,
            Fault::RateLimited { .. } => FaultKind::RateLimited,
            Fault::Failed { .. } | Fault::Stream(_) => FaultKind::Error,
            Fault::Refused { .. } => FaultKind::InvalidRequest,
            Fault::Timeout { .. } => FaultKind::Timeout,
            Fault::Cut(_) => FaultKind::StreamCut,
            Fault::Protocol(_) => FaultKind::ProtocolError,
            Fault::ModelMismatch { .. } => FaultKind::ModelMismatch,
        }
    }

    /// A transport error, `waited` after the call began: no answer came at all. Only a
    /// connection that could not be made is `Unreachable` (the request never left); one
    /// that failed after the request was written (reset, closed) is `Cut`, and is not
    /// sent to that replica again (another may take it, while nothing of the answer has
    /// reached the client); a timeout says how long it waited.
    pub fn from_transport(error: &reqwest::Error, waited: Duration) -> Self {
        Self::transport(error, waited).scrubbed()
    }

    fn transport(error: &reqwest::Error, waited: Duration) -> Self {
        if error.is_connect() {
            return Fault::Unreachable(describe(error));
        }
        if error.is_timeout() {
            return Fault::Timeout {
                waited,
                first_byte: true,
            };
        }
        Fault::Cut(format!(
            "the connection failed before an answer: {}",
            describe(error)
        ))
    }

    /// An answer with a status other than 2xx, and its body (cut to a few KiB).
    pub fn from_answer(status: StatusCode, retry_after: Option<Duration>, body: &[u8]) -> Self {
        Self::answer(status, retry_after, body).scrubbed()
    }

    fn answer(status: StatusCode, retry_after: Option<Duration>, body: &[u8]) -> Self {
        use crate::secret::scrub;
        let said = Said::parse(body);
        match status.as_u16() {
            401 | 403 => Fault::Auth {
                status: status.as_u16(),
            },
            429 => Fault::RateLimited { retry_after },
            400 | 422 => Fault::Refused {
                param: said.param,
                // Scrubbed whole, then cut: a key across the cut would leave a prefix
                // neither the held secrets nor the redactor recognise.
                message: said
                    .message
                    .map(|m| scrub(&m).chars().take(MAX_MESSAGE_CHARS).collect())
                    .unwrap_or_else(|| format!("HTTP {status} without a reason")),
            },
            408 => Fault::Timeout {
                waited: Duration::ZERO,
                first_byte: true,
            },
            code => Fault::Failed {
                status: code,
                retry_after,
                detail: scrub(
                    &said
                        .message
                        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
                )
                .chars()
                .take(200)
                .collect(),
            },
        }
    }

    /// The fault with every text in it passed through [`crate::secret::scrub`]: an
    /// upstream's words may quote the key the gateway sent it, a URL's password, or a
    /// user's personal data, and they go on to the client, the log, spans and documents.
    pub fn scrubbed(self) -> Self {
        use crate::secret::{scrub, scrub_held};
        match self {
            // The gateway's own words about the operator's URL (a refused connection, a
            // stream that broke off): the replica's address stays.
            Fault::Unreachable(text) => Fault::Unreachable(scrub_held(&text)),
            Fault::Failed {
                status,
                retry_after,
                detail,
            } => Fault::Failed {
                status,
                retry_after,
                detail: scrub(&detail),
            },
            Fault::Refused { param, message } => Fault::Refused {
                param: param.map(|p| scrub(&p)),
                message: scrub(&message),
            },
            Fault::Cut(text) => Fault::Cut(scrub_held(&text)),
            Fault::Protocol(text) => Fault::Protocol(scrub(&text)),
            Fault::ModelMismatch { expected, got } => Fault::ModelMismatch {
                expected,
                got: scrub(&got),
            },
            Fault::Stream(text) => Fault::Stream(scrub(&text)),
            fault @ (Fault::Auth { .. } | Fault::RateLimited { .. } | Fault::Timeout { .. }) => {
                fault
            }
        }
    }

    /// Whether the request may be sent once more: it never reached the upstream.
    pub fn is_connect(&self) -> bool {
        matches!(self, Fault::Unreachable(_))
    }
}

/// What an error body says, in the shapes upstreams use: OpenAI's
/// `{"error": {"message", "param"}}`, vLLM's `{"object": "error", "message", "param"}`,
/// FastAPI's `{"detail": [{"loc": ["body", "x"], "msg"}]}` (llama.cpp's Python server),
/// TGI's `{"error": "...", "error_type"}`.
#[derive(Debug, Default, PartialEq)]
struct Said {
    message: Option<String>,
    param: Option<String>,
}

impl Said {
    fn parse(body: &[u8]) -> Self {
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            let text = String::from_utf8_lossy(body).trim().to_owned();
            return Said {
                message: (!text.is_empty()).then_some(text),
                param: None,
            };
        };
        let text = |v: &Value| v.as_str().map(str::to_owned);
        if let Some(error) = value.get("error") {
            if let Some(message) = text(error) {
                return Said {
                    message: Some(message),
                    param: None,
                };
            }
            return Said {
                message: error.get("message").and_then(text),
                param: error.get("param").and_then(text),
            };
        }
        if value.get("message").is_some() {
            return Said {
                message: value.get("message").and_then(text),
                param: value.get("param").and_then(text),
            };
        }
        match value.get("detail") {
            Some(Value::Array(items)) => {
                let first = items.first();
                let param = first
                    .and_then(|d| d.get("loc"))
                    .and_then(Value::as_array)
                    .map(|loc| {
                        loc.iter()
                            .skip_while(|p| p.as_str() == Some("body"))
                            .map(|p| match p {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            })
                            .collect::<Vec<_>>()
                            .join(".")
                    })
                    .filter(|p| !p.is_empty());
                Said {
                    message: first.and_then(|d| d.get("msg")).and_then(text),
                    param,
                }
            }
            Some(detail) => Said {
                message: text(detail),
                param: None,
            },
            None => Said::default(),
        }
    }
}

/// A transport error in a sentence, with its cause (refused, DNS, TLS...).
fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() {
        "the connection timed out".to_owned()
    } else {
        error.to_string()
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    // reqwest puts the URL in its message; it is the operator's, not a secret, but it
    // may carry credentials when written as user:password@host.
    strip_credentials(&text)
}

/// `scheme://user:password@host` spelled without the user and password.
pub fn strip_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"' || c == ')')
            .unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(user_end) => rest = &tail[user_end + 1..],
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

/// `Retry-After` as seconds (the HTTP-date form is read as "soon").
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    match value.trim().parse::<u64>() {
        Ok(secs) => Some(Duration::from_secs(secs.min(3600))),
        Err(_) => Some(Duration::from_secs(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that timed out says how long it waited (the probe said "0 s" after 10).
    #[tokio::test]
    async fn a_timeout_says_how_long_it_waited() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/v1/models", silent.local_addr().expect("addr"));
        let began = std::time::Instant::now();
        let error = reqwest::Client::new()
            .get(&url)
            .timeout(Duration::from_millis(1100))
            .send()
            .await
            .expect_err("nothing answers");
        let fault = Fault::from_transport(&error, began.elapsed());
        assert_eq!(
            fault.to_string(),
            "the upstream sent nothing for 1 s (no first byte)"
        );
        drop(silent);
    }

    #[test]
    fn each_error_body_shape_gives_its_message_and_param() {
        let said = |body: &str| Said::parse(body.as_bytes());
        assert_eq!(
            said(
                r#"{"error":{"message":"bad top_k","type":"invalid_request_error","param":"top_k"}}"#
            ),
            Said {
                message: Some("bad top_k".into()),
                param: Some("top_k".into())
            }
        );
        assert_eq!(
            said(
                r#"{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}"#
            ),
            Said {
                message: Some("too long".into()),
                param: None
            }
        );
        assert_eq!(
            said(r#"{"detail":[{"loc":["body","messages",0,"content"],"msg":"field required"}]}"#),
            Said {
                message: Some("field required".into()),
                param: Some("messages.0.content".into())
            }
        );
        assert_eq!(
            said(r#"{"error":"Input validation error: `top_k` must be > 0","error_type":"validation"}"#)
                .message
                .as_deref(),
            Some("Input validation error: `top_k` must be > 0")
        );
        assert_eq!(said("Bad Gateway").message.as_deref(), Some("Bad Gateway"));
    }

    #[test]
    fn statuses_map_to_faults() {
        let body = br#"{"error":{"message":"Incorrect API key provided: sk-abc","param":null}}"#;
        let auth = Fault::from_answer(StatusCode::UNAUTHORIZED, None, body);
        // The body, which may echo the key, is not kept at all.
        assert_eq!(auth, Fault::Auth { status: 401 });
        let limited = Fault::from_answer(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(7)),
            b"",
        );
        assert_eq!(
            limited,
            Fault::RateLimited {
                retry_after: Some(Duration::from_secs(7))
            }
        );
        let refused = Fault::from_answer(
            StatusCode::BAD_REQUEST,
            None,
            br#"{"error":{"message":"top_k must be positive","param":"top_k"}}"#,
        );
        assert_eq!(
            refused,
            Fault::Refused {
                param: Some("top_k".into()),
                message: "top_k must be positive".into()
            }
        );
        let failed = Fault::from_answer(StatusCode::BAD_GATEWAY, None, b"oops");
        assert_eq!(failed.kind().as_str(), "upstream_error");
        assert!(FaultKind::ALL.contains(&failed.kind()));
    }

    #[test]
    fn each_kind_serializes_as_its_one_spelling() {
        for kind in FaultKind::ALL {
            let json = serde_json::to_value(kind).expect("a string");
            assert_eq!(json, kind.as_str());
            assert_eq!(kind.to_string(), kind.as_str());
        }
        assert_eq!(FaultKind::StreamCut.as_str(), "upstream_stream_cut");
    }

    #[test]
    fn credentials_in_urls_are_left_out() {
        assert_eq!(
            strip_credentials("error sending request for url (http://bob:s3cret@host:8000/v1/x)"),
            "error sending request for url (http://host:8000/v1/x)"
        );
        assert_eq!(strip_credentials("http://host/v1"), "http://host/v1");
    }
}

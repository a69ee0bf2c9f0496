//! What the handlers' `#[utoipa::path]` annotations say they answer besides their
//! success bodies: the error statuses of each kind of route, with OpenAI's error body,
//! and the event of a stream. Descriptions only, read by [`super::openapi`]; a leaf of
//! `api`, so the handlers and the document that lists them need not know each other.

use std::collections::BTreeMap;

use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, ToSchema};

use crate::error::ErrorBody;

// OpenAPI 3.1 describes an event stream by the schema of each event, read as an object of
// its fields (`data`, `event`, `id`, `retry`); schemathesis checks every event against it,
// so the stream's media type names this rather than a string. A description only:
// crate::stream::producer writes the events.
/// One event of a streamed answer (`text/event-stream`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ServerSentEvent {
    /// A `CompletionChunk` as JSON (an error body for a failure mid-stream), or `[DONE]`,
    /// the last event.
    data: String,
}

/// The error statuses of the generation routes, each with OpenAI's error body.
pub struct GenerationErrors;

impl IntoResponses for GenerationErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[
            (400, "Invalid JSON, an invalid, unknown or unsupported parameter, or the prompt and budget over the context; `param` names it"),
            (401, "A key is needed (the gateway has keys) or the key is not valid"),
            (404, "`model` is not served"),
            (405, "Only POST"),
            (408, "The body did not arrive in time"),
            (413, "The body is over `server.max_body_bytes`"),
            (415, "The body is not `application/json`"),
            (429, "Too many requests in flight, or the key's rate limit (Retry-After)"),
            (500, "The engine failed; logged with the request id"),
            (502, "The upstream failed, refused the gateway's key or broke its stream"),
            (503, "The model is loading, the queue wait ran out, or the gateway is stopping (Retry-After)"),
            (504, "The request deadline, or an upstream's timeout"),
        ])
    }
}

/// The error statuses of `/tokenize` and `/detokenize`.
pub struct TokenErrors;

impl IntoResponses for TokenErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[
            (400, "Invalid JSON or parameter; `param` names it"),
            (401, "A key is needed or is not valid"),
            (404, "`model` is not served"),
            (405, "Only POST"),
            (408, "The body did not arrive in time"),
            (413, "The body is over `server.max_body_bytes`"),
            (415, "The body is not `application/json`"),
            (500, "The engine failed"),
            (502, "The upstream failed"),
            (503, "The model is loading (Retry-After)"),
            (504, "An upstream's timeout"),
        ])
    }
}

/// The error statuses of a route read with GET or HEAD that is open to every client.
pub struct GetErrors;

impl IntoResponses for GetErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[(405, ONLY_GET)])
    }
}

/// The error statuses of a route read with GET or HEAD that needs a key when the
/// gateway has keys.
pub struct KeyedGetErrors;

impl IntoResponses for KeyedGetErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[(401, "A key is needed or is not valid"), (405, ONLY_GET)])
    }
}

/// 405 of the routes read with GET or HEAD.
const ONLY_GET: &str = "Only GET and HEAD";

/// Responses with OpenAI's error body, by status.
fn errors(statuses: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    let body = || {
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(ErrorBody::name())))
            .build()
    };
    statuses
        .iter()
        .map(|&(status, description)| {
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body())
                .build();
            (status.to_string(), response.into())
        })
        .collect()
}

//! Reading a request's body: JSON only, and no more than the limit, refused as soon as
//! it is known to be over it. Shared by the generation and token routes.

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use bytes::BytesMut;
use futures_util::StreamExt;

use crate::error::ApiError;

/// Only JSON bodies are read: a web page can make a browser post a form or plain text
/// to a gateway on localhost without asking (a "simple" cross-site request), never JSON.
pub fn json_content_type(req: &HttpRequest) -> Result<(), ApiError> {
    let value = req
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mime = value.split(';').next().unwrap_or_default().trim();
    if mime.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    let shown = if value.is_empty() {
        "no Content-Type".to_owned()
    } else {
        format!("'{}'", value.chars().take(100).collect::<String>())
    };
    Err(ApiError::UnsupportedMediaType(shown))
}

/// Reads the body, refusing it with 413 as soon as it is known to be over `limit`.
pub async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<BytesMut, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(1024).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::InvalidJson(format!("the body could not be read: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

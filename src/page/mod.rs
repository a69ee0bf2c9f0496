//! The built-in page at `GET /`: a playground whose answer streams in token by token,
//! the timeline of that answer (each token at its arrival time, TTFT, inter-token gaps,
//! the server's `timings` beside what the browser measured) and a live view of the
//! gateway (`GET /stats`). docs/page.md describes it for its users.
//!
//! Hand-written files (one HTML file, two scripts, a style sheet, an icon), compiled
//! into the binary: the page works offline and loads nothing from another origin. No
//! framework and no build step: the page is small enough to read whole, and a bundler
//! would be one more toolchain on every machine that builds the gateway. The Content-Security-Policy allows scripts, styles, images
//! and connections from this origin only, no inline script or style, no frames.
//!
//! The page needs no key to load (it holds no data); what it asks for (`/v1/*`,
//! `/stats`) is guarded as any client's request is, with the key the person types,
//! kept in the tab's `sessionStorage` only. `server.page = false` turns it off (404).
//! Its routes are in [`crate::routes`].

use actix_web::http::header;
use actix_web::{web, HttpResponse};

use crate::api::AppState;
use crate::error::ApiError;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/page.js");
const TIMELINE: &str = include_str!("assets/timeline.js");
const STYLE: &str = include_str!("assets/page.css");
const ICON: &str = include_str!("assets/icon.svg");

/// Same origin only, for everything; nothing inline; no frames, forms or base changes.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

fn asset(
    state: &AppState,
    content_type: &'static str,
    body: &'static str,
) -> Result<HttpResponse, ApiError> {
    if !state.page {
        return Err(ApiError::NotFound);
    }
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, content_type))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // Built into the binary: a new build is a new page, so the browser revalidates.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body))
}

pub async fn index(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/html; charset=utf-8", INDEX)
}

pub async fn script(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/javascript; charset=utf-8", SCRIPT)
}

pub async fn timeline(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/javascript; charset=utf-8", TIMELINE)
}

pub async fn style(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/css; charset=utf-8", STYLE)
}

pub async fn icon(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "image/svg+xml", ICON)
}

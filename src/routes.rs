//! The route table: every path each listener serves and its handler, in one place. The
//! API's routes are what `/openapi.json` describes (tests/openapi.rs reads [`api`] here
//! and compares); the page's are beside them, not part of that description. Neither
//! `api` nor `page` knows the other's routes.

use actix_web::http::Method;
use actix_web::{web, FromRequest, Handler, Resource, Responder};

use crate::api::{generation, llamacpp, meta, openapi, stats, tokens};
use crate::error::ApiError;
use crate::page;

/// The API listener: the API, the page, and `/metrics` only when `metrics` (otherwise it
/// has its own listener, [`configure_metrics`]). Any other path is a 404.
pub fn configure(cfg: &mut web::ServiceConfig, metrics: bool) {
    api(cfg, metrics);
    page(cfg);
    cfg.default_service(web::to(not_found));
}

/// The API's routes.
fn api(cfg: &mut web::ServiceConfig, metrics: bool) {
    cfg.service(only(
        POST,
        "/v1/chat/completions",
        generation::chat_completions,
    ))
    .service(only(POST, "/v1/completions", generation::completions))
    // Without `/v1`, as llama.cpp's server and many clients call them.
    .service(only(
        POST,
        "/chat/completions",
        generation::chat_completions,
    ))
    .service(only(POST, "/completions", generation::completions))
    .service(only(GET, "/models", meta::list_models))
    .service(only(GET, "/models/{id}", meta::get_model))
    // llama.cpp's server's own routes (`api::llamacpp`).
    .service(only(POST, "/completion", generation::native_completion))
    .service(only(GET, "/props", llamacpp::meta::props))
    .service(only(GET, "/slots", llamacpp::meta::slots_list))
    .service(only(POST, "/apply-template", tokens::apply_template))
    .service(only(POST, "/tokenize", tokens::tokenize))
    .service(only(POST, "/detokenize", tokens::detokenize))
    .service(only(GET, "/v1/models", meta::list_models))
    .service(only(GET, "/v1/models/{id}", meta::get_model))
    .service(only(GET, "/health", meta::health))
    .service(only(GET, "/ready", meta::ready))
    .service(only(GET, "/openapi.json", openapi::openapi_json))
    .service(only(GET, "/stats", stats::stats))
    .service(only(GET, "/stats/requests/{id}", stats::request));
    if metrics {
        cfg.service(only(GET, "/metrics", meta::metrics));
    }
}

/// The page: its HTML and assets; each answers 404 when the page is off.
fn page(cfg: &mut web::ServiceConfig) {
    cfg.service(only(GET, "/", page::index))
        .service(only(GET, "/page/page.js", page::script))
        .service(only(GET, "/page/timeline.js", page::timeline))
        .service(only(GET, "/page/page.css", page::style))
        .service(only(GET, "/page/icon.svg", page::icon));
}

/// A metrics listener: the scrape and the liveness probe.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    cfg.service(only(GET, "/metrics", meta::metrics))
        .service(only(GET, "/health", meta::health))
        .default_service(web::to(not_found));
}

/// `path` answered by `handler` for the methods `allow` lists (as the `Allow` header
/// writes them); any other method is 405 with that header.
fn only<F, Args>(allow: &'static str, path: &str, handler: F) -> Resource
where
    F: Handler<Args>,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    let resource = allow
        .split(", ")
        .fold(web::resource(path), |resource, name| {
            // The names are this file's own literals.
            let method = Method::from_bytes(name.as_bytes()).unwrap_or(Method::GET);
            resource.route(web::method(method).to(handler.clone()))
        });
    resource.default_service(web::to(move || not_allowed(allow)))
}

const POST: &str = "POST";
const GET: &str = "GET, HEAD";

async fn not_allowed(allow: &'static str) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed { allow })
}

async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

//! The OpenAPI 3.1 description of this HTTP API, served at `GET /openapi.json`.
//!
//! Derived, not written: the request schemas are the wire structs the parsers read
//! (`api::request`), the response schemas the structs the handlers serialise (the
//! chunks, `timings`, the error body, the model objects), and each route's statuses
//! sit on its handler (`#[utoipa::path]`). tests/openapi.rs keeps it honest: every
//! route the route table serves is described, every described one is served, every
//! reference resolves. Schemathesis (tests/python/test_openapi.py) then checks the
//! running server against it: statuses, error shapes and response bodies.
//!
//! Served per gateway: `model` is an enum of the served ids, so a client generated from
//! the description (or a fuzzer) names a real one.

use actix_web::{web, HttpResponse};
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::responses::ServerSentEvent;
use super::AppState;
use crate::engine::served::ModelPolicy;
use crate::error::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "llmgate",
        description = "OpenAI-compatible LLM serving gateway that measures every request: \
            TTFT, TPOT, inter-token latency, repetition, refusals and confidence come back \
            in each answer's `timings` object.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        super::generation::chat_completions,
        super::generation::completions,
        super::generation::native_completion,
        super::llamacpp::meta::props,
        super::llamacpp::meta::slots_list,
        super::tokens::tokenize,
        super::tokens::detokenize,
        super::tokens::apply_template,
        super::meta::list_models,
        super::meta::get_model,
        super::meta::health,
        super::meta::ready,
        super::meta::metrics,
        super::stats::stats,
        super::stats::request,
        openapi_json,
    ),
    components(schemas(
        crate::stream::chunks::Chunk,
        ErrorBody,
        ServerSentEvent,
        super::tokens::Piece
    )),
    modifiers(&BearerKeys),
    tags(
        (name = "generation", description = "OpenAI's chat and legacy completions, streamed or not"),
        (name = "tokens", description = "vLLM's /tokenize and /detokenize (with llama.cpp's fields)"),
        (name = "llama.cpp", description = "llama.cpp's server's own routes, for its clients"),
        (name = "models", description = "The served models"),
        (name = "operations", description = "Probes, metrics and this description"),
    )
)]
pub struct ApiDoc;

/// `Authorization: Bearer <key>` when the gateway has keys (`--api-keys-file`);
/// without them the routes are open.
struct BearerKeys;

impl Modify for BearerKeys {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API key from the gateway's keys file; routes are open when it has none.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The description as JSON for the models in `served`: `model` is one of their ids,
/// and the completion budget at most the smallest of their caps.
pub fn document(served: &[ModelPolicy]) -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or(Value::Null);
    let ids: Vec<Value> = served.iter().map(|m| Value::from(m.id.as_str())).collect();
    let cap = served
        .iter()
        .map(|m| m.max_tokens_cap)
        .min()
        .unwrap_or(u32::MAX);
    let mut set = |schema: &str, property: &str, key: &str, value: Value| {
        let pointer = format!("/components/schemas/{schema}/properties/{property}");
        if let Some(Value::Object(property)) = doc.pointer_mut(&pointer) {
            property.insert(key.to_owned(), value);
        }
    };
    for schema in [
        "GenerationParameters",
        "TokenizeRequest",
        "DetokenizeRequest",
    ] {
        set(schema, "model", "enum", Value::Array(ids.clone()));
    }
    for (schema, budget) in [
        ("GenerationParameters", "max_tokens"),
        ("GenerationParameters", "min_tokens"),
        ("ChatParameters", "max_completion_tokens"),
    ] {
        set(schema, budget, "maximum", Value::from(cap));
    }
    add_unversioned(&mut doc);
    doc
}

/// The routes served without `/v1` too (`/chat/completions`, `/models`: llama.cpp's
/// server and many clients call them so), described as what they are: the same
/// operations, under operation ids of their own.
fn add_unversioned(doc: &mut Value) {
    let Some(Value::Object(paths)) = doc.get_mut("paths") else {
        return;
    };
    let aliases: Vec<(String, Value)> = UNVERSIONED
        .iter()
        .filter_map(|path| {
            let mut item = paths.get(&format!("/v1{path}"))?.clone();
            for operation in item.as_object_mut()?.values_mut() {
                if let Some(Value::String(id)) = operation.get_mut("operationId") {
                    id.push_str("_unversioned");
                }
                if let Some(Value::String(summary)) = operation.get_mut("summary") {
                    summary.push_str(" (without /v1)");
                }
            }
            Some(((*path).to_owned(), item))
        })
        .collect();
    paths.extend(aliases);
}

/// The `/v1/...` routes also served without the prefix.
const UNVERSIONED: [&str; 4] = [
    "/chat/completions",
    "/completions",
    "/models",
    "/models/{id}",
];

/// This description.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1, JSON", content_type = "application/json", body = Object)),
)]
pub async fn openapi_json(state: web::Data<AppState>) -> HttpResponse {
    let body = state.openapi.get_or_init(|| {
        serde_json::to_vec(&document(&state.limits.models))
            .unwrap_or_default()
            .into()
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body.clone())
}

//! `/openapi.json` describes exactly the routes served, in a document whose references
//! all resolve, with `model` narrowed to the served ids.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::engine::scripted::Script;
use serde_json::Value;

async fn document(server: &TestServer) -> Value {
    let response = reqwest::get(server.url("/openapi.json"))
        .await
        .expect("openapi.json");
    assert_eq!(response.status(), 200);
    response.json().await.expect("JSON")
}

/// The (method, path) pairs the API's route table (`routes::api`) serves, read from its
/// source: the route table is code, and this is the one place that lists it.
fn routes_in_table() -> BTreeSet<(String, String)> {
    let source = include_str!("../src/routes.rs");
    let table = &source[source.find("fn api(").expect("the API's routes")..];
    let table = &table[..table.find("\n}\n").expect("end of the API's routes")];
    let mut routes = BTreeSet::new();
    for call in table.split("only(").skip(1) {
        let mut parts = call.splitn(3, ',');
        let method = parts.next().expect("method").trim();
        let path = parts.next().expect("path").trim().trim_matches('"');
        let method = match method {
            "POST" => "post",
            "GET" => "get",
            other => panic!("unknown method constant {other}"),
        };
        routes.insert((method.to_owned(), path.to_owned()));
    }
    routes
}

fn routes_described(doc: &Value) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            routes.insert((method.clone(), path.clone()));
        }
    }
    routes
}

fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                found.push(r);
            }
            map.values().for_each(|v| refs(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
        _ => {}
    }
}

#[tokio::test]
async fn the_description_covers_every_route_and_only_those() {
    let script = Script::tokens(&["Hi"], Duration::ZERO);
    let server = TestServer::builder(Arc::new(scripted(script)))
        .start()
        .await;
    let doc = document(&server).await;
    assert!(doc["openapi"].as_str().expect("version").starts_with("3.1"));

    let mut table = routes_in_table();
    // /metrics is on the API listener unless it has one of its own.
    table.insert(("get".into(), "/metrics".into()));
    assert_eq!(routes_described(&doc), table);

    // Each described route is served: no fallback 404 (`not_found`) for any of them.
    let client = reqwest::Client::new();
    for (method, path) in routes_described(&doc) {
        let url = server.url(&path.replace("{id}", "test-model"));
        let request = match method.as_str() {
            "get" => client.get(url),
            _ => client.post(url).json(&serde_json::json!({})),
        };
        let response = request.send().await.expect("request");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_ne!(
            body["error"]["code"], "not_found",
            "{method} {path}: {status}"
        );
    }
}

#[tokio::test]
async fn every_reference_resolves_and_model_is_a_served_id() {
    let server = TestServer::builder(Arc::new(scripted(Script::tokens(&["Hi"], Duration::ZERO))))
        .start()
        .await;
    let doc = document(&server).await;
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(!found.is_empty());
    for r in found {
        assert!(
            doc.pointer(&r.replacen('#', "", 1)).is_some(),
            "{r} does not resolve"
        );
    }
    for schema in [
        "GenerationParameters",
        "TokenizeRequest",
        "DetokenizeRequest",
    ] {
        let model = &doc["components"]["schemas"][schema]["properties"]["model"];
        assert_eq!(model["enum"], serde_json::json!(["test-model"]), "{schema}");
    }
    // A streamed answer is described event by event, as OpenAPI 3.1 reads a stream's
    // schema: an object whose `data` is a string (a chunk as JSON, or `[DONE]`), not the
    // whole stream as one string, which every event would violate.
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let stream =
            &doc["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"];
        let event = doc
            .pointer(
                &stream["schema"]["$ref"]
                    .as_str()
                    .expect(path)
                    .replacen('#', "", 1),
            )
            .expect("the event schema");
        assert_eq!(event["type"], "object", "{path}");
        assert_eq!(event["required"], serde_json::json!(["data"]), "{path}");
        assert_eq!(event["properties"]["data"]["type"], "string", "{path}");
    }
    // The extensions and the error shape are described.
    let common = &doc["components"]["schemas"]["GenerationParameters"]["properties"];
    for extension in [
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
        "min_tokens",
    ] {
        assert!(common.get(extension).is_some(), "{extension}");
    }
    let timings = serde_json::to_string(&doc["components"]["schemas"]).expect("schemas");
    for field in [
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "repetition_rate",
        "low_confidence_share",
    ] {
        assert!(timings.contains(field), "{field}");
    }
    let error = &doc["components"]["schemas"]["Error"]["properties"];
    for field in ["message", "type", "param", "code"] {
        assert!(error.get(field).is_some(), "{field}");
    }
}

//! An upstream's error text never carries a secret out: a replica that quotes the key
//! the gateway sent it (and a user's card number) in a 400, a 500 and an error event
//! inside its stream. The client's answer, every log line and every request record are
//! searched for each planted value.

mod common;

use std::net::TcpListener;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use common::chat_body;
use common::logs::captured_logs;
use common::upstream::{gateway, upstream_config};
use llmgate::secret::Secret;
use serde_json::{json, Value};

const KEY: &str = "upstream-key-7TqZ1pXw9LmN3bVc";
const CARD: &str = "4111 1111 1111 1111";

/// A replica that echoes what it was given, as careless servers do: the prompt's
/// `fault:<kind>` picks the answer.
async fn careless(request: HttpRequest, body: web::Json<Value>) -> HttpResponse {
    let key = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim_start_matches("Bearer ")
        .to_owned();
    let prompt = body["messages"][0]["content"].as_str().unwrap_or_default();
    let said = format!("rejected for key {key} and card {CARD}");
    match prompt {
        "fault:400" => HttpResponse::BadRequest()
            .json(json!({"error": {"message": said, "param": "messages", "type": "invalid_request_error"}})),
        "fault:500" => HttpResponse::InternalServerError().body(format!("panic: {said}")),
        _ => {
            let chunk = json!({"id": "x", "object": "chat.completion.chunk", "model": "scripted",
                "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]});
            let stream = format!(
                "data: {chunk}\n\nevent: error\ndata: {{\"message\": \"{said}\"}}\n\n"
            );
            HttpResponse::Ok()
                .content_type("text/event-stream")
                .body(stream)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_of_the_gateway_leaves_through_an_upstreams_error_text() {
    let logs = captured_logs();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let server =
        HttpServer::new(|| App::new().route("/v1/chat/completions", web::post().to(careless)))
            .listen(listener)
            .expect("listen")
            .workers(1)
            .run();
    let handle = server.handle();
    tokio::spawn(server);

    let mut config = upstream_config(&url);
    config.api_key = Some(Secret::new(KEY));
    config.check_model = false;
    let gw = gateway(config).await;
    let client = reqwest::Client::new();
    let mut answers = String::new();
    for (prompt, stream) in [
        ("fault:400", false),
        ("fault:500", false),
        ("fault:event", true),
    ] {
        let response = client
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body(prompt, json!({"stream": stream})))
            .send()
            .await
            .expect("send");
        answers.push_str(&response.text().await.expect("body"));
    }
    // The refusal still says what the upstream refused, without the secrets.
    assert!(answers.contains("rejected for key <SECRET>"), "{answers}");
    let records = format!("{:?}", gw.observer.records());
    let logged = String::from_utf8_lossy(&logs.lock().expect("logs")).into_owned();
    for (place, text) in [
        ("answers", &answers),
        ("records", &records),
        ("logs", &logged),
    ] {
        for planted in [KEY, CARD, "4111111111111111"] {
            assert!(!text.contains(planted), "{planted} in the {place}: {text}");
        }
    }
    handle.stop(false).await;
}

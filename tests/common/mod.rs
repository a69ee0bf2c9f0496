//! Shared harness for black-box tests: the real HTTP server on 127.0.0.1:0 with an
//! injected engine, clock and observer ([`server`]), and the requests, answers and waits
//! every test file uses.
#![allow(dead_code)]

pub mod es;
pub mod logs;
pub mod otlp;
pub mod server;
pub mod upstream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use llmgate::config::{Config, ServeArgs, DEFAULT_MODEL_PATH};
use llmgate::engine::scripted::{Script, ScriptedEngine};
use llmgate::engine::ModelInfo;
use serde_json::Value;

pub use server::TestServer;

/// A loopback port free now, for a process to listen on later, never one this test
/// process handed out before: the kernel may give a port back as soon as the probe closes,
/// and two ports drawn before either is listened on were once the same (CI, issue 60).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().expect("lock");
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The id test gateways serve their model as.
pub const MODEL: &str = "test-model";

/// The config of a gateway serving [`MODEL`] from the scripted engine. Its model path
/// names no known model file, so no model card's defaults apply (docs/defaults.md):
/// a request gets what it asks for, and the degeneration guard is off unless a test
/// turns it on.
pub fn test_config(toml: &str) -> Config {
    let base = format!("[engine]\nmodel_id = \"{MODEL}\"\nmodel_path = \"scripted.gguf\"\n");
    let text = if toml.contains("[engine]") {
        toml.replace("[engine]", &base)
    } else {
        format!("{base}{toml}")
    };
    Config::from_toml(&ServeArgs::default(), &text).expect("test config")
}

/// The default model's file (for the tests that run the real model).
pub fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_MODEL_PATH);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model",
        path.display()
    );
    path
}

/// The scripted model: [`MODEL`], `context_length` tokens of context, fingerprint
/// `fp_test`.
pub fn model_info(context_length: u32) -> ModelInfo {
    ModelInfo {
        id: MODEL.into(),
        context_length,
        system_fingerprint: "fp_test".into(),
        ..ModelInfo::default()
    }
}

/// The scripted engine with a 64-token context: small enough to test its limits.
pub fn scripted(default: Script) -> ScriptedEngine {
    ScriptedEngine::new(model_info(64), default)
}

/// The scripted engine's usual answer: "Hello!" in three tokens, at once.
pub fn hello() -> Script {
    Script::tokens(&["Hel", "lo", "!"], Duration::ZERO)
}

/// The scripted engine answering [`hello`].
pub fn hello_engine() -> Arc<ScriptedEngine> {
    Arc::new(scripted(hello()))
}

/// The scripted engine with an 8192-token context, for long answers.
pub fn scripted_long(default: Script) -> ScriptedEngine {
    ScriptedEngine::new(model_info(8192), default)
}

/// A chat request for [`MODEL`] of one user turn saying `content`, with `extra`'s fields
/// added.
pub fn chat_body(content: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

/// The chat route.
pub const CHAT: &str = "/v1/chat/completions";

/// The legacy completions route.
pub const COMPLETIONS: &str = "/v1/completions";

/// POSTs `body` as JSON to `path` with the request id `t1`, so that the answer's id is
/// known (`chatcmpl-t1`, `cmpl-t1`).
pub async fn post(server: &TestServer, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(server.url(path))
        .header("x-request-id", "t1")
        .json(body)
        .send()
        .await
        .expect("request")
}

/// [`post`], then the answer's body as JSON.
pub async fn post_json(server: &TestServer, path: &str, body: &Value) -> Value {
    post(server, path, body).await.json().await.expect("json")
}

/// POSTs a chat request that must succeed: its answer, after a 200 (the answer shown
/// if not).
pub async fn chat_ok(server: &TestServer, body: &Value) -> Value {
    let response = post(server, CHAT, body).await;
    let status = response.status();
    let answer: Value = response.json().await.expect("json");
    assert_eq!(status, 200, "{answer}");
    answer
}

/// [`post`], then the answer's body as text.
pub async fn post_text(server: &TestServer, path: &str, body: &Value) -> String {
    post(server, path, body).await.text().await.expect("body")
}

/// GETs `path`, with `key` as the bearer token where there is one.
pub async fn get_with_key(server: &TestServer, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(server.url(path));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("request")
}

/// POSTs `body` as JSON to `path`, with `key` as the bearer token where there is one
/// (and no request id of its own, unlike [`post`]).
pub async fn post_with_key(
    server: &TestServer,
    path: &str,
    body: &Value,
    key: Option<&str>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new().post(server.url(path)).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("request")
}

/// The JSON chunks of an SSE body, `[DONE]` left out.
pub fn chunks_of(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).expect("chunk"))
        .collect()
}

/// The server's `/metrics` text.
/// `GET path` of the server, its body as JSON.
pub async fn get_json(server: &TestServer, path: &str) -> Value {
    reqwest::get(server.url(path))
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

pub async fn metrics(server: &TestServer) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// What the server's `/ready` says of the semantic log.
pub async fn semlog_status(server: &TestServer) -> serde_json::Value {
    let ready: serde_json::Value = reqwest::get(server.url("/ready"))
        .await
        .expect("ready")
        .json()
        .await
        .expect("json");
    ready["semlog"].clone()
}

/// Polls `cond` every 10 ms until it holds (true) or `seconds` have passed (false).
pub async fn eventually(seconds: u64, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..seconds * 100 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// A `/v1/completions` answer's choices as (index, text), in the order they came.
pub fn indexed_texts(answer: &Value) -> Vec<(u64, &str)> {
    answer["choices"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(|c| {
            (
                c["index"].as_u64().expect("index"),
                c["text"].as_str().expect("text"),
            )
        })
        .collect()
}

//! Shared harness for black-box tests: the real HTTP server on 127.0.0.1:0 with an
//! injected engine, clock and observer.
#![allow(dead_code)]

pub mod es;
pub mod logs;
pub mod otlp;
pub mod upstream;

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::ServerHandle;
use actix_web::web;
use llmgate::clock::{ManualClock, MonotonicClock, SharedClock};
use llmgate::config::{Config, ServeArgs};
use llmgate::engine::scripted::{Script, ScriptedEngine};
use llmgate::engine::served::ServedModels;
use llmgate::engine::ModelInfo;
use llmgate::record::{CollectingObserver, FanOut, LogObserver, RequestObserver};
use llmgate::semlog::indexer::Pacing;
use llmgate::semlog::Semlog;
use llmgate::telemetry::metrics::Metrics;
use llmgate::telemetry::trace::{TraceSettings, Tracing};
use llmgate::telemetry::Telemetry;
use llmgate::AppState;

pub const MODEL: &str = "test-model";

pub struct TestServer {
    pub base: String,
    pub observer: Arc<CollectingObserver>,
    pub telemetry: Arc<Telemetry>,
    /// The semantic-log pipeline, when the server was started with one.
    pub semlog: Option<Arc<Semlog>>,
    /// What the handlers share: admission, the drain, limits.
    pub state: web::Data<AppState>,
    handle: ServerHandle,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn stop(self) {
        self.handle.stop(false).await;
    }

    /// Stops like the binary does: HTTP first, then the semantic log drains (to the
    /// cluster or the spool), then traces are flushed.
    pub async fn shut_down(self) {
        self.handle.stop(true).await;
        if let Some(semlog) = &self.semlog {
            semlog.shutdown(std::time::Duration::from_secs(10)).await;
        }
        self.telemetry.shutdown();
    }
}

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

/// The scripted engine with an 8192-token context, for long answers.
pub fn scripted_long(default: Script) -> ScriptedEngine {
    ScriptedEngine::new(model_info(8192), default)
}

/// Starts the server with the monotonic clock.
pub async fn start(engine: impl Into<llmgate::engine::Front>, config: &Config) -> TestServer {
    start_with_clock(engine, config, Arc::new(MonotonicClock::new())).await
}

/// Starts the server with a frozen clock, for byte-exact responses.
pub async fn start_frozen(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
) -> TestServer {
    start_with_clock(engine, config, Arc::new(ManualClock::new())).await
}

pub async fn start_with_clock(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
    clock: SharedClock,
) -> TestServer {
    let observer = Arc::new(CollectingObserver::default());
    let telemetry = Telemetry::without_traces(MODEL, observer.clone());
    start_with_telemetry(engine, config, clock, observer, telemetry).await
}

/// Starts the server exporting traces over OTLP/gRPC to `endpoint`, sampled as `config`'s
/// `[telemetry]` table says.
pub async fn start_traced(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
    endpoint: &str,
) -> TestServer {
    start_with(engine, config, Some(endpoint), None).await
}

/// Pacing for tests: small batches soon, quick retries.
pub const TEST_PACING: Pacing = Pacing {
    batch_docs: 500,
    batch_bytes: 5 << 20,
    batch_age: std::time::Duration::from_millis(50),
    base_backoff: std::time::Duration::from_millis(20),
    max_backoff: std::time::Duration::from_millis(200),
    attempts: 3,
};

/// Starts the server with the request log line, optionally traces to `otlp` and the
/// semantic-log pipeline as `config`'s `[semlog]` table says (when `semlog` is given).
pub async fn start_with(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
    otlp: Option<&str>,
    semlog: Option<Pacing>,
) -> TestServer {
    let open = llmgate::auth::Guard::default();
    start_with_guard(engine, config, otlp, semlog, open).await
}

/// [`start_with`], with API keys.
pub async fn start_with_guard(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
    otlp: Option<&str>,
    semlog: Option<Pacing>,
    guard: llmgate::auth::Guard,
) -> TestServer {
    let observer = Arc::new(CollectingObserver::default());
    let metrics = Arc::new(Metrics::new(MODEL));
    let settings = TraceSettings::from(&config.telemetry);
    let tracing = otlp
        .map(|endpoint| Tracing::grpc(endpoint, &settings, Arc::clone(&metrics)).expect("tracing"));
    let semlog = semlog.map(|pacing| {
        Arc::new(Semlog::start(&config.semlog, Arc::clone(&metrics), pacing).expect("semlog"))
    });
    // The request log line too, so log lines can be checked against spans.
    let mut observers: Vec<Arc<dyn RequestObserver>> =
        vec![observer.clone(), Arc::new(LogObserver)];
    if let Some(semlog) = &semlog {
        observers.push(semlog.clone());
    }
    let telemetry = Arc::new(Telemetry::new(
        metrics,
        tracing,
        settings.policy,
        Arc::new(FanOut(observers)),
    ));
    let mut state = AppState::new(
        config,
        engine,
        Arc::new(MonotonicClock::new()),
        Arc::clone(&telemetry),
    );
    if let Some(semlog) = &semlog {
        state.semlog = semlog.status();
    }
    state.guard = guard;
    let mut server = listen(state, observer, telemetry);
    server.semlog = semlog;
    server
}

/// Starts the server with API keys (and the request log line, for the captured logs).
pub async fn start_guarded(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
    guard: llmgate::auth::Guard,
) -> TestServer {
    let observer = Arc::new(CollectingObserver::default());
    let observers: Vec<Arc<dyn RequestObserver>> = vec![observer.clone(), Arc::new(LogObserver)];
    let telemetry = Telemetry::without_traces(MODEL, Arc::new(FanOut(observers)));
    let clock = Arc::new(MonotonicClock::new());
    start_guarded_with(engine, config, clock, observer, telemetry, guard).await
}

async fn start_with_telemetry(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
    clock: SharedClock,
    observer: Arc<CollectingObserver>,
    telemetry: Telemetry,
) -> TestServer {
    let open = llmgate::auth::Guard::default();
    start_guarded_with(engine, config, clock, observer, telemetry, open).await
}

async fn start_guarded_with(
    engine: impl Into<llmgate::engine::Front>,
    config: &Config,
    clock: SharedClock,
    observer: Arc<CollectingObserver>,
    telemetry: Telemetry,
    guard: llmgate::auth::Guard,
) -> TestServer {
    let telemetry = Arc::new(telemetry);
    let mut state = AppState::new(config, engine, clock, Arc::clone(&telemetry));
    state.guard = guard;
    listen(state, observer, telemetry)
}

/// Starts the server on several models (their ids are the metric labels), with the
/// request log line beside the collecting observer.
pub async fn start_models(models: ServedModels, upstreams: &[&str], config: &Config) -> TestServer {
    let observer = Arc::new(CollectingObserver::default());
    let observers: Vec<Arc<dyn RequestObserver>> = vec![observer.clone(), Arc::new(LogObserver)];
    let ids: Vec<String> = models.iter().map(|m| m.id().to_owned()).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let metrics = Arc::new(Metrics::for_models(&ids, upstreams));
    let telemetry = Arc::new(Telemetry::new(
        metrics,
        None,
        TraceSettings::from(&config.telemetry).policy,
        Arc::new(FanOut(observers)),
    ));
    let state = AppState::with_models(
        config,
        models,
        Arc::new(MonotonicClock::new()),
        Arc::clone(&telemetry),
    );
    listen(state, observer, telemetry)
}

fn listen(
    state: AppState,
    observer: Arc<CollectingObserver>,
    telemetry: Arc<Telemetry>,
) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let state = web::Data::new(state);
    let server = llmgate::serve(state.clone(), listener, 2).expect("server");
    let handle = server.handle();
    tokio::spawn(server);
    TestServer {
        base,
        observer,
        telemetry,
        semlog: None,
        state,
        handle,
    }
}

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

/// The server's `/metrics` text.
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

/// Polls `cond` for up to five seconds.
pub async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if cond() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    cond()
}

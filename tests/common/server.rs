//! The gateway under test: the real HTTP server on 127.0.0.1:0 with an injected engine
//! (or several models), clock, keys and telemetry, built by [`TestServerBuilder`] and
//! stopped when it goes out of scope.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::ServerHandle;
use actix_web::web;
use llmgate::auth::Guard;
use llmgate::clock::{ManualClock, MonotonicClock, SharedClock};
use llmgate::config::Config;
use llmgate::engine::served::ServedModels;
use llmgate::engine::Front;
use llmgate::record::{CollectingObserver, FanOut, LogObserver, RequestObserver};
use llmgate::semlog::indexer::Pacing;
use llmgate::semlog::Semlog;
use llmgate::telemetry::metrics::Metrics;
use llmgate::telemetry::trace::{TraceSettings, Tracing};
use llmgate::telemetry::Telemetry;
use llmgate::AppState;

use super::{test_config, MODEL};

/// Pacing for tests: small batches soon, quick retries.
const TEST_PACING: Pacing = Pacing {
    batch_docs: 500,
    batch_bytes: 5 << 20,
    batch_age: std::time::Duration::from_millis(50),
    base_backoff: std::time::Duration::from_millis(20),
    max_backoff: std::time::Duration::from_millis(200),
    attempts: 3,
};

/// A running gateway. Dropping it stops its HTTP server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`, the address it listens on.
    pub base: String,
    /// Every request's record, as the gateway handed it off.
    pub observer: Arc<CollectingObserver>,
    /// Metrics, traces and the record hand-off, as the handlers see them.
    pub telemetry: Arc<Telemetry>,
    /// The semantic-log pipeline, when the server was started with one.
    pub semlog: Option<Arc<Semlog>>,
    /// What the handlers share: admission, the drain, limits.
    pub state: web::Data<AppState>,
    handle: ServerHandle,
}

impl TestServer {
    /// A gateway serving `engine` as [`MODEL`], under `test_config("")` with the
    /// monotonic clock, no keys, no traces and no semantic log until the builder says
    /// otherwise.
    pub fn builder(engine: impl Into<Front>) -> TestServerBuilder {
        TestServerBuilder::new(Served::Engine(engine.into()))
    }

    /// A gateway serving `models`, of which `upstreams` are served by upstream servers
    /// (the metrics label both by model id).
    pub fn serving(models: ServedModels, upstreams: &[&str]) -> TestServerBuilder {
        let upstreams = upstreams.iter().map(|u| (*u).to_owned()).collect();
        TestServerBuilder::new(Served::Models { models, upstreams })
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
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

impl Drop for TestServer {
    fn drop(&mut self) {
        // `stop` sends its command when called; the future it returns only waits for the
        // command to be carried out. The server's task carries it out (the accept thread
        // closes the listener, the worker threads end), or, when the test's runtime ends
        // first and drops that task, actix-server's own drop of the server does the same.
        drop(self.handle.stop(false));
    }
}

/// What a test server serves.
enum Served {
    /// One engine, as the config's first model.
    Engine(Front),
    /// Several models; `upstreams` are the ids of those served by upstream servers.
    Models {
        models: ServedModels,
        upstreams: Vec<String>,
    },
}

/// How to start a [`TestServer`]; see [`TestServer::builder`].
pub struct TestServerBuilder {
    served: Served,
    config: Config,
    clock: SharedClock,
    /// The OTLP/gRPC endpoint traces are exported to.
    otlp: Option<String>,
    /// Whether the semantic-log pipeline runs.
    semlog: bool,
    guard: Guard,
}

impl TestServerBuilder {
    fn new(served: Served) -> Self {
        Self {
            served,
            config: test_config(""),
            clock: Arc::new(MonotonicClock::new()),
            otlp: None,
            semlog: false,
            guard: Guard::default(),
        }
    }

    /// Serves under `config` rather than `test_config("")`.
    pub fn config(mut self, config: &Config) -> Self {
        self.config = config.clone();
        self
    }

    /// A clock that stands still, for byte-exact responses.
    pub fn frozen(mut self) -> Self {
        self.clock = Arc::new(ManualClock::new());
        self
    }

    /// Exports traces over OTLP/gRPC to `endpoint`, sampled as the config's
    /// `[telemetry]` table says.
    pub fn traced(mut self, endpoint: &str) -> Self {
        self.otlp = Some(endpoint.to_owned());
        self
    }

    /// Runs the semantic-log pipeline as the config's `[semlog]` table says, paced by
    /// [`TEST_PACING`].
    pub fn semlog(mut self) -> Self {
        self.semlog = true;
        self
    }

    /// Asks for API keys as `guard` says.
    pub fn guard(mut self, guard: Guard) -> Self {
        self.guard = guard;
        self
    }

    /// Starts the server on a free port. Every record goes to the collecting observer
    /// and the request log line (so log lines can be checked against spans), and to the
    /// semantic log when it runs.
    pub async fn start(self) -> TestServer {
        let metrics = Arc::new(match &self.served {
            Served::Engine(_) => Metrics::new(MODEL),
            Served::Models { models, upstreams } => {
                let ids: Vec<&str> = models.iter().map(|m| m.id()).collect();
                let upstreams: Vec<&str> = upstreams.iter().map(String::as_str).collect();
                Metrics::for_models(&ids, &upstreams)
            }
        });
        let settings = TraceSettings::from(&self.config.telemetry);
        let tracing = self.otlp.map(|endpoint| {
            Tracing::grpc(&endpoint, &settings, Arc::clone(&metrics)).expect("tracing")
        });
        let semlog = self.semlog.then(|| {
            let semlog = Semlog::start(&self.config.semlog, Arc::clone(&metrics), TEST_PACING);
            Arc::new(semlog.expect("semlog"))
        });
        let observer = Arc::new(CollectingObserver::default());
        let mut observers: Vec<Arc<dyn RequestObserver>> = vec![
            observer.clone(),
            Arc::new(LogObserver {
                hashes: semlog.as_ref().and_then(|s| s.hash_key()),
            }),
        ];
        if let Some(semlog) = &semlog {
            observers.push(semlog.clone());
        }
        // As `llmgate serve` wires it: answers count against their keys' quotas.
        if let Some(keys) = &self.guard.keys {
            observers.push(Arc::new(llmgate::auth::QuotaCounter(Arc::clone(keys))));
        }
        let telemetry = Arc::new(Telemetry::new(
            metrics,
            tracing,
            settings.policy,
            Arc::new(FanOut(observers)),
        ));
        let shared = Arc::clone(&telemetry);
        let mut state = match self.served {
            Served::Engine(engine) => AppState::new(&self.config, engine, self.clock, shared),
            Served::Models { models, .. } => {
                AppState::with_models(&self.config, models, self.clock, shared)
            }
        };
        if let Some(semlog) = &semlog {
            state.semlog = semlog.status();
        }
        state.guard = self.guard;
        listen(state, observer, telemetry, semlog)
    }
}

fn listen(
    state: AppState,
    observer: Arc<CollectingObserver>,
    telemetry: Arc<Telemetry>,
    semlog: Option<Arc<Semlog>>,
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
        semlog,
        state,
        handle,
    }
}

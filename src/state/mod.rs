//! State that must hold across gateways: per-key limits and token quotas, and the
//! routing state of upstream fleets ([`fleet`]). One gateway keeps it in
//! its own process ([`crate::auth::limits`]) and needs nothing else; gateways given
//! `[state] redis_url` share it through Redis.
//!
//! Every step on the request path is one Lua script, so a request costs one round trip
//! ([`limits`]). A call has a deadline (`state.timeout_ms`, default 5 ms); past it, or
//! with Redis gone, the request meets the operator's choice ([`OnFailure`]): the
//! gateway's own limits (`fail_open`, the default), or 503 `state_unavailable`
//! (`fail_closed`). Never a hung request. Each thread has its own connection, a redis-rs
//! `ConnectionManager`, which reconnects by itself; a watcher pings Redis every second so
//! that `/ready` and `llmgate_state_up` tell the truth when no request is calling, and
//! loads the scripts whenever Redis comes (back) up.

pub mod config;
pub mod fleet;
pub mod limits;
pub mod quota;

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub use config::{OnFailure, RedisConfig, StateConfig, StateTable};

use crate::telemetry::metrics::Metrics;

/// How often the watcher pings Redis.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Why a call to Redis gave no answer; the `reason` label of
/// `llmgate_state_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer within the deadline.
    Timeout,
    /// Redis refused or the connection is down.
    Error,
}

impl Failure {
    pub const ALL: [Failure; 2] = [Failure::Timeout, Failure::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Error => "error",
        }
    }
}

/// Tells one [`SharedState`] from another in [`CONNECTIONS`].
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's connection to each shared state (one per gateway; tests run
    /// several). A request's call is then driven on the request's own worker thread: a
    /// connection shared by every thread lives on one, and each call would cost two
    /// wake-ups across threads (measured: +0.25 ms TTFT p50 at one stream, against
    /// +0.17 ms this way; docs/access-control.md).
    static CONNECTIONS: RefCell<Vec<(usize, ConnectionManager)>> = const { RefCell::new(Vec::new()) };
}

/// Shared state in Redis: how to connect, the deadline, and what the gateway last saw.
pub struct SharedState {
    id: usize,
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    config: RedisConfig,
    address: String,
    up: AtomicBool,
    /// The last failure, scrubbed, for `/ready`.
    last_error: Mutex<Option<String>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("address", &self.address)
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

impl SharedState {
    /// Connects lazily (a gateway starts whether or not Redis is up yet) and starts the
    /// watcher. Needs a Tokio runtime.
    pub fn start(config: RedisConfig, metrics: Arc<Metrics>) -> Result<Arc<Self>, String> {
        let address = config.connection.addr().to_string();
        let client = redis::Client::open(config.connection.clone())
            .map_err(|e| format!("state.redis_url: {e}"))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            // The request path has its own, shorter deadline; this one ends calls that
            // nobody waits for any more (the watcher's).
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let state = Arc::new(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            client,
            manager_config,
            config,
            address,
            up: AtomicBool::new(false),
            last_error: Mutex::new(Some("not connected yet".to_owned())),
            metrics,
        });
        state.metrics.state_up(false);
        state
            .metrics
            .state_reasons(Failure::ALL.map(Failure::as_str));
        tokio::spawn(watch(Arc::downgrade(&state)));
        Ok(state)
    }

    pub fn on_failure(&self) -> OnFailure {
        self.config.on_failure
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub(crate) fn key_prefix(&self) -> &str {
        &self.config.key_prefix
    }

    /// Runs one call within the deadline `timeout`; a failure is counted and logged
    /// when it is news (the first after a success). A call that finds this thread's
    /// connection broken (Redis restarted since it last called) is made again at once
    /// on a new connection, within the same deadline.
    pub(crate) async fn call<T, F>(
        &self,
        timeout: Duration,
        call: impl Fn(ConnectionManager) -> F,
    ) -> Result<T, Failure>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        let attempts = async {
            match call(self.connection()?).await {
                Err(error) if error.is_io_error() || error.is_connection_dropped() => {
                    self.forget_connection();
                    call(self.connection()?).await
                }
                outcome => outcome,
            }
        };
        let outcome = tokio::time::timeout(timeout, attempts).await;
        let (failure, detail) = match outcome {
            Ok(Ok(value)) => {
                self.went_up();
                return Ok(value);
            }
            Ok(Err(error)) => {
                // A connection that failed is made afresh by the next call, which then
                // connects as part of it: a kept one would first hand that call the
                // failed reconnection's error, once Redis is back.
                self.forget_connection();
                (
                    Failure::Error,
                    crate::secret::scrub_held(&error.to_string()),
                )
            }
            Err(_) => (
                Failure::Timeout,
                format!("no answer within {} ms", timeout.as_millis()),
            ),
        };
        self.metrics.state_failure(failure.as_str());
        let was_up = self.up.swap(false, Ordering::Relaxed);
        self.metrics.state_up(false);
        if was_up {
            tracing::warn!(
                redis = %self.address,
                error = %detail,
                on_failure = self.config.on_failure.as_str(),
                "Shared state: Redis did not answer; requests meet state.on_failure until it does."
            );
        }
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(detail);
        Err(failure)
    }

    /// This thread's connection, made (lazily: it connects on its first call) the first
    /// time the thread calls, and again after a call failed.
    fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        CONNECTIONS.with(|connections| {
            if let Some((_, connection)) =
                connections.borrow().iter().find(|(id, _)| *id == self.id)
            {
                return Ok(connection.clone());
            }
            let connection = ConnectionManager::new_lazy_with_config(
                self.client.clone(),
                self.manager_config.clone(),
            )?;
            connections.borrow_mut().push((self.id, connection.clone()));
            Ok(connection)
        })
    }

    fn forget_connection(&self) {
        CONNECTIONS.with(|connections| connections.borrow_mut().retain(|(id, _)| *id != self.id));
    }

    fn went_up(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            self.metrics.state_up(true);
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
            tracing::info!(redis = %self.address, "Shared state: Redis answers.");
        }
    }

    /// What `/ready` says of it.
    pub fn to_json(&self) -> serde_json::Value {
        let error = self
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        serde_json::json!({
            "backend": "redis",
            "address": self.address,
            "up": self.is_up(),
            "on_failure": self.config.on_failure.as_str(),
            "error": error,
        })
    }
}

/// Pings Redis every [`WATCH_EVERY`] while the state lives, so its health is known
/// without traffic and a dropped connection is made again before a request needs it.
async fn watch(state: std::sync::Weak<SharedState>) {
    let mut every = tokio::time::interval(WATCH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(state) = state.upgrade() else { return };
        let ping = |mut connection: ConnectionManager| async move {
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
        };
        // A ping has a second: it reports health, it does not hold a request up.
        let was_up = state.is_up();
        if state.call(Duration::from_secs(1), ping).await.is_ok() && !was_up {
            // A Redis that (re)starts knows no script: loaded here, a request's first
            // call is not the one that finds it missing and sends it.
            let load = |mut connection: ConnectionManager| async move {
                limits::script().load_async(&mut connection).await
            };
            let _ = state.call(Duration::from_secs(1), load).await;
        }
    }
}

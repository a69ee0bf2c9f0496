//! State that must hold across gateways: per-key limits today. One gateway keeps it in
//! its own process ([`crate::auth::limits`]) and needs nothing else; gateways given
//! `[state] redis_url` share it through Redis.
//!
//! Every step on the request path is one Lua script, so a request costs one round trip
//! ([`limits`]). A call has a deadline (`state.timeout_ms`, default 5 ms); past it, or
//! with Redis gone, the request meets the operator's choice ([`OnFailure`]): the
//! gateway's own limits (`fail_open`, the default), or 503 `state_unavailable`
//! (`fail_closed`). Never a hung request. The connection is redis-rs's
//! `ConnectionManager`, which reconnects by itself; a watcher pings Redis every second so
//! that `/ready` and `llmgate_state_up` tell the truth when no request is calling.

pub mod config;
pub mod limits;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Shared state in Redis: the connection, the deadline, and what the gateway last saw.
pub struct SharedState {
    connection: ConnectionManager,
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
        let connection = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| format!("state.redis_url: {e}"))?;
        let state = Arc::new(Self {
            connection,
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
    /// when it is news (the first after a success).
    async fn call<T, F>(
        &self,
        timeout: Duration,
        call: impl FnOnce(ConnectionManager) -> F,
    ) -> Result<T, Failure>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        let outcome = tokio::time::timeout(timeout, call(self.connection.clone())).await;
        let (failure, detail) = match outcome {
            Ok(Ok(value)) => {
                self.went_up();
                return Ok(value);
            }
            Ok(Err(error)) => (
                Failure::Error,
                crate::secret::scrub_held(&error.to_string()),
            ),
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
        let _ = state.call(Duration::from_secs(1), ping).await;
    }
}

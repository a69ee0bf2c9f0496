//! State that must hold across gateways: per-key limits and token quotas, and the
//! routing state of upstream fleets ([`fleet`]). One gateway keeps it in
//! its own process ([`crate::auth::limits`]) and needs nothing else; gateways given
//! `[state] redis_url` share it through Redis.
//!
//! Every step on the request path is one Lua script, so a request costs one round trip
//! ([`limits`], called by `budget`, which is how the keys see it). A call has a deadline (`state.timeout_ms`, default 50 ms); past it, or
//! with Redis gone, the request meets the operator's choice ([`OnFailure`]): the
//! gateway's own limits (`fail_open`, the default), or 503 `state_unavailable`
//! (`fail_closed`). Never a hung request. Each thread has its own connection, a redis-rs
//! `ConnectionManager`, which reconnects by itself; a watcher pings Redis every second so
//! that `/ready` and `llmgate_state_up` tell the truth when no request is calling, and
//! loads the scripts whenever Redis comes (back) up. While its pings go unanswered no
//! call is tried (a request meets `on_failure` at once, and no thread reconnects per
//! request), and every thread connects afresh once one is answered.

mod budget;
pub mod config;
mod connect;
pub mod fleet;
pub mod limits;

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

pub use config::{OnFailure, RedisConfig, StateConfig, StateTable, Target};
pub(crate) use connect::Connection;
use connect::Reach;

use crate::auth::Unanswered;
use crate::telemetry::metrics::Metrics;

/// How often the watcher pings Redis.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The least a thread's first call on a new connection may take: it connects (and
/// authenticates, and over TLS shakes hands) as part of it, which a deadline of a few
/// milliseconds may not leave room for. Once per thread per connection: at its first
/// call, after its connection broke, and after Redis comes back.
const CONNECT_ALLOWANCE: Duration = Duration::from_millis(250);

/// Pings unanswered in a row before calls stop being tried ([`Failure::Down`]): one late
/// ping (a pause of the process, a fork in Redis) does not turn every request away.
const DOWN_AFTER: u32 = 2;

/// Why a call to Redis gave no answer: the `reason` label of
/// `llmgate_state_failures_total` (the caller only learns that it had none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// No answer within the deadline.
    Timeout,
    /// Redis refused, or the connection broke after the call was written.
    Error,
    /// No connection could be made, or Redis refused the call before running it: the
    /// call did not run.
    Unreachable,
    /// Not tried: the watcher's last ping went unanswered, so no call waits for a Redis
    /// that is gone, and no thread reconnects on every request.
    Down,
}

impl Failure {
    pub const ALL: [Failure; 3] = [Failure::Timeout, Failure::Error, Failure::Down];

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Error | Failure::Unreachable => "error",
            Failure::Down => "down",
        }
    }

    /// Whether the call may have run in Redis all the same.
    fn maybe_ran(self) -> bool {
        matches!(self, Failure::Timeout | Failure::Error)
    }
}

/// Whether Redis answered that it did not run the call: a Cluster that lost the key's
/// master (`CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`), a node that does not hold the key
/// or is a replica (`MOVED`, `ASK`, `READONLY`), one loading its data, an unknown script
/// or a command not allowed. Such a call is sent again later rather than taken as run: a
/// quota's tokens counted in the gateway while a Cluster failed over were otherwise
/// lost (tests/shared_state/topologies.rs). This holds because no call is retried
/// (`retries(0)` in connect.rs): with retries, such an answer could follow an attempt
/// that did run, and the tokens would be charged twice. `READONLY` may also come from
/// inside a script, at its first write, which then wrote nothing. A refusal that lasts
/// (`NOPERM`, `CROSSSLOT`: a misconfigured Redis) keeps the tokens in the backlog, and
/// says so in `llmgate_state_failures_total{reason="error"}` and the warning when Redis
/// stops answering.
fn refused_unrun(error: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as S};
    matches!(
        error.kind(),
        ErrorKind::Server(
            S::ClusterDown
                | S::TryAgain
                | S::MasterDown
                | S::ReadOnly
                | S::BusyLoading
                | S::Moved
                | S::Ask
                | S::CrossSlot
                | S::NoScript
                | S::NoPerm
        )
    )
}

/// Tells one [`SharedState`] from another in [`CONNECTIONS`].
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's connection to each shared state (one per gateway; tests run
    /// several). A request's call is then driven on the request's own worker thread: a
    /// connection shared by every thread lives on one, and each call would cost two
    /// wake-ups across threads (measured: +0.25 ms TTFT p50 at one stream, against
    /// +0.17 ms this way; docs/access-control.md).
    static CONNECTIONS: RefCell<Vec<(usize, u64, ConnectionManager)>> = const { RefCell::new(Vec::new()) };
}

/// Shared state in Redis: how to connect, the deadline, and what the gateway last saw.
pub struct SharedState {
    id: usize,
    reach: Reach,
    manager_config: ConnectionManagerConfig,
    config: RedisConfig,
    address: String,
    /// The last call, a request's or the watcher's, was answered.
    up: AtomicBool,
    /// The watcher's last ping was answered: what `/ready` says (one late request does
    /// not make a gateway unready).
    answering: AtomicBool,
    /// The watcher's last ping went unanswered (false before its first): a thread's
    /// fresh connection then gets the request's own deadline, not the
    /// [`CONNECT_ALLOWANCE`]: to a Redis that stopped answering a connection is made at
    /// once and then hangs, and the allowance held one request per thread 250 ms
    /// (issue 61), past the deadline the docs promise.
    silent: AtomicBool,
    /// The watcher's last [`DOWN_AFTER`] pings went unanswered (false before its first;
    /// never for a Cluster, whose ping asks every master): calls are not tried until
    /// one is answered ([`Failure::Down`]).
    down: AtomicBool,
    /// Counts the times every thread must connect afresh: the watcher saw Redis come
    /// (back) up, or a ping went unanswered (its connection may be silently dead), or
    /// the sentinels named another master. A thread's connection made before the last
    /// count is made again.
    epoch: AtomicU64,
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
        let address = config.target.address();
        if config.target.is_tls() {
            // rustls wants one crypto provider for the process, and this build's
            // dependencies bring two (ring and aws-lc-rs), so it cannot pick: ring, unless
            // one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let reach = Reach::new(&config.target, config.ca_cert.as_deref())
            .map_err(|e| format!("state.redis_url: {e}"))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            // The request path has its own, shorter deadline; this one ends calls that
            // nobody waits for any more (the watcher's).
            // Longer than the watcher's ping's own second, so that the ping's deadline,
            // not redis-rs's, tells a connection gone silent.
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let state = Arc::new(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            reach,
            manager_config,
            config,
            address,
            up: AtomicBool::new(false),
            answering: AtomicBool::new(false),
            silent: AtomicBool::new(false),
            down: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
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
    /// when it is news (the first after a success). While the watcher finds Redis
    /// gone, the call is not tried.
    pub(crate) async fn call<T, F>(
        &self,
        timeout: Duration,
        call: impl Fn(Connection) -> F,
    ) -> Result<T, Unanswered>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        let outcome = if self.down.load(Ordering::Relaxed) {
            Err((
                Failure::Down,
                "the watcher's last pings went unanswered".into(),
            ))
        } else {
            self.try_call(timeout, call).await
        };
        outcome.map_err(|(failure, detail)| {
            self.metrics.state_failure(failure.as_str());
            self.went_down(&detail);
            Unanswered {
                maybe_ran: failure.maybe_ran(),
            }
        })
    }

    /// One call within `timeout` (longer for a connection's first, see
    /// [`CONNECT_ALLOWANCE`]), or why it got no answer.
    async fn try_call<T, F>(
        &self,
        timeout: Duration,
        call: impl Fn(Connection) -> F,
    ) -> Result<T, (Failure, String)>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        // Never sent twice: a command that reached Redis before its connection broke may
        // have run (a request charged twice). A connection that broke is made afresh by
        // the next call, and every thread's after the watcher sees Redis come back.
        let outcome = match self.connection() {
            Ok((connection, fresh)) => {
                let timeout = if fresh && !self.silent.load(Ordering::Relaxed) {
                    timeout.max(CONNECT_ALLOWANCE)
                } else {
                    timeout
                };
                tokio::time::timeout(timeout, call(connection))
                    .await
                    .map_err(|_| timeout)
            }
            Err(error) => {
                return Err((
                    Failure::Unreachable,
                    crate::secret::scrub_held(&error.to_string()),
                ))
            }
        };
        match outcome {
            Ok(Ok(value)) => {
                self.went_up();
                Ok(value)
            }
            Ok(Err(error)) => {
                // A broken connection is made afresh by the next call, which then
                // connects as part of it: a kept one would first hand that call the
                // failed reconnection's error. Redis's own error replies (OOM, a script's
                // error) leave the connection as it is.
                if error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || error.is_timeout()
                {
                    self.forget_connection();
                }
                // A refused connection (a lazy connection connects within its first
                // call) sent nothing; a Cluster without the key's master, or a node that
                // is not it, refuses the call before running it.
                let failure = if error.is_connection_refusal() || refused_unrun(&error) {
                    Failure::Unreachable
                } else {
                    Failure::Error
                };
                Err((failure, crate::secret::scrub_held(&error.to_string())))
            }
            Err(timeout) => Err((
                Failure::Timeout,
                format!("no answer within {} ms", timeout.as_millis()),
            )),
        }
    }

    fn went_down(&self, detail: &str) {
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
    }

    /// This thread's connection, made (lazily: it connects on its first call) the first
    /// time the thread calls, and again after a call failed; a Cluster's one connection.
    /// True with one made now.
    fn connection(&self) -> redis::RedisResult<(Connection, bool)> {
        if let Some(cluster) = self.reach.cluster_connection() {
            return cluster.map(|c| (c, false));
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        CONNECTIONS.with(|connections| {
            let mut connections = connections.borrow_mut();
            if let Some((_, made, connection)) = connections.iter().find(|(id, ..)| *id == self.id)
            {
                if *made == epoch {
                    return Ok((Connection::Server(connection.clone()), false));
                }
            }
            connections.retain(|(id, ..)| *id != self.id);
            let Some(client) = self.reach.client()? else {
                unreachable!("a Cluster's connection is the gateway's, not a thread's")
            };
            let connection =
                ConnectionManager::new_lazy_with_config(client, self.manager_config.clone())?;
            connections.push((self.id, epoch, connection.clone()));
            Ok((Connection::Server(connection), true))
        })
    }

    fn forget_connection(&self) {
        CONNECTIONS.with(|connections| connections.borrow_mut().retain(|(id, ..)| *id != self.id));
    }

    fn went_up(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            self.metrics.state_up(true);
            tracing::info!(redis = %self.address, "Shared state: Redis answers.");
        }
    }

    /// Whether the watcher's last ping was answered.
    pub fn answering(&self) -> bool {
        self.answering.load(Ordering::Relaxed)
    }

    /// What `/ready` says of it. `/ready` needs no key: the address and the error are
    /// in the log only.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "backend": "redis",
            "up": self.answering(),
            "on_failure": self.config.on_failure.as_str(),
        })
    }
}

/// Pings Redis every [`WATCH_EVERY`] while the state lives, so its health is known
/// without traffic and a dropped connection is made again before a request needs it.
async fn watch(state: std::sync::Weak<SharedState>) {
    let mut every = tokio::time::interval(WATCH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unanswered = 0u32;
    loop {
        every.tick().await;
        let Some(state) = state.upgrade() else { return };
        if !state.answering() && state.reach.find().await {
            // The sentinels named another master: every thread connects to it.
            state.epoch.fetch_add(1, Ordering::Relaxed);
        }
        let checks_role = state.reach.checks_role();
        let ping = |mut connection: Connection| async move {
            if !checks_role {
                return redis::cmd("PING")
                    .query_async::<String>(&mut connection)
                    .await
                    .map(|_| ());
            }
            // A master demoted by a failover still answers, as a replica that refuses
            // writes: it does not count as answering.
            let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut connection).await?;
            match role.first() {
                Some(Value::BulkString(name)) if name == b"master" => Ok(()),
                _ => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "no longer the master",
                ))),
            }
        };
        // A ping has a second: it reports health, it does not hold a request up. It is
        // tried whatever the last one found, and is not counted among the requests' calls.
        let ping = state.try_call(Duration::from_secs(1), ping).await;
        // Before the connections are dropped below: their fresh ones get no allowance.
        state.silent.store(ping.is_err(), Ordering::Relaxed);
        if let Err((_, detail)) = &ping {
            state.went_down(detail);
            // A connection whose peer vanished without a reset (a node lost, a pod
            // replaced behind its Service) only times out: every thread, the watcher's
            // next ping first, connects afresh.
            state.epoch.fetch_add(1, Ordering::Relaxed);
        }
        let answered = ping.is_ok();
        unanswered = if answered {
            0
        } else {
            unanswered.saturating_add(1)
        };
        // A Cluster's PING asks every master: one node down would stop every call,
        // though redis-rs routes each to its slot's node and follows failovers itself.
        let down = unanswered >= DOWN_AFTER && !state.reach.is_cluster();
        state.down.store(down, Ordering::Relaxed);
        let was = state.answering.swap(answered, Ordering::Relaxed);
        if answered && !was {
            // Back (or there for the first time): every thread connects afresh, and the
            // scripts are loaded, so no request is the one that finds them missing.
            state.epoch.fetch_add(1, Ordering::Relaxed);
            let load = |mut connection: Connection| async move {
                limits::script().load_async(&mut connection).await?;
                budget::spend_script().load_async(&mut connection).await?;
                fleet::script().load_async(&mut connection).await
            };
            let _ = state.try_call(Duration::from_secs(1), load).await;
        }
    }
}

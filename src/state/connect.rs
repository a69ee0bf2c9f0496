//! How a gateway reaches Redis ([`Reach`]): one server, the master a Sentinel names, or a
//! Cluster; and the connection a call is made on ([`Connection`]), whichever it is.
//!
//! One server: each thread has its own redis-rs `ConnectionManager` (see `CONNECTIONS`
//! in the module above), which reconnects by itself. Sentinel: the same, to the master the
//! sentinels name; the watcher asks them again whenever the master stops answering as a
//! master (a failover), and every thread then connects to the new one. Cluster: one
//! redis-rs `ClusterConnection` for the gateway, made by the watcher; it follows the
//! slots' moves and reconnects by itself. Every key a script touches carries one hash tag
//! (`{<key id>}`, `{<model>}`), so a call goes to one node.

use std::sync::RwLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Cmd, Pipeline, RedisFuture, TlsCertificates, Value};

use super::config::Target;

/// The connection a call is made on.
#[derive(Clone)]
pub(crate) enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Server(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Server(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the gateway's calls go, and what it knows of it now.
pub(super) enum Reach {
    Server(redis::Client),
    Sentinel {
        sentinel: tokio::sync::Mutex<SentinelClient>,
        /// The master, as the sentinels last named it; `None` until they have.
        master: RwLock<Option<redis::Client>>,
    },
    Cluster {
        client: ClusterClient,
        /// Made by the watcher; `None` until a node has answered.
        connection: RwLock<Option<ClusterConnection>>,
    },
}

/// How long asking the sentinels, or making a Cluster's connection, may take.
const FIND_TIMEOUT: Duration = Duration::from_secs(2);

impl Reach {
    pub(super) fn new(target: &Target, ca_cert: Option<&[u8]>) -> redis::RedisResult<Self> {
        let certificates = || TlsCertificates {
            client_tls: None,
            root_cert: ca_cert.map(<[u8]>::to_vec),
        };
        Ok(match target {
            Target::Server(info) => Reach::Server(match ca_cert {
                Some(_) => redis::Client::build_with_tls(info.clone(), certificates())?,
                None => redis::Client::open(info.clone())?,
            }),
            Target::Sentinel {
                sentinels,
                master,
                settings,
                tls,
            } => {
                let mut builder = SentinelClientBuilder::new(
                    sentinels.iter().cloned(),
                    master,
                    SentinelServerType::Master,
                )?
                .set_client_to_redis_db(settings.db());
                if let Some(username) = settings.username() {
                    builder = builder.set_client_to_redis_username(username);
                }
                if let Some(password) = settings.password() {
                    builder = builder.set_client_to_redis_password(password);
                }
                if *tls {
                    builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
                    if ca_cert.is_some() {
                        builder = builder
                            .set_client_to_redis_certificates(certificates())
                            .set_client_to_sentinel_certificates(certificates());
                    }
                }
                Reach::Sentinel {
                    sentinel: tokio::sync::Mutex::new(builder.build()?),
                    master: RwLock::new(None),
                }
            }
            Target::Cluster(nodes) => {
                // No retries: a command that reached a node before its connection broke
                // may have run, and is never sent twice (a request charged twice). A
                // slot that moved fails one call to state.on_failure, then the
                // connection knows the new map.
                let mut builder = ClusterClient::builder(nodes.clone())
                    .connection_timeout(Duration::from_secs(1))
                    .response_timeout(Duration::from_secs(1))
                    // No retry: refused_unrun (mod.rs) takes a refusal as "not run".
                    .retries(0);
                if ca_cert.is_some() {
                    builder = builder.certs(certificates());
                }
                Reach::Cluster {
                    client: builder.build()?,
                    connection: RwLock::new(None),
                }
            }
        })
    }

    /// The client a thread's connection is made from, when the gateway has one per
    /// thread (`None` for a Cluster); an error while a Sentinel has named no master yet.
    pub(super) fn client(&self) -> redis::RedisResult<Option<redis::Client>> {
        match self {
            Reach::Server(client) => Ok(Some(client.clone())),
            Reach::Sentinel { master, .. } => master
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .map(Some)
                .ok_or_else(|| not_yet("the sentinels have not named the master yet")),
            Reach::Cluster { .. } => Ok(None),
        }
    }

    /// The Cluster's connection, for a Cluster.
    pub(super) fn cluster_connection(&self) -> Option<redis::RedisResult<Connection>> {
        let Reach::Cluster { connection, .. } = self else {
            return None;
        };
        Some(
            connection
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .map(Connection::Cluster)
                .ok_or_else(|| not_yet("no Cluster node has answered yet")),
        )
    }

    /// Finds Redis again when it does not answer (the watcher's job): asks the sentinels
    /// for the master, or makes the Cluster's connection if there is none. True when
    /// every thread must connect afresh (the master moved).
    pub(super) async fn find(&self) -> bool {
        match self {
            Reach::Server(_) => false,
            Reach::Sentinel { sentinel, master } => {
                let named = tokio::time::timeout(FIND_TIMEOUT, async {
                    sentinel.lock().await.async_get_client().await
                })
                .await;
                let Ok(Ok(named)) = named else {
                    return false;
                };
                let mut master = master.write().unwrap_or_else(|e| e.into_inner());
                let moved = master.as_ref().is_none_or(|known| {
                    known.get_connection_info().addr() != named.get_connection_info().addr()
                });
                if moved {
                    tracing::info!(master = %named.get_connection_info().addr(), "Shared state: the sentinels name the Redis master.");
                    *master = Some(named);
                }
                moved
            }
            Reach::Cluster { client, connection } => {
                if connection
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_some()
                {
                    return false;
                }
                if let Ok(Ok(made)) =
                    tokio::time::timeout(FIND_TIMEOUT, client.get_async_connection()).await
                {
                    *connection.write().unwrap_or_else(|e| e.into_inner()) = Some(made);
                }
                false
            }
        }
    }

    /// Whether what answers a ping is where writes go: a Sentinel's master may have been
    /// demoted to a replica by a failover, and still answer.
    pub(super) fn checks_role(&self) -> bool {
        matches!(self, Reach::Sentinel { .. })
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Reach::Cluster { .. })
    }
}

fn not_yet(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, what))
}

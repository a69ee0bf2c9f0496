//! `[state]`: where the state that must hold across gateways lives. Without `redis_url`
//! it stays in the process, as one gateway needs nothing else.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

/// The deadline of one call to Redis when none is set. A call on loopback answers in a
/// fraction of a millisecond, but on a host whose cores are busy (a model beside the
/// gateway) the request's thread may wait that long to run again: 5 ms, the default
/// until issue 61, expired there and sent requests to `on_failure` with Redis healthy
/// (tests/shared_state/loaded.rs). A request waits this long at most only while Redis
/// hangs and before the watcher notices (a second); once it has, none waits at all.
const DEFAULT_TIMEOUT_MS: u64 = 50;

/// What a request meets when the shared state cannot be reached within the deadline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum OnFailure {
    /// The gateway's own limits apply, as if it ran alone; a warning and a metric say so.
    #[default]
    FailOpen,
    /// The request is refused with 503 `state_unavailable`.
    FailClosed,
}

impl OnFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::FailOpen => "fail_open",
            OnFailure::FailClosed => "fail_closed",
        }
    }
}

/// `[state]`: each key a file key and, unless `#[arg(skip)]`, a flag of `llmgate serve`
/// with its environment variable.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Shared state")]
pub struct StateTable {
    /// Redis URL (redis://host:6379/0, rediss:// for TLS;
    /// redis+sentinel://sentinel1:26379,sentinel2:26379/<master>/0 through Sentinel;
    /// redis+cluster://node1:6379,node2:6379 for a Cluster) where gateways share per-key
    /// limits and quotas and upstream fleets' state; without it each keeps its own.
    #[arg(
        long = "state-redis-url",
        env = "LLMGATE_STATE_REDIS_URL",
        hide_env_values = true
    )]
    pub redis_url: Option<String>,
    /// Redis password, for a URL without one.
    #[arg(
        long = "state-redis-password",
        env = "LLMGATE_STATE_REDIS_PASSWORD",
        hide_env_values = true
    )]
    pub redis_password: Option<String>,
    /// File holding the Redis password instead (a mounted Secret; white space around it
    /// ignored).
    #[arg(
        long = "state-redis-password-file",
        env = "LLMGATE_STATE_REDIS_PASSWORD_FILE"
    )]
    pub redis_password_file: Option<PathBuf>,
    /// PEM file of the CA that signed a `rediss://` server's certificate, when it is not
    /// one the system trusts.
    #[arg(long = "state-redis-ca-cert", env = "LLMGATE_STATE_REDIS_CA_CERT")]
    pub redis_ca_cert: Option<PathBuf>,
    /// Milliseconds one call to Redis may take before the request goes on without it
    /// [default: 50].
    #[arg(long = "state-timeout-ms", env = "LLMGATE_STATE_TIMEOUT_MS")]
    pub timeout_ms: Option<u64>,
    /// What a request meets when Redis does not answer in time: fail_open (the gateway's
    /// own limits) or fail_closed (503) [default: fail_open].
    #[arg(
        long = "state-on-failure",
        env = "LLMGATE_STATE_ON_FAILURE",
        value_enum
    )]
    pub on_failure: Option<OnFailure>,
    /// Prefix of every Redis key the gateway writes, so gateways of different
    /// deployments can share one Redis [default: llmgate].
    #[arg(long = "state-key-prefix", env = "LLMGATE_STATE_KEY_PREFIX")]
    pub key_prefix: Option<String>,
}

/// `[state]` resolved: `None` keeps the state in the process.
#[derive(Debug, Clone, Default)]
pub struct StateConfig {
    pub redis: Option<RedisConfig>,
}

/// Where Redis is.
#[derive(Clone)]
pub enum Target {
    /// One server (`redis://`, `rediss://`).
    Server(redis::ConnectionInfo),
    /// The master Sentinel names (`redis+sentinel://`): `settings` are how to talk to it
    /// (its database, user, password; the sentinels take none).
    Sentinel {
        sentinels: Vec<redis::ConnectionAddr>,
        master: String,
        settings: redis::RedisConnectionInfo,
        tls: bool,
    },
    /// A Cluster's nodes to start from (`redis+cluster://`).
    Cluster(Vec<redis::ConnectionInfo>),
}

impl Target {
    /// Where it is, for the log (never the password).
    pub fn address(&self) -> String {
        let list = |addrs: Vec<String>| addrs.join(",");
        match self {
            Target::Server(info) => info.addr().to_string(),
            Target::Sentinel {
                sentinels, master, ..
            } => format!(
                "sentinel {} master {master}",
                list(sentinels.iter().map(ToString::to_string).collect())
            ),
            Target::Cluster(nodes) => format!(
                "cluster {}",
                list(nodes.iter().map(|n| n.addr().to_string()).collect())
            ),
        }
    }

    pub fn is_tls(&self) -> bool {
        let tls =
            |addr: &redis::ConnectionAddr| matches!(addr, redis::ConnectionAddr::TcpTls { .. });
        match self {
            Target::Server(info) => tls(info.addr()),
            Target::Sentinel { tls, .. } => *tls,
            Target::Cluster(nodes) => nodes.iter().any(|n| tls(n.addr())),
        }
    }

    /// The password the URL carries, if any.
    fn password(&self) -> Option<&str> {
        match self {
            Target::Server(info) => info.redis_settings().password(),
            Target::Sentinel { settings, .. } => settings.password(),
            Target::Cluster(nodes) => nodes.first()?.redis_settings().password(),
        }
    }

    fn set_password(self, password: &str) -> Self {
        let with = |info: redis::ConnectionInfo| {
            let settings = info.redis_settings().clone().set_password(password);
            info.set_redis_settings(settings)
        };
        match self {
            Target::Server(info) => Target::Server(with(info)),
            Target::Sentinel {
                sentinels,
                master,
                settings,
                tls,
            } => Target::Sentinel {
                sentinels,
                master,
                settings: settings.set_password(password),
                tls,
            },
            Target::Cluster(nodes) => Target::Cluster(nodes.into_iter().map(with).collect()),
        }
    }

    /// Reads a `redis[s]://`, `redis[s]+sentinel://` or `redis[s]+cluster://` URL.
    fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url.split_once("://").ok_or("not a Redis URL: no scheme")?;
        let (base, kind) = scheme.split_once('+').unwrap_or((scheme, ""));
        if kind.is_empty() {
            // redis-rs reads it (unix sockets too) and names what it does not take.
            return redis::IntoConnectionInfo::into_connection_info(url)
                .map(Target::Server)
                .map_err(|e| format!("not a Redis URL: {e}"));
        }
        if !matches!(base, "redis" | "rediss") || !matches!(kind, "sentinel" | "cluster") {
            return Err(format!(
                "not a Redis URL: the scheme is redis://, rediss://, redis+sentinel:// or redis+cluster:// (rediss+ for TLS), not {scheme}://"
            ));
        }
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((credentials, rest)) => (format!("{credentials}@"), rest),
            None => (String::new(), rest),
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let hosts: Vec<&str> = hosts.split(',').filter(|h| !h.is_empty()).collect();
        if hosts.is_empty() {
            return Err(format!(
                "not a Redis URL: {kind} needs at least one host:port"
            ));
        }
        let node = |host: &str, path: &str| {
            redis::IntoConnectionInfo::into_connection_info(
                format!("{base}://{credentials}{host}/{path}").as_str(),
            )
            .map_err(|e| format!("not a Redis URL: {host}: {e}"))
        };
        if kind == "cluster" {
            if !path.is_empty() {
                return Err("not a Redis URL: a Cluster has one database, so no /<db>".to_owned());
            }
            return hosts
                .iter()
                .map(|h| node(h, ""))
                .collect::<Result<_, _>>()
                .map(Target::Cluster);
        }
        let (master, db) = path.split_once('/').unwrap_or((path, "0"));
        if master.is_empty() {
            return Err(
                "not a Redis URL: Sentinel needs the master's name: redis+sentinel://host:26379/<master>/<db>"
                    .to_owned(),
            );
        }
        let settings = node(hosts[0], db)?.redis_settings().clone();
        // A sentinel's port is 26379 unless given (`[::1]` is a host without one).
        let with_port = |h: &str| match h.rsplit_once(':') {
            Some((_, port)) if !port.contains(']') => h.to_owned(),
            _ => format!("{h}:26379"),
        };
        let sentinels = hosts
            .iter()
            .map(|h| {
                let h = with_port(h);
                redis::IntoConnectionInfo::into_connection_info(format!("{base}://{h}").as_str())
                    .map(|info| info.addr().clone())
                    .map_err(|e| format!("not a Redis URL: {h}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Target::Sentinel {
            sentinels,
            master: master.to_owned(),
            settings,
            tls: base == "rediss",
        })
    }
}

#[derive(Clone)]
pub struct RedisConfig {
    /// Where and how to connect, the password from the file set into it where one is
    /// given.
    pub target: Target,
    /// The CA that signed a TLS server's certificate (PEM), if not a system-trusted one.
    pub ca_cert: Option<Vec<u8>>,
    pub timeout: Duration,
    pub on_failure: OnFailure,
    pub key_prefix: String,
}

impl std::fmt::Debug for RedisConfig {
    // The address only: the connection info holds the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("address", &self.target.address())
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl StateConfig {
    pub fn resolve(table: StateTable) -> Result<Self, (&'static str, String)> {
        // Taken apart, so that a setting added to the table and not used here is an error.
        let StateTable {
            redis_url,
            redis_password,
            redis_password_file,
            redis_ca_cert,
            timeout_ms,
            on_failure,
            key_prefix,
        } = table;
        let Some(url) = redis_url else {
            let set = [
                (redis_password.is_some(), "state.redis_password"),
                (redis_password_file.is_some(), "state.redis_password_file"),
                (redis_ca_cert.is_some(), "state.redis_ca_cert"),
                (timeout_ms.is_some(), "state.timeout_ms"),
                (on_failure.is_some(), "state.on_failure"),
                (key_prefix.is_some(), "state.key_prefix"),
            ];
            if let Some((_, name)) = set.iter().find(|(is_set, _)| *is_set) {
                return Err((name, "it needs state.redis_url".to_owned()));
            }
            return Ok(Self::default());
        };
        let mut target = Target::parse(&url).map_err(|e| ("state.redis_url", e))?;
        let password = match (redis_password, redis_password_file) {
            (Some(_), Some(_)) => {
                return Err((
                    "state.redis_password",
                    "set state.redis_password or state.redis_password_file, not both".to_owned(),
                ))
            }
            (None, Some(path)) => Some(
                crate::secret::read_file(&path).map_err(|m| ("state.redis_password_file", m))?,
            ),
            (password, None) => password,
        };
        if let Some(password) = password {
            if target.password().is_some() {
                return Err((
                    "state.redis_password",
                    "the URL has a password already; give it in one place".to_owned(),
                ));
            }
            target = target.set_password(&password);
        }
        if let Some(password) = target.password() {
            crate::secret::hold(password);
        }
        let tls = target.is_tls();
        let ca_cert = match redis_ca_cert {
            Some(_) if !tls => {
                return Err((
                    "state.redis_ca_cert",
                    "a CA is for a TLS server: the URL must be rediss://".to_owned(),
                ))
            }
            Some(path) => Some(std::fs::read(&path).map_err(|e| {
                (
                    "state.redis_ca_cert",
                    format!("could not read {}: {e}", path.display()),
                )
            })?),
            None => None,
        };
        let timeout = Duration::from_millis(timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
        if timeout.is_zero() || timeout > Duration::from_secs(10) {
            return Err((
                "state.timeout_ms",
                "must be from 1 to 10000 milliseconds".to_owned(),
            ));
        }
        let key_prefix = key_prefix.unwrap_or_else(|| "llmgate".to_owned());
        if key_prefix.is_empty() || key_prefix.contains(['{', '}']) || key_prefix.len() > 64 {
            return Err((
                "state.key_prefix",
                "must be 1 to 64 characters without { or }".to_owned(),
            ));
        }
        Ok(Self {
            redis: Some(RedisConfig {
                target,
                ca_cert,
                timeout,
                on_failure: on_failure.unwrap_or_default(),
                key_prefix,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(url: &str) -> StateTable {
        StateTable {
            redis_url: Some(url.to_owned()),
            ..StateTable::default()
        }
    }

    #[test]
    fn without_a_url_the_state_stays_in_the_process_and_its_settings_are_refused() {
        assert!(StateConfig::resolve(StateTable::default())
            .expect("valid")
            .redis
            .is_none());
        let lone = StateTable {
            on_failure: Some(OnFailure::FailClosed),
            ..StateTable::default()
        };
        assert_eq!(
            StateConfig::resolve(lone).map(|_| ()),
            Err(("state.on_failure", "it needs state.redis_url".to_owned()))
        );
    }

    #[test]
    fn a_url_resolves_with_its_defaults_and_the_password_given_once() {
        let config = StateConfig::resolve(table("redis://127.0.0.1:6390/2"))
            .expect("valid")
            .redis
            .expect("redis");
        assert_eq!(config.timeout, Duration::from_millis(50));
        assert_eq!(config.on_failure, OnFailure::FailOpen);
        assert_eq!(config.key_prefix, "llmgate");
        let Target::Server(info) = &config.target else {
            panic!("one server")
        };
        assert_eq!(info.redis_settings().db(), 2);
        let with_password = StateTable {
            redis_password: Some("a-redis-password".into()),
            ..table("redis://redis:6379")
        };
        let config = StateConfig::resolve(with_password)
            .expect("valid")
            .redis
            .expect("redis");
        assert_eq!(config.target.password(), Some("a-redis-password"));
        assert!(
            !format!("{config:?}").contains("a-redis-password"),
            "{config:?}"
        );
        let twice = StateTable {
            redis_password: Some("a-redis-password".into()),
            ..table("redis://:other-password@redis:6379")
        };
        assert_eq!(
            StateConfig::resolve(twice).unwrap_err().0,
            "state.redis_password"
        );
    }

    #[test]
    fn sentinel_and_cluster_urls_name_their_nodes() {
        let sentinel = StateTable {
            redis_password: Some("a-redis-password".into()),
            ..table("redis+sentinel://s1,s2:26380/mymaster/3")
        };
        let config = StateConfig::resolve(sentinel)
            .expect("valid")
            .redis
            .expect("redis");
        let Target::Sentinel {
            sentinels,
            master,
            settings,
            tls,
        } = &config.target
        else {
            panic!("sentinel")
        };
        assert_eq!(sentinels.len(), 2);
        assert_eq!(master, "mymaster");
        assert_eq!(
            (settings.db(), settings.password(), *tls),
            (3, Some("a-redis-password"), false)
        );
        assert_eq!(
            config.target.address(),
            "sentinel s1:26379,s2:26380 master mymaster"
        );
        let cluster = StateConfig::resolve(table("rediss+cluster://:pw@n1:7000,n2:7001"))
            .expect("valid")
            .redis
            .expect("redis");
        let Target::Cluster(nodes) = &cluster.target else {
            panic!("cluster")
        };
        assert_eq!(nodes.len(), 2);
        assert!(cluster.target.is_tls());
        assert!(nodes
            .iter()
            .all(|n| n.redis_settings().password() == Some("pw")));
        for bad in [
            "redis+sentinel://s1:26379",
            "redis+cluster://n1:7000/2",
            "redis+cluster://",
            "redis+shards://n1",
        ] {
            let refused = StateConfig::resolve(table(bad)).map(|_| ()).unwrap_err();
            assert_eq!(refused.0, "state.redis_url", "{bad}");
        }
    }

    #[test]
    fn bad_values_name_their_setting() {
        assert_eq!(
            StateConfig::resolve(table("http://redis")).unwrap_err().0,
            "state.redis_url"
        );
        let cases = [
            (Some(0), None, "state.timeout_ms"),
            (Some(10_001), None, "state.timeout_ms"),
            (None, Some("a{b}"), "state.key_prefix"),
        ];
        for (timeout_ms, prefix, setting) in cases {
            let bad = StateTable {
                timeout_ms,
                key_prefix: prefix.map(str::to_owned),
                ..table("redis://redis")
            };
            assert_eq!(StateConfig::resolve(bad).unwrap_err().0, setting);
        }
    }
}

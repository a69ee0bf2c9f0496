//! The harness: `redis-server` processes, gateway processes, a keys file.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::eventually;
use crate::common::upstream::UPSTREAM_MODEL;
use llmgate::bench::upstream::UpstreamScript;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub(crate) const KEY: &str = "llmgate-shared-state-test-key-alice";

pub(crate) use crate::common::free_port;

/// A `redis-server` on a loopback port, killed when dropped.
pub(crate) struct Redis {
    pub(crate) port: u16,
    child: Option<Child>,
    /// It speaks TLS only.
    tls: bool,
}

/// What a gateway's `--state-redis-url` points at.
pub(crate) trait Backend {
    fn url(&self) -> String;
}

impl Backend for Redis {
    fn url(&self) -> String {
        Redis::url(self)
    }
}

impl Redis {
    pub(crate) fn start() -> Self {
        let mut redis = Self {
            port: free_port(),
            child: None,
            tls: false,
        };
        redis.start_again();
        redis
    }

    pub(crate) fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// One that speaks TLS only, with the certificate and key in `dir` (see [`tls_files`]).
    pub(crate) fn start_tls(dir: &Path) -> Self {
        let mut redis = Self {
            port: free_port(),
            child: None,
            tls: true,
        };
        let file = |name: &str| dir.join(name).display().to_string();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &redis.port.to_string()])
            .args(["--bind", "127.0.0.1", "--tls-auth-clients", "no"])
            .args(["--tls-cert-file", &file("server.pem")])
            .args(["--tls-key-file", &file("server.key")])
            .args(["--tls-ca-cert-file", &file("ca.pem")])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        redis.child = Some(child);
        redis.wait_for_connections();
        redis
    }

    /// Starts it (again, on the same port) and waits until it takes connections.
    pub(crate) fn start_again(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server; scripts/setup test installs it)");
        self.child = Some(child);
        self.wait_for_connections();
    }

    pub(crate) fn wait_for_connections(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.kill());
            drop(child.wait());
        }
    }

    /// SIGSTOP or SIGCONT: a Redis that takes connections and answers nothing.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal}");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal("-CONT");
        }
        self.stop();
    }
}

/// A gateway process, killed when dropped.
pub(crate) struct Gateway {
    pub(crate) base: String,
    child: Child,
}

impl Gateway {
    /// A gateway serving `upstream` as the model `shared`, or what a `--config` in
    /// `extra` serves.
    pub(crate) async fn start(
        dir: &Path,
        upstream: Option<&str>,
        redis: &impl Backend,
        extra: &[&str],
    ) -> Self {
        let port = free_port();
        let data = tempfile::tempdir_in(dir).expect("data dir").keep();
        let mut command = Command::new(env!("CARGO_BIN_EXE_llmgate"));
        command.arg("serve");
        if let Some(upstream) = upstream {
            command
                .args(["--upstream-url", upstream])
                .args(["--upstream-model", UPSTREAM_MODEL])
                .args(["--model-id", "shared"]);
        }
        let child = command
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--api-keys-file", &dir.join("keys").display().to_string()])
            .args(["--data-dir", &data.display().to_string()])
            .args(["--state-redis-url", &redis.url()])
            .args(["--log", "warn"])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("the llmgate binary");
        let gateway = Self {
            base: format!("http://127.0.0.1:{port}"),
            child,
        };
        let ready = eventually(30, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        assert!(ready, "the gateway did not start listening");
        assert!(
            gateway.until_ready(200).await,
            "the gateway did not become ready"
        );
        gateway
    }

    /// A small chat request with the key: its status, body and how long it took.
    pub(crate) async fn chat(&self) -> (u16, Value, Duration) {
        self.chat_with(4).await
    }

    /// A chat request of `max_tokens` with the key.
    pub(crate) async fn chat_with(&self, max_tokens: u32) -> (u16, Value, Duration) {
        let started = Instant::now();
        let response = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", self.base))
            .bearer_auth(KEY)
            .json(&json!({
                "model": "shared",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": max_tokens,
            }))
            .send()
            .await
            .expect("the gateway answers");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body, started.elapsed())
    }

    pub(crate) async fn ready(&self) -> (u16, Value) {
        let response = reqwest::get(format!("{}/ready", self.base))
            .await
            .expect("/ready answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Waits up to 15 s for `/ready` to say Redis answers (its watcher pings each second).
    pub(crate) async fn until_state_up(&self) -> bool {
        self.until_state(true).await
    }

    /// Waits up to 15 s for `/ready` to say whether Redis answers as `up`.
    pub(crate) async fn until_state(&self, up: bool) -> bool {
        for _ in 0..150 {
            if self.ready().await.1["state"]["up"] == up {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Waits up to 15 s for `/ready` to answer `status`.
    pub(crate) async fn until_ready(&self, status: u16) -> bool {
        for _ in 0..150 {
            if self.ready().await.0 == status {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Three gateways, as [`Gateway::start`] starts one.
    pub(crate) async fn three(
        dir: &Path,
        upstream: Option<&str>,
        redis: &impl Backend,
        extra: &[&str],
    ) -> Vec<Self> {
        Self::many(3, dir, upstream, redis, extra).await
    }

    /// `count` gateways, as [`Gateway::start`] starts one.
    pub(crate) async fn many(
        count: usize,
        dir: &Path,
        upstream: Option<&str>,
        redis: &impl Backend,
        extra: &[&str],
    ) -> Vec<Self> {
        let mut gateways = Vec::new();
        for _ in 0..count {
            gateways.push(Self::start(dir, upstream, redis, extra).await);
        }
        gateways
    }

    /// Its `/metrics` text.
    pub(crate) async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base))
            .await
            .expect("/metrics")
            .text()
            .await
            .expect("text")
    }

    /// Its `/stats`, asked with the key.
    pub(crate) async fn stats(&self) -> Value {
        reqwest::Client::new()
            .get(format!("{}/stats", self.base))
            .bearer_auth(KEY)
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("json")
    }
    /// Each replica of its model as its `/stats` shows it.
    pub(crate) async fn endpoints(&self) -> Vec<Value> {
        self.stats().await["upstreams"][0]["endpoints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) async fn state_of(&self, url: &str) -> String {
        let endpoints = self.endpoints().await;
        let endpoint = endpoints.iter().find(|e| e["endpoint"] == url);
        endpoint.map_or_else(String::new, |e| {
            e["state"].as_str().unwrap_or_default().to_owned()
        })
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        drop(self.child.kill());
        drop(self.child.wait());
    }
}

/// A directory holding a keys file that gives `alice` `limits`.
/// The tokens an answer's `usage` counts, prompt and completion (0 for an error).
pub(crate) fn usage_tokens(body: &Value) -> u64 {
    let usage = &body["usage"];
    usage["prompt_tokens"].as_u64().unwrap_or(0) + usage["completion_tokens"].as_u64().unwrap_or(0)
}

pub(crate) fn keys_dir(limits: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("dir");
    let hash = hex::encode(Sha256::digest(KEY.as_bytes()));
    std::fs::write(dir.path().join("keys"), format!("alice {hash} {limits}\n")).expect("keys");
    dir
}

pub(crate) fn script() -> UpstreamScript {
    UpstreamScript {
        model: UPSTREAM_MODEL.into(),
        tokens: 4,
        record: false,
        ..UpstreamScript::default()
    }
}

/// A TCP relay in front of Redis whose connections can be black-holed: they stay open
/// and forward nothing more, as when Redis's node is lost or its pod replaced behind a
/// Service without a reset. Connections made after that pass again.
pub(crate) struct Relay {
    pub(crate) port: u16,
    /// Connections made before this generation forward nothing.
    cut: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Backend for Relay {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Relay {
    pub(crate) async fn start(to: u16) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let generation = std::sync::Arc::clone(&cut);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let born = generation.load(Ordering::Relaxed);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                for (from, into) in [(client_read, server_write), (server_read, client_write)] {
                    let generation = std::sync::Arc::clone(&generation);
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let (mut from, mut into) = (from, into);
                        let mut buffer = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = from.read(&mut buffer).await {
                            if generation.load(Ordering::Relaxed) > born {
                                continue;
                            }
                            if into.write_all(&buffer[..n]).await.is_err() {
                                return;
                            }
                        }
                        // Held open, silent, once black-holed.
                        std::future::pending::<()>().await;
                    });
                }
            }
        });
        Self { port, cut }
    }

    /// Every connection made so far forwards nothing more, and is never closed.
    pub(crate) fn black_hole(&self) {
        self.cut.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

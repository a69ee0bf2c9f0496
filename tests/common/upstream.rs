//! A scripted upstream server for the tests, and the gateway in front of it.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgate::bench::upstream::{self, Received, UpstreamScript};
use llmgate::engine::served::ModelPolicy;
use llmgate::engine::served::{ServedModel, ServedModels};
use llmgate::engine::upstream::config::UpstreamConfig;
use llmgate::engine::upstream::fleet::FleetConfig;
use llmgate::engine::upstream::UpstreamEngine;

use super::{test_config, TestServer, MODEL};

/// The model name the scripted upstream answers as.
pub const UPSTREAM_MODEL: &str = "scripted";

/// A scripted upstream server; dropping it stops it.
pub struct Upstream {
    /// Base URL of its API (`http://127.0.0.1:PORT/v1`).
    pub url: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Answers the gateway stopped reading before their end.
    pub abandoned: Arc<std::sync::atomic::AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

impl Upstream {
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Stops it and waits until its listener is closed: a replica that goes away.
    pub async fn stop(self) {
        self.handle.stop(false).await;
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // The stop command is sent when `stop` is called; see `TestServer`'s drop.
        drop(self.handle.stop(false));
    }
}

/// Starts the scripted upstream on a free port.
pub async fn start_upstream(script: UpstreamScript) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let served = upstream::serve(listener, script, 1).expect("upstream");
    let handle = served.server.handle();
    tokio::spawn(served.server);
    Upstream {
        url,
        received: served.received,
        abandoned: served.abandoned,
        handle,
    }
}

/// The upstream settings of the tests: short timeouts, the model checked.
pub fn upstream_config(url: &str) -> UpstreamConfig {
    UpstreamConfig {
        urls: vec![url.to_owned()],
        model: UPSTREAM_MODEL.to_owned(),
        api_key: None,
        tokenizer: None,
        logprobs: true,
        connect_timeout: Duration::from_millis(500),
        first_byte_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(1),
        probe_interval: Duration::from_secs(60),
        context_length: 4096,
        check_model: true,
        max_tokens_param: "max_tokens".into(),
        fleet: Default::default(),
    }
}

pub fn limits(id: &str) -> ModelPolicy {
    ModelPolicy::plain(id, 2048)
}

/// The clock an upstream engine reads its answers' moments from in these tests.
pub fn monotonic() -> llmgate::clock::SharedClock {
    std::sync::Arc::new(llmgate::clock::MonotonicClock::new())
}

/// The gateway serving [`MODEL`] from an upstream configured as `config` says.
pub async fn gateway(config: UpstreamConfig) -> TestServer {
    gateway_with(config, limits(MODEL), "").await
}

/// The same, with the model's `limits` and the gateway's own config (`toml`).
pub async fn gateway_with(config: UpstreamConfig, limits: ModelPolicy, toml: &str) -> TestServer {
    let engine = UpstreamEngine::start(MODEL, config, monotonic()).expect("engine");
    let models = ServedModels::single(limits, engine);
    TestServer::serving(models, &[MODEL])
        .config(&test_config(toml))
        .start()
        .await
}

/// The gateway serving each `(id, engine)`.
pub async fn gateway_of(
    models: Vec<(&str, Arc<dyn llmgate::engine::Backend>)>,
    upstreams: &[&str],
) -> TestServer {
    let models = models
        .into_iter()
        .map(|(id, engine)| ServedModel {
            policy: limits(id),
            engine: engine.into(),
        })
        .collect();
    let models = ServedModels::new(models).expect("models");
    TestServer::serving(models, upstreams).start().await
}

/// The settings of a model served by several replicas, `fleet` saying how.
pub fn fleet_config(urls: &[&str], fleet: FleetConfig) -> UpstreamConfig {
    UpstreamConfig {
        urls: urls.iter().map(|u| (*u).to_owned()).collect(),
        fleet,
        ..upstream_config(urls[0])
    }
}

/// The base URL of a port nothing listens on (a replica that is gone).
pub fn closed_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    drop(listener);
    url
}

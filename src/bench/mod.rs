//! `llmgate bench`: an OpenAI-compatible load generator (llmgate, llama.cpp's server,
//! vLLM...) that measures client-side TTFT, TPOT, ITL and e2e with the gateway's own
//! definitions, over a prompt set from `prompts/`, at a fixed concurrency or request rate.
//!
//! With `--engine-direct` it loads the model in-process and runs the same prompts twice:
//! straight into the engine (no HTTP), then through an in-process gateway over the same
//! engine, so the gateway's own overhead is a measured ratio from one run.
//!
//! - [`client`]: one measured request, over HTTP or in-process.
//! - [`upstream`]: a scripted OpenAI-compatible server, the zero-model-time upstream of
//!   the proxy benchmark (`llmgate scripted-upstream`) and the tests' faulty one.

pub mod client;
mod report;
pub mod upstream;

use report::percentiles_ms;
pub use report::{overhead, LatencyPercentiles, Report};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Mutex;

use crate::config::{Config, EngineTable, ServeArgs, DEFAULT_MODEL_ID, DEFAULT_MODEL_PATH};
use crate::engine::Front;
use client::{Sample, Settings};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Base URL of the server under test (any OpenAI-compatible server).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Model id to send.
    #[arg(long, default_value = DEFAULT_MODEL_ID)]
    pub model: String,
    /// Prompt set: JSONL lines with a `messages` array.
    #[arg(long, default_value = "prompts/mixed.jsonl")]
    pub prompts: PathBuf,
    /// Requests in flight at once (closed loop).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Requests per second (open loop) instead of a fixed concurrency.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured requests.
    #[arg(long, default_value_t = 24)]
    pub requests: usize,
    /// Stop after this many seconds even if fewer requests were sent.
    #[arg(long)]
    pub duration_secs: Option<u64>,
    /// Unmeasured requests first (caches, allocator, lazy initialisation).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Also write the report(s) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Name of the run in the report (e.g. "llama.cpp").
    #[arg(long)]
    pub label: Option<String>,
    /// Load the model in-process and compare engine-direct with the gateway over it.
    #[arg(long)]
    pub engine_direct: bool,
    /// GGUF for --engine-direct.
    #[arg(long, default_value = DEFAULT_MODEL_PATH)]
    pub model_path: PathBuf,
    /// Also measure this server directly, beside the gateway at --url in front of it
    /// (its upstream): the gateway's overhead, request by request, from one run.
    #[arg(long, conflicts_with = "engine_direct")]
    pub direct_url: Option<String>,
    /// Model id to send to --direct-url [default: --model].
    #[arg(long)]
    pub direct_model: Option<String>,
    /// API key sent as `Authorization: Bearer` (a gateway with keys, LiteLLM's master key).
    #[arg(long, env = "LLMGATE_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// The HTTP client of a run: pooled connections, the API key on every request.
fn http_client(args: &BenchArgs) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = &args.api_key {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .tcp_nodelay(true)
        .pool_max_idle_per_host(4096)
        .build()?)
}

impl From<&BenchArgs> for Settings {
    fn from(args: &BenchArgs) -> Self {
        Settings {
            max_tokens: args.max_tokens,
            temperature: args.temperature,
        }
    }
}

/// Where the requests go.
#[derive(Clone)]
enum Target {
    Http {
        client: reqwest::Client,
        url: String,
        model: String,
    },
    /// The engine in this process (`--engine-direct`).
    #[cfg_attr(not(feature = "mistral"), allow(dead_code))]
    Engine(Front),
}

impl Target {
    async fn one(&self, messages: &Value, settings: Settings) -> Sample {
        match self {
            Target::Http { client, url, model } => {
                client::over_http(client, url, model, messages, settings).await
            }
            Target::Engine(engine) => client::in_process(engine, messages, settings).await,
        }
    }
}

/// Reads the `messages` of each JSONL line.
pub fn load_prompts(path: &std::path::Path) -> anyhow::Result<Vec<Value>> {
    Ok(load_prompt_set(path)?
        .into_iter()
        .map(|(_, messages)| messages)
        .collect())
}

/// A prompt set: JSONL lines with a `messages` array and an optional `id` (the line
/// number when absent).
pub fn load_prompt_set(path: &std::path::Path) -> anyhow::Result<Vec<(String, Value)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("could not read {}: {e}", path.display()))?;
    let prompts: Vec<(String, Value)> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let value: Value = serde_json::from_str(line)
                .map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), i + 1))?;
            let messages = value
                .get("messages")
                .filter(|m| m.is_array())
                .cloned()
                .ok_or_else(|| {
                    anyhow::anyhow!("{} line {}: no messages array", path.display(), i + 1)
                })?;
            let id = value["id"]
                .as_str()
                .map_or_else(|| format!("line-{}", i + 1), str::to_owned);
            Ok((id, messages))
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!prompts.is_empty(), "{} has no prompts", path.display());
    Ok(prompts)
}

/// Runs warm-up, then the measured requests, with a progress bar on standard error.
async fn run(target: &Target, args: &BenchArgs, prompts: &[Value]) -> (Vec<Sample>, Duration) {
    let settings = Settings::from(args);
    for i in 0..args.warmup {
        target.one(&prompts[i % prompts.len()], settings).await;
    }
    let progress = indicatif::ProgressBar::new(args.requests as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests, {elapsed} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let deadline = args
        .duration_secs
        .map(|s| Instant::now() + Duration::from_secs(s));
    let next = Arc::new(Mutex::new(0usize));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(args.requests)));
    let started = Instant::now();
    let shared: Arc<[Value]> = prompts.into();
    let mut tasks = Vec::new();
    let workers = if args.rate.is_some() {
        args.requests
    } else {
        args.concurrency.max(1)
    };
    for worker in 0..workers {
        let (target, next, samples, progress) = (
            target.clone(),
            next.clone(),
            samples.clone(),
            progress.clone(),
        );
        let prompts = Arc::clone(&shared);
        let (requests, rate) = (args.requests, args.rate);
        tasks.push(tokio::spawn(async move {
            if let Some(rate) = rate {
                // Open loop: request `worker` starts at worker / rate, whatever the others do.
                tokio::time::sleep(Duration::from_secs_f64(worker as f64 / rate)).await;
            }
            loop {
                let i = {
                    let mut n = next.lock().await;
                    if *n >= requests || deadline.is_some_and(|d| Instant::now() >= d) {
                        return;
                    }
                    *n += 1;
                    *n - 1
                };
                let sample = target.one(&prompts[i % prompts.len()], settings).await;
                samples.lock().await.push(sample);
                progress.inc(1);
                if rate.is_some() {
                    return;
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    progress.finish_and_clear();
    let took = started.elapsed();
    let samples = std::mem::take(&mut *samples.lock().await);
    (samples, took)
}

/// Sends each prompt to `a` then to `b`, one request at a time; each side's duration is
/// the sum of its own requests.
async fn interleaved(
    a: &Target,
    b: &Target,
    args: &BenchArgs,
    prompts: &[Value],
) -> ((Vec<Sample>, Duration), (Vec<Sample>, Duration)) {
    let settings = Settings::from(args);
    for i in 0..args.warmup {
        a.one(&prompts[i % prompts.len()], settings).await;
        b.one(&prompts[i % prompts.len()], settings).await;
    }
    let progress = indicatif::ProgressBar::new(args.requests as u64);
    let deadline = args
        .duration_secs
        .map(|s| Instant::now() + Duration::from_secs(s));
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    let (mut ta, mut tb) = (Duration::ZERO, Duration::ZERO);
    for i in 0..args.requests {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let prompt = &prompts[i % prompts.len()];
        let started = Instant::now();
        sa.push(a.one(prompt, settings).await);
        ta += started.elapsed();
        let started = Instant::now();
        sb.push(b.one(prompt, settings).await);
        tb += started.elapsed();
        progress.inc(1);
    }
    progress.finish_and_clear();
    ((sa, ta), (sb, tb))
}

/// The configuration `--engine-direct` serves with: `llmgate serve`'s defaults on
/// `--model-path`. The caller applies its process-wide engine settings before the async
/// runtime starts (`engine::mistral::process::apply`).
pub fn engine_direct_config(args: &BenchArgs) -> anyhow::Result<Config> {
    Ok(Config::from_toml(
        &ServeArgs {
            engine: EngineTable {
                model_id: Some(args.model.clone()),
                model_path: Some(args.model_path.clone()),
                ..EngineTable::default()
            },
            ..ServeArgs::default()
        },
        "",
    )?)
}

/// The `bench` command. `direct` is the configuration of `--engine-direct` (from
/// [`engine_direct_config`], its process-wide settings already applied); `None` measures
/// the server at `--url`.
pub async fn bench(args: &BenchArgs, direct: Option<&Config>) -> anyhow::Result<Vec<Report>> {
    let prompts = load_prompts(&args.prompts)?;
    let client = http_client(args)?;
    let http = |url: String| Target::Http {
        client: client.clone(),
        url,
        model: args.model.clone(),
    };
    let mut reports = Vec::new();
    if let Some(direct_url) = &args.direct_url {
        let direct = Target::Http {
            client: client.clone(),
            url: direct_url.clone(),
            model: args
                .direct_model
                .clone()
                .unwrap_or_else(|| args.model.clone()),
        };
        let gateway = http(args.url.clone());
        return Ok(side_by_side(
            (&direct, "upstream-direct", direct_url),
            (&gateway, &args.url),
            args,
            &prompts,
        )
        .await);
    }
    let Some(config) = direct else {
        let (samples, took) = run(&http(args.url.clone()), args, &prompts).await;
        let label = args.label.clone().unwrap_or_else(|| "server".into());
        reports.push(Report::from_samples(
            label,
            args.url.clone(),
            args,
            &samples,
            took,
        ));
        return Ok(reports);
    };

    engine_direct(config, args, &prompts, http).await
}

/// `--engine-direct`: the engine in this process, and the gateway over it on loopback,
/// as `llmgate serve` would run them by default (`engine = "auto"`).
#[cfg(feature = "mistral")]
async fn engine_direct(
    config: &Config,
    args: &BenchArgs,
    prompts: &[Value],
    http: impl Fn(String) -> Target,
) -> anyhow::Result<Vec<Report>> {
    let engine: Arc<dyn crate::engine::Backend> = match config.models.first().map(|m| &m.engine) {
        #[cfg(feature = "llamacpp")]
        Some(crate::config::ModelEngine::Llamacpp { .. }) => {
            crate::engine::llamacpp::LlamaCppEngine::load_now(
                crate::engine::llamacpp::LlamaCppSettings::from_config(&config.engine),
            )?
        }
        _ => {
            crate::engine::mistral::MistralEngine::load_now(
                crate::engine::mistral::MistralSettings::from_config(&config.engine),
            )
            .await?
        }
    };
    let engine = Front::from(engine);

    // The gateway over the same engine, on loopback.
    let telemetry = Arc::new(crate::telemetry::Telemetry::without_traces(
        &args.model,
        Arc::new(crate::record::FanOut(Vec::new())),
    ));
    let state = crate::AppState::new(
        config,
        engine.clone(),
        Arc::new(crate::clock::MonotonicClock::new()),
        telemetry,
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = crate::serve(actix_web::web::Data::new(state), listener, 2)?;
    let handle = server.handle();
    tokio::spawn(server);

    let direct = Target::Engine(engine);
    let gateway = http(url.clone());
    let reports = side_by_side(
        (&direct, "engine-direct", "in-process"),
        (&gateway, &url),
        args,
        prompts,
    )
    .await;
    handle.stop(true).await;
    Ok(reports)
}

#[cfg(not(feature = "mistral"))]
async fn engine_direct(
    _: &Config,
    _: &BenchArgs,
    _: &[Value],
    _: impl Fn(String) -> Target,
) -> anyhow::Result<Vec<Report>> {
    anyhow::bail!("--engine-direct needs the `mistral` feature")
}

/// The same prompts straight to `direct` and through `gateway` in front of it: one at a
/// time and alternating at concurrency 1 (so drift on a shared machine hits both alike,
/// and each request is paired with its twin), one after the other above it.
async fn side_by_side(
    (direct, direct_label, direct_target): (&Target, &str, &str),
    (gateway, gateway_url): (&Target, &str),
    args: &BenchArgs,
    prompts: &[Value],
) -> Vec<Report> {
    let ((direct_samples, direct_took), (gateway_samples, gateway_took)) =
        if args.concurrency <= 1 && args.rate.is_none() {
            interleaved(direct, gateway, args, prompts).await
        } else {
            (
                run(direct, args, prompts).await,
                run(gateway, args, prompts).await,
            )
        };
    let direct_report = Report::from_samples(
        direct_label.into(),
        direct_target.into(),
        args,
        &direct_samples,
        direct_took,
    );
    let mut gateway_report = Report::from_samples(
        "gateway".into(),
        gateway_url.into(),
        args,
        &gateway_samples,
        gateway_took,
    );
    if direct_samples.len() == gateway_samples.len() && args.concurrency <= 1 {
        let paired = |f: &dyn Fn(&Sample) -> Option<Duration>| -> Vec<f64> {
            direct_samples
                .iter()
                .zip(&gateway_samples)
                .filter_map(|(d, g)| Some((f(g)?.as_secs_f64() - f(d)?.as_secs_f64()) * 1000.0))
                .collect()
        };
        gateway_report.gateway_minus_direct_ttft_ms = percentiles_ms(&paired(&|s| s.ttft));
        gateway_report.gateway_minus_direct_tpot_ms = percentiles_ms(&paired(&|s| s.tpot));
    }
    vec![direct_report, gateway_report]
}

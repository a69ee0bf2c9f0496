//! `llmgate bench`: an OpenAI-compatible load generator (llmgate, llama.cpp's server,
//! vLLM...) that measures client-side TTFT, TPOT, ITL and e2e with the gateway's own
//! definitions, over a prompt set from `prompts/`, at a fixed concurrency or request rate.
//!
//! With `--engine-direct` it loads the model in-process and runs the same prompts twice:
//! straight into the engine (no HTTP), then through an in-process gateway over the same
//! engine, so the gateway's own overhead is a measured ratio from one run.
//!
//! - [`client`]: one measured request, over HTTP or in-process.

pub mod client;

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::config::{Config, EngineTable, ServeArgs, DEFAULT_MODEL_ID, DEFAULT_MODEL_PATH};
use crate::engine::Engine;
use crate::timing::nearest_rank;
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
}

/// p50, p95 and p99 in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

fn percentiles(values: &[Duration]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let ms = |q: f64| nearest_rank(&sorted, q).as_secs_f64() * 1000.0;
    Some(Percentiles {
        p50: ms(0.50),
        p95: ms(0.95),
        p99: ms(0.99),
    })
}

/// Percentiles of signed millisecond values (client minus server can be negative).
fn percentiles_ms(values: &[f64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    };
    Some(Percentiles {
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
    })
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub label: String,
    pub target: String,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub requests_ok: usize,
    pub errors: usize,
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub ttft_ms: Option<Percentiles>,
    pub tpot_ms: Option<Percentiles>,
    pub itl_ms: Option<Percentiles>,
    pub e2e_ms: Option<Percentiles>,
    /// Client minus server, per request, when the server reports `timings` (llmgate).
    pub client_minus_server_ttft_ms: Option<Percentiles>,
    pub client_minus_server_tpot_ms: Option<Percentiles>,
    /// With `--engine-direct` at concurrency 1: this request through the gateway minus
    /// the same prompt straight into the engine, paired request by request.
    pub gateway_minus_direct_ttft_ms: Option<Percentiles>,
    pub gateway_minus_direct_tpot_ms: Option<Percentiles>,
}

impl Report {
    fn from_samples(
        label: String,
        target: String,
        args: &BenchArgs,
        samples: &[Sample],
        took: Duration,
    ) -> Self {
        let ok: Vec<&Sample> = samples.iter().filter(|s| s.error.is_none()).collect();
        let collect = |f: &dyn Fn(&Sample) -> Option<Duration>| -> Vec<Duration> {
            ok.iter().filter_map(|s| f(s)).collect()
        };
        let itl: Vec<Duration> = ok.iter().flat_map(|s| s.itl.iter().copied()).collect();
        let ttft_diff: Vec<f64> = ok
            .iter()
            .filter_map(|s| Some(s.ttft?.as_secs_f64() * 1000.0 - s.server_ttft_ms?))
            .collect();
        let tpot_diff: Vec<f64> = ok
            .iter()
            .filter_map(|s| Some(s.tpot?.as_secs_f64() * 1000.0 - s.server_tpot_ms?))
            .collect();
        let tokens: u64 = ok.iter().map(|s| u64::from(s.output_tokens)).sum();
        let secs = took.as_secs_f64().max(f64::EPSILON);
        Report {
            label,
            target,
            concurrency: args.concurrency,
            rate: args.rate,
            requests_ok: ok.len(),
            errors: samples.len() - ok.len(),
            duration_s: secs,
            requests_per_s: ok.len() as f64 / secs,
            output_tokens_per_s: tokens as f64 / secs,
            ttft_ms: percentiles(&collect(&|s| s.ttft)),
            tpot_ms: percentiles(&collect(&|s| s.tpot)),
            itl_ms: percentiles(&itl),
            e2e_ms: percentiles(&collect(&|s| Some(s.e2e))),
            client_minus_server_ttft_ms: percentiles_ms(&ttft_diff),
            client_minus_server_tpot_ms: percentiles_ms(&tpot_diff),
            gateway_minus_direct_ttft_ms: None,
            gateway_minus_direct_tpot_ms: None,
        }
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let row = |name: &str, p: Option<Percentiles>| match p {
            Some(p) => format!(
                "{name:<28} {:>10.2} {:>10.2} {:>10.2}\n",
                p.p50, p.p95, p.p99
            ),
            None => format!("{name:<28} {:>10} {:>10} {:>10}\n", "-", "-", "-"),
        };
        let mut out = format!(
            "{} ({}), concurrency {}{}: {} ok, {} errors in {:.1} s\n",
            self.label,
            self.target,
            self.concurrency,
            self.rate.map_or(String::new(), |r| format!(", rate {r}/s")),
            self.requests_ok,
            self.errors,
            self.duration_s
        );
        out.push_str(&format!(
            "{:<28} {:>10} {:>10} {:>10}\n",
            "ms", "p50", "p95", "p99"
        ));
        out.push_str(&row("TTFT", self.ttft_ms));
        out.push_str(&row("TPOT", self.tpot_ms));
        out.push_str(&row("ITL", self.itl_ms));
        out.push_str(&row("e2e", self.e2e_ms));
        if self.gateway_minus_direct_ttft_ms.is_some() {
            out.push_str(&row(
                "TTFT gateway - direct",
                self.gateway_minus_direct_ttft_ms,
            ));
            out.push_str(&row(
                "TPOT gateway - direct",
                self.gateway_minus_direct_tpot_ms,
            ));
        }
        if self.client_minus_server_ttft_ms.is_some() {
            out.push_str(&row(
                "TTFT client - server",
                self.client_minus_server_ttft_ms,
            ));
            out.push_str(&row(
                "TPOT client - server",
                self.client_minus_server_tpot_ms,
            ));
        }
        out.push_str(&format!(
            "throughput: {:.2} requests/s, {:.1} output tokens/s\n",
            self.requests_per_s, self.output_tokens_per_s
        ));
        out
    }
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
    Engine(Arc<dyn Engine>),
}

impl Target {
    async fn one(&self, messages: &Value, settings: Settings) -> Sample {
        match self {
            Target::Http { client, url, model } => {
                client::over_http(client, url, model, messages, settings).await
            }
            Target::Engine(engine) => client::in_process(engine.as_ref(), messages, settings).await,
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
    let http = |url: String| Target::Http {
        client: reqwest::Client::new(),
        url,
        model: args.model.clone(),
    };
    let mut reports = Vec::new();
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

    // The engine and the gateway over it as `llmgate serve` would run them by default.
    let engine = crate::engine::mistral::MistralEngine::load_now(
        crate::engine::mistral::MistralSettings::from_config(&config.engine),
    )
    .await?;
    let engine: Arc<dyn Engine> = engine;

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
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = crate::serve(actix_web::web::Data::new(state), listener, 2)?;
    let handle = server.handle();
    tokio::spawn(server);

    let direct = Target::Engine(engine);
    let gateway = http(url.clone());
    let ((direct_samples, direct_took), (gateway_samples, gateway_took)) =
        if args.concurrency <= 1 && args.rate.is_none() {
            // One at a time, alternating, so drift on a shared machine hits both alike.
            interleaved(&direct, &gateway, args, &prompts).await
        } else {
            (
                run(&direct, args, &prompts).await,
                run(&gateway, args, &prompts).await,
            )
        };
    reports.push(Report::from_samples(
        "engine-direct".into(),
        "in-process".into(),
        args,
        &direct_samples,
        direct_took,
    ));
    let mut gateway_report =
        Report::from_samples("gateway".into(), url, args, &gateway_samples, gateway_took);
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
    reports.push(gateway_report);
    handle.stop(true).await;
    Ok(reports)
}

/// Gateway over engine-direct, for the summary line of an `--engine-direct` run.
pub fn overhead(engine: &Report, gateway: &Report) -> String {
    let ratio = |g: Option<Percentiles>, e: Option<Percentiles>| match (g, e) {
        (Some(g), Some(e)) if e.p50 > 0.0 => {
            format!("{:+.3} ms ({:.4}x)", g.p50 - e.p50, g.p50 / e.p50)
        }
        _ => "-".into(),
    };
    format!(
        "gateway vs engine-direct at p50: TTFT {}, TPOT {}, e2e {}\n",
        ratio(gateway.ttft_ms, engine.ttft_ms),
        ratio(gateway.tpot_ms, engine.tpot_ms),
        ratio(gateway.e2e_ms, engine.e2e_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttft_ms: u64, server_ttft: f64) -> Sample {
        Sample {
            ttft: Some(Duration::from_millis(ttft_ms)),
            tpot: Some(Duration::from_millis(20)),
            itl: vec![Duration::from_millis(20); 3],
            e2e: Duration::from_millis(ttft_ms + 60),
            output_tokens: 4,
            server_ttft_ms: Some(server_ttft),
            server_tpot_ms: Some(20.0),
            error: None,
        }
    }

    #[test]
    fn a_report_aggregates_samples_with_the_gateway_percentiles() {
        let args = BenchArgs {
            url: "u".into(),
            model: "m".into(),
            prompts: "p".into(),
            concurrency: 2,
            rate: None,
            requests: 4,
            duration_secs: None,
            warmup: 0,
            max_tokens: 4,
            temperature: 0.0,
            json: None,
            label: None,
            engine_direct: false,
            model_path: "x".into(),
        };
        let mut failed = sample(0, 0.0);
        failed.error = Some("status 500".into());
        let samples = [
            sample(100, 99.0),
            sample(200, 198.5),
            sample(300, 299.0),
            failed,
        ];
        let r = Report::from_samples(
            "t".into(),
            "u".into(),
            &args,
            &samples,
            Duration::from_secs(2),
        );
        assert_eq!((r.requests_ok, r.errors), (3, 1));
        assert_eq!(r.ttft_ms.map(|p| p.p50), Some(200.0));
        assert_eq!(r.ttft_ms.map(|p| p.p99), Some(300.0));
        assert_eq!(r.output_tokens_per_s, 6.0);
        assert_eq!(r.client_minus_server_ttft_ms.map(|p| p.p50), Some(1.0));
        assert!(r.table().contains("TTFT client - server"));
    }
}

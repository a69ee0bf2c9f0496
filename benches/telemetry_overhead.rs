//! What telemetry costs the serving path: the same streamed requests with telemetry off
//! (metrics and the request log only) and on (metrics, every trace exported over OTLP/gRPC
//! to an in-process collector, sampling ratio 1), reported as server-side TPOT and e2e.
//!
//! `cargo bench --bench telemetry_overhead` runs it: the scripted engine at zero token
//! delay (the gateway's own per-token cost, nothing hidden behind a model), then the
//! default model when `models/` has it. `cargo test` runs one request of each as a smoke
//! test.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::otlp::Collector;
use common::{chat_body, scripted_long, test_config, TestServer};
use llmgate::engine::scripted::Script;
use llmgate::engine::Front;
use serde_json::{json, Value};

struct Run {
    tpot_ms: Vec<f64>,
    e2e_ms: Vec<f64>,
}

fn p50(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Sends `n` streamed requests one after another; collects the server's timings.
async fn drive(server: &TestServer, n: usize, body: &Value) -> Run {
    let client = reqwest::Client::new();
    let mut run = Run {
        tpot_ms: Vec::new(),
        e2e_ms: Vec::new(),
    };
    for _ in 0..n {
        let text = client
            .post(server.url("/v1/chat/completions"))
            .json(body)
            .send()
            .await
            .expect("send")
            .text()
            .await
            .expect("body");
        let usage = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|chunk| chunk["timings"].is_object())
            .expect("a usage chunk with timings");
        let t = &usage["timings"];
        if let Some(tpot) = t["tpot_ms"].as_f64() {
            run.tpot_ms.push(tpot);
        }
        run.e2e_ms.push(t["e2e_ms"].as_f64().expect("e2e"));
    }
    run
}

async fn compare(label: &str, engine: Front, n: usize, body: Value) {
    let config = test_config("[telemetry]\ntrace_sample_ratio = 1.0\n");
    let off_server = TestServer::builder(engine.clone())
        .config(&config)
        .start()
        .await;
    let (collector, endpoint) = Collector::start().await;
    let on_server = TestServer::builder(engine)
        .config(&config)
        .traced(&endpoint)
        .start()
        .await;
    // Warm up both, then alternate so drift on a shared machine hits both alike.
    drive(&off_server, 2.min(n), &body).await;
    drive(&on_server, 2.min(n), &body).await;
    let (mut off, mut on) = (
        Run {
            tpot_ms: vec![],
            e2e_ms: vec![],
        },
        Run {
            tpot_ms: vec![],
            e2e_ms: vec![],
        },
    );
    for _ in 0..n {
        let a = drive(&off_server, 1, &body).await;
        let b = drive(&on_server, 1, &body).await;
        off.tpot_ms.extend(a.tpot_ms);
        off.e2e_ms.extend(a.e2e_ms);
        on.tpot_ms.extend(b.tpot_ms);
        on.e2e_ms.extend(b.e2e_ms);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let exported = collector
        .spans()
        .iter()
        .filter(|s| s.name.starts_with("chat"))
        .count();
    let (tpot_off, tpot_on) = (p50(&mut off.tpot_ms), p50(&mut on.tpot_ms));
    let (e2e_off, e2e_on) = (p50(&mut off.e2e_ms), p50(&mut on.e2e_ms));
    println!("{label}: {n} requests each, p50 (traces exported with telemetry on: {exported})");
    println!("  telemetry off: TPOT {tpot_off:.4} ms, e2e {e2e_off:.3} ms");
    println!("  telemetry on:  TPOT {tpot_on:.4} ms, e2e {e2e_on:.3} ms");
    println!(
        "  on/off: TPOT {:+.2}%, e2e {:+.2}%",
        (tpot_on / tpot_off - 1.0) * 100.0,
        (e2e_on / e2e_off - 1.0) * 100.0
    );
    on_server.telemetry.shutdown();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let n = if benchmarking { 200 } else { 1 };
    let tokens: Vec<String> = (0..256).map(|i| format!(" t{i}")).collect();
    let engine = Arc::new(scripted_long(Script::tokens(&tokens, Duration::ZERO)));
    let body = chat_body(
        "hi",
        json!({"stream": true, "max_tokens": 256, "stream_options": {"include_usage": true}}),
    );
    compare(
        "scripted engine, 256 tokens at zero delay",
        engine.into(),
        n,
        body,
    )
    .await;

    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(llmgate::config::DEFAULT_MODEL_PATH);
    if benchmarking && model.is_file() {
        let engine = llmgate::engine::mistral::MistralEngine::load_now(
            llmgate::engine::mistral::MistralSettings {
                force_cpu: true,
                ..llmgate::engine::mistral::MistralSettings::new(model, common::MODEL)
            },
        )
        .await
        .expect("the default model loads");
        let body = chat_body(
            "Write a short story about a robot.",
            json!({"stream": true, "max_tokens": 64, "temperature": 0,
                   "stream_options": {"include_usage": true}}),
        );
        compare("default model, 64 tokens greedy", engine.into(), 20, body).await;
    }
}

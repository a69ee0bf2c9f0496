//! The semantic-log pipeline under load, against the in-test Elasticsearch
//! (tests/common/es.rs):
//!
//! 1. the cluster is down for a minute while documents arrive at a steady rate: resident
//!    memory, queue and spool are sampled every 5 s;
//! 2. the cluster comes back: how fast the spool drains into it (documents/s), and
//!    whether every document arrived exactly once;
//! 3. the request-path cost of one hand-off (build, redact, encode, spool append).
//!
//! `cargo bench --bench semlog` runs it in full; `cargo test` runs a seconds-long smoke
//! version (`--bench` absent).
//!
//! With `LLMGATE_BENCH_NODE_URL` (scripts/semlog-bench starts a real OpenSearch node and
//! sets it) it measures instead the indexer's documents/s into that node against the
//! node's own bulk rate from a plain client sending the same documents (see
//! [`real_node`]).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::es::FakeEs;
use llmgate::config::{Config, ServeArgs};
use llmgate::quality::Quality;
use llmgate::record::TraceIds;
use llmgate::record::{RequestObserver, RequestParams, RequestRecord, Status};
use llmgate::semlog::Semlog;
use llmgate::telemetry::metrics::{resident_memory_bytes, Metrics};
use llmgate::timing::{Phases, Timings};
use llmgate::tokens::{FinishReason, Usage};

fn record(i: usize) -> RequestRecord {
    RequestRecord {
        response_id: Some(format!("chatcmpl-bench-{i}")),
        operation: llmgate::names::OPERATION_CHAT,
        request_id: format!("bench-{i:08}"),
        api_key_id: None,
        model: common::MODEL.into(),
        stream: true,
        status: Status::Ok,
        error_kind: None,
        finish_reason: Some(FinishReason::Stop),
        usage: Usage {
            prompt_tokens: 40,
            completion_tokens: 64,
            cached_tokens: None,
            reasoning_tokens: None,
        },
        timings: Timings {
            ttft_ms: Some(540.0),
            engine_ttft_ms: Some(538.0),
            tpot_ms: Some(23.5),
            e2e_ms: 2020.0,
            queue_ms: Some(1.0),
            itl_ms: None,
            tokens_per_second: Some(31.7),
            output_tokens: 64,
            chunks: 64,
            delivery_ms: None,
            client_wait_ms: Some(0.0),
            upstream_ttft_ms: None,
            overhead_ms: 0.0,
            kinds: Default::default(),
        },
        quality: Some(Quality {
            repetition_rate: 0.12,
            degenerated: false,
            refusal: false,
            intent: "general".into(),
            language: "eng",
            answer_language: "eng",
            mean_logprob: Some(-0.8),
            min_logprob: Some(-4.1),
            low_confidence_share: Some(0.06),
            repetition_basis: Default::default(),
        }),
        input_hash: Some("a".repeat(64)),
        output_hash: Some("b".repeat(64)),
        seed: None,
        served: Some(std::sync::Arc::new(llmgate::engine::ModelInfo {
            id: "smollm2-135m-instruct".into(),
            context_length: 8192,
            system_fingerprint: "fp_0123456789abcdef".into(),
            sha256: "0c1d3326cd9793cfb7296113c063dd5c24e2bd734b48ec1a3d01b7158eca9387".into(),
            quant: "Q8_0".into(),
            device: "cpu/quantized".into(),
            accelerator: Default::default(),
            upstream: None,
            loaded_at: 0,
        })),
        params: RequestParams::default(),
        trace: TraceIds {
            trace_id: opentelemetry::trace::TraceId::from(i as u128 + 1),
            span_id: opentelemetry::trace::SpanId::from(i as u64 + 1),
        },
        phases: Phases::default(),
        itl_gaps: Vec::new(),
        user: None,
        received_at: SystemTime::now(),
        prompt: Some(format!(
            "Hi, I am customer {i}, reach me at user{i}@example.com or +44 20 7946 0958. \
             Please summarise the attached quarterly report in three bullet points and \
             suggest two follow-up questions for the finance team."
        )),
        response: Some(
            "Here is a summary of the report: revenue grew 12% year over year, costs were \
             flat, and the outlook for the next quarter is cautious. Follow-up questions: \
             what drove the revenue growth, and which costs can still be reduced?"
                .repeat(3),
        ),
        upstream: None,
        quota_hold: None,
        shadow: None,
        split: None,
        comparison: None,
        agent: None,
    }
}

fn config(es: &FakeEs, dir: &std::path::Path) -> Config {
    config_for(&format!("es_url = \"{}\"", es.url), dir)
}

/// A configuration whose `[semlog]` table has `lines` besides its data folder.
fn config_for(lines: &str, dir: &std::path::Path) -> Config {
    let text = format!(
        "[engine]\nmodel_id = \"{}\"\n[semlog]\ndata_dir = \"{}\"\n{lines}\n",
        common::MODEL,
        dir.display(),
    );
    Config::from_toml(&ServeArgs::default(), &text).expect("config")
}

/// Indexer against the node's limit, on one real node at `url`, the same `N` documents
/// each way, three times in turn (the JVM warms up on the first):
/// - the gateway's pipeline: `N` requests observed at once into the namespace `gatewayK`,
///   timed until the node counts them all (spool, batches of `batch_docs`, gzip, `create`
///   with the event id, per-item outcomes);
/// - a plain client: the very documents, as the pipeline's NDJSON sink wrote them in
///   `_bulk` form, posted uncompressed in batches of the same size, one request at a time
///   as the indexer sends, into the namespace `plainK`, timed until the last answer.
async fn real_node(url: &str) {
    const N: usize = 20_000;
    let http = reqwest::Client::new();
    let count = |stream: String| {
        let http = http.clone();
        let url = url.to_owned();
        async move {
            let _ = http.post(format!("{url}/{stream}/_refresh")).send().await;
            let answer = http
                .get(format!("{url}/{stream}/_count"))
                .send()
                .await
                .ok()?;
            let body: serde_json::Value = answer.json().await.ok()?;
            body["count"].as_u64()
        }
    };
    // The documents once, through the NDJSON sink.
    let files = tempfile::tempdir().expect("tempdir");
    let files_cfg = config_for("", files.path()).semlog;
    let pacing = llmgate::semlog::DEFAULT_PACING;
    let sink =
        Semlog::start(&files_cfg, Arc::new(Metrics::new(common::MODEL)), pacing).expect("semlog");
    (0..N).for_each(|i| sink.observe(&record(i)));
    sink.shutdown(Duration::from_secs(60)).await;
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(files.path().join("semlog")).expect("semlog files") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("read");
        lines.extend(text.lines().map(str::to_owned));
    }
    assert_eq!(lines.len(), 2 * N, "an action and a source per document");
    let batch = files_cfg.batch_docs;
    println!("{N} documents, batches of {batch}, one bulk in flight, on {url}");
    for round in 1..=3 {
        let dir = tempfile::tempdir().expect("tempdir");
        let lines_cfg = format!("es_url = \"{url}\"\nnamespace = \"gateway{round}\"");
        let semlog_cfg = config_for(&lines_cfg, dir.path()).semlog;
        let stream = semlog_cfg.data_stream();
        let semlog = Semlog::start(&semlog_cfg, Arc::new(Metrics::new(common::MODEL)), pacing)
            .expect("semlog");
        // One document first: the set-up has run and the stream exists when the clock starts.
        semlog.observe(&record(N));
        while count(stream.clone()).await != Some(1) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let started = Instant::now();
        (0..N).for_each(|i| semlog.observe(&record(i)));
        while count(stream.clone()).await.unwrap_or(0) < N as u64 + 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let gateway = N as f64 / started.elapsed().as_secs_f64();
        semlog.shutdown(Duration::from_secs(10)).await;

        let plain_stream = stream.replace("gateway", "plain");
        let started = Instant::now();
        for chunk in lines.chunks(2 * batch) {
            let body = chunk.join("\n") + "\n";
            let answer = http
                .post(format!("{url}/{plain_stream}/_bulk"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("bulk");
            let items: serde_json::Value = answer.json().await.expect("bulk answer");
            assert_eq!(items["errors"], false, "plain bulk refused: {items}");
        }
        let plain = N as f64 / started.elapsed().as_secs_f64();
        assert_eq!(count(plain_stream).await, Some(N as u64));
        println!(
            "round {round}: gateway {gateway:>7.0} documents/s, plain client {plain:>7.0} documents/s, \
             gateway at {:.0}% of the plain client",
            100.0 * gateway / plain
        );
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Ok(url) = std::env::var("LLMGATE_BENCH_NODE_URL") {
        return real_node(&url).await;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let (outage, rate) = if full {
        (Duration::from_secs(60), 1000u32)
    } else {
        (Duration::from_secs(2), 200)
    };
    let es = FakeEs::not_yet();
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = Arc::new(Metrics::new(common::MODEL));
    let semlog = Semlog::start(
        &config(&es, dir.path()).semlog,
        Arc::clone(&metrics),
        // Retry at most every 2 s, so the drain starts soon after the cluster is back.
        llmgate::semlog::indexer::Pacing {
            max_backoff: Duration::from_secs(2),
            ..llmgate::semlog::DEFAULT_PACING
        },
    )
    .expect("semlog");

    // 1. Cluster down, steady load.
    let rss_before = resident_memory_bytes().unwrap_or(0);
    println!(
        "cluster down for {} s at {rate} documents/s; resident memory at start {:.1} MiB",
        outage.as_secs(),
        mib(rss_before)
    );
    let started = Instant::now();
    let mut sent = 0usize;
    let mut handoff = Duration::ZERO;
    let mut next_sample = Duration::from_secs(5);
    let tick = Duration::from_secs(1) / rate;
    while started.elapsed() < outage {
        let r = record(sent);
        let t = Instant::now();
        semlog.observe(&r);
        handoff += t.elapsed();
        sent += 1;
        let due = tick * sent as u32;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        if started.elapsed() >= next_sample {
            let backlog = semlog.backlog();
            println!(
                "  t={:>3} s  sent {sent:>6}  rss {:>6.1} MiB  queue {:>5}  spool {:>6.1} MiB",
                next_sample.as_secs(),
                mib(resident_memory_bytes().unwrap_or(0)),
                backlog.queued,
                mib(backlog.spooled_bytes)
            );
            next_sample += Duration::from_secs(5);
        }
    }
    let rss_after = resident_memory_bytes().unwrap_or(0);
    println!(
        "  after the outage: rss {:.1} MiB ({:+.1} MiB), spool {:.1} MiB for {sent} documents",
        mib(rss_after),
        mib(rss_after) - mib(rss_before),
        mib(semlog.backlog().spooled_bytes)
    );
    println!(
        "request-path hand-off (build + redact + encode + spool append): {:.1} µs per document",
        handoff.as_secs_f64() * 1e6 / sent as f64
    );

    // 2. Cluster back: drain.
    let back = Instant::now();
    es.come_back();
    let mut first_bulk = None;
    while es.doc_count() < sent && back.elapsed() < Duration::from_secs(600) {
        if first_bulk.is_none() && !es.bulks().is_empty() {
            first_bulk = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let indexed = es.doc_count();
    let draining = first_bulk.map_or(back.elapsed(), |t| t.elapsed());
    println!(
        "cluster back: first bulk after {:.2} s (set-up retry backoff); {indexed} of {sent} documents \
         indexed in {:.2} s from the first bulk = {:.0} documents/s ({} bulk requests)",
        (back.elapsed() - draining).as_secs_f64(),
        draining.as_secs_f64(),
        indexed as f64 / draining.as_secs_f64(),
        es.bulks().len()
    );
    assert_eq!(indexed, sent, "every document arrives exactly once");
    semlog.shutdown(Duration::from_secs(10)).await;
}

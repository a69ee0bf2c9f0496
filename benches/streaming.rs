//! The streaming path on its own: the scripted engine emits tokens at zero delay, so
//! every microsecond measured is the gateway's (chunk assembly, JSON serialisation, the
//! timer and quality bookkeeping, channel hops, SSE framing) plus the loopback HTTP
//! client reading the frames in the same process.
//!
//! Reports frames per second and CPU time per frame (user + system of the whole process,
//! from /proc/self/stat), for one stream and for 8 concurrent streams.
//!
//! `cargo bench --bench streaming`; `cargo test` runs a short smoke version.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{chat_body, scripted_long, test_config, TestServer};
use futures_util::StreamExt;
use llmgate::engine::scripted::Script;
use serde_json::json;

/// CPU seconds (user + system) this process has used, from /proc/self/stat.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on Linux for every architecture llmgate builds for.
    Some(ticks / 100.0)
}

async fn stream_once(client: &reqwest::Client, url: &str, tokens: usize) -> usize {
    let body = chat_body("hi", json!({"stream": true, "max_tokens": tokens}));
    let response = client.post(url).json(&body).send().await.expect("send");
    let mut frames = 0usize;
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("bytes");
        frames += chunk.windows(6).filter(|w| w == b"data: ").count();
    }
    frames
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let tokens = if full { 2000 } else { 50 };
    let rounds = if full { 10 } else { 1 };
    let texts: Vec<String> = (0..tokens).map(|i| format!(" w{i}")).collect();
    // A context long enough for the answer; the default cap allows 2048 tokens.
    let engine = Arc::new(scripted_long(Script::tokens(&texts, Duration::ZERO)));
    let server = TestServer::builder(engine)
        .config(&test_config(""))
        .start()
        .await;
    let url = server.url("/v1/chat/completions");
    let client = reqwest::Client::new();
    stream_once(&client, &url, tokens).await;

    for streams in [1usize, 8] {
        let cpu0 = cpu_seconds().unwrap_or(0.0);
        let started = Instant::now();
        let mut frames = 0usize;
        for _ in 0..rounds {
            let tasks: Vec<_> = (0..streams)
                .map(|_| {
                    let (client, url) = (client.clone(), url.clone());
                    tokio::spawn(async move { stream_once(&client, &url, tokens).await })
                })
                .collect();
            for task in tasks {
                frames += task.await.expect("stream");
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds().unwrap_or(0.0) - cpu0;
        println!(
            "{streams} stream(s) x {rounds} x {tokens} tokens: {frames} frames in {wall:.3} s = {:.0} frames/s, {:.2} µs CPU per frame (gateway + client)",
            frames as f64 / wall,
            cpu * 1e6 / frames as f64
        );
    }
}

//! What API keys cost per request.
//!
//! 1. `KeyTable::verify` alone (sha256 of the presented key, then a constant-time
//!    comparison with every entry) for files of 1, 100 and 1,000 keys.
//! 2. `KeyBudget::charge` (one request and its tokens against a key with both limits): the
//!    per-request cost of rate limits, on the chat route only.
//! 3. Through the real server (the scripted engine): `GET /v1/models` over one kept-alive
//!    connection, with keys and without, alternating in rounds; the median of each.
//!
//! `cargo bench --bench auth` prints microseconds; `cargo test` runs a short smoke version.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use llmgate::auth::limits::{KeyBudget, LimitClock, Limits};
use llmgate::auth::{add_key, Guard, KeyTable, Keys};
use llmgate::clock::MonotonicClock;

fn median(mut times: Vec<Duration>) -> f64 {
    times.sort_unstable();
    times[times.len() / 2].as_secs_f64() * 1e6
}

fn verify_cost(keys: usize, calls: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let mut last = String::new();
    for i in 0..keys {
        last = add_key(&file, &format!("key-{i}")).expect("add");
    }
    let table = KeyTable::parse(&std::fs::read_to_string(&file).expect("read")).expect("parse");
    for (name, key) in [("right", last.as_str()), ("wrong", "llmgate-not-a-key")] {
        let times: Vec<Duration> = (0..calls)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(table.verify(std::hint::black_box(key)));
                t.elapsed()
            })
            .collect();
        println!(
            "verify, {keys:>5} keys, {name} key: {:>7.2} µs (p50)",
            median(times)
        );
    }
}

fn charge_cost(calls: usize) {
    // Limits no bench run reaches, so every charge passes (the common case).
    let budget = KeyBudget::with_clock(
        Limits {
            requests_per_minute: std::num::NonZeroU32::new(u32::MAX),
            tokens_per_minute: std::num::NonZeroU32::new(u32::MAX),
        },
        LimitClock(Arc::new(MonotonicClock::new())),
    );
    let times: Vec<Duration> = (0..calls)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(budget.charge(std::hint::black_box(300)).is_ok());
            t.elapsed()
        })
        .collect();
    println!(
        "charge, requests and tokens limits: {:>7.2} µs (p50)",
        median(times)
    );
}

async fn per_request(requests: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let key = add_key(&file, "bench").expect("add");
    let config = common::test_config("");
    let engine = || {
        Arc::new(common::scripted(llmgate::engine::scripted::Script::tokens(
            &["x"],
            Duration::ZERO,
        )))
    };
    let open = common::TestServer::builder(engine())
        .config(&config)
        .start()
        .await;
    let guard = Guard {
        keys: Some(Arc::new(
            Keys::load(&file, Limits::default(), Arc::new(MonotonicClock::new())).expect("keys"),
        )),
        metrics_need_key: false,
    };
    let guarded = common::TestServer::builder(engine())
        .config(&config)
        .guard(guard)
        .start()
        .await;
    let client = reqwest::Client::new();
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..requests {
        for (i, server) in [&open, &guarded].into_iter().enumerate() {
            let request = client.get(server.url("/v1/models")).bearer_auth(&key);
            let t = Instant::now();
            let response = request.send().await.expect("request");
            assert_eq!(response.status(), 200);
            response.bytes().await.expect("body");
            if round >= requests / 10 {
                times[i].push(t.elapsed());
            }
        }
    }
    let [open_times, guarded_times] = times;
    let (a, b) = (median(open_times), median(guarded_times));
    println!(
        "GET /v1/models over HTTP: open {a:.1} µs, with keys {b:.1} µs (p50), difference {:+.1} µs",
        b - a
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (calls, requests) = if full { (20_000, 4_000) } else { (50, 20) };
    for keys in [1, 100, 1000] {
        verify_cost(if full { keys } else { keys.min(10) }, calls);
    }
    charge_cost(calls);
    per_request(requests).await;
}

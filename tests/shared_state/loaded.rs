//! Shared quotas on a loaded host (issue 61): six clients on three gateways spend one
//! daily quota while threads that never yield keep every core busy, with the deadline
//! left at its default. An outside tester saw the 5 ms deadline expire under such load:
//! `fail_open` gateways then fell back to their own counts and a 500-token quota was
//! spent four times over; `fail_closed` ones refused with 503 while Redis was healthy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::upstream::start_upstream;
use crate::harness::{keys_dir, script, usage_tokens, Gateway, Redis};
use llmgate::bench::upstream::UpstreamScript;

/// Threads that spin until dropped, one per core: the CPU burner beside the gateways.
struct Burner {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Burner {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Burner { stop, threads }
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What the six clients got: tokens the key used, the largest answer, 503s, refusals.
struct Outcome {
    used: u64,
    largest: u64,
    unavailable: u32,
    answered: u32,
    timeouts: u64,
}

async fn six_clients_on_a_loaded_host(on_failure: &str) -> Outcome {
    let redis = Redis::start();
    // Answers of 100 tokens over ~0.2 s, so each client's requests overlap the others'.
    let upstream = start_upstream(UpstreamScript {
        tokens: 100,
        interval: Duration::from_millis(2),
        ..script()
    })
    .await;
    let dir = keys_dir("daily_tokens=2000");
    let args = ["--state-on-failure", on_failure];
    let gateways = Gateway::three(dir.path(), Some(&upstream.url), &redis, &args).await;
    let burner = Burner::start();
    let clients = (0..6).map(|c| {
        let gateway = &gateways[c % 3];
        async move {
            let (mut answered, mut unavailable, mut largest) = (0u32, 0u32, 0u64);
            for _ in 0..500 {
                let (status, body, _) = gateway.chat_with(100).await;
                match (status, body["error"]["code"].as_str()) {
                    (200, _) => {
                        answered += 1;
                        largest = largest.max(usage_tokens(&body));
                    }
                    (429, Some("quota_held")) => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    (429, Some("insufficient_quota")) => break,
                    (503, Some("state_unavailable")) => {
                        unavailable += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    _ => panic!("{status}: {body}"),
                }
            }
            (answered, unavailable, largest)
        }
    });
    let outcomes = futures_util::future::join_all(clients).await;
    drop(burner);
    let stats = gateways[0].stats().await;
    let mut timeouts = 0;
    for gateway in &gateways {
        timeouts += gateway
            .metrics()
            .await
            .lines()
            .filter(|l| l.starts_with("llmgate_state_failures_total") && l.contains("timeout"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Outcome {
        used: stats["quotas"][0]["used"].as_u64().expect("used"),
        largest: outcomes.iter().map(|o| o.2).max().unwrap_or(0),
        unavailable: outcomes.iter().map(|o| o.1).sum(),
        answered: outcomes.iter().map(|o| o.0).sum(),
        timeouts,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_holds_on_a_loaded_host_failing_open() {
    let o = six_clients_on_a_loaded_host("fail_open").await;
    eprintln!(
        "fail_open: {} used of 2000 by {} answers of up to {}, {} deadline misses",
        o.used, o.answered, o.largest, o.timeouts
    );
    assert!(
        o.used < 2000 + o.largest,
        "{} tokens used; at most the quota and one answer ({}) expected ({} deadline misses)",
        o.used,
        o.largest,
        o.timeouts
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_holds_on_a_loaded_host_failing_closed() {
    let o = six_clients_on_a_loaded_host("fail_closed").await;
    eprintln!(
        "fail_closed: {} used of 2000 by {} answers of up to {}, {} refused 503, {} deadline misses",
        o.used, o.answered, o.largest, o.unavailable, o.timeouts
    );
    assert!(o.used < 2000 + o.largest, "{} tokens used", o.used);
    assert_eq!(
        o.unavailable, 0,
        "Redis was healthy: no request should meet fail_closed ({} deadline misses)",
        o.timeouts
    );
}

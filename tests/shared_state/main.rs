//! State shared through Redis, black-box: a real `redis-server` (Debian's; `scripts/setup
//! test` installs it) and gateway processes (the `llmgate` binary) on one keys file, in
//! front of scripted upstreams. A limit and a quota hold across gateways; Redis gone or
//! hung neither hangs a request nor stops `fail_open` gateways, `fail_closed` ones refuse
//! with 503, and both recover when Redis returns (or vanishes without a reset and is
//! reached afresh); `fail_open` holds a key to the gateway's own limits and to the quota
//! Redis last counted, and hands Redis what it counted meanwhile; a replica one gateway
//! ejects is out for all, and one conversation stays on one replica whichever gateway
//! takes a turn.

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod loaded;
mod topologies;

use std::path::Path;
use std::time::{Duration, Instant};

use common::upstream::{start_upstream, UPSTREAM_MODEL};
use harness::{keys_dir, script, usage_tokens, Gateway, Redis, Relay, KEY};
use llmgate::bench::upstream::{ScriptedFault, UpstreamScript};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_holds_across_three_gateways() {
    let redis = Redis::start();
    let upstream = start_upstream(script()).await;
    let dir = keys_dir("rpm=60");
    // A deadline a loaded test machine meets: a call past it would fall back to the
    // gateway's own limits (fail_open), which is another test's subject.
    let deadline = ["--state-timeout-ms", "500"];
    let gateways = Gateway::three(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    // 200 requests, spread over the three, 12 at a time.
    let started = Instant::now();
    let mut allowed = [0usize; 3];
    let mut refused = 0;
    for round in 0..(200 / 12 + 1) {
        let batch: Vec<_> = (0..12)
            .map(|i| round * 12 + i)
            .filter(|n| *n < 200)
            .map(|n| {
                let gateway = &gateways[n % 3];
                async move { (n % 3, gateway.chat().await) }
            })
            .collect();
        for (which, (status, body, _)) in futures_util::future::join_all(batch).await {
            match status {
                200 => allowed[which] += 1,
                429 => {
                    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
                    refused += 1;
                }
                other => panic!("unexpected {other}: {body}"),
            }
        }
    }
    let elapsed = started.elapsed();
    let total: usize = allowed.iter().sum();
    assert_eq!(total + refused, 200);
    // A 60 rpm bucket gives 60 at once and one more each second after; three gateways
    // each enforcing it alone would have let 180 through.
    let refilled = elapsed.as_secs() as usize + 1;
    assert!(
        (60..=60 + refilled).contains(&total),
        "{total} allowed in {elapsed:?} ({allowed:?} by gateway); 60 + at most {refilled} refilled expected"
    );
    assert!(
        allowed.iter().all(|n| *n > 0),
        "every gateway answered some: {allowed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_gone_or_hung_never_hangs_a_request_and_both_policies_recover() {
    let mut redis = Redis::start();
    let upstream = start_upstream(script()).await;
    let dir = keys_dir("rpm=100000");
    // A deadline long enough for a loaded test machine; what matters is that it holds.
    let deadline = ["--state-timeout-ms", "200"];
    let open = Gateway::start(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    let closed_args = [&deadline[..], &["--state-on-failure", "fail_closed"]].concat();
    let closed = Gateway::start(dir.path(), Some(&upstream.url), &redis, &closed_args).await;
    for gateway in [&open, &closed] {
        assert_eq!(gateway.chat().await.0, 200);
        assert!(gateway.until_state_up().await);
    }

    for (how, stop) in [("hung", true), ("gone", false)] {
        if stop {
            redis.signal("-STOP");
        } else {
            redis.stop();
        }
        let (status, body, took) = open.chat().await;
        assert_eq!(status, 200, "Redis {how}: fail_open answers: {body}");
        assert!(
            took < Duration::from_secs(3),
            "Redis {how}: fail_open took {took:?}"
        );
        let (status, body, took) = closed.chat().await;
        assert_eq!(status, 503, "Redis {how}: fail_closed refuses: {body}");
        assert_eq!(body["error"]["code"], "state_unavailable");
        assert!(
            took < Duration::from_secs(3),
            "Redis {how}: fail_closed took {took:?}"
        );
        assert!(
            closed.until_ready(503).await,
            "Redis {how}: not ready when refusing all"
        );
        // Each gateway's watcher pings on its own second.
        assert!(
            open.until_state(false).await,
            "Redis {how}: fail_open sees it"
        );
        let (status, ready) = open.ready().await;
        assert_eq!(status, 200, "Redis {how}: fail_open stays ready: {ready}");

        if stop {
            redis.signal("-CONT");
        } else {
            redis.start_again();
        }
        assert!(
            closed.until_ready(200).await,
            "Redis back after {how}: ready again"
        );
        assert_eq!(
            closed.chat().await.0,
            200,
            "Redis back after {how}: answers again"
        );
        assert!(
            open.until_state_up().await,
            "Redis back after {how}: fail_open sees it"
        );
    }
    let metrics = closed.metrics().await;
    assert!(
        metrics.contains("llmgate_state_up{backend=\"redis\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("llmgate_requests_total{model=\"shared\",status=\"error\",finish_reason=\"none\",error_type=\"state_unavailable\",traffic=\"client\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_quota_holds_across_three_gateways() {
    let redis = Redis::start();
    // Answers that take a while (100 tokens, 2 ms apart), so requests overlap.
    let upstream = start_upstream(UpstreamScript {
        tokens: 100,
        interval: Duration::from_millis(2),
        ..script()
    })
    .await;
    let dir = keys_dir("daily_tokens=10000");
    let deadline = ["--state-timeout-ms", "500"];
    let gateways = Gateway::three(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    // Six clients at once, two on each gateway, each until the quota is used up; one
    // that finds the rest held by the others' requests waits and tries again.
    let clients = (0..6).map(|c| {
        let gateway = &gateways[c % 3];
        async move {
            let (mut answered, mut held, mut largest) = (0u32, 0u32, 0u64);
            loop {
                let (status, body, _) = gateway.chat_with(100).await;
                match (status, body["error"]["code"].as_str()) {
                    (200, _) => {
                        answered += 1;
                        largest = largest.max(usage_tokens(&body));
                    }
                    (429, Some("quota_held")) => {
                        held += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    (429, Some("insufficient_quota")) => return (answered, held, largest),
                    _ => panic!("{status}: {body}"),
                }
                assert!(answered < 500, "the quota never stopped the key");
            }
        }
    });
    let outcomes = futures_util::future::join_all(clients).await;
    let answered: u32 = outcomes.iter().map(|o| o.0).sum();
    let held: u32 = outcomes.iter().map(|o| o.1).sum();
    let request_tokens = outcomes.iter().map(|o| o.2).max().unwrap_or(0);
    for gateway in &gateways {
        let (status, body, _) = gateway.chat_with(100).await;
        assert_eq!(status, 429, "every gateway refuses now: {body}");
        assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
    }
    let stats = gateways[0].stats().await;
    let quota = &stats["quotas"][0];
    let used = quota["used"].as_u64().expect("used");
    eprintln!("quota: {used} used by {answered} answers of up to {request_tokens}, {held} refusals while held");
    // A request passes only while used and held tokens stay under the quota, and holds
    // its prompt and max_tokens (about one answer here): it passes by less than that.
    assert!(
        (10_000..10_000 + request_tokens).contains(&used),
        "{used} tokens used by {answered} answers of up to {request_tokens} ({held} refusals while held); 10,000 and less than one answer more expected"
    );
    assert_eq!(quota["held"], 0, "every hold is released: {quota}");
    // Whether the six clients meet each other's holds depends on how their last requests
    // interleave: CI met none in one run of many (10,080 used, within the bound). The
    // bound above is the property; `held` is reported, not required.
    // Each gateway counts what it answered; together, what the key used.
    let mut counted = 0;
    for gateway in &gateways {
        let metrics = gateway.metrics().await;
        counted += metrics
            .lines()
            .find_map(|l| l.strip_prefix("llmgate_quota_tokens_total{api_key_id=\"alice\"} "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("a count on every gateway");
    }
    assert_eq!(counted, used);
}

/// A config file serving `urls` as one upstream model `shared` with `policy`, each
/// failure ejecting a replica for a minute.
fn fleet_config(dir: &Path, urls: &[&str], policy: &str) -> String {
    let path = dir.join(format!("fleet-{policy}.toml"));
    let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    let text = format!(
        "[[models]]\nid = \"shared\"\nengine = \"upstream\"\nurls = [{}]\nupstream_model = \"{UPSTREAM_MODEL}\"\npolicy = \"{policy}\"\neject_after_failures = 1\neject_secs = 60\n",
        urls.join(", ")
    );
    std::fs::write(&path, text).expect("config");
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejection_by_one_gateway_reaches_the_others_within_a_second() {
    let redis = Redis::start();
    let bad = start_upstream(UpstreamScript {
        fault: Some(ScriptedFault::ServerError),
        ..script()
    })
    .await;
    let good = start_upstream(script()).await;
    let dir = keys_dir("");
    let config = fleet_config(dir.path(), &[&bad.url, &good.url], "round_robin");
    let args = ["--config", config.as_str(), "--state-timeout-ms", "500"];
    let gateways = Gateway::three(dir.path(), None, &redis, &args).await;
    // Only the first gateway sends work; round robin gives the bad replica its turn.
    for _ in 0..2 {
        let (status, body, _) = gateways[0].chat().await;
        assert_eq!(status, 200, "failed over: {body}");
    }
    assert_eq!(gateways[0].state_of(&bad.url).await, "ejected");
    let ejected = Instant::now();
    for gateway in &gateways[1..] {
        let mut state = String::new();
        while ejected.elapsed() < Duration::from_secs(3) {
            state = gateway.state_of(&bad.url).await;
            if state == "ejected" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(state, "ejected", "another gateway learned it");
    }
    // Within a second (a sync every 500 ms on each side, and the polling above).
    assert!(
        ejected.elapsed() < Duration::from_millis(1500),
        "{:?}",
        ejected.elapsed()
    );
    assert_eq!(gateways[2].state_of(&good.url).await, "up");
    // A gateway that never met the bad replica does not send it a request.
    let before = bad.received().len();
    for _ in 0..4 {
        assert_eq!(gateways[1].chat().await.0, 200);
    }
    assert_eq!(bad.received().len(), before, "the others keep away from it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_conversation_stays_on_one_replica_whichever_gateway_takes_each_turn() {
    let redis = Redis::start();
    let recorded = || UpstreamScript {
        record: true,
        ..script()
    };
    let replicas = [
        start_upstream(recorded()).await,
        start_upstream(recorded()).await,
        start_upstream(recorded()).await,
    ];
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    let dir = keys_dir("");
    let config = fleet_config(dir.path(), &urls, "prefix_affinity");
    let args = ["--config", config.as_str()];
    let gateways = Gateway::three(dir.path(), None, &redis, &args).await;
    let system = "You are the support assistant of a shop that sells tea. ".repeat(8);
    for conversation in 0..3 {
        let before: Vec<usize> = replicas.iter().map(|r| r.received().len()).collect();
        let mut messages = vec![json!({"role": "system", "content": system})];
        for turn in 0..6 {
            messages.push(json!({"role": "user", "content": format!("conversation {conversation}, turn {turn}")}));
            let response = reqwest::Client::new()
                .post(format!("{}/v1/chat/completions", gateways[turn % 3].base))
                .bearer_auth(KEY)
                .json(&json!({"model": "shared", "messages": messages, "max_tokens": 4}))
                .send()
                .await
                .expect("answer");
            assert_eq!(response.status(), 200);
            messages.push(json!({"role": "assistant", "content": "tok0 tok1 tok2 tok3"}));
        }
        let got: Vec<usize> = replicas
            .iter()
            .zip(&before)
            .map(|(r, b)| r.received().len() - b)
            .collect();
        assert!(
            got.contains(&6),
            "conversation {conversation}: every turn on one replica, not {got:?}"
        );
    }
}

/// A CA, and a certificate it signed for 127.0.0.1 with its key, as PEM files in `dir`:
/// `ca.pem`, `server.pem`, `server.key`.
fn tls_files(dir: &Path) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&key, &ca, &ca_key)
        .expect("certificate");
    std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write");
    std::fs::write(dir.join("server.pem"), server.pem()).expect("write");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_shared_over_tls_with_the_servers_ca_and_refused_without_it() {
    let dir = keys_dir("rpm=3");
    tls_files(dir.path());
    let redis = Redis::start_tls(dir.path());
    let upstream = start_upstream(script()).await;
    let ca = dir.path().join("ca.pem").display().to_string();
    let args = ["--state-timeout-ms", "500", "--state-redis-ca-cert", &ca];
    let trusted = Gateway::start(dir.path(), Some(&upstream.url), &redis, &args).await;
    assert!(
        trusted.until_state_up().await,
        "{}",
        trusted.ready().await.1
    );
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(trusted.chat().await.0);
    }
    assert_eq!(
        seen,
        [200, 200, 200, 429],
        "the limit is kept in Redis, over TLS"
    );
    // Without the CA the server's certificate is not trusted: no connection, and the
    // gateway says so (and answers on its own limits, fail_open).
    let untrusting = Gateway::start(dir.path(), Some(&upstream.url), &redis, &args[..2]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, ready) = untrusting.ready().await;
    assert_eq!(ready["state"]["up"], false, "{ready}");
    assert_eq!(
        untrusting.chat().await.0,
        200,
        "its own limits: a fresh budget"
    );
}

/// The tokens an answer used, from its `usage`.
fn used_by(body: &serde_json::Value) -> u64 {
    let usage = &body["usage"];
    usage["prompt_tokens"].as_u64().unwrap_or(0) + usage["completion_tokens"].as_u64().unwrap_or(0)
}

/// Issue 61: under `fail_open`, requests admitted by the gateway's own count while
/// Redis did not answer passed the quota, because that count did not know the tokens
/// the gateway's own requests still held in Redis. Each hold Redis grants is now
/// mirrored in the gateway's count until its request ends, so the fallback counts it:
/// in flight together, the key passes its quota by less than one request's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_counts_the_holds_its_gateway_took_in_redis() {
    // Each answer holds about 560 tokens of a 1,000-token day for its 4 s.
    let upstream = start_upstream(UpstreamScript {
        tokens: 8,
        first_delay: Duration::from_secs(4),
        ..script()
    })
    .await;
    let redis = Redis::start();
    let dir = keys_dir("daily_tokens=1000");
    let deadline = ["--state-timeout-ms", "200"];
    let gateway = Gateway::start(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    let after = |ms: u64| {
        let gateway = &gateway;
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let (status, body, _) = gateway.chat_with(550).await;
            (status, body)
        }
    };
    let stop = async {
        // Redis stops answering once the first request is admitted and held there.
        tokio::time::sleep(Duration::from_millis(400)).await;
        redis.signal("-STOP");
    };
    // The first held in Redis; the second by the fallback (560 held < 1,000); the third
    // finds 1,120 held, 560 of them by the first, which the fallback did not see before.
    let (first, second, third, ()) = tokio::join!(after(0), after(800), after(1600), stop);
    redis.signal("-CONT");
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(second.0, 200, "{}", second.1);
    assert_eq!(
        third.0, 429,
        "the fallback let a third hold pass the quota: {}",
        third.1
    );
    assert_eq!(third.1["error"]["code"], "quota_held", "{}", third.1);
}

/// A gateway's count of calls to Redis not tried because its watcher found it gone.
async fn calls_not_tried(gateway: &Gateway) -> u64 {
    let metrics = gateway.metrics().await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("llmgate_state_failures_total{reason=\"down\"} "))
        .and_then(|v| v.parse().ok())
        .expect("the down reason is counted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_starts_from_what_redis_counted_and_hands_its_own_count_back() {
    let upstream = start_upstream(script()).await;
    let deadline = ["--state-timeout-ms", "200"];

    // A quota spent through another gateway while Redis answered stays spent when it
    // hangs: a gateway falls back to its own count, which starts from what Redis said,
    // not from nothing.
    let redis = Redis::start();
    let dir = keys_dir("daily_tokens=100");
    let spender = Gateway::start(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    let gateway = Gateway::start(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    let mut answered = 0;
    loop {
        let (status, body, _) = spender.chat().await;
        match (status, body["error"]["code"].as_str()) {
            (200, _) => answered += 1,
            (429, Some("insufficient_quota")) => break,
            // The last answer's hold is released just after it, off its path.
            (429, Some("quota_held")) => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => panic!("{status}: {body}"),
        }
        assert!(answered < 50, "the quota never stopped the key");
    }
    let (status, body, _) = gateway.chat().await;
    assert_eq!(status, 429, "spent, through the other gateway: {body}");
    redis.signal("-STOP");
    assert!(gateway.until_state(false).await, "the watcher sees it hang");
    // Refused by the gateway's own count, whether its call to Redis timed out or (once
    // two pings went unanswered) was not tried.
    for _ in 0..50 {
        let (status, body, _) = gateway.chat().await;
        assert_eq!(status, 429, "spent, as Redis said: {body}");
        assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
        if calls_not_tried(&gateway).await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        calls_not_tried(&gateway).await > 0,
        "a Redis found gone is not called"
    );
    redis.signal("-CONT");

    // What a gateway counted while Redis hung goes there once it is back.
    let redis = Redis::start();
    let dir = keys_dir("daily_tokens=100000");
    let open = Gateway::start(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    let other = Gateway::start(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    let mut used = 0;
    let ask = async |phase: &str| {
        let (status, body, _) = open.chat().await;
        assert_eq!(status, 200, "{phase}: {body}");
        used_by(&body)
    };
    let counted_in_redis = async |used| {
        // Each answer is counted just after it, off its path.
        let mut seen = None;
        for _ in 0..50 {
            seen = other.stats().await["quotas"][0]["used"].as_u64();
            if seen == Some(used) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    };
    for _ in 0..2 {
        used += ask("Redis up").await;
    }
    assert_eq!(counted_in_redis(used).await, Some(used));
    redis.signal("-STOP");
    assert!(open.until_state(false).await, "the watcher sees it hang");
    for _ in 0..3 {
        used += ask("Redis hung, fail_open").await;
    }
    redis.signal("-CONT");
    assert!(open.until_state_up().await, "the watcher sees it back");
    used += ask("Redis back").await;
    let seen = counted_in_redis(used).await;
    assert_eq!(
        seen,
        Some(used),
        "Redis counts every answer, those counted while it hung too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_a_redis_that_vanished_without_a_reset_are_made_again() {
    let redis = Redis::start();
    let relay = Relay::start(redis.port).await;
    let upstream = start_upstream(script()).await;
    let dir = keys_dir("rpm=100000");
    let args = [
        "--state-timeout-ms",
        "200",
        "--state-on-failure",
        "fail_closed",
    ];
    let gateway = Gateway::start(dir.path(), Some(&upstream.url), &relay, &args).await;
    assert!(gateway.until_state_up().await);
    // Requests on every worker thread, so each holds a connection.
    let warm = (0..16).map(|_| gateway.chat());
    for (status, body, _) in futures_util::future::join_all(warm).await {
        assert_eq!(status, 200, "{body}");
    }
    // Every connection the gateway holds goes silent; a new one would reach Redis.
    relay.black_hole();
    let mut in_a_row = 0;
    for _ in 0..150 {
        let (status, body, took) = gateway.chat().await;
        assert!(
            took < Duration::from_secs(3),
            "never a hung request: {took:?}"
        );
        match status {
            200 => in_a_row += 1,
            503 => {
                assert_eq!(body["error"]["code"], "state_unavailable", "{body}");
                in_a_row = 0;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("{other}: {body}"),
        }
        if in_a_row == 20 {
            break;
        }
    }
    assert_eq!(in_a_row, 20, "every thread connected afresh");
    assert!(gateway.until_ready(200).await, "ready again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_holds_a_key_to_its_limits_in_the_gateway_while_redis_is_gone() {
    let mut redis = Redis::start();
    let upstream = start_upstream(script()).await;
    let dir = keys_dir("rpm=3");
    let deadline = ["--state-timeout-ms", "200"];
    let gateway = Gateway::start(dir.path(), Some(&upstream.url), &redis, &deadline).await;
    assert!(gateway.until_state_up().await);
    redis.stop();
    assert!(gateway.until_state(false).await, "the watcher sees it gone");
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let (status, body, _) = gateway.chat().await;
        if status == 429 {
            assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
        }
        statuses.push(status);
    }
    // The bucket starts full: 3 at once, then one a minute apart.
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "the gateway's own limit"
    );
}

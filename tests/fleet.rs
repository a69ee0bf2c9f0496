//! One model on several replicas (scripted upstreams): where each request goes under
//! each policy, what a failing replica costs the client (nothing, before the first
//! byte), how it is taken out and shown in `/ready`, `/stats`, the record and the
//! metrics.

mod common;

use std::time::{Duration, Instant};

use common::upstream::*;
use common::*;
use llmgate::bench::upstream::{ScriptedFault as Fault, UpstreamScript};
use llmgate::engine::upstream::fleet::{EndpointView, FleetConfig, Policy};
use llmgate::record::{RequestRecord, Status};
use serde_json::{json, Value};

fn replica(tokens: u32) -> UpstreamScript {
    UpstreamScript {
        model: UPSTREAM_MODEL.into(),
        tokens,
        ..UpstreamScript::default()
    }
}

/// Three replicas answering `tokens` tokens.
async fn three_replicas(tokens: u32) -> [Upstream; 3] {
    [
        start_upstream(replica(tokens)).await,
        start_upstream(replica(tokens)).await,
        start_upstream(replica(tokens)).await,
    ]
}

/// A replica that answers every request with `fault`.
fn failing(fault: Fault) -> UpstreamScript {
    UpstreamScript {
        fault: Some(fault),
        ..replica(4)
    }
}

fn policy(policy: Policy) -> FleetConfig {
    FleetConfig {
        policy,
        ..FleetConfig::default()
    }
}

async fn chat(server: &TestServer, body: &Value) -> (u16, String) {
    let response = post(server, CHAT, body).await;
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// What the gateway's one model says of its replicas.
fn endpoints(server: &TestServer) -> Vec<EndpointView> {
    let model = server.state.models.iter().next().expect("a model");
    model.engine.endpoints()
}

/// The endpoints a record's attempts went to, and how each failed (`None`: answered).
fn route(record: &RequestRecord) -> Vec<(String, Option<&'static str>)> {
    record
        .upstream
        .as_ref()
        .expect("an upstream record")
        .attempts
        .iter()
        .map(|a| (a.endpoint.clone(), a.error_type))
        .collect()
}

#[tokio::test]
async fn round_robin_spreads_requests_and_each_record_names_its_replica() {
    let replicas = three_replicas(3).await;
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    let server = gateway(fleet_config(&urls, policy(Policy::RoundRobin))).await;
    for _ in 0..6 {
        let (status, body) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 200, "{body}");
    }
    for r in &replicas {
        assert_eq!(r.received().len(), 2, "{} got its third", r.url);
    }
    let records = server.observer.records();
    assert_eq!(records.len(), 6);
    for record in &records {
        let route = route(record);
        assert_eq!(route.len(), 1, "no failover: {route:?}");
        assert!(urls.contains(&route[0].0.as_str()) && route[0].1.is_none());
    }
    // Each replica has its own series.
    let text = metrics(&server).await;
    for url in &urls {
        let served = format!(
            "llmgate_endpoint_attempts_total{{model=\"{MODEL}\",endpoint=\"{url}\",error_type=\"none\"}} 2"
        );
        assert!(text.contains(&served), "{served} in\n{text}");
        assert!(text.contains(&format!(
            "llmgate_endpoint_time_to_first_token_seconds_count{{model=\"{MODEL}\",endpoint=\"{url}\"}} 2"
        )));
        assert!(text.contains(&format!(
            "llmgate_endpoint_state{{model=\"{MODEL}\",endpoint=\"{url}\",state=\"up\"}} 1"
        )));
    }
}

#[tokio::test]
async fn a_replica_killed_mid_run_is_failed_over_then_ejected_and_shown_out() {
    let doomed = start_upstream(replica(3)).await;
    let live = start_upstream(replica(3)).await;
    let fleet = FleetConfig {
        policy: Policy::RoundRobin,
        eject_after: 2,
        cool_down: Duration::from_secs(60),
        ..FleetConfig::default()
    };
    let server = gateway(fleet_config(&[&doomed.url, &live.url], fleet)).await;
    for _ in 0..2 {
        let (status, _) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 200);
    }
    assert_eq!(doomed.received().len(), 1, "round robin, both up");
    let gone = doomed.url.clone();
    let doomed_received = std::sync::Arc::clone(&doomed.received);
    doomed.stop().await;
    for _ in 0..6 {
        let (status, body) = chat(&server, &chat_body("hi", json!({"stream": true}))).await;
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains("tok2") && body.ends_with("data: [DONE]\n\n"),
            "{body}"
        );
    }
    // A connection it had open may carry one more answer while it stops (on a busy
    // machine); every other answer comes from the live one.
    let late = doomed_received.lock().unwrap().len() - 1;
    assert_eq!(
        live.received().len() + late,
        7,
        "every answer since from the live one"
    );
    let records = server.observer.records();
    let failed_over: Vec<_> = records.iter().filter(|r| route(r).len() == 2).collect();
    assert_eq!(
        failed_over.len(),
        2,
        "two refused connections eject it; then it is not tried"
    );
    // Each went first to the gone one: over a connection it had open, closed after the
    // request was written (a cut), or to its closed port (unreachable). Either way the
    // live one answered, before anything reached the client.
    for record in &failed_over {
        let tried = route(record);
        assert_eq!(tried[0].0, gone, "{tried:?}");
        assert!(
            [Some("upstream_unreachable"), Some("upstream_stream_cut")].contains(&tried[0].1),
            "{tried:?}"
        );
        assert_eq!(tried[1], (live.url.clone(), None));
    }
    let last_fault = route(failed_over[1])[0].1.unwrap();
    let refused = failed_over
        .iter()
        .any(|r| route(r)[0].1 == Some("upstream_unreachable"));
    assert!(records.iter().all(|r| r.status == Status::Ok));

    // /ready: the model is ready (one replica is), and says the other is out, without
    // its address; /stats names it.
    let ready = get_json(&server, "/ready").await;
    assert_eq!(ready["status"], "ready");
    let endpoints = &ready["models"][0]["endpoints"];
    assert_eq!(endpoints[0]["state"], "ejected", "{ready}");
    assert_eq!(
        endpoints[0]["reachable"], !refused,
        "a refused connect says so"
    );
    assert_eq!(
        endpoints[0]["reason"], last_fault,
        "the fault that ejected it"
    );
    assert_eq!(endpoints[1]["state"], "up");
    assert!(!ready.to_string().contains(&gone), "no address in /ready");
    let stats = get_json(&server, "/stats").await;
    let upstream = &stats["upstreams"][0];
    assert_eq!(upstream["policy"], "round_robin");
    assert_eq!(upstream["endpoints"][0]["endpoint"], gone.as_str());
    assert_eq!(upstream["endpoints"][0]["state"], "ejected");
    assert!(upstream["endpoints"][0]["back_in_secs"].as_f64().unwrap() > 50.0);
    assert_eq!(stats["endpoints"][&gone]["failed_attempts"], 2);
    assert_eq!(stats["endpoints"][&gone]["served"], 1 + late);
    assert_eq!(stats["endpoints"][&live.url]["served"], 7 - late);
    assert!(stats["endpoints"][&live.url]["ttft_ms"]["p50"].is_number());
}

#[tokio::test]
async fn a_replica_gone_before_the_first_request_is_out_from_the_first_probe() {
    let live = start_upstream(replica(3)).await;
    let gone = closed_url();
    let server = gateway(fleet_config(
        &[&gone, &live.url],
        policy(Policy::RoundRobin),
    ))
    .await;
    let probed = eventually(5, || endpoints(&server)[0].state == "ejected").await;
    assert!(probed, "the start-up probe found it gone");
    for _ in 0..4 {
        let (status, _) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 200);
    }
    assert!(server
        .observer
        .records()
        .iter()
        .all(|r| route(r).len() == 1));
    assert_eq!(live.received().len(), 4);
}

#[tokio::test]
async fn server_errors_429s_and_silence_before_the_first_byte_go_to_another_replica() {
    let good = start_upstream(replica(3)).await;
    let faults = [
        Fault::ServerError,
        Fault::RateLimited,
        Fault::NoFirstByte,
        // One replica's own: a pod with another key, of another model in a rollout.
        Fault::Unauthorized,
        Fault::OtherModel,
    ];
    for fault in faults {
        let bad = start_upstream(failing(fault)).await;
        let mut config = fleet_config(&[&bad.url, &good.url], policy(Policy::RoundRobin));
        config.first_byte_timeout = Duration::from_millis(300);
        let server = gateway(config).await;
        let (status, body) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 200, "{fault:?}: {body}");
        let record = &server.observer.records()[0];
        let expected = match fault {
            Fault::ServerError => "upstream_error",
            Fault::RateLimited => "upstream_rate_limited",
            Fault::Unauthorized => "upstream_auth_failed",
            Fault::OtherModel => "upstream_model_mismatch",
            _ => "upstream_timeout",
        };
        assert_eq!(
            route(record),
            [(bad.url.clone(), Some(expected)), (good.url.clone(), None)],
            "{fault:?}"
        );
        if fault == Fault::NoFirstByte {
            // The replica that answered is measured from its own attempt: the 300 ms
            // spent on the silent one are the request's, not its.
            assert!(record.timings.ttft_ms.unwrap() >= 300.0);
            let stats = get_json(&server, "/stats").await;
            let own = stats["endpoints"][&good.url]["ttft_ms"]["p50"]
                .as_f64()
                .unwrap();
            assert!(own < 250.0, "{own} ms");
        }
        if fault == Fault::RateLimited {
            // Its Retry-After (7 s) keeps it out; the next request goes to the other
            // at once, round robin or not.
            let stats = get_json(&server, "/stats").await;
            let view = &stats["upstreams"][0]["endpoints"][0];
            assert_eq!(view["state"], "rate_limited", "{stats}");
            let back = view["back_in_secs"].as_f64().unwrap();
            assert!(back > 6.0 && back <= 7.0, "{back}");
            let (status, _) = chat(&server, &chat_body("again", json!({}))).await;
            assert_eq!(status, 200);
            assert_eq!(bad.received().len(), 1, "not tried while rate limited");
        }
    }
}

#[tokio::test]
async fn a_client_that_leaves_before_the_first_byte_ends_the_attempts() {
    let silent = start_upstream(failing(Fault::NoFirstByte)).await;
    let other = start_upstream(replica(3)).await;
    let mut config = fleet_config(&[&silent.url, &other.url], policy(Policy::RoundRobin));
    config.first_byte_timeout = Duration::from_secs(3);
    let server = gateway(config).await;
    let request = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .timeout(Duration::from_millis(1500))
        .json(&chat_body("hi", json!({"stream": true})))
        .send();
    // The status line after the opening window (1 s), then the client gives up at 1.5 s.
    if let Ok(response) = request.await {
        let _ = response.bytes().await;
    }
    // Had the attempt gone on, its timeout (3 s) would have sent it to the other one.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        other.received().len(),
        0,
        "no attempt after the client left"
    );
    let records = server.observer.records();
    assert_eq!(records[0].status, Status::Cancelled);
}

/// A replica that cuts its answers after two chunks, one that answers, round robin.
async fn cut_then_good() -> (Upstream, Upstream, TestServer) {
    let cuts = start_upstream(failing(Fault::Cut)).await;
    let good = start_upstream(replica(3)).await;
    let server = gateway(fleet_config(
        &[&cuts.url, &good.url],
        policy(Policy::RoundRobin),
    ))
    .await;
    (cuts, good, server)
}

#[tokio::test]
async fn an_answer_in_one_body_that_failed_after_content_starts_over_elsewhere() {
    // The outside tester's case: the client of a non-streamed request has received
    // nothing when the replica fails midway, so it should not get a 502.
    let (cuts, good, server) = cut_then_good().await;
    let (status, body) = chat(&server, &chat_body("hi", json!({}))).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        answer["choices"][0]["message"]["content"], "tok0 tok1 tok2",
        "the second replica's answer alone: {body}"
    );
    assert_eq!(answer["usage"]["completion_tokens"], 3, "{body}");
    let record = &server.observer.records()[0];
    assert_eq!(record.status, Status::Ok);
    assert_eq!(
        route(record),
        [
            (cuts.url.clone(), Some("upstream_stream_cut")),
            (good.url.clone(), None)
        ]
    );
}

#[tokio::test]
async fn a_stream_that_failed_after_content_is_never_answered_twice() {
    let (cuts, good, server) = cut_then_good().await;
    let (status, body) = chat(&server, &chat_body("hi", json!({"stream": true}))).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("tok0 tok1") || body.contains("tok1"),
        "{body}"
    );
    assert!(body.contains("upstream_stream_cut"), "{body}");
    assert_eq!(good.received().len(), 0, "no second answer after content");
    let record = &server.observer.records()[0];
    assert_eq!(
        route(record),
        [(cuts.url.clone(), Some("upstream_stream_cut"))]
    );
}

#[tokio::test]
async fn a_refusal_every_replica_gives_is_answered_and_held_against_none() {
    let a = start_upstream(failing(Fault::RefusedInStream)).await;
    let b = start_upstream(failing(Fault::RefusedInStream)).await;
    let c = start_upstream(failing(Fault::RefusedInStream)).await;
    let fleet = FleetConfig {
        policy: Policy::RoundRobin,
        eject_after: 1,
        ..FleetConfig::default()
    };
    let server = gateway(fleet_config(&[&a.url, &b.url, &c.url], fleet)).await;
    let body = chat_body("hi", json!({"stream": true, "stop_token_ids": [999999]}));
    let (status, text) = chat(&server, &body).await;
    assert_eq!(status, 400, "{text}");
    let error: Value = serde_json::from_str(&text).expect("error");
    assert_eq!(error["error"]["param"], "stop_token_ids");
    let asked: usize = [&a, &b, &c].iter().map(|u| u.received().len()).sum();
    assert_eq!(asked, 2, "one second opinion, no more");
    let stats = get_json(&server, "/stats").await;
    for endpoint in stats["upstreams"][0]["endpoints"]
        .as_array()
        .expect("endpoints")
    {
        assert_eq!(endpoint["state"], "up", "the request's fault: {stats}");
    }
}

#[tokio::test]
async fn a_replica_that_refuses_what_its_peer_answers_is_held_to_fail() {
    // As a replica started with a smaller max_model_len than its peers refuses their
    // requests with 400: the outside tester's fleet kept sending it work.
    let refuses = start_upstream(failing(Fault::BadRequest)).await;
    let good = start_upstream(replica(3)).await;
    let fleet = FleetConfig {
        policy: Policy::RoundRobin,
        eject_after: 2,
        ..FleetConfig::default()
    };
    let server = gateway(fleet_config(&[&refuses.url, &good.url], fleet)).await;
    for _ in 0..6 {
        let (status, text) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(
            status, 200,
            "the peer answers what the replica refused: {text}"
        );
    }
    // Counted before the peer's answer reached the client, so the next request knows.
    assert_eq!(
        refuses.received().len(),
        2,
        "out after two refusals of what its peer served"
    );
    let stats = get_json(&server, "/stats").await;
    let endpoints = &stats["upstreams"][0]["endpoints"];
    assert_eq!(endpoints[0]["state"], "ejected", "{stats}");
    assert_eq!(
        endpoints[0]["reason"], "upstream_invalid_request",
        "{stats}"
    );
    assert_eq!(endpoints[1]["state"], "up", "{stats}");
}

#[tokio::test]
async fn when_every_replica_fails_the_client_gets_the_last_fault_after_max_attempts() {
    let a = start_upstream(failing(Fault::ServerError)).await;
    let b = start_upstream(failing(Fault::ServerError)).await;
    let c = start_upstream(failing(Fault::ServerError)).await;
    let fleet = FleetConfig {
        policy: Policy::RoundRobin,
        max_attempts: 2,
        ..FleetConfig::default()
    };
    let server = gateway(fleet_config(&[&a.url, &b.url, &c.url], fleet)).await;
    let (status, text) = chat(&server, &chat_body("hi", json!({}))).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("upstream_error"), "{text}");
    let record = &server.observer.records()[0];
    assert_eq!(record.status, Status::Error);
    assert_eq!(route(record).len(), 2, "bounded by max_attempts");
    let tried = [&a, &b, &c]
        .iter()
        .map(|r| r.received().len())
        .sum::<usize>();
    assert_eq!(tried, 2, "one attempt each at two of the three");
}

#[tokio::test]
async fn a_silent_replica_costs_a_streaming_client_no_more_than_the_opening_window() {
    let silent = start_upstream(failing(Fault::Silent)).await;
    let mut config = upstream_config(&silent.url);
    config.first_byte_timeout = Duration::from_secs(3);
    let server = gateway_with(config, limits(MODEL), "[server]\nkeepalive_secs = 1\n").await;
    let started = Instant::now();
    let mut response = post(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    let headers_after = started.elapsed();
    assert_eq!(response.status(), 200);
    assert!(
        headers_after < Duration::from_millis(1800),
        "status line after {headers_after:?}"
    );
    // The role chunk at once, keep-alive comments while the upstream says nothing, and
    // its first-byte timeout (3 s) ends it as an error frame.
    let first = tokio::time::timeout(Duration::from_millis(500), response.chunk())
        .await
        .expect("a byte with the status line")
        .expect("body")
        .expect("a chunk");
    assert!(String::from_utf8_lossy(&first).contains("\"role\":\"assistant\""));
    let mut rest = String::new();
    while let Some(chunk) = response.chunk().await.expect("body") {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.starts_with(':'), "a keep-alive comment next: {rest}");
    assert!(rest.contains("upstream_timeout"), "{rest}");
}

#[tokio::test]
async fn prefix_affinity_keeps_a_system_prompt_on_one_replica() {
    let replicas = three_replicas(2).await;
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    let server = gateway(fleet_config(&urls, policy(Policy::PrefixAffinity))).await;
    // A system prompt longer than affinity_prefix_chars (1,024) decides alone; a
    // shorter one with its first user turn (one conversation stays on one replica).
    let support = "You are the support bot of ACME. Answer briefly. ".repeat(25);
    let with_system = |system: &str, user: &str| {
        json!({"model": MODEL, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user}]})
    };
    for user in ["one", "two", "three", "four"] {
        let (status, _) = chat(&server, &with_system(&support, user)).await;
        assert_eq!(status, 200);
    }
    let homes: Vec<String> = server
        .observer
        .records()
        .iter()
        .map(|r| route(r)[0].0.clone())
        .collect();
    assert!(homes.iter().all(|h| *h == homes[0]), "{homes:?}");
    // Other system prompts reach the other replicas.
    for i in 0..30 {
        let (status, _) = chat(&server, &with_system(&format!("Persona {i}."), "hi")).await;
        assert_eq!(status, 200);
    }
    assert!(replicas.iter().all(|r| !r.received().is_empty()));
}

#[tokio::test]
async fn the_latency_policy_learns_which_replica_is_fast() {
    let slow = start_upstream(UpstreamScript {
        first_delay: Duration::from_millis(150),
        ..replica(2)
    })
    .await;
    let fast = start_upstream(replica(2)).await;
    let server = gateway(fleet_config(
        &[&slow.url, &fast.url],
        policy(Policy::Latency),
    ))
    .await;
    for _ in 0..20 {
        let (status, _) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 200);
    }
    // Each is measured once, then the fast one takes all but the exploration (5%).
    let to_fast = fast.received().len();
    assert!(to_fast >= 16, "{to_fast} of 20 to the fast replica");
    assert!(!slow.received().is_empty(), "the slow one was measured");
}

#[tokio::test]
async fn engine_metrics_follow_the_replicas_own_queues() {
    // Replica a runs one answer at a time and is busy with someone else's requests (a
    // second gateway, another client): this gateway has nothing in flight there, but
    // its /metrics shows the queue.
    let busy = start_upstream(UpstreamScript {
        slots: 1,
        interval: Duration::from_millis(50),
        ..replica(60)
    })
    .await;
    let idle = start_upstream(replica(2)).await;
    let others = reqwest::Client::new();
    let mut load = Vec::new();
    for _ in 0..3 {
        let request = others
            .post(format!("{}/chat/completions", busy.url))
            .json(&json!({"model": UPSTREAM_MODEL, "stream": true,
                          "messages": [{"role": "user", "content": "long"}]}))
            .send();
        load.push(tokio::spawn(request));
    }
    let fleet = FleetConfig {
        policy: Policy::EngineMetrics,
        scrape_interval: Duration::from_millis(50),
        ..FleetConfig::default()
    };
    let server = gateway(fleet_config(&[&busy.url, &idle.url], fleet)).await;
    let scraped = eventually(5, || {
        endpoints(&server)[0]
            .engine_waiting
            .is_some_and(|w| w >= 1.0)
    })
    .await;
    assert!(scraped, "the busy replica's queue was scraped");
    for _ in 0..4 {
        let (status, _) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 200);
    }
    assert_eq!(idle.received().len(), 4, "all to the replica with no queue");
    for l in load {
        l.abort();
    }
    // The busy replica goes away: its last figures stay, with their age, and the failed
    // scrapes are counted.
    let busy_url = busy.url.clone();
    busy.stop().await;
    let failing = eventually(5, || {
        let view = &endpoints(&server)[0];
        view.scrape_failures >= 2 && view.engine_metrics_age_secs.is_some_and(|age| age >= 0.1)
    })
    .await;
    assert!(failing, "{:?}", endpoints(&server)[0]);
    let text = metrics(&server).await;
    let line = format!(
        "llmgate_endpoint_scrape_failures_total{{model=\"test-model\",endpoint=\"{busy_url}\"}}"
    );
    assert!(text.contains(&line), "{text}");
}

#[tokio::test]
async fn a_dns_name_becomes_one_endpoint_per_address() {
    let up = start_upstream(replica(2)).await;
    let port = up
        .url
        .trim_end_matches("/v1")
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let fleet = FleetConfig {
        dns_refresh: Some(Duration::from_secs(1)),
        ..FleetConfig::default()
    };
    let named = format!("http://localhost:{port}/v1");
    let server = gateway(fleet_config(&[&named], fleet)).await;
    let resolved = eventually(5, || {
        endpoints(&server).iter().any(|e| e.endpoint == up.url)
    })
    .await;
    assert!(resolved, "localhost resolved to 127.0.0.1");
    for _ in 0..3 {
        let (status, body) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 200, "{body}");
    }
    // Whatever else localhost resolves to (::1, where nothing listens), every answer
    // came from the address that serves, under its address.
    let served: Vec<_> = server
        .observer
        .records()
        .iter()
        .map(|r| route(r).last().unwrap().0.clone())
        .collect();
    assert!(served.iter().all(|e| *e == up.url), "{served:?}");
}

#[tokio::test]
async fn a_fleet_whose_every_replica_fails_is_down_in_ready_and_the_metric() {
    let a = start_upstream(failing(Fault::ServerError)).await;
    let b = start_upstream(failing(Fault::ServerError)).await;
    let fleet = FleetConfig {
        policy: Policy::RoundRobin,
        max_attempts: 2,
        ..FleetConfig::default()
    };
    let server = gateway(fleet_config(&[&a.url, &b.url], fleet)).await;
    let ready = reqwest::get(server.url("/ready")).await.expect("ready");
    assert_eq!(ready.status(), 200, "reachable and not failing yet");
    // Each request tries both; three in a row fail each replica as often as ejects one,
    // though only one of two may be out.
    for _ in 0..3 {
        let (status, text) = chat(&server, &chat_body("hi", json!({}))).await;
        assert_eq!(status, 502, "{text}");
    }
    let ready = reqwest::get(server.url("/ready")).await.expect("ready");
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.expect("json");
    assert_eq!(body["status"], "down", "{body}");
    let reason = body["models"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("all 2 endpoints are failing"), "{body}");
    let text = metrics(&server).await;
    assert!(
        text.contains("llmgate_upstream_up{model=\"test-model\"} 0"),
        "{text}"
    );
}

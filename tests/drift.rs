//! The drift canary on a fleet of scripted replicas: one that answers differently from
//! its two peers is flagged within a round, in `/stats` (with both texts), `/ready` and
//! `/metrics`; a fleet of three that agree is never flagged over a hundred rounds. And an
//! answer names the replica that served it and the fingerprint that replica reported.

mod common;

use std::time::{Duration, Instant};

use common::upstream::*;
use common::*;
use llmgate::bench::upstream::UpstreamScript;
use llmgate::engine::upstream::fleet::canary::CanaryConfig;
use llmgate::engine::upstream::fleet::FleetConfig;
use serde_json::{json, Value};

const ROUND: Duration = Duration::from_millis(50);

fn replica(words: &[&str]) -> UpstreamScript {
    UpstreamScript {
        model: UPSTREAM_MODEL.into(),
        tokens: 4,
        record: false,
        words: words.iter().map(|w| (*w).to_owned()).collect(),
        ..UpstreamScript::default()
    }
}

fn canaried() -> FleetConfig {
    FleetConfig {
        canary: Some(CanaryConfig {
            every: ROUND,
            prompts: vec![
                "What is the capital of France?".into(),
                "Count to three.".into(),
            ],
            max_tokens: 4,
        }),
        ..FleetConfig::default()
    }
}

async fn endpoints(server: &TestServer) -> Vec<Value> {
    get_json(server, "/stats").await["upstreams"][0]["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn the_replica_unlike_its_peers_is_flagged_with_both_texts() {
    let replicas = [
        start_upstream(replica(&[])).await,
        start_upstream(replica(&[])).await,
        start_upstream(replica(&["other"])).await,
    ];
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    let server = gateway(fleet_config(&urls, canaried())).await;
    let started = Instant::now();
    let flagged = loop {
        let views = endpoints(&server).await;
        if views.iter().all(|v| !v["canary"].is_null()) {
            break views;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no canary round: {views:?}"
        );
        tokio::time::sleep(ROUND / 5).await;
    };
    let drifting: Vec<&Value> = flagged
        .iter()
        .filter(|v| v["canary"]["drifting"] == true)
        .collect();
    assert_eq!(drifting.len(), 1, "{flagged:?}");
    assert_eq!(drifting[0]["endpoint"], urls[2]);
    let differing = &drifting[0]["canary"]["differing"][0];
    assert_eq!(differing["answer"], "other other other other");
    assert_eq!(differing["majority"], "tok0 tok1 tok2 tok3");
    let ready = get_json(&server, "/ready").await;
    let flags: Vec<bool> = ready["models"][0]["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .map(|e| e["drifting"] == true)
        .collect();
    assert_eq!(flags, [false, false, true], "{ready}");
    let metrics = metrics(&server).await;
    let gauge =
        |url: &str| format!("llmgate_endpoint_drifting{{model=\"{MODEL}\",endpoint=\"{url}\"}}");
    assert!(
        metrics.contains(&format!("{} 1", gauge(urls[2]))),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("{} 0", gauge(urls[0]))),
        "{metrics}"
    );
}

#[tokio::test]
async fn replicas_that_agree_are_never_flagged_over_a_hundred_rounds() {
    // Recording what they are asked, to count the rounds.
    let recorded = || UpstreamScript {
        record: true,
        ..replica(&[])
    };
    let replicas = [
        start_upstream(recorded()).await,
        start_upstream(recorded()).await,
        start_upstream(recorded()).await,
    ];
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    let server = gateway(fleet_config(&urls, canaried())).await;
    let started = Instant::now();
    let mut rounds_seen = 0;
    let mut hashes = std::collections::BTreeSet::new();
    // Until each replica has answered 100 rounds of two prompts.
    while replicas.iter().any(|r| r.received().len() < 200) {
        // A guard against a hang, not a speed test: a loaded machine runs rounds late.
        assert!(started.elapsed() < ROUND * 1200, "under 100 rounds");
        for view in endpoints(&server).await {
            if view["canary"].is_null() {
                continue;
            }
            assert_eq!(view["canary"]["drifting"], false, "{view}");
            hashes.insert(
                view["canary"]["output_hash"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            );
            rounds_seen += 1;
        }
        tokio::time::sleep(ROUND / 2).await;
    }
    assert!(
        rounds_seen > 200,
        "the canary ran: {rounds_seen} views with a round"
    );
    assert_eq!(
        hashes.len(),
        1,
        "every replica, every round, the same answers"
    );
}

#[tokio::test]
async fn an_answer_names_its_replica_and_the_replicas_fingerprint() {
    let replicas = [
        start_upstream(replica(&[])).await,
        start_upstream(replica(&[])).await,
    ];
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    let server = gateway(fleet_config(&urls, FleetConfig::default())).await;
    let response = post(
        &server,
        "/v1/chat/completions",
        &chat_body("hi", json!({"max_tokens": 4})),
    )
    .await;
    let replica = response
        .headers()
        .get("x-llmgate-replica")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let fingerprint = response
        .headers()
        .get("x-llmgate-upstream-fingerprint")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = response.json().await.expect("json");
    assert!(urls.contains(&replica.as_str()), "{replica}");
    assert_eq!(fingerprint.as_deref(), Some("fp_scripted"));
    assert_eq!(body["timings"]["upstream"]["endpoint"], replica.as_str());
    assert_eq!(
        body["timings"]["upstream"]["system_fingerprint"].as_str(),
        fingerprint.as_deref()
    );
    assert_ne!(
        body["system_fingerprint"].as_str(),
        fingerprint.as_deref(),
        "the gateway's own beside it"
    );
    // A stream names it in its last chunk's timings.
    let text = post_text(
        &server,
        "/v1/chat/completions",
        &chat_body(
            "hi",
            json!({"max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    let last = chunks_of(&text)
        .into_iter()
        .rev()
        .find(|c| !c["timings"].is_null())
        .expect("timings");
    assert!(
        urls.contains(
            &last["timings"]["upstream"]["endpoint"]
                .as_str()
                .unwrap_or("")
        ),
        "{last}"
    );
}

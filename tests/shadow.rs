//! Shadow traffic and A/B splits, black-box: the gateway binary serving two upstream
//! models (scripted servers). Shadow: the first shadowed by the second. The candidate is slower and loops ("la la
//! la"): the comparisons must name it slower and more repetitive, every pair must have
//! both sides' figures in one semantic-log document, the client must only ever see the
//! primary's answers, and copies beyond the shadow's cap must be dropped and counted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::free_port;
use common::upstream::{start_upstream, Upstream, UPSTREAM_MODEL};
use llmgate::bench::upstream::UpstreamScript;
use serde_json::{json, Value};

struct Gateway {
    base: String,
    data: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        drop(self.child.kill());
        drop(self.child.wait());
    }
}

/// A scripted upstream answering `tokens` tokens as the fleet's model, without recording.
fn scripted(tokens: u32) -> UpstreamScript {
    UpstreamScript {
        model: UPSTREAM_MODEL.into(),
        tokens,
        record: false,
        ..UpstreamScript::default()
    }
}

/// The gateway serving `current` (on `primary`) shadowed by `next` (on `candidate`) as
/// `shadow` (an inline table's contents) says.
async fn gateway(primary: &Upstream, candidate: &Upstream, shadow: &str) -> Gateway {
    let first = format!("shadow = {{ model = \"next\", {shadow} }}\n");
    gateway_of(primary, candidate, &first, "", &[]).await
}

/// The gateway serving `current` (on `primary`, with `first` added to its entry) and
/// `next` (on `candidate`), then `rest` of the config file; `args` added.
async fn gateway_of(
    primary: &Upstream,
    candidate: &Upstream,
    first: &str,
    rest: &str,
    args: &[&str],
) -> Gateway {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("llmgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[models]]\nid = \"current\"\nengine = \"upstream\"\nurl = \"{}\"\nupstream_model = \"{UPSTREAM_MODEL}\"\n{first}\n\
             [[models]]\nid = \"next\"\nengine = \"upstream\"\nurl = \"{}\"\nupstream_model = \"{UPSTREAM_MODEL}\"\n\n{rest}",
            primary.url, candidate.url
        ),
    )
    .expect("config");
    let port = free_port();
    let data = dir.path().join("data");
    let child = Command::new(env!("CARGO_BIN_EXE_llmgate"))
        .arg("serve")
        .args(["--config", &config.display().to_string()])
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--data-dir", &data.display().to_string()])
        .args(["--log", "warn"])
        .stdout(Stdio::null())
        .spawn()
        .expect("the llmgate binary");
    let gateway = Gateway {
        base: format!("http://127.0.0.1:{port}"),
        data,
        child,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = reqwest::get(format!("{}/ready", gateway.base)).await;
        if ready.is_ok_and(|r| r.status() == 200) {
            return gateway;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn ask(gateway: &Gateway, stream: bool) -> String {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.base))
        .json(&json!({
            "model": "current",
            "messages": [{"role": "user", "content": "Name three rivers of Europe."}],
            "max_tokens": 12,
            "seed": 7,
            "stream": stream,
        }))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 200);
    response.text().await.expect("body")
}

async fn get(gateway: &Gateway, path: &str) -> String {
    reqwest::get(format!("{}{path}", gateway.base))
        .await
        .expect(path)
        .text()
        .await
        .expect("text")
}

/// The shadow view of `/stats` once `until` holds of it (up to 20 s).
async fn shadows_until(gateway: &Gateway, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats: Value = serde_json::from_str(&get(gateway, "/stats").await).expect("json");
        let view = stats["shadows"][0].clone();
        if until(&view) || Instant::now() > deadline {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn semlog_docs(data: &Path) -> Vec<Value> {
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(data.join("semlog"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "ndjson") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            docs.extend(
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok()),
            );
        }
    }
    docs
}

fn verdict<'a>(view: &'a Value, figure: &str) -> &'a Value {
    view["figures"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["figure"] == figure))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifth_of_the_requests_are_compared_and_the_slower_looping_candidate_is_named() {
    let primary = start_upstream(scripted(12)).await;
    let candidate = start_upstream(UpstreamScript {
        first_delay: Duration::from_millis(40),
        interval: Duration::from_millis(2),
        words: vec!["la".into()],
        ..scripted(12)
    })
    .await;
    let gateway = gateway(&primary, &candidate, "share = 0.2, max_in_flight = 64").await;
    for i in 0..100 {
        let body = ask(&gateway, i % 2 == 0).await;
        assert!(
            body.contains("tok1") && !body.contains(" la"),
            "the client gets the primary's answer: {body}"
        );
    }
    let view = shadows_until(&gateway, |v| v["compared"] == 20).await;
    assert_eq!(view["compared"], 20, "every fifth request: {view}");
    assert_eq!(
        (view["primary"].as_str(), view["candidate"].as_str()),
        (Some("current"), Some("next"))
    );
    assert_eq!(view["different"], 20, "{view}");
    for (figure, expected) in [
        ("ttft_ms", "worse"),
        ("e2e_ms", "worse"),
        ("repetition_rate", "worse"),
        ("completion_tokens", "not_distinguishable"),
    ] {
        assert_eq!(
            verdict(&view, figure)["verdict"],
            expected,
            "{figure}: {view}"
        );
    }
    // The same verdicts from the command line, which fails on a worse figure.
    let live = Command::new(env!("CARGO_BIN_EXE_llmgate"))
        .args([
            "compare",
            "--live",
            "current:next",
            "--gateway",
            &gateway.base,
        ])
        .arg("--fail-on-worse")
        .output()
        .expect("llmgate compare");
    let printed = String::from_utf8_lossy(&live.stdout);
    assert_eq!(live.status.code(), Some(1), "{printed}");
    assert!(printed.contains("20 pairs compared"), "{printed}");
    let line = |figure: &str| {
        printed
            .lines()
            .find(|l| l.starts_with(figure))
            .unwrap_or("")
            .to_owned()
    };
    assert!(line("ttft_ms").ends_with("worse"), "{printed}");
    assert!(
        line("completion_tokens").ends_with("not distinguishable"),
        "{printed}"
    );
    let metrics = get(&gateway, "/metrics").await;
    assert!(
        metrics.contains(
            "llmgate_shadow_compared_total{primary=\"current\",candidate=\"next\",outcome=\"different\"} 20"
        ),
        "{metrics}"
    );
    // One document per pair carries both sides; both sides' own documents name the pair.
    let deadline = Instant::now() + Duration::from_secs(20);
    let compared = loop {
        let docs = semlog_docs(&gateway.data);
        let compared: Vec<Value> = docs
            .iter()
            .filter(|d| !d["llm"]["comparison"].is_null())
            .cloned()
            .collect();
        let sides = docs
            .iter()
            .filter(|d| !d["llm"]["shadow"].is_null())
            .count();
        if (compared.len() == 20 && sides == 40) || Instant::now() > deadline {
            assert_eq!(sides, 40, "both sides of 20 pairs are logged");
            break compared;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(compared.len(), 20);
    for doc in &compared {
        let c = &doc["llm"]["comparison"];
        for side in ["primary", "candidate"] {
            let figures = &c[side];
            for figure in [
                "ttft_ms",
                "tpot_ms",
                "itl_p95_ms",
                "e2e_ms",
                "repetition_rate",
                "mean_logprob",
            ] {
                assert!(figures[figure].is_f64(), "{side} {figure}: {c}");
            }
            assert!(
                figures["completion_tokens"].as_u64() > Some(0),
                "{side}: {c}"
            );
            assert!(figures["refusal"].is_boolean(), "{side}: {c}");
            assert!(figures["language"].is_string(), "{side}: {c}");
            assert_eq!(figures["finish_reason"], "stop", "{side}: {c}");
            assert_eq!(figures["status"], "ok", "{side}: {c}");
        }
        assert_eq!(c["primary"]["model"], "current");
        assert_eq!(c["candidate"]["model"], "next");
        assert_eq!(c["difference"]["identical"], false);
        assert_eq!(c["difference"]["first_difference_word"], 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_beyond_the_shadow_cap_are_dropped_and_counted() {
    let primary = start_upstream(scripted(4)).await;
    let candidate = start_upstream(UpstreamScript {
        first_delay: Duration::from_secs(2),
        ..scripted(4)
    })
    .await;
    let gateway = gateway(&primary, &candidate, "share = 1.0, max_in_flight = 1").await;
    let answers = (0..8).map(|_| ask(&gateway, false));
    futures_util::future::join_all(answers).await;
    let metrics = get(&gateway, "/metrics").await;
    let dropped = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "llmgate_shadow_dropped_total{primary=\"current\",candidate=\"next\",reason=\"busy\"} ",
            )
        })
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the busy counter");
    assert!(
        dropped >= 5,
        "one copy in flight at a time: {dropped} of 8 dropped"
    );
    let view = shadows_until(&gateway, |v| {
        v["compared"].as_u64().unwrap_or(0) + dropped == 8
    })
    .await;
    assert_eq!(
        view["compared"].as_u64().unwrap_or(0) + dropped,
        8,
        "each picked request compared or dropped: {view}"
    );
}

/// The sum of the `/metrics` samples whose line starts with `prefix`.
fn metric_sum(metrics: &str, prefix: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_copy_makes_way_for_clients_and_is_compared_with_nothing() {
    // Clients' answers take 400 ms; copies wait 3 s for their first byte.
    let primary = start_upstream(UpstreamScript {
        interval: Duration::from_millis(100),
        ..scripted(4)
    })
    .await;
    let candidate = start_upstream(UpstreamScript {
        first_delay: Duration::from_secs(3),
        ..scripted(4)
    })
    .await;
    let first = "shadow = { model = \"next\", share = 1.0 }\n";
    let gateway = gateway_of(&primary, &candidate, first, "", &["--max-in-flight", "4"]).await;
    // One client alone: its copy is sent and still runs after the answer.
    ask(&gateway, false).await;
    // Three clients at once fill over half of the gateway's 4: copies give way.
    futures_util::future::join_all((0..3).map(|_| ask(&gateway, false))).await;
    let metrics = get(&gateway, "/metrics").await;
    let shed = metric_sum(
        &metrics,
        "llmgate_shadow_dropped_total{primary=\"current\",candidate=\"next\",reason=\"shed\"}",
    );
    assert!(shed >= 1, "the running copy was stopped: {shed}");
    // Each of the 4 picked requests is dropped, stopped or compared, never compared
    // against a copy that was stopped (it would count as the candidate failing). A copy
    // let through answers 3 s after it is sent: waited for, however busy the machine.
    let (mut dropped, mut compared, mut metrics) = (0, 0, String::new());
    for _ in 0..200 {
        metrics = get(&gateway, "/metrics").await;
        dropped = metric_sum(&metrics, "llmgate_shadow_dropped_total{");
        compared = metric_sum(&metrics, "llmgate_shadow_compared_total{");
        if dropped + compared >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = metric_sum(
        &metrics,
        "llmgate_shadow_compared_total{primary=\"current\",candidate=\"next\",outcome=\"failed\"}",
    );
    assert_eq!(
        dropped + compared,
        4,
        "{dropped} dropped, {compared} compared"
    );
    assert_eq!(failed, 0, "a stopped copy is not a failed candidate");
}

/// A request to the split `chat` as `user`, with `key`: the variant header and the body.
async fn ask_split(gateway: &Gateway, user: &str, key: Option<&str>) -> (String, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.base))
        .json(&json!({
            "model": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "user": user,
        }));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("an answer");
    assert_eq!(response.status(), 200);
    let variant = response
        .headers()
        .get("x-llmgate-variant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (variant, response.json().await.expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_holds_its_weights_and_each_caller_stays_on_its_variant() {
    let (a, b) = (
        start_upstream(scripted(2)).await,
        start_upstream(scripted(2)).await,
    );
    let splits = "[[splits]]\nid = \"chat\"\nsticky = \"user\"\n\
                  variants = [{ model = \"current\", weight = 80 }, { model = \"next\", weight = 20 }]\n";
    let gateway = gateway_of(&a, &b, "", splits, &[]).await;
    let mut on_next = 0;
    for i in 0..1000 {
        let (variant, body) = ask_split(&gateway, &format!("user-{i}"), None).await;
        assert_eq!(
            body["model"], variant,
            "the answer names the variant's model"
        );
        on_next += usize::from(variant == "next");
    }
    assert!(
        (150..=250).contains(&on_next),
        "20% ± 5% of 1,000 on next, not {on_next}"
    );
    // A body that is not an object naming the split is refused, not rewritten.
    let refused = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.base))
        .header("content-type", "application/json")
        .body(r#"["chat", "someone", null]"#)
        .send()
        .await
        .expect("an answer");
    assert_eq!(refused.status(), 400);
    for user in ["alice", "bob", "carol"] {
        let (first, _) = ask_split(&gateway, user, None).await;
        for _ in 0..10 {
            assert_eq!(
                ask_split(&gateway, user, None).await.0,
                first,
                "{user} stays"
            );
        }
    }
    // Each request's record names the split and its variant.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let docs = semlog_docs(&gateway.data);
        let named = docs
            .iter()
            .filter(|d| d["llm"]["split"]["id"] == "chat")
            .filter(|d| d["llm"]["split"]["variant"] == d["gen_ai"]["request"]["model"])
            .count();
        if named == 1033 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{named} of 1,033 documents name the split"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_stays_on_its_variant() {
    use sha2::{Digest, Sha256};
    let (a, b) = (
        start_upstream(scripted(2)).await,
        start_upstream(scripted(2)).await,
    );
    let keys_dir = tempfile::tempdir().expect("dir");
    let keys: Vec<String> = (0..12)
        .map(|i| format!("llmgate-split-test-key-{i:02}"))
        .collect();
    let lines: String = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("k{i} {}\n", hex::encode(Sha256::digest(k.as_bytes()))))
        .collect();
    let keys_file = keys_dir.path().join("keys");
    std::fs::write(&keys_file, lines).expect("keys");
    let splits = "[[splits]]\nid = \"chat\"\n\
                  variants = [{ model = \"current\" }, { model = \"next\" }]\n";
    let args = ["--api-keys-file", keys_file.to_str().expect("path")];
    let gateway = gateway_of(&a, &b, "", splits, &args).await;
    let mut seen = std::collections::BTreeSet::new();
    for key in &keys {
        // Another user each time: the key, not the user, decides.
        let (first, _) = ask_split(&gateway, "u0", Some(key)).await;
        for u in 1..6 {
            let (variant, _) = ask_split(&gateway, &format!("u{u}"), Some(key)).await;
            assert_eq!(variant, first, "a key stays on its variant");
        }
        seen.insert(first);
    }
    assert_eq!(seen.len(), 2, "twelve keys land on both variants: {seen:?}");
}

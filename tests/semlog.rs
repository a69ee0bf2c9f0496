//! The semantic log, black-box: the real server and the real Elasticsearch client against
//! an in-test `_bulk` server (tests/common/es.rs): set-up, per-item outcomes, partial
//! retries, dead letters, an outage under traffic, a restart with a non-empty spool, the
//! file sink, and no unredacted value in any sink, span or log line.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::es::FakeEs;
use common::logs::captured_logs;
use common::otlp::Collector;
use common::{chat_body, eventually, metrics, scripted, semlog_status, test_config, TestServer};
use llmgate::engine::scripted::Script;
use llmgate::engine::Backend;
use serde_json::Value;

fn engine() -> Arc<dyn Backend> {
    Arc::new(scripted(Script::tokens(
        &["Sure", ", done", "."],
        Duration::ZERO,
    )))
}

fn config(es: Option<&FakeEs>, data_dir: &std::path::Path, extra: &str) -> llmgate::config::Config {
    let es_line = es.map_or(String::new(), |es| format!("es_url = \"{}\"\n", es.url));
    let age = if extra.contains("batch_age_ms") {
        ""
    } else {
        "batch_age_ms = 50\n"
    };
    test_config(&format!(
        "[semlog]\ndata_dir = \"{}\"\n{es_line}{age}{extra}",
        data_dir.display()
    ))
}

/// The gateway with the semantic log as `config` says.
async fn gateway(config: &llmgate::config::Config) -> TestServer {
    TestServer::builder(engine())
        .config(config)
        .semlog()
        .start()
        .await
}

async fn ask(server: &TestServer, id: &str, prompt: &str) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .header("x-request-id", id)
        .json(&chat_body(prompt, serde_json::json!({})))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200, "{id}");
}

fn request_ids(es: &FakeEs) -> Vec<String> {
    let mut ids: Vec<String> = es
        .docs()
        .iter()
        .map(|d| d["llm"]["request_id"].as_str().unwrap_or("?").to_owned())
        .collect();
    ids.sort();
    ids
}

async fn metric(server: &TestServer, series: &str) -> f64 {
    let text = metrics(server).await;
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().expect("number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_up_then_per_item_outcomes_partial_retries_and_dead_letters() {
    let es = FakeEs::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // One bulk of 5: created, 429, 400, 503, created. The retry carries only the 429 and
    // 503 documents, with their _ids; the 400 goes to the dead-letter file.
    es.script_items(&[201, 429, 400, 503, 201]);
    let config = config(Some(&es), dir.path(), "batch_age_ms = 1000\n");
    let server = gateway(&config).await;
    let ids: Vec<String> = (0..5).map(|i| format!("item-{i}")).collect();
    let sends = ids.iter().map(|id| ask(&server, id, "hello"));
    futures_util::future::join_all(sends).await;

    assert!(
        eventually(10, || es.doc_count() == 4).await,
        "docs: {}",
        es.doc_count()
    );
    let (setup, bulks) = {
        let state = es.state.lock().expect("lock");
        (state.setup.clone(), state.bulks.clone())
    };
    // Set-up came first, with the golden bodies, and before any bulk.
    let paths: Vec<&str> = setup.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/_ilm/policy/llmgate-requests",
            "/_component_template/llmgate-requests@mappings",
            "/_index_template/logs-llmgate.requests"
        ]
    );
    for ((_, body), golden) in setup.iter().zip([
        "ilm_policy.json",
        "component_template.json",
        "index_template.json",
    ]) {
        let path = format!("{}/tests/golden/{golden}", env!("CARGO_MANIFEST_DIR"));
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("json");
        assert_eq!(body, &expected, "{golden}");
    }
    assert_eq!(setup[2].1["priority"], 200);
    assert_eq!(bulks[0].path, "/logs-llmgate.requests-default/_bulk");
    assert!(
        bulks[0].query.contains("include_source_on_error=false"),
        "{:?}",
        bulks[0]
    );
    assert_eq!(bulks[0].content_encoding.as_deref(), Some("gzip"));
    assert_eq!(bulks[0].ids.len(), 5, "one batch of five: {bulks:?}");
    assert_eq!(bulks.len(), 2, "{bulks:?}");
    assert_eq!(
        bulks[1].ids,
        vec![bulks[0].ids[1].clone(), bulks[0].ids[3].clone()]
    );

    // The dead letter: the refused document as the bulk pair it was sent as, and beside
    // it why it was refused.
    let read = |prefix: &str| {
        std::fs::read_dir(dir.path().join("dead-letter"))
            .expect("dead-letter dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .map(|p| std::fs::read_to_string(p).expect("read"))
            .collect::<String>()
    };
    let dead = read("dead-letter-");
    let pair: Vec<Value> = dead
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(pair.len(), 2, "{dead}");
    assert_eq!(pair[0]["create"]["_id"], bulks[0].ids[2].as_str());
    assert!(pair[1]["llm"]["request_id"].is_string());
    let refusals = read("refusals-");
    let why: Value = serde_json::from_str(refusals.trim()).expect("one refusal");
    assert_eq!(why["status"], 400);
    assert_eq!(why["error_type"], "document_parsing_exception");
    assert_eq!(why["_id"], bulks[0].ids[2].as_str());
    let status = semlog_status(&server).await;
    assert_eq!(status["dead_letters"], 1, "{status}");
    assert_eq!(status["state"], "ok", "{status}");

    assert_eq!(metric(&server, "llmgate_semlog_indexed_total").await, 4.0);
    assert_eq!(metric(&server, "llmgate_semlog_retried_total").await, 2.0);
    assert_eq!(
        metric(&server, "llmgate_semlog_dead_lettered_total").await,
        1.0
    );
    assert_eq!(metric(&server, "llmgate_semlog_queued_total").await, 5.0);

    // A document already there (a retry after a lost answer) is a duplicate, not an error.
    let doc = es.docs().into_iter().next().expect("a doc");
    let id = doc["event"]["id"].as_str().expect("event.id").to_owned();
    assert!(
        es.state.lock().expect("lock").docs.contains_key(&id),
        "_id is event.id"
    );
    server.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_traffic_loses_nothing_and_indexes_each_document_once() {
    let es = FakeEs::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(Some(&es), dir.path(), "");
    let server = gateway(&config).await;
    let mut sent = Vec::new();
    for i in 0..60 {
        if i == 15 {
            es.go_away().await;
        }
        if i == 40 {
            // Whole-request failures while it comes back: 503, then 429 with Retry-After.
            es.script_requests(&[503, 429]);
            es.come_back();
        }
        let id = format!("steady-{i:02}");
        ask(&server, &id, "hello").await;
        sent.push(id);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        eventually(30, || es.doc_count() == 60).await,
        "indexed {} of 60",
        es.doc_count()
    );
    sent.sort();
    assert_eq!(
        request_ids(&es),
        sent,
        "each request's document exactly once"
    );
    assert!(metric(&server, "llmgate_semlog_deferred_total").await > 0.0);
    assert_eq!(
        metric(
            &server,
            "llmgate_semlog_dropped_total{reason=\"spool_full\"}"
        )
        .await,
        0.0
    );
    assert!(
        eventually(5, || server.semlog.as_ref().is_some_and(|s| {
            use llmgate::record::RequestObserver;
            s.backlog().spooled_bytes == 0
        }))
        .await
    );
    server.shut_down().await;
}

/// Issue 61: a batch the cluster took but whose answer was lost (a proxy's 503) is
/// looked up before it is sent again, and what the stream holds is not sent twice
/// (after a rollover the write index would not know it: this fake has one index, so
/// what shows it is that the re-send leaves those documents out). A healthy batch is
/// sent without a look-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_whose_answer_was_lost_are_looked_up_not_sent_again() {
    let es = FakeEs::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(Some(&es), dir.path(), "");
    let server = gateway(&config).await;
    ask(&server, "healthy", "hello").await;
    assert!(eventually(10, || es.doc_count() == 1).await);
    assert!(es.searches().is_empty(), "nothing to look up");
    es.script_requests(&[common::es::TOOK_IT]);
    ask(&server, "answer-lost", "hello").await;
    assert!(
        eventually(10, || es.searches().iter().flatten().count() == 1).await,
        "looked up: {:?}",
        es.searches()
    );
    let mut found = 0.0;
    for _ in 0..100 {
        found = metric(&server, "llmgate_semlog_duplicates_total").await;
        if found > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(found, 1.0, "found in the stream, counted as already there");
    let sent: Vec<Vec<String>> = es.bulks().into_iter().map(|b| b.ids).collect();
    let lost = es.searches()[0][0].clone();
    assert_eq!(
        sent.iter().flatten().filter(|id| **id == lost).count(),
        1,
        "sent once, found, not sent again: {sent:?}"
    );
    assert_eq!(es.doc_count(), 2);
    server.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_replays_the_spool_left_by_the_previous_run() {
    let es = FakeEs::not_yet();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(Some(&es), dir.path(), "");

    // First run: the cluster is unreachable throughout; documents end up in the spool.
    let first = gateway(&config).await;
    let mut sent = Vec::new();
    for i in 0..12 {
        let id = format!("before-restart-{i:02}");
        ask(&first, &id, "hello").await;
        sent.push(id);
    }
    first.shut_down().await;
    let spooled: u64 = std::fs::read_dir(dir.path().join("spool"))
        .expect("spool dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".ndjson"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum();
    assert!(spooled > 0, "the first run left its documents in the spool");

    // Second run: the cluster is there; the spool is replayed, then new traffic flows.
    es.come_back();
    let second = gateway(&config).await;
    ask(&second, "after-restart", "hello").await;
    sent.push("after-restart".into());
    assert!(
        eventually(20, || es.doc_count() == 13).await,
        "indexed {} of 13",
        es.doc_count()
    );
    sent.sort();
    assert_eq!(request_ids(&es), sent);
    second.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_elasticsearch_documents_go_to_bulk_ready_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(None, dir.path(), "");
    let server = gateway(&config).await;
    for i in 0..3 {
        ask(&server, &format!("file-{i}"), "hello").await;
    }
    server.shut_down().await;
    let text: String = std::fs::read_dir(dir.path().join("semlog"))
        .expect("semlog dir")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("read"))
        .collect();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 6, "three action/source pairs:\n{text}");
    for pair in lines.chunks(2) {
        assert_eq!(pair[0]["create"]["_id"], pair[1]["event"]["id"]);
        assert_eq!(pair[1]["data_stream"]["dataset"], "llmgate.requests");
    }
}

const EMAIL: &str = "jane.doe@example.com";
const CARD: &str = "4111 1111 1111 1111";
const PHONE: &str = "+44 20 7946 0958";
const KEY: &str = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_unredacted_value_reaches_a_sink_a_span_or_a_log_line() {
    let logs = captured_logs();
    let es = FakeEs::start().await;
    let (collector, endpoint) = Collector::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Every trace exported, so every span can be searched.
    let config = config(
        Some(&es),
        dir.path(),
        "[telemetry]\ntrace_sample_ratio = 1.0\n",
    );
    // The model echoes personal data back: the response is redacted too.
    let echo = Arc::new(scripted(Script::tokens(
        &["Call ", PHONE, " or mail ", EMAIL, "."],
        Duration::ZERO,
    )));
    let server = TestServer::builder(echo)
        .config(&config)
        .traced(&endpoint)
        .semlog()
        .start()
        .await;
    let prompt = format!("My card is {CARD}, my mail {EMAIL}, my key {KEY}. Help?");
    ask(&server, "pii-1", &prompt).await;
    assert!(eventually(10, || es.doc_count() == 1).await);
    assert!(eventually(10, || collector.spans().len() >= 3).await);
    server.shut_down().await;

    let doc = es.docs().pop().expect("the document");
    let llm = &doc["llm"];
    let prompt_excerpt = llm["prompt_excerpt"].as_str().expect("prompt excerpt");
    let response_excerpt = llm["response_excerpt"].as_str().expect("response excerpt");
    assert!(
        prompt_excerpt.contains("<CARD>") && prompt_excerpt.contains("<EMAIL>"),
        "{prompt_excerpt}"
    );
    assert!(prompt_excerpt.contains("<API_KEY>"), "{prompt_excerpt}");
    assert!(response_excerpt.contains("<PHONE>"), "{response_excerpt}");
    assert_eq!(llm["redactions"]["email"], 2);
    assert_eq!(llm["redactions"]["card"], 1);
    assert_eq!(llm["redactions_total"], 5);

    let spans = format!("{:?}", collector.spans());
    let log_text = String::from_utf8(logs.lock().expect("lock").clone()).expect("utf-8");
    let sinks = [
        ("elasticsearch", doc.to_string()),
        ("spans", spans),
        ("log lines", log_text),
    ];
    for (sink, text) in &sinks {
        for secret in [EMAIL, CARD, "4111111111111111", PHONE, KEY] {
            assert!(!text.contains(secret), "{sink} holds {secret}");
        }
    }
}

//! The semantic log on each kind of cluster users run, against the in-test stand-in in
//! each flavor (tests/common/es.rs, modelled on each one's API specification): what the
//! set-up detects and applies, what `_bulk` is sent, and every document indexed exactly
//! once through an outage.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::es::{FakeEs, Flavor};
use common::*;
use llmgate::engine::scripted::Script;

fn config(es: &FakeEs, dir: &std::path::Path, extra: &str) -> llmgate::config::Config {
    test_config(&format!(
        "[semlog]\nes_url = \"{}\"\ndata_dir = \"{}\"\nfsync_ms = 0\n{extra}",
        es.url,
        dir.display()
    ))
}

async fn start_gateway(es: &FakeEs, dir: &std::path::Path, extra: &str) -> TestServer {
    let engine = Arc::new(scripted(Script::tokens(&["a", "b"], Duration::ZERO)));
    TestServer::builder(engine)
        .config(&config(es, dir, extra))
        .semlog()
        .start()
        .await
}

async fn ask(server: &TestServer, n: usize) {
    for _ in 0..n {
        let status = post(server, CHAT, &chat_body("hi", serde_json::json!({})))
            .await
            .status();
        assert_eq!(status, 200);
    }
}

/// What each flavor's set-up calls, in order, and what it applies.
struct Expected {
    flavor: Flavor,
    calls: &'static [&'static str],
    lifecycle: &'static str,
    data_stream: bool,
    source_flag: bool,
}

const ILM: &str = "PUT /_ilm/policy/llmgate-requests";
const ISM: &str = "PUT /_plugins/_ism/policies/llmgate-requests";
const COMPONENT: &str = "PUT /_component_template/llmgate-requests@mappings";
const INDEX: &str = "PUT /_index_template/logs-llmgate.requests";
const STREAM: &str = "PUT /_data_stream/logs-llmgate.requests-default";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_flavor_is_detected_set_up_as_it_allows_and_indexed_exactly_once_through_an_outage() {
    for expected in [
        Expected {
            flavor: Flavor::Elasticsearch9,
            calls: &["GET /", ILM, COMPONENT, INDEX, STREAM],
            lifecycle: "ilm",
            data_stream: true,
            source_flag: true,
        },
        Expected {
            flavor: Flavor::Elasticsearch815,
            calls: &["GET /", ILM, COMPONENT, INDEX, STREAM],
            lifecycle: "ilm",
            data_stream: true,
            source_flag: false,
        },
        Expected {
            flavor: Flavor::Serverless,
            calls: &["GET /", COMPONENT, INDEX, STREAM],
            lifecycle: "data_stream",
            data_stream: true,
            source_flag: true,
        },
        Expected {
            flavor: Flavor::OpenSearch2,
            calls: &["GET /", ISM, COMPONENT, INDEX, STREAM],
            lifecycle: "ism",
            data_stream: true,
            source_flag: false,
        },
        Expected {
            flavor: Flavor::Minimal,
            calls: &["GET /", ILM, COMPONENT, INDEX, STREAM, INDEX],
            lifecycle: "none",
            data_stream: false,
            source_flag: false,
        },
    ] {
        let name = format!("{:?}", expected.flavor);
        let es = FakeEs::start_as(expected.flavor).await;
        let dir = tempfile::tempdir().expect("dir");
        let server = start_gateway(&es, dir.path(), "").await;
        ask(&server, 3).await;
        assert!(
            eventually(10, || es.doc_count() == 3).await,
            "{name}: {}",
            es.doc_count()
        );
        let (calls, setup, bulks) = {
            let state = es.state.lock().expect("lock");
            (
                state.calls.clone(),
                state.setup.clone(),
                state.bulks.clone(),
            )
        };
        assert_eq!(calls, expected.calls, "{name}");
        let status = semlog_status(&server).await;
        assert_eq!(status["lifecycle"], expected.lifecycle, "{name}: {status}");
        assert_eq!(status["data_stream"], expected.data_stream, "{name}");
        assert_eq!(status["problems"], serde_json::json!([]), "{name}");
        assert!(
            bulks
                .iter()
                .all(|b| b.query.contains("include_source_on_error") == expected.source_flag),
            "{name}: {bulks:?}"
        );
        let template = setup
            .iter()
            .rev()
            .find(|(p, _)| p.starts_with("/_index_template/"))
            .map(|(_, b)| b.clone())
            .expect("an index template");
        match expected.lifecycle {
            "ilm" => assert_eq!(
                template["template"]["settings"]["index.lifecycle.name"],
                "llmgate-requests"
            ),
            "data_stream" => assert_eq!(template["template"]["lifecycle"]["data_retention"], "30d"),
            _ => assert!(template.get("template").is_none(), "{name}: {template}"),
        }
        if expected.flavor == Flavor::OpenSearch2 {
            let component = setup
                .iter()
                .find(|(p, _)| p.contains("_component_template"))
                .expect("component");
            assert!(
                !component.1.to_string().contains("constant_keyword"),
                "only types OpenSearch 2 knows"
            );
        }
        let text = metrics(&server).await;
        let info = format!(
            "llmgate_semlog_target_info{{product=\"{}\",",
            if expected.flavor == Flavor::OpenSearch2 {
                "opensearch"
            } else {
                "elasticsearch"
            }
        );
        assert!(text.contains(&info), "{name}: {text}");
        assert!(
            text.contains(&format!("lifecycle=\"{}\"", expected.lifecycle)),
            "{name}"
        );

        // An outage: documents wait in the spool, then each is indexed once.
        es.go_away().await;
        ask(&server, 3).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        es.come_back();
        assert!(
            eventually(15, || es.doc_count() == 6).await,
            "{name}: {}",
            es.doc_count()
        );
        let ids: std::collections::HashSet<String> = es
            .docs()
            .iter()
            .filter_map(|d| d["event"]["id"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(ids.len(), 6, "{name}: no duplicates");
        server.shut_down().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_set_up_is_named_counted_and_never_keeps_documents_out() {
    // An API key that may only index: every set-up PUT is 403.
    let es = FakeEs::start_as(Flavor::Elasticsearch9).await;
    es.state.lock().expect("lock").deny_setup = true;
    let dir = tempfile::tempdir().expect("dir");
    let server = start_gateway(&es, dir.path(), "").await;
    ask(&server, 2).await;
    assert!(
        eventually(10, || es.doc_count() == 2).await,
        "indexed anyway"
    );
    let status = semlog_status(&server).await;
    let steps: Vec<&str> = status["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .filter_map(|p| p["step"].as_str())
        .collect();
    assert_eq!(
        steps,
        ["policy", "component_template", "index_template"],
        "{status}"
    );
    assert!(status["problems"][0]["fix"]
        .as_str()
        .is_some_and(|f| f.contains("manage_ilm")));
    assert_eq!(status["lifecycle"], "none");
    let text = metrics(&server).await;
    assert!(
        text.contains(r#"llmgate_semlog_setup_problems_total{step="policy"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"llmgate_semlog_setup_problems_total{step="data_stream"} 0"#));
    server.shut_down().await;

    // An explicit lifecycle the cluster lacks: reported, and indexed without.
    let serverless = FakeEs::start_as(Flavor::Serverless).await;
    let dir = tempfile::tempdir().expect("dir");
    let server = start_gateway(&serverless, dir.path(), "lifecycle = \"ilm\"\n").await;
    ask(&server, 1).await;
    assert!(eventually(10, || serverless.doc_count() == 1).await);
    let status = semlog_status(&server).await;
    assert_eq!(status["problems"][0]["step"], "policy", "{status}");
    assert!(status["problems"][0]["fix"]
        .as_str()
        .is_some_and(|f| f.contains("semlog.lifecycle = auto")));
    server.shut_down().await;
}

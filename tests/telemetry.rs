//! Telemetry, black-box: `/metrics` after scripted traffic (and `promtool` on it), spans
//! received by an in-test OTLP/gRPC collector built from the official protobufs, and
//! JSON log lines that carry the trace id of their request's span.

mod common;

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use common::logs::captured_logs;
use common::otlp::{string, Collector};
use common::{chat_body, eventually, scripted, test_config, TestServer, MODEL};
use futures_util::StreamExt;
use llmgate::engine::scripted::Script;
use llmgate::engine::EngineError;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

const TOKEN_DELAY: Duration = Duration::from_millis(40);

fn engine() -> Arc<llmgate::engine::scripted::ScriptedEngine> {
    Arc::new(
        scripted(Script::tokens(&["Hello", " there", " friend"], TOKEN_DELAY))
            .with_script(
                "fail please",
                Script::tokens(&["Half", " an"], TOKEN_DELAY)
                    .then_fail(EngineError::Internal("device lost".into())),
            )
            .with_script(
                "take your time",
                Script::tokens(&["slow"; 20], Duration::from_millis(150)),
            ),
    )
}

async fn scrape(base: &str, accept: Option<&str>) -> (String, String) {
    let mut request = reqwest::Client::new().get(format!("{base}/metrics"));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let response = request.send().await.expect("scrape");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .expect("content type")
        .to_owned();
    (content_type, response.text().await.expect("body"))
}

/// The value of the series whose line starts with `series` (name and labels), or 0.
fn value(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line[series.len()..].split_whitespace().next())
        .map_or(0.0, |v| v.parse().expect("number"))
}

/// Sends the four outcomes: one success, one 400, one mid-stream failure, one cancel.
async fn send_outcomes(base: &str, client: &reqwest::Client) {
    let url = format!("{base}/v1/chat/completions");
    let send = |prompt: &str, extra: serde_json::Value| {
        client.post(&url).json(&chat_body(prompt, extra)).send()
    };
    let ok = send("hi", serde_json::json!({"stream": true}))
        .await
        .expect("send");
    assert!(ok.text().await.expect("body").contains("[DONE]"));

    let bad = send("hi", serde_json::json!({"temperature": 7}))
        .await
        .expect("send");
    assert_eq!(bad.status(), 400);

    let failing = send("fail please", serde_json::json!({"stream": true}))
        .await
        .expect("send");
    assert!(failing.text().await.expect("body").contains("\"error\""));

    let slow = send("take your time", serde_json::json!({"stream": true}))
        .await
        .expect("send");
    let mut frames = slow.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("slow") {
        let chunk = frames.next().await.expect("a frame").expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(frames);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_outcome_and_pass_promtool() {
    let engine = engine();
    let server = TestServer::builder(engine.clone()).start().await;
    let client = reqwest::Client::new();
    send_outcomes(&server.base, &client).await;
    assert!(eventually(5, || server.observer.records().len() == 4).await);

    // The cancelled generation runs until the engine notices the client left.
    let mut text = String::new();
    for _ in 0..50 {
        text = scrape(&server.base, None).await.1;
        if value(&text, "llmgate_requests_running") == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (content_type, text) = (scrape(&server.base, None).await.0, text);
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let requests = |status: &str, finish: &str, error: &str| {
        value(
            &text,
            &format!(
                "llmgate_requests_total{{model=\"{MODEL}\",status=\"{status}\",finish_reason=\"{finish}\",error_type=\"{error}\",traffic=\"client\"}}"
            ),
        )
    };
    assert_eq!(requests("ok", "stop", "none"), 1.0, "{text}");
    assert_eq!(requests("error", "none", "invalid_value"), 1.0, "{text}");
    assert_eq!(requests("error", "none", "engine_error"), 1.0, "{text}");
    assert_eq!(requests("cancelled", "none", "cancelled"), 1.0, "{text}");
    // The model label takes configured values only: another model's request is "none".
    let other = client
        .post(server.url("/v1/chat/completions"))
        .json(
            &serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .expect("send");
    assert_eq!(other.status(), 404);
    let text = scrape(&server.base, None).await.1;
    assert_eq!(
        value(
            &text,
            "llmgate_requests_total{model=\"none\",status=\"error\",finish_reason=\"none\",error_type=\"model_not_found\",traffic=\"client\"}"
        ),
        1.0,
        "{text}"
    );
    assert!(!text.contains("gpt-4o"));

    // Token counts: 3 (success) + 2 (failure) + the cancelled request's tokens.
    let cancelled_tokens = server
        .observer
        .records()
        .iter()
        .find(|r| r.status == llmgate::record::Status::Cancelled)
        .map(|r| f64::from(r.usage.completion_tokens))
        .expect("cancelled record");
    let model = format!("{{model=\"{MODEL}\"}}");
    assert_eq!(
        value(&text, &format!("llmgate_generation_tokens_total{model}")),
        5.0 + cancelled_tokens
    );
    assert!(value(&text, &format!("llmgate_prompt_tokens_total{model}")) >= 3.0);

    // Bucket placement. TTFT: every request that sent content (3) waited at least one
    // 40 ms token delay, so none is in the 20 ms bucket and all are in the 80 s one.
    let ttft = |le: &str| {
        value(
            &text,
            &format!("llmgate_time_to_first_token_seconds_bucket{{model=\"{MODEL}\",le=\"{le}\"}}"),
        )
    };
    assert_eq!(ttft("0.02"), 0.0, "{text}");
    assert_eq!(ttft("80"), 3.0, "{text}");
    assert_eq!(
        value(
            &text,
            &format!("llmgate_time_to_first_token_seconds_count{model}")
        ),
        3.0
    );
    // TPOT: the success (2 gaps of >= 40 ms) and the failure (1 gap): above 30 ms.
    let tpot = |le: &str| {
        value(
            &text,
            &format!(
                "llmgate_time_per_output_token_seconds_bucket{{model=\"{MODEL}\",le=\"{le}\"}}"
            ),
        )
    };
    assert_eq!(tpot("0.03"), 0.0, "{text}");
    assert!(tpot("80") >= 2.0, "{text}");
    // ITL: one sample per gap: 2 + 1 + (cancelled tokens - 1).
    assert_eq!(
        value(
            &text,
            &format!("llmgate_inter_token_latency_seconds_count{model}")
        ),
        3.0 + cancelled_tokens - 1.0
    );
    // e2e of all four, the 400 among them.
    assert_eq!(
        value(
            &text,
            &format!("llmgate_e2e_request_latency_seconds_count{model}")
        ),
        4.0
    );
    // Gauges: nothing running now; the process has memory.
    assert_eq!(value(&text, "llmgate_requests_running"), 0.0);
    assert_eq!(value(&text, "llmgate_requests_waiting"), 0.0);
    assert!(value(&text, "llmgate_process_resident_memory_bytes") > 1e6);

    let checked = promtool_check(&text);
    assert!(checked.0, "promtool check metrics failed:\n{}", checked.1);

    // OpenMetrics on request, ending with # EOF.
    let (content_type, open) = scrape(&server.base, Some("application/openmetrics-text")).await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(open.trim_end().ends_with("# EOF"));
}

/// Runs `promtool check metrics` on an exposition; `(passed, output)`.
fn promtool_check(exposition: &str) -> (bool, String) {
    // scripts/setup puts it in the checkout's .tools/bin; elsewhere, whatever PATH has.
    let local = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/promtool");
    let promtool = if local.is_file() {
        local
    } else {
        "promtool".into()
    };
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (scripts/setup test puts it in .tools/bin)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("write");
    let output = child.wait_with_output().expect("promtool ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|v| v.value)
}

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_collector_tail_sampled_and_linked_to_logs() {
    let logs = captured_logs();
    let (collector, endpoint) = Collector::start().await;
    // Ratio 0: only errors, slow requests and sampled parents are exported.
    let config = test_config("[telemetry]\ntrace_sample_ratio = 0.0\n");
    let server = TestServer::builder(engine())
        .config(&config)
        .traced(&endpoint)
        .start()
        .await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/chat/completions");

    // 1. Continues the caller's sampled trace: kept (reason "parent").
    let traced = client
        .post(&url)
        .header("traceparent", format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01"))
        .header("x-request-id", "traced-1")
        .json(&chat_body(
            "a secret prompt",
            serde_json::json!({"stream": true, "seed": 7, "max_tokens": 16, "temperature": 0.5, "top_p": 0.9}),
        ))
        .send()
        .await
        .expect("send");
    assert!(traced.text().await.expect("body").contains("[DONE]"));
    // 2. Fast, successful, no caller trace: sampled out.
    let fast = client
        .post(&url)
        .header("x-request-id", "fast-1")
        .json(&chat_body("hi", serde_json::json!({})))
        .send()
        .await
        .expect("send");
    assert_eq!(fast.status(), 200);
    // 3. An error: always kept.
    let bad = client
        .post(&url)
        .header("x-request-id", "bad-1")
        .json(&chat_body("hi", serde_json::json!({"n": 9})))
        .send()
        .await
        .expect("send");
    assert_eq!(bad.status(), 400);

    assert!(
        eventually(5, || collector
            .spans()
            .iter()
            .filter(|s| s.name.starts_with("chat"))
            .count()
            == 2)
        .await,
        "spans: {:?}",
        collector
            .spans()
            .iter()
            .map(|s| &s.name)
            .collect::<Vec<_>>()
    );
    let records = server.observer.records();
    let trace_of = |id: &str| {
        records
            .iter()
            .find(|r| r.request_id == id)
            .map(|r| r.trace)
            .expect("record")
    };
    let spans = collector.spans();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();

    // The continued trace: the caller's trace id and parent span.
    let root = spans
        .iter()
        .find(|s| hex(&s.trace_id) == PARENT_TRACE && s.name.starts_with("chat"))
        .expect("the traced request's span");
    assert_eq!(root.name, format!("chat {MODEL}"));
    assert_eq!(hex(&root.parent_span_id), PARENT_SPAN);
    assert_eq!(trace_of("traced-1").trace_id.to_string(), PARENT_TRACE);
    assert_eq!(hex(&root.span_id), trace_of("traced-1").span_id.to_string());
    let s = |key: &str| string(attribute(root, key));
    let i = |key: &str| match attribute(root, key) {
        Some(Value::IntValue(v)) => v,
        other => panic!("{key}: {other:?}"),
    };
    let f = |key: &str| match attribute(root, key) {
        Some(Value::DoubleValue(v)) => v,
        other => panic!("{key}: {other:?}"),
    };
    assert_eq!(s("gen_ai.operation.name"), "chat");
    assert_eq!(s("gen_ai.provider.name"), "llmgate");
    assert_eq!(s("gen_ai.request.model"), MODEL);
    assert_eq!(s("gen_ai.response.model"), MODEL);
    assert_eq!(s("gen_ai.response.id"), "chatcmpl-traced-1");
    assert_eq!(i("gen_ai.request.seed"), 7);
    assert_eq!(i("gen_ai.request.max_tokens"), 16);
    assert_eq!(f("gen_ai.request.temperature"), 0.5);
    assert_eq!(f("gen_ai.request.top_p"), 0.9);
    assert_eq!(i("gen_ai.usage.output_tokens"), 3);
    assert!(i("gen_ai.usage.input_tokens") > 0);
    match attribute(root, "gen_ai.response.finish_reasons") {
        Some(Value::ArrayValue(a)) => {
            assert_eq!(a.values.len(), 1);
            assert_eq!(string(a.values[0].value.clone()), "stop");
        }
        other => panic!("finish reasons: {other:?}"),
    }
    assert!(f("llm.ttft_ms") >= 40.0);
    assert!(f("llm.tpot_ms") >= 40.0);
    assert!((0.0..=1.0).contains(&f("llm.repetition_rate")));
    // The prompt never becomes an attribute.
    for span in &spans {
        for kv in &span.attributes {
            let text = format!("{:?}", kv.value);
            assert!(!text.contains("secret"), "{} = {text}", kv.key);
        }
    }
    // Children: tokenize, queue, prefill, decode, semantic-log hand-off, inside the root,
    // one after the other.
    let children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_id)
        .collect();
    let mut names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["decode", "prefill", "queue", "semlog.handoff", "tokenize"]
    );
    let span = |name: &str| {
        children
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    assert!(span("tokenize").end_time_unix_nano <= span("queue").start_time_unix_nano);
    assert!(span("queue").end_time_unix_nano <= span("prefill").start_time_unix_nano);
    for child in &children {
        assert_eq!(child.trace_id, root.trace_id);
        assert!(child.start_time_unix_nano >= root.start_time_unix_nano);
        assert!(child.end_time_unix_nano <= root.end_time_unix_nano);
    }
    let decode = children
        .iter()
        .find(|s| s.name == "decode")
        .expect("decode");
    // Two 40 ms token gaps.
    assert!(decode.end_time_unix_nano - decode.start_time_unix_nano >= 80_000_000);
    assert_eq!(
        collector
            .service_names
            .lock()
            .expect("lock")
            .first()
            .map(String::as_str),
        Some("llmgate")
    );

    // The error was exported with its error type; the fast request was not.
    let bad_trace = trace_of("bad-1").trace_id.to_string();
    let error_span = spans
        .iter()
        .find(|s| hex(&s.trace_id) == bad_trace && s.name.starts_with("chat"))
        .expect("the error request's span");
    assert_eq!(string(attribute(error_span, "error.type")), "invalid_value");
    let fast_trace = trace_of("fast-1").trace_id.to_string();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !collector
            .spans()
            .iter()
            .any(|s| hex(&s.trace_id) == fast_trace),
        "the sampled-out request was exported"
    );

    // Metrics: decisions counted; exemplars point at exported traces only.
    let (_, open) = scrape(&server.base, Some("application/openmetrics-text")).await;
    assert_eq!(
        value(&open, "llmgate_traces_sampled_total{reason=\"parent\"}"),
        1.0
    );
    assert_eq!(
        value(&open, "llmgate_traces_sampled_total{reason=\"error\"}"),
        1.0
    );
    assert_eq!(
        value(
            &open,
            "llmgate_traces_dropped_total{reason=\"sampled_out\"}"
        ),
        1.0
    );
    assert!(
        open.contains(&format!("# {{trace_id=\"{PARENT_TRACE}\"}}")),
        "no exemplar for the exported trace:\n{open}"
    );
    assert!(
        !open.contains(&fast_trace),
        "an exemplar points at a dropped trace"
    );

    // Every JSON log line of the traced request carries its trace and span ids.
    let text = String::from_utf8(logs.lock().expect("lock").clone()).expect("utf-8");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|l: &serde_json::Value| l["request_id"] == "traced-1")
        .collect();
    assert!(lines.len() >= 2, "lines of traced-1: {lines:?}");
    for line in &lines {
        assert_eq!(line["trace_id"], PARENT_TRACE, "{line}");
        assert_eq!(line["span_id"], hex(&root.span_id), "{line}");
    }
    assert!(lines.iter().any(|l| l["message"] == "Request finished."));
    server.telemetry.shutdown();
}

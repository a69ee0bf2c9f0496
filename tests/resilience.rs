//! Resilience, black-box over HTTP with the scripted engine: clients that stop reading,
//! bodies that never arrive, requests that wait too long for the engine or run too long.
//! Each deadline answers with its own OpenAI-shaped error and leaves a record naming it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use llmgate::engine::scripted::Script;
use llmgate::record::Status;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw connection to the server, for clients no HTTP library would imitate.
async fn connect(server: &TestServer, receive_buffer: Option<u32>) -> tokio::net::TcpStream {
    let address: std::net::SocketAddr = server
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    if let Some(bytes) = receive_buffer {
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
    }
    socket.connect(address).await.expect("connect")
}

/// The head of a chat request announcing a body of `content_length` bytes.
fn request_head(content_length: usize) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: llmgate\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\n\r\n"
    )
}

/// A raw connection to the server that has sent a whole chat request with `body`.
async fn send_chat(
    server: &TestServer,
    receive_buffer: Option<u32>,
    body: &Value,
) -> tokio::net::TcpStream {
    let mut stream = connect(server, receive_buffer).await;
    let body = body.to_string();
    let request = format!("{}{body}", request_head(body.len()));
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send request");
    stream
}

/// Waits up to ten seconds for a record with this status and error kind.
async fn recorded(server: &TestServer, status: Status, kind: &str) -> bool {
    eventually(10, || {
        server
            .observer
            .records()
            .iter()
            .any(|r| r.status == status && r.error_kind == Some(kind))
    })
    .await
}

/// Whether `/metrics` counts a request with this status and error type.
fn counted(metrics: &str, status: &str, error_type: &str) -> bool {
    metrics.lines().any(|l| {
        l.starts_with("llmgate_requests_total{")
            && l.contains(&format!("status=\"{status}\""))
            && l.contains(&format!("error_type=\"{error_type}\""))
    })
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off_and_the_server_carries_on() {
    // 12 MB of answer at full speed: more than the kernel buffers of a loopback socket
    // (tcp_wmem's 4 MB ceiling) and the gateway's own can hold.
    let block = "x".repeat(4096);
    let flood = Script::tokens(&vec![block.as_str(); 3000], Duration::ZERO);
    let engine = Arc::new(scripted_long(hello()).with_script("flood", flood));
    let config =
        test_config("[server]\nstream_write_timeout_secs = 1\n[engine]\nmax_tokens_cap = 4096\n");
    let server = TestServer::builder(engine.clone())
        .config(&config)
        .start()
        .await;

    // A client with a tiny receive window that sends its request and never reads a byte.
    let stalled = send_chat(
        &server,
        Some(4096),
        &chat_body("flood", json!({"stream": true, "max_tokens": 3000})),
    )
    .await;
    let started = std::time::Instant::now();

    // While it stalls, the server answers others.
    let health = reqwest::get(server.url("/health")).await.expect("health");
    assert_eq!(health.status(), 200);

    assert!(
        recorded(&server, Status::Cancelled, "client_stalled").await,
        "the stalled stream was not cut off: {:?}",
        server.observer.records()
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "cut off before the write timeout"
    );
    assert!(
        eventually(5, || engine.generations_cancelled() == 1).await,
        "the generation ran on"
    );
    assert!(
        engine.tokens_produced() < 3000,
        "the whole answer was generated"
    );

    let second = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(second.status(), 200);
    let answer: Value = second.json().await.expect("json");
    assert_eq!(answer["choices"][0]["message"]["content"], "Hello!");
    let health = reqwest::get(server.url("/health")).await.expect("health");
    assert_eq!(health.status(), 200);
    assert!(counted(
        &metrics(&server).await,
        "cancelled",
        "client_stalled"
    ));
    drop(stalled);
}

/// The answer a loopback socket's kernel buffers would absorb whole if left to
/// autotuning (about 900 KB, where an autotuned send buffer grows to 4 MB): the write
/// never blocks, so the write timeout never fires and the generation runs on for a
/// client that reads nothing. Bounded (`send_buffer_bytes`), it does.
async fn a_quiet_non_reader(send_buffer_bytes: usize) -> (bool, u64) {
    let block = "x".repeat(100);
    let long = Script::tokens(&vec![block.as_str(); 3000], Duration::from_micros(300));
    let engine = Arc::new(scripted_long(hello()).with_script("long", long));
    let config = test_config(&format!(
        "[server]\nstream_write_timeout_secs = 1\nsend_buffer_bytes = {send_buffer_bytes}\n[engine]\nmax_tokens_cap = 4096\n"
    ));
    let server = TestServer::builder(engine.clone())
        .config(&config)
        .start()
        .await;
    // An ordinary client (default buffers) that sends its request and never reads.
    let quiet = send_chat(
        &server,
        None,
        &chat_body("long", json!({"stream": true, "max_tokens": 3000})),
    )
    .await;
    let cut = recorded(&server, Status::Cancelled, "client_stalled").await;
    let produced = engine.tokens_produced();
    drop(quiet);
    (cut, produced)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_cut_even_when_the_kernel_could_hold_the_answer() {
    let (cut, produced) = a_quiet_non_reader(64 << 10).await;
    assert!(cut, "the non-reader was not cut off");
    assert!(
        produced < 3000,
        "the whole answer was generated: {produced}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_spent_waiting_for_a_slow_reader_is_reported_on_its_own() {
    // 12 MB at full speed, read at about 12 MB/s: more than the buffers hold, so frames
    // wait for the reader.
    let block = "x".repeat(4096);
    let flood = Script::tokens(&vec![block.as_str(); 3000], Duration::ZERO);
    let engine = Arc::new(scripted_long(hello()).with_script("flood", flood));
    let config = test_config("[engine]\nmax_tokens_cap = 4096\n");
    let server = TestServer::builder(engine).config(&config).start().await;

    let mut slow = send_chat(
        &server,
        None,
        &chat_body("flood", json!({"stream": true, "max_tokens": 3000})),
    )
    .await;
    let mut tail = Vec::new();
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let n = slow.read(&mut buffer).await.expect("read");
        assert!(n > 0, "the stream ended before [DONE]");
        tail.extend_from_slice(&buffer[..n]);
        tail.drain(..tail.len().saturating_sub(64));
        // Chunked framing follows the last frame.
        if tail.windows(12).any(|w| w == b"data: [DONE]") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(eventually(5, || server.observer.records().len() == 1).await);
    let slow = server.observer.records()[0].timings.clone();
    let waited = slow
        .client_wait_ms
        .expect("a stream reports its client wait");
    assert!(
        waited >= 200.0 && waited <= slow.e2e_ms,
        "waited {waited} ms of {} ms",
        slow.e2e_ms
    );

    // A client that reads at once is barely waited for; a non-streamed answer reports
    // no client wait at all.
    let fast = post_text(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    assert!(fast.ends_with("data: [DONE]\n\n"), "{fast}");
    let whole = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(whole.status(), 200);
    assert!(eventually(5, || server.observer.records().len() == 3).await);
    let records = server.observer.records();
    let fast = records[1].timings.client_wait_ms.expect("streamed");
    assert!(fast < 50.0, "{fast}");
    assert_eq!(records[2].timings.client_wait_ms, None);
}

#[tokio::test]
async fn a_body_that_never_arrives_gets_408() {
    let server = TestServer::builder(hello_engine())
        .config(&test_config("[server]\nbody_timeout_secs = 1\n"))
        .start()
        .await;
    let mut slow = connect(&server, None).await;
    // Announces 100 bytes of body and sends 9 of them.
    let head = format!("{}{{\"model\":", request_head(100));
    slow.write_all(head.as_bytes()).await.expect("send head");

    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buffer = [0u8; 4096];
        loop {
            let n = slow.read(&mut buffer).await.expect("read");
            answer.extend_from_slice(&buffer[..n]);
            if n == 0 || answer.windows(4).any(|w| w == b"}}") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 10 s");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    assert!(recorded(&server, Status::Error, "body_timeout").await);
}

#[tokio::test]
async fn a_request_the_engine_does_not_start_in_time_gets_503_with_retry_after() {
    let busy = hello().after_queue(Duration::from_secs(5));
    let engine = Arc::new(scripted(hello()).with_script("busy", busy));
    let server = TestServer::builder(engine)
        .config(&test_config("[server]\nqueue_timeout_secs = 1\n"))
        .start()
        .await;

    let response = post(&server, CHAT, &chat_body("busy", json!({"stream": true}))).await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "queue_timeout");
    assert_eq!(body["error"]["type"], "server_error");
    assert!(recorded(&server, Status::Error, "queue_timeout").await);
    assert!(counted(&metrics(&server).await, "error", "queue_timeout"));

    // A request the engine starts at once is served as usual.
    let served = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(served.status(), 200);
}

#[tokio::test]
async fn a_request_past_its_deadline_ends_with_an_error_and_stops_the_engine() {
    let slow = Script::tokens(&vec!["tok"; 200], Duration::from_millis(25));
    let engine = Arc::new(scripted_long(slow));
    let server = TestServer::builder(engine.clone())
        .config(&test_config("[server]\nrequest_timeout_secs = 1\n"))
        .start()
        .await;

    // Streamed: content, then one error frame, then [DONE].
    let text = post_text(&server, CHAT, &chat_body("hi", json!({"stream": true}))).await;
    let frames: Vec<&str> = text
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .collect();
    assert!(frames.len() > 3, "{text}");
    assert_eq!(frames.last(), Some(&"[DONE]"), "{text}");
    let error: Value = serde_json::from_str(frames[frames.len() - 2]).expect("error frame");
    assert_eq!(error["error"]["code"], "request_timeout", "{text}");
    assert!(frames[1].contains("\"tok\""), "{text}");

    // Not streamed: a 504.
    let response = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(response.status(), 504);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "request_timeout");

    assert!(
        eventually(5, || engine.generations_cancelled() == 2).await,
        "the engine ran past the deadline"
    );
    let timed_out = server
        .observer
        .records()
        .iter()
        .filter(|r| r.status == Status::Error && r.error_kind == Some("request_timeout"))
        .count();
    assert_eq!(timed_out, 2);
    assert!(counted(&metrics(&server).await, "error", "request_timeout"));
}

#[tokio::test]
async fn a_budget_that_does_not_fit_the_context_is_refused_and_a_default_one_shrinks() {
    // The scripted model's context is 64 tokens, one per word of the prompt.
    let long = Script::tokens(&vec!["tok"; 100], Duration::ZERO);
    let server = TestServer::builder(Arc::new(scripted(long)))
        .config(&test_config(
            "[engine]\nmax_tokens_cap = 100\ndefault_max_tokens = 100\n",
        ))
        .start()
        .await;
    let prompt = "word ".repeat(30);

    let refused = post(
        &server,
        CHAT,
        &chat_body(&prompt, json!({"max_tokens": 40})),
    )
    .await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(body["error"]["param"], "messages");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("30 in the messages, 40 in the completion"),
        "{message}"
    );
    let legacy: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": 40}),
    )
    .await;
    assert_eq!(legacy["error"]["param"], "prompt", "{legacy}");
    let message = legacy["error"]["message"].as_str().expect("message");
    assert!(message.contains("30 in the prompt,"), "{message}");

    let fitted = post(&server, CHAT, &chat_body(&prompt, json!({}))).await;
    assert_eq!(fitted.status(), 200);
    let body: Value = fitted.json().await.expect("json");
    assert_eq!(body["usage"]["completion_tokens"], 34, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn a_client_that_half_closes_its_connection_has_left() {
    let slow = Script::tokens(&vec!["tok"; 300], Duration::from_millis(20));
    let engine = Arc::new(scripted_long(slow));
    let server = TestServer::builder(engine.clone()).start().await;

    // A non-streamed request, then the client shuts its writing side and waits.
    let mut client = send_chat(&server, None, &chat_body("hi", json!({}))).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.shutdown().await.expect("half-close");

    assert!(
        eventually(5, || engine.generations_cancelled() == 1).await,
        "the generation ran on for a client that left"
    );
    assert!(engine.tokens_produced() < 300);
    assert!(
        eventually(5, || server
            .observer
            .records()
            .iter()
            .any(|r| r.status == Status::Cancelled && r.error_kind.is_none()))
        .await
    );
}

#[tokio::test]
async fn a_drain_lets_running_requests_finish_refuses_new_ones_and_ends_the_rest() {
    // The short stream ends 0.2 s into a 4 s drain, with room for a busy machine; the
    // long one (400 tokens, 8 s) outlasts it.
    let short = Script::tokens(&["s"; 10], Duration::from_millis(20));
    let long = Script::tokens(&vec!["l"; 400], Duration::from_millis(20));
    let engine = scripted_long(hello())
        .with_script("short", short)
        .with_script("long", long);
    let server = TestServer::builder(Arc::new(engine)).start().await;
    let read = |prompt: &'static str| {
        let url = server.url("/v1/chat/completions");
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .json(&chat_body(prompt, json!({"stream": true})))
                .send()
                .await
                .expect("request")
                .text()
                .await
                .expect("body")
        })
    };
    let (short, long) = (read("short"), read("long"));
    let state = server.state.clone();
    assert!(eventually(5, || state.admission.in_flight() == 2).await);

    let draining = {
        let state = state.clone();
        tokio::spawn(async move {
            state
                .lifecycle
                .drain(&state.admission, Duration::from_secs(4))
                .await;
        })
    };
    assert!(eventually(5, || state.lifecycle.is_draining()).await);
    let ready = reqwest::get(server.url("/ready")).await.expect("ready");
    assert_eq!(ready.status(), 503);
    let refused = post(&server, CHAT, &chat_body("hi", json!({}))).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "5");
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "server_shutting_down");

    draining.await.expect("drain");
    assert_eq!(state.admission.in_flight(), 0);
    let short = short.await.expect("short");
    assert!(short.contains("\"finish_reason\":\"stop\""), "{short}");
    assert!(short.ends_with("data: [DONE]\n\n"), "{short}");
    let long = long.await.expect("long");
    assert!(long.contains("\"code\":\"server_shutting_down\""), "{long}");
    assert!(long.ends_with("data: [DONE]\n\n"), "{long}");

    let mut outcomes: Vec<_> = server
        .observer
        .records()
        .iter()
        .map(|r| (r.status, r.error_kind))
        .collect();
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(
        outcomes,
        [
            (Status::Error, Some("server_shutting_down")),
            (Status::Error, Some("server_shutting_down")),
            (Status::Ok, None),
        ]
    );
}

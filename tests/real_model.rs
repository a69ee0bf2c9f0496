//! End-to-end with the real default model (SmolLM2-135M-Instruct Q4_1) through
//! mistral.rs. `scripts/fetch-model` puts it in place; `scripts/test` runs it first.
//! The model loads once per test function.

mod common;

use common::*;
use llmgate::engine::mistral::{MistralEngine, MistralSettings};
use llmgate::engine::Front;
use llmgate::record::Status;
use serde_json::{json, Value};

fn f(t: &Value, key: &str) -> f64 {
    t[key]
        .as_f64()
        .unwrap_or_else(|| panic!("timings.{key} missing in {t}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_model_streams_and_answers_with_consistent_timings() {
    // Two replicas, so concurrent requests really run side by side below.
    let engine = MistralEngine::load_now(MistralSettings {
        force_cpu: true,
        replicas: 2,
        ..MistralSettings::new(model_path(), MODEL)
    })
    .await
    .expect("the default model loads");
    // The front holds the running count and the KV accounting the tests below read.
    let engine = Front::from(engine);
    let server = TestServer::builder(engine.clone()).start().await;
    let client = reqwest::Client::new();
    let sampling = json!({"temperature": 0, "max_tokens": 32});
    let question = chat_body(LOOPING, sampling.clone());

    // Non-streamed.
    let whole = ask(&server, LOOPING, sampling).await;
    let content = whole["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(!content.trim().is_empty(), "{whole}");
    let usage = &whole["usage"];
    let n = usage["completion_tokens"]
        .as_f64()
        .expect("completion tokens");
    assert!((1.0..=32.0).contains(&n));
    assert!(usage["prompt_tokens"].as_u64() > Some(5));
    let t = &whole["timings"];
    assert_eq!(t["output_tokens"].as_f64(), Some(n));
    assert!(
        f(t, "ttft_ms") > 0.0 && f(t, "ttft_ms") <= f(t, "e2e_ms"),
        "{t}"
    );
    if n >= 2.0 {
        assert!(f(t, "tpot_ms") * (n - 1.0) <= f(t, "e2e_ms"), "{t}");
    }
    assert!(whole["system_fingerprint"]
        .as_str()
        .is_some_and(|s| s.starts_with("fp_")));

    // Streamed, same greedy request: same text, same token counts.
    let mut streamed_req = question.clone();
    streamed_req["stream"] = json!(true);
    streamed_req["stream_options"] = json!({"include_usage": true});
    let text = client
        .post(server.url("/v1/chat/completions"))
        .json(&streamed_req)
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk json"))
        .collect();
    assert!(text.ends_with("data: [DONE]\n\n"));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content, "greedy stream and non-stream differ");
    let last = chunks.last().expect("usage chunk");
    assert_eq!(
        last["usage"], whole["usage"],
        "usage differs between the two paths"
    );
    let t = &last["timings"];
    assert!(f(t, "ttft_ms") <= f(t, "e2e_ms"));
    if n >= 2.0 {
        assert!(f(t, "tpot_ms") * (n - 1.0) <= f(t, "e2e_ms"), "{t}");
        assert!(t["itl_ms"]["p50"].as_f64() > Some(0.0));
    }
    assert!(
        t["queue_ms"].as_f64().is_some(),
        "the engine reports when it started the request: {t}"
    );

    // A prompt the model's context cannot hold is refused before streaming starts.
    let long = chat_body(&"lorem ipsum ".repeat(10_000), json!({"stream": true}));
    let refused = client
        .post(server.url("/v1/chat/completions"))
        .json(&long)
        .send()
        .await
        .expect("request");
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "context_length_exceeded");

    let records = server.observer.records();
    assert_eq!(records.iter().filter(|r| r.status == Status::Ok).count(), 2);

    repetition_rates(&server).await;
    end_rules(&server).await;
    same_seed_same_text_whatever_the_neighbours(&server, &engine).await;
    kv_cache_follows_the_running_sequences(&server, &engine).await;

    let guarded = TestServer::builder(engine)
        .config(&test_config(
            "[quality]\ndegeneration_guard = true\nguard_window = 32\nguard_threshold = 0.5\n",
        ))
        .start()
        .await;
    guard_stops_a_looping_answer(&guarded).await;
}

/// Greedy; this question sends SmolLM2-135M into a loop ("la femme au martyre, ...").
const LOOPING: &str = "What is the capital of France?";

async fn ask(server: &TestServer, prompt: &str, extra: Value) -> Value {
    post_json(server, CHAT, &chat_body(prompt, extra)).await
}

async fn repetition_rates(server: &TestServer) {
    let looping = ask(
        server,
        LOOPING,
        json!({"temperature": 0, "max_tokens": 128}),
    )
    .await;
    let rate = f(&looping["timings"], "repetition_rate");
    assert!(rate > 0.5, "a looping answer scores high: {looping}");
    let factual = ask(
        server,
        "What color is the sky on a clear day?",
        json!({"temperature": 0, "max_tokens": 48}),
    )
    .await;
    let low = f(&factual["timings"], "repetition_rate");
    assert!(low < 0.1, "a varied answer scores low: {factual}");
    assert_eq!(factual["timings"]["degenerated"], false);
}

async fn guard_stops_a_looping_answer(server: &TestServer) {
    let stopped = ask(
        server,
        LOOPING,
        json!({"temperature": 0, "max_tokens": 128}),
    )
    .await;
    assert_eq!(stopped["timings"]["degenerated"], true, "{stopped}");
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop", "{stopped}");
    let n = stopped["usage"]["completion_tokens"]
        .as_u64()
        .expect("tokens");
    assert!(n < 128, "the guard stopped the loop early: {n} tokens");
}

/// vLLM's `ignore_eos`, `min_tokens` and `stop_token_ids`, as benchmark clients send them,
/// on a greedy answer that ends by itself.
async fn end_rules(server: &TestServer) {
    const SHORT: &str = "Say hello.";
    let greedy = |extra: Value| {
        let mut body = json!({"temperature": 0, "max_tokens": 40});
        body.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        ask(server, SHORT, body)
    };
    let tokens = |answer: &Value| {
        answer["usage"]["completion_tokens"]
            .as_u64()
            .expect("usage")
    };
    let text = |answer: &Value| {
        answer["choices"][0]["message"]["content"]
            .as_str()
            .expect("text")
            .to_owned()
    };
    let plain = greedy(json!({})).await;
    let n = tokens(&plain);
    assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{plain}");
    assert!(
        (3..35).contains(&n),
        "the premise: a short answer, {n} tokens"
    );

    let ignoring = greedy(json!({"ignore_eos": true})).await;
    assert_eq!(tokens(&ignoring), 40, "{ignoring}");
    assert_eq!(ignoring["choices"][0]["finish_reason"], "length");
    assert!(
        text(&ignoring).starts_with(&text(&plain)),
        "the same answer, then more"
    );

    let at_least = greedy(json!({"min_tokens": n + 5})).await;
    assert!(tokens(&at_least) >= n + 5, "{at_least}");

    // Stop on the answer's third token: the text ends before it.
    let ids: Value = post_json(
        server,
        "/tokenize",
        &json!({"model": MODEL, "prompt": text(&plain), "add_special_tokens": false}),
    )
    .await;
    let third = ids["tokens"][2].as_u64().expect("a third token");
    let stopped = greedy(json!({"stop_token_ids": [third]})).await;
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop", "{stopped}");
    let cut = text(&stopped);
    assert!(
        cut.len() < text(&plain).len() && text(&plain).starts_with(&cut),
        "{cut:?} is the start of {:?}",
        text(&plain)
    );
    let unknown = greedy(json!({"stop_token_ids": [4_000_000]})).await;
    assert_eq!(unknown["error"]["param"], "stop_token_ids[0]", "{unknown}");
}

/// Seeded answers do not depend on what runs beside them, nor on which replica runs them.
async fn same_seed_same_text_whatever_the_neighbours(server: &TestServer, engine: &Front) {
    let story = "Write a short story about a cat.";
    let seeded = json!({"temperature": 0.9, "seed": 1234, "max_tokens": 24});
    let mut calls = Vec::new();
    for i in 0..16u64 {
        // Even calls: the request under test. Odd calls: different concurrent neighbours.
        let (prompt, extra) = if i % 2 == 0 {
            (story, seeded.clone())
        } else {
            (
                "Tell me about the sea.",
                json!({"temperature": 1.0, "seed": i, "max_tokens": 4 + i}),
            )
        };
        calls.push(async move {
            ask(server, prompt, extra).await["choices"][0]["message"]["content"].clone()
        });
    }
    // Watch the engine while the calls run: both replicas must have been busy at once.
    let most_running = async {
        let mut most = 0;
        for _ in 0..2000 {
            most = most.max(engine.load().running);
            if most == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        most
    };
    let (answers, most_running) = tokio::join!(futures_util::future::join_all(calls), most_running);
    assert_eq!(most_running, 2, "two sequences ran at once on two replicas");
    let seeded_answers: Vec<&Value> = answers.iter().step_by(2).collect();
    assert_eq!(seeded_answers.len(), 8);
    assert!(
        seeded_answers.iter().all(|a| *a == seeded_answers[0]),
        "same seed, different texts: {seeded_answers:?}"
    );

    let other_seed = ask(
        server,
        story,
        json!({"temperature": 0.9, "seed": 99, "max_tokens": 24}),
    )
    .await;
    assert_ne!(
        &other_seed["choices"][0]["message"]["content"], seeded_answers[0],
        "different seeds, same text"
    );
}

/// The KV-cache share (the model-server protocol's KVCacheUtilization) counts the running
/// sequences' prompt and output positions, and falls back to zero when they end.
async fn kv_cache_follows_the_running_sequences(server: &TestServer, engine: &Front) {
    let idle = engine
        .kv_cache()
        .expect("a loaded engine knows its KV cache");
    let context = engine.model_info().expect("loaded").context_length;
    assert_eq!(idle.used_tokens, 0, "{idle:?}");
    assert_eq!(idle.capacity_tokens, 2 * u64::from(context), "two replicas");
    let answer = ask(
        server,
        "Tell me about the sea.",
        // ignore_eos: 48 tokens to watch on any CPU, wherever the answer would end.
        json!({"temperature": 0, "max_tokens": 48, "ignore_eos": true}),
    );
    let watch = async {
        let mut most = 0;
        for _ in 0..4000 {
            most = most.max(engine.kv_cache().expect("loaded").used_tokens);
            if engine.load().running == 0 && most > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        most
    };
    let (answer, most) = tokio::join!(answer, watch);
    let usage = &answer["usage"];
    let held = usage["prompt_tokens"].as_u64().expect("prompt")
        + usage["completion_tokens"].as_u64().expect("completion");
    assert!(
        most > usage["prompt_tokens"].as_u64().expect("prompt") && most <= held,
        "most held {most}, the request's tokens {held}"
    );
    assert_eq!(
        engine.kv_cache().expect("loaded").used_tokens,
        0,
        "released"
    );
    let text = metrics(server).await;
    assert!(
        text.contains(&format!(
            "llmgate_kv_cache_usage_ratio{{model=\"{MODEL}\"}} 0.0"
        )),
        "{text}"
    );
}

/// The start-up canary sees mistral.rs 0.8.1's batched-decode defect on CPU: were it to
/// miss it (say, the pair never shared a decode step), it would wave batching through on
/// a GPU whose kernels garble too. When a fixed mistral.rs lands, this fails: then the
/// CPU default batch size can rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batching_canary_catches_the_cpu_defect() {
    let engine = MistralEngine::load_now(MistralSettings {
        force_cpu: true,
        max_batch_size: 2,
        ..MistralSettings::new(model_path(), MODEL)
    })
    .await
    .expect("the default model loads");
    let outcome = engine.batching_check().await.expect("the canary runs");
    assert!(!outcome.batched_equals_single(), "{}", outcome.describe());
    // The defect's signature: the last row of the batch is answered correctly.
    assert!(
        outcome.pairs.iter().any(|p| p.alone == p.together),
        "{}",
        outcome.describe()
    );
}

/// The default model on one mistral.rs instance, behind the gateway (through the front
/// returned beside it, which counts its running sequences and their KV positions).
async fn one_instance() -> (std::sync::Arc<MistralEngine>, Front, TestServer) {
    let engine = MistralEngine::load_now(MistralSettings {
        force_cpu: true,
        ..MistralSettings::new(model_path(), MODEL)
    })
    .await
    .expect("the default model loads");
    let front = Front::from(engine.clone());
    let server = TestServer::builder(front.clone()).start().await;
    (engine, front, server)
}

/// A client that gives up on a long prompt, then one that gives up while its short
/// prompt waits to be counted behind the long one's prefill, then a patient one (the
/// reproduction: mistral.rs 0.8.1's engine thread panicked when the second one's token
/// count found nobody waiting for it, `add_request.rs:774`, and the next request got
/// nothing). The engine thread keeps running (the watchdog would have restarted it and
/// counted the restart), the patient request is answered, and the slots of the two that
/// left are given back once mistral.rs has let their sequences go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_leave_do_not_stop_the_engine() {
    let (engine, front, server) = one_instance().await;
    let impatient = |seconds: f64| {
        reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs_f64(seconds))
            .build()
            .expect("client")
    };
    // About 1,500 tokens: a prefill of seconds on CPU, one mistral.rs step.
    let long = format!(
        "Summarise this. {}",
        "The sea is wide and deep. ".repeat(210)
    );
    let gave_up = impatient(1.0)
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(&long, json!({"max_tokens": 8})))
        .send()
        .await;
    assert!(gave_up.is_err(), "the long prompt outlasted its client");
    let short = chat_body("Hello there", json!({"max_tokens": 4}));
    let gave_up = impatient(0.3)
        .post(server.url("/v1/chat/completions"))
        .json(&short)
        .send()
        .await;
    assert!(gave_up.is_err(), "counted while the long prefill ran");

    let answer = ask(&server, "Hello there", json!({"max_tokens": 4})).await;
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(
        engine.engine_restarts(),
        0,
        "mistral.rs's engine thread stopped"
    );
    for _ in 0..200 {
        if front.load().running == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        front.load().running,
        0,
        "a departed client's slot is still held"
    );
    assert_eq!(front.kv_cache().expect("loaded").used_tokens, 0);
}

/// An engine thread that stops (as a panic inside mistral.rs stops it) is restarted by
/// the watchdog on the loaded weights, counted, and the model serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_engine_thread_is_restarted() {
    let (engine, _front, server) = one_instance().await;
    // The watchdog has looked once: it knows the running thread's channel.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    engine.stop_engine_threads().await.expect("stopped");
    for _ in 0..100 {
        if engine.engine_restarts() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(engine.engine_restarts(), 1, "the watchdog restarted it");
    let ready = reqwest::get(server.url("/ready")).await.expect("ready");
    assert_eq!(ready.status(), 200);
    let answer = ask(&server, "Hello there", json!({"max_tokens": 4})).await;
    assert_eq!(answer["object"], "chat.completion", "{answer}");
}

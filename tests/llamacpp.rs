//! End to end with the real default model through the llama.cpp engine
//! (`engine = "llamacpp"`): what the gateway measures and controls works as with
//! mistral.rs (token ids, log-probabilities, seeds, stops, the end rules, structured
//! output, cancellation, /tokenize, the fingerprint), several sequences are decoded
//! together, and a seeded answer does not depend on what runs beside it.

mod common;

use std::sync::Arc;

use common::*;
use llmgate::engine::llamacpp::{LlamaCppEngine, LlamaCppSettings};
use llmgate::engine::Front;
use serde_json::{json, Value};

/// The default model in llama.cpp, behind the front that counts its sequences.
fn engine(prefix_cache: bool) -> Front {
    LlamaCppEngine::load_now(LlamaCppSettings {
        sequences: 4,
        context_length: Some(2048),
        prefix_cache,
        ..LlamaCppSettings::new(model_path(), MODEL)
    })
    .expect("llama.cpp loads the default model")
    .into()
}

const FRANCE: &str = "What is the capital of France? Answer in one word.";

/// The text and the final chunk of a streamed answer.
async fn stream(server: &TestServer, mut body: Value) -> (String, Value) {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = post_text(server, CHAT, &body).await;
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let chunks = chunks_of(&text);
    let content = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    (content, chunks.last().cloned().expect("a last chunk"))
}

fn content(answer: &Value) -> &str {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_answers_times_and_scores_like_the_other_engine() {
    let engine = engine(false);
    let info = engine.model_info().expect("loaded");
    assert!(
        info.system_fingerprint.starts_with("fp_") && info.device == "cpu",
        "{info:?}"
    );
    let server = TestServer::builder(engine.clone()).start().await;

    // Greedy, non-streamed and streamed: the same text and counts, the timings sound.
    let greedy = chat_body(
        FRANCE,
        json!({"temperature": 0, "max_tokens": 16, "logprobs": true, "top_logprobs": 2}),
    );
    let whole = chat_ok(&server, &greedy).await;
    assert!(content(&whole).contains("Paris"), "{whole}");
    let n = whole["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!((1..=16).contains(&n));
    assert!(
        whole["usage"]["prompt_tokens"].as_u64() > Some(10),
        "chat template applied"
    );
    let logprobs = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs");
    assert!(!logprobs.is_empty() && logprobs.len() as u64 <= n);
    assert_eq!(
        logprobs[0]["top_logprobs"].as_array().map(Vec::len),
        Some(2)
    );
    assert!(logprobs.iter().all(|l| l["logprob"].as_f64() <= Some(0.0)));
    let t = &whole["timings"];
    assert!(t["ttft_ms"].as_f64() <= t["e2e_ms"].as_f64(), "{t}");
    assert_eq!(
        t["repetition_basis"],
        Value::Null,
        "the engine's own token ids"
    );
    assert!(t["mean_logprob"].as_f64().is_some());
    let (streamed, last) = stream(&server, greedy.clone()).await;
    assert_eq!(streamed, content(&whole));
    assert_eq!(last["usage"], whole["usage"]);
    let chunks = last["timings"]["chunks"].as_u64().expect("chunks");
    assert!(
        (1..=n).contains(&chunks),
        "one chunk per token at most: {chunks} of {n}"
    );

    // The end rules and the stops: ignore_eos runs to max_tokens, min_tokens holds the
    // end back, a stop sequence cuts, a stop token ends without its text.
    let long = chat_ok(
        &server,
        &chat_body(
            FRANCE,
            json!({"temperature": 0, "max_tokens": 24, "ignore_eos": true}),
        ),
    )
    .await;
    assert_eq!(long["usage"]["completion_tokens"], 24);
    assert_eq!(long["choices"][0]["finish_reason"], "length");
    let stopped = chat_ok(
        &server,
        &chat_body(
            FRANCE,
            json!({"temperature": 0, "max_tokens": 16, "stop": ["aris"]}),
        ),
    )
    .await;
    assert!(!content(&stopped).contains("aris"), "{stopped}");
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Structured output: the answer is JSON of the schema. The string is bounded, so
    // the whole object fits the budget however the model spells the city.
    let schema = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"], "additionalProperties": false}}});
    let structured = chat_ok(
        &server,
        &chat_body(
            FRANCE,
            json!({"temperature": 0, "max_tokens": 64, "response_format": schema}),
        ),
    )
    .await;
    assert_eq!(
        structured["choices"][0]["finish_reason"], "stop",
        "{structured}"
    );
    let parsed: Value = serde_json::from_str(content(&structured)).expect("JSON");
    assert!(parsed["city"].is_string(), "{parsed}");

    // /tokenize: the chat template's tokens, and text as text.
    let tokens: Value = post_json(
        &server,
        "/tokenize",
        &json!({"model": MODEL, "prompt": "Hello world", "add_special_tokens": false}),
    )
    .await;
    assert_eq!(
        tokens["tokens"].as_array().map(Vec::len),
        Some(2),
        "{tokens}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_streams_decode_together_and_a_seed_gives_the_same_text_beside_them() {
    let engine = engine(false);
    let server = Arc::new(TestServer::builder(engine.clone()).start().await);
    let seeded = chat_body(
        "Write a short poem about the sea.",
        json!({"temperature": 0.9, "seed": 42, "max_tokens": 32}),
    );
    let alone = content(&chat_ok(&server, &seeded).await).to_owned();
    // The same seeded request with three others running: long enough (no end before
    // max_tokens) to be running together on a fast machine, and waited for on a slow one.
    let mut handles = Vec::new();
    for i in 0..3 {
        let server = Arc::clone(&server);
        handles.push(tokio::spawn(async move {
            let body = chat_body(
                &format!("Tell me a story about a dragon number {i}."),
                json!({"temperature": 0.7, "max_tokens": 160, "ignore_eos": true}),
            );
            chat_ok(&server, &body).await
        }));
    }
    let mut peak = 0;
    eventually(30, || {
        peak = peak.max(engine.load().running);
        peak >= 2
    })
    .await;
    let beside = content(&chat_ok(&server, &seeded).await).to_owned();
    for handle in handles {
        let answer = handle.await.expect("joined");
        assert!(!content(&answer).is_empty());
    }
    assert_eq!(
        alone, beside,
        "a seeded answer does not depend on its company"
    );
    assert!(peak >= 2, "sequences ran together: {peak}");
    assert_eq!(engine.load().running, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_frees_its_sequence() {
    let engine = engine(false);
    let server = TestServer::builder(engine.clone()).start().await;
    let body = chat_body(
        "Write a very long story.",
        json!({"stream": true, "max_tokens": 1000, "ignore_eos": true}),
    );
    let mut response = post(&server, CHAT, &body).await;
    let mut seen = 0;
    while seen < 5 {
        if response.chunk().await.expect("body").is_some() {
            seen += 1;
        }
    }
    assert_eq!(engine.load().running, 1);
    drop(response);
    let freed = eventually(5, || engine.load().running == 0).await;
    assert!(freed, "the sequence ended when its client left");
}

/// The `field` of each `message` the engine of test `case` logged (its lines carry the
/// `case` span's field; other tests' engines log beside it).
fn logged(logs: &[u8], case: &str, message: &str, field: &str) -> Vec<u64> {
    let case = format!(r#""case":"{case}""#);
    String::from_utf8_lossy(logs)
        .lines()
        .filter(|l| l.contains(message) && l.contains(&case))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| l["fields"][field].as_u64().or(l[field].as_u64()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_is_read_once_with_the_prefix_cache() {
    let logs = common::logs::captured_logs();
    // The engine's thread logs inside this span: the lines of this test's engine, not
    // of the others running beside it.
    let engine = tracing::info_span!(target: "llmgate::tests", "case", case = "prefix")
        .in_scope(|| engine(true));
    let server = TestServer::builder(engine.clone()).start().await;
    let system = "You are the assistant of a bakery. ".repeat(40);
    let ask_with = |question: &str, seed: Option<u64>| {
        json!({"model": MODEL, "temperature": 0, "max_tokens": 1, "seed": seed, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}]})
    };
    let reused = |logs: &[u8]| logged(logs, "prefix", "Reusing a cached prompt prefix.", "reused");
    let cached =
        |answer: &Value| answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let first = chat_ok(&server, &ask_with("Are you open today?", None)).await;
    let prompt = first["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(prompt > 300, "{prompt}");
    assert!(
        reused(&logs.lock().unwrap()).is_empty(),
        "nothing cached yet"
    );
    assert_eq!(cached(&first), Some(0), "OpenAI's usage says so too");
    let second = chat_ok(&server, &ask_with("Do you sell bread?", None)).await;
    let hits = reused(&logs.lock().unwrap());
    assert_eq!(hits.len(), 1, "the second request reused the first's cache");
    assert!(
        hits[0] > 300 && hits[0] < prompt,
        "the system prompt, not the question: {hits:?}"
    );
    assert_eq!(cached(&second), Some(hits[0]), "{second}");
    // A seeded request reads its whole prompt: a prefix from another batch could change
    // its answer.
    chat_ok(&server, &ask_with("Do you sell cakes?", Some(7))).await;
    assert_eq!(reused(&logs.lock().unwrap()).len(), 1);
    // Another app's system prompt takes another sequence rather than overwrite the
    // bakery's, so both stay: interleaved, each is read once.
    let other = "You are the assistant of a hiking club. ".repeat(40);
    let hiking = json!({"model": MODEL, "temperature": 0, "max_tokens": 1, "messages": [
        {"role": "system", "content": other}, {"role": "user", "content": "Where do we meet?"}]});
    chat_ok(&server, &hiking).await;
    chat_ok(&server, &ask_with("Do you bake on Sundays?", None)).await;
    let mut again = hiking.clone();
    again["messages"][1]["content"] = json!("When do we leave?");
    chat_ok(&server, &again).await;
    let hits = reused(&logs.lock().unwrap());
    assert_eq!(hits.len(), 3, "{hits:?}");
    assert!(
        hits[1..].iter().all(|&n| n > 300),
        "each app's prefix kept: {hits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_whose_sequence_was_given_away_comes_back_from_the_stash() {
    let logs = common::logs::captured_logs();
    // One sequence: each new app's prompt takes it from the previous one.
    let engine: Front = tracing::info_span!(target: "llmgate::tests", "case", case = "stash")
        .in_scope(|| {
            LlamaCppEngine::load_now(LlamaCppSettings {
                sequences: 1,
                context_length: Some(2048),
                ..LlamaCppSettings::new(model_path(), MODEL)
            })
            .expect("llama.cpp loads the default model")
            .into()
        });
    let server = TestServer::builder(engine).start().await;
    let app = |role: &str, question: &str| {
        json!({"model": MODEL, "temperature": 0, "max_tokens": 8, "messages": [
            {"role": "system", "content": format!("You are the assistant of {role}. ").repeat(40)},
            {"role": "user", "content": question}]})
    };
    let restored = |logs: &[u8]| {
        logged(
            logs,
            "stash",
            "Restored a stashed prompt prefix.",
            "restored",
        )
    };
    let bakery = app("a bakery", "Are you open today?");
    let first = chat_ok(&server, &bakery).await;
    chat_ok(&server, &app("a hiking club", "Where do we meet?")).await;
    assert!(
        restored(&logs.lock().unwrap()).iter().all(|&n| n < 20),
        "at most the template's opening"
    );
    // The bakery's keys and values went to the stash when the hiking club took the
    // sequence; they come back, and the answer is the one read from scratch.
    let again = chat_ok(&server, &bakery).await;
    let hits = restored(&logs.lock().unwrap());
    let prompt = first["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert_eq!(
        hits.iter().filter(|&&n| n > 300).count(),
        1,
        "one long restore: {hits:?}"
    );
    assert!(
        hits.contains(&(prompt - 1)),
        "all but the last token, read again for its logits: {hits:?}"
    );
    assert_eq!(
        again["choices"][0]["message"]["content"],
        first["choices"][0]["message"]["content"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_steers_the_real_models_picks() {
    let server = TestServer::builder(engine(false)).start().await;
    let tokens: Value = reqwest::Client::new()
        .post(server.url("/tokenize"))
        .json(&json!({"model": MODEL, "prompt": " banana", "add_special_tokens": false}))
        .send()
        .await
        .expect("tokenize")
        .json()
        .await
        .expect("json");
    let id = tokens["tokens"][0].as_u64().expect("a token");
    let body = |bias: Value| {
        json!({"model": MODEL, "temperature": 0, "max_tokens": 3, "logit_bias": bias,
               "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    };
    let plain = chat_ok(&server, &body(json!({}))).await;
    let steered = chat_ok(&server, &body(json!({ id.to_string(): 100 }))).await;
    let text = |answer: &Value| {
        answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    assert!(!text(&plain).contains("banana"), "{plain}");
    assert!(
        text(&steered).starts_with("banana") || text(&steered).starts_with(" banana"),
        "{steered}"
    );
    assert_eq!(steered["usage"]["completion_tokens"], 3);
}

/// llama.cpp's `post_sampling_probs`, on the real model: `/completion` answers with
/// `prob` and `top_probs` in the distribution each token was drawn from (top_k 3: at most
/// three alternatives, their probabilities summing to 1); the same seeded answer as
/// without it; on the OpenAI routes the log-probabilities are the drawn distribution's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_sampling_probabilities_are_those_of_the_draw() {
    let server = TestServer::builder(engine(false)).start().await;
    let body = |post: bool| {
        json!({"prompt": "Today was the day. Today I would finally become a", "n_probs": 10,
               "temperature": 1.0, "top_k": 3, "n_predict": 5, "seed": 4,
               "post_sampling_probs": post})
    };
    let drawn = post_json(&server, "/completion", &body(true)).await;
    let plain = post_json(&server, "/completion", &body(false)).await;
    assert_eq!(drawn["content"], plain["content"], "the same answer");
    let probabilities = drawn["completion_probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("{drawn}"));
    assert_eq!(probabilities.len(), 5, "{drawn}");
    for token in probabilities {
        let prob = token["prob"].as_f64().unwrap_or_else(|| panic!("{token}"));
        assert!(prob > 0.0 && prob <= 1.0, "{token}");
        assert!(
            token.get("logprob").is_none() && token["bytes"].is_array(),
            "{token}"
        );
        let top = token["top_probs"].as_array().expect("top_probs");
        assert!((1..=3).contains(&top.len()), "top_k 3: {token}");
        let sum: f64 = top.iter().map(|t| t["prob"].as_f64().expect("prob")).sum();
        assert!((sum - 1.0).abs() < 1e-4, "{token}");
        assert!(top.iter().any(|t| t["id"] == token["id"]), "{token}");
    }
    let model = plain["completion_probabilities"][0]["logprob"]
        .as_f64()
        .expect("logprob");
    assert!(model < probabilities[0]["prob"].as_f64().expect("prob").ln());

    let chat = post_json(
        &server,
        CHAT,
        &chat_body(
            "Name a fruit.",
            json!({"temperature": 1.0, "top_k": 2, "max_tokens": 4, "logprobs": true,
                   "top_logprobs": 5, "post_sampling_probs": true}),
        ),
    )
    .await;
    for token in chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("{chat}"))
    {
        let top = token["top_logprobs"].as_array().expect("top");
        assert!((1..=2).contains(&top.len()), "top_k 2: {token}");
        let sum: f64 = top
            .iter()
            .map(|t| t["logprob"].as_f64().expect("lp").exp())
            .sum();
        assert!((sum - 1.0).abs() < 1e-4, "{token}");
    }
}

/// llama.cpp's `return_progress`, on the real model: before any text, a stream carries
/// `prompt_progress` chunks, the first as reading begins (`processed` = `cache`), then
/// one per chunk read, `processed` counting up to `total` (the prompt's tokens); a prompt
/// the prefix cache holds starts from its cached part. `/completion`'s frames carry it
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_progress_reports_the_prompt_as_it_is_read() {
    let server = TestServer::builder(engine(true)).start().await;
    let body = chat_body(
        &"This is a test. ".repeat(20),
        json!({"max_tokens": 2, "stream": true, "return_progress": true,
               "stream_options": {"include_usage": true}}),
    );
    let progress_of = |chunks: &[Value]| -> Vec<(u64, u64, u64)> {
        let first_text = chunks
            .iter()
            .position(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            })
            .unwrap_or(chunks.len());
        let reports: Vec<(usize, (u64, u64, u64))> = chunks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let p = c.get("prompt_progress")?;
                let n = |k: &str| p[k].as_u64().expect("a count");
                Some((i, (n("total"), n("cache"), n("processed"))))
            })
            .collect();
        assert!(
            reports.iter().all(|(i, _)| *i < first_text),
            "before any text"
        );
        reports.into_iter().map(|(_, p)| p).collect()
    };
    let chunks = chunks_of(&post_text(&server, CHAT, &body).await);
    let prompt = chunks.last().expect("usage")["usage"]["prompt_tokens"]
        .as_u64()
        .expect("usage");
    let first = progress_of(&chunks);
    assert_eq!(first.first(), Some(&(prompt, 0, 0)), "{first:?}");
    assert_eq!(first.last(), Some(&(prompt, 0, prompt)), "{first:?}");
    assert!(first.windows(2).all(|w| w[0].2 < w[1].2), "{first:?}");
    // Again: the prefix cache holds the prompt, all but what gives the first logits.
    let again = progress_of(&chunks_of(&post_text(&server, CHAT, &body).await));
    let (total, cache, processed) = again[0];
    assert!(
        cache > 0 && cache == processed && total == prompt,
        "{again:?}"
    );
    assert_eq!(again.last().map(|p| p.2), Some(prompt), "{again:?}");

    let native = post_text(
        &server,
        "/completion",
        &json!({"prompt": "Once upon a time", "n_predict": 2, "stream": true,
                "return_progress": true}),
    )
    .await;
    let frames = chunks_of(&native);
    assert!(
        frames[0]["prompt_progress"]["total"].as_u64() > Some(0),
        "{native}"
    );
    assert_eq!(frames[0]["content"], "", "{native}");
}

/// `engine.chat_template`, as llama-server's `--chat-template`: a template llama.cpp
/// knows by name renders conversations in place of the file's; a name it does not know
/// stops the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_template_named_renders_in_place_of_the_files() {
    let settings = |name: &str| LlamaCppSettings {
        sequences: 1,
        context_length: Some(512),
        chat_template: Some(name.into()),
        ..LlamaCppSettings::new(model_path(), MODEL)
    };
    let engine: Front = LlamaCppEngine::load_now(settings("command-r"))
        .expect("a template llama.cpp knows")
        .into();
    let server = TestServer::builder(engine).start().await;
    let rendered = post_json(
        &server,
        "/apply-template",
        &json!({"messages": [{"role": "system", "content": "You are a test."},
                             {"role": "user", "content": "Hi there"}]}),
    )
    .await;
    assert_eq!(
        rendered["prompt"],
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        "{rendered}"
    );
    let error =
        LlamaCppEngine::load_now(settings("no-such-template")).expect_err("an unknown name");
    assert!(
        error.to_string().contains("engine.chat_template"),
        "{error}"
    );
}

/// `n` choices read their prompt once: one reads it, the others wait and take its cache
/// (each choice's record counts those tokens as cached), and at temperature 0 every
/// choice is the answer the prompt alone gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_read_their_shared_prompt_once() {
    let server = TestServer::builder(engine(true)).start().await;
    let body = |n: u32| {
        chat_body(
            &"Tell me about the sea. ".repeat(12),
            json!({"temperature": 0, "max_tokens": 6, "n": n}),
        )
    };
    let three = chat_ok(&server, &body(3)).await;
    let mut cached: Vec<(u32, u32)> = server
        .observer
        .records()
        .iter()
        .map(|r| (r.usage.cached_tokens.unwrap_or(0), r.usage.prompt_tokens))
        .collect();
    cached.sort_unstable();
    let prompt = cached[0].1;
    assert!(prompt > 60, "{cached:?}");
    assert_eq!(
        cached,
        [(0, prompt), (prompt - 1, prompt), (prompt - 1, prompt)],
        "one reads the prompt, two take it (all but its last token)"
    );
    let alone = chat_ok(&server, &body(1)).await;
    let text = content(&alone);
    for choice in three["choices"].as_array().expect("choices") {
        assert_eq!(choice["message"]["content"], text, "{three}");
    }
}

/// llama.cpp's spellings of structured output, on the real model: a GBNF `grammar` (chat,
/// legacy completions and `/completion`) and a top-level `json_schema`, each holding the
/// answer; a grammar that is not GBNF, or a schema the compiler cannot use, is a 400
/// naming what the client sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gbnf_grammar_and_a_bare_json_schema_hold_the_real_models_answer() {
    let server = TestServer::builder(engine(false)).start().await;
    let chat = |extra: Value| {
        let mut body = chat_body(
            "Does not matter what I say, does it?",
            json!({"temperature": 0.8, "seed": 3, "max_tokens": 6}),
        );
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        body
    };
    // llama.cpp's own test: exactly five a's, then only the end.
    let five = chat_ok(&server, &chat(json!({"grammar": "root ::= \"a\"{5,5}"}))).await;
    assert_eq!(content(&five), "aaaaa", "{five}");
    assert_eq!(five["choices"][0]["finish_reason"], "stop", "{five}");
    // Rules, alternatives, a class and a comment, streamed.
    let gbnf = "root ::= answer \".\" # one word\nanswer ::= (\"yes\" | \"no\") [!]?";
    let (streamed, _) = stream(&server, chat(json!({"grammar": gbnf, "max_tokens": 8}))).await;
    assert!(
        ["yes.", "no.", "yes!.", "no!."].contains(&streamed.as_str()),
        "{streamed:?}"
    );
    let legacy = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": "Count: ", "max_tokens": 8, "temperature": 0,
                "grammar": "root ::= [1-3]{3} \"!\""}),
    )
    .await;
    let text = legacy["choices"][0]["text"].as_str().expect("text");
    assert!(
        text.len() == 4
            && text.ends_with('!')
            && text[..3].chars().all(|c| ('1'..='3').contains(&c)),
        "{legacy}"
    );
    let native = post_json(
        &server,
        "/completion",
        &json!({"prompt": "Say something:", "n_predict": 6, "grammar": "root ::= \"ok\" \" ok\"?"}),
    )
    .await;
    assert!(
        ["ok", "ok ok"].contains(&native["content"].as_str().unwrap_or_default()),
        "{native}"
    );
    // llama.cpp's top-level json_schema.
    let schema = chat_ok(&server, &chat(json!({"json_schema": {"const": "42"}}))).await;
    assert_eq!(content(&schema), "\"42\"", "{schema}");

    for (extra, param) in [
        (
            json!({"grammar": "root ::= this is (not valid GBNF"}),
            "grammar",
        ),
        (
            json!({"json_schema": {"type": "no-such-type"}}),
            "json_schema",
        ),
        (
            json!({"json_schema": {"const": 1}, "grammar": "root ::= \"a\""}),
            "grammar",
        ),
    ] {
        let response = post(&server, CHAT, &chat(extra.clone())).await;
        assert_eq!(response.status(), 400, "{extra}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["param"], param, "{extra}: {error}");
    }
    // On /completion, the schema's error names llama.cpp's json_schema too.
    let response = post(
        &server,
        "/completion",
        &json!({"prompt": "x", "json_schema": {"type": "no-such-type"}}),
    )
    .await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["param"], "json_schema", "{error}");
}

/// llama.cpp's `timings_per_token`, on the real model: every content chunk carries
/// llama.cpp's timings so far, counting up, and the last chunk llama.cpp's figures beside
/// the gateway's; `/completion`'s frames carry them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_per_token_count_up_in_every_chunk() {
    let server = TestServer::builder(engine(false)).start().await;
    let body = chat_body(
        FRANCE,
        // ignore_eos: eight tokens on any CPU, wherever the greedy answer would end.
        json!({"temperature": 0, "max_tokens": 8, "ignore_eos": true, "timings_per_token": true,
               "stream": true, "stream_options": {"include_usage": true}}),
    );
    let chunks = chunks_of(&post_text(&server, CHAT, &body).await);
    let counted: Vec<u64> = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .map(|c| {
            c["timings"]["predicted_n"]
                .as_u64()
                .expect("timings in a content chunk")
        })
        .collect();
    assert!(counted.len() >= 2, "{chunks:?}");
    assert!(counted.windows(2).all(|w| w[0] < w[1]), "{counted:?}");
    let last = &chunks.last().expect("a last chunk")["timings"];
    assert_eq!(last["predicted_n"], 8, "{last}");
    assert!(
        last["predicted_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{last}"
    );
    assert!(
        last["ttft_ms"].as_f64().is_some(),
        "the gateway's own stay: {last}"
    );
    assert!(
        chunks[0].get("timings").is_none(),
        "the role chunk has none: {}",
        chunks[0]
    );

    let native = post_text(
        &server,
        "/completion",
        &json!({"prompt": "The sky is", "n_predict": 4, "stream": true, "timings_per_token": true}),
    )
    .await;
    let frames = chunks_of(&native);
    assert!(!frames.is_empty(), "{native}");
    assert!(
        frames
            .iter()
            .all(|f| f["timings"]["predicted_n"].as_u64().is_some()),
        "{native}"
    );
}

/// Token-id prompts, on the real model: ids from `/tokenize` give the greedy answer the
/// text gives, on `/v1/completions` and llama.cpp's `/completion` (whose answer repeats
/// the prompt as text); an id past the vocabulary is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_of_token_ids_reads_as_its_text() {
    let server = TestServer::builder(engine(false)).start().await;
    let text = "I believe the meaning of life is";
    let tokens: Value = post_json(
        &server,
        "/tokenize",
        &json!({"model": MODEL, "prompt": text, "add_special_tokens": true}),
    )
    .await;
    let ids = tokens["tokens"].clone();
    let answer = |prompt: Value| {
        let server = &server;
        async move {
            let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0});
            let answer = post_json(server, COMPLETIONS, &body).await;
            answer["choices"][0]["text"]
                .as_str()
                .unwrap_or_else(|| panic!("{answer}"))
                .to_owned()
        }
    };
    let by_text = answer(json!(text)).await;
    assert!(!by_text.is_empty());
    assert_eq!(answer(ids.clone()).await, by_text);
    assert_eq!(answer(json!([ids.clone()])).await, by_text);

    let native = post_json(
        &server,
        "/completion",
        &json!({"prompt": ids, "n_predict": 8, "temperature": 0}),
    )
    .await;
    assert_eq!(native["content"], by_text.as_str(), "{native}");
    assert_eq!(native["prompt"], text, "{native}");

    // A batch: on /v1/completions one choice per prompt, the prompts counted each once;
    // on /completion a list of answers, as llama-server's.
    let single = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": text, "max_tokens": 8, "temperature": 0}),
    )
    .await;
    let batch = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": [text, ids.clone()], "max_tokens": 8, "temperature": 0}),
    )
    .await;
    let texts = indexed_texts(&batch);
    assert_eq!(
        texts,
        [(0, by_text.as_str()), (1, by_text.as_str())],
        "{batch}"
    );
    let prompt_tokens = single["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert_eq!(
        batch["usage"]["prompt_tokens"],
        2 * prompt_tokens,
        "{batch}"
    );
    let listed = post_json(
        &server,
        "/completion",
        &json!({"prompt": [ids.clone(), text, {"prompt_string": text}], "n_predict": 8,
                "temperature": 0}),
    )
    .await;
    let answers = listed.as_array().unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(answers.len(), 3, "{listed}");
    for (index, answer) in answers.iter().enumerate() {
        assert_eq!(answer["index"], index, "{listed}");
        assert_eq!(answer["content"], by_text.as_str(), "{listed}");
        assert_eq!(answer["prompt"], text, "{listed}");
    }
    // Ids and text mixed in one list are one prompt, read in order.
    let mut mixed = ids.as_array().expect("ids").clone();
    mixed.push(json!(" and"));
    let mixed = post_json(
        &server,
        "/completion",
        &json!({"prompt": mixed, "n_predict": 4, "temperature": 0}),
    )
    .await;
    assert_eq!(mixed["prompt"], format!("{text} and"), "{mixed}");
    assert!(mixed["content"].is_string(), "{mixed}");

    let response = post(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": [1, 2, 999_999], "max_tokens": 2}),
    )
    .await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["param"], "prompt[2]", "{error}");
}

/// The end token is counted once and is no part of the content (docs/api.md, "The end
/// token"): not in the text, the log-probabilities or llama.cpp's `tokens`. Where the
/// answer ends is set by the request, not left to the model (a greedy answer's length
/// moves with the CPU's floating point): a `stop_token_ids` entry taken from the
/// answer's own tokens, and a bias that makes the end token the first pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_token_is_counted_and_not_listed() {
    let server = TestServer::builder(engine(false)).start().await;
    let with = |mut body: Value, extra: Value| {
        body.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        body
    };
    let legacy = |extra: Value| {
        let body = with(
            json!({"model": MODEL, "prompt": "The sea is", "max_tokens": 8, "temperature": 0,
                   "logprobs": 0}),
            extra,
        );
        let server = &server;
        async move { post_json(server, COMPLETIONS, &body).await }
    };
    let tokens = |answer: &Value| -> Vec<Value> {
        answer["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .clone()
    };
    let whole = legacy(json!({"ignore_eos": true})).await;
    let spelled = tokens(&whole);
    assert_eq!(spelled.len(), 8, "{whole}");
    let ids: Value = post_json(
        &server,
        "/tokenize",
        &json!({"model": MODEL, "prompt": "The sea is", "add_special_tokens": true}),
    )
    .await;
    let prompt = ids["tokens"].as_array().expect("ids").len();
    let native = |extra: Value| {
        let body = with(
            json!({"model": MODEL, "prompt": "The sea is", "n_predict": 8, "temperature": 0,
                   "return_tokens": true, "n_probs": 1}),
            extra,
        );
        let server = &server;
        async move { post_json(server, "/completion", &body).await }
    };
    let answer_ids = native(json!({"ignore_eos": true})).await["tokens"]
        .as_array()
        .expect("tokens")
        .clone();
    assert_eq!(
        answer_ids.len(),
        8,
        "the same 8 tokens, by id ({prompt} in the prompt)"
    );

    // Ended on a token of its own (the first one past the start not seen before it),
    // as a stop token: the tokens before it listed, one more counted.
    let at = (1..answer_ids.len())
        .find(|&i| !answer_ids[..i].contains(&answer_ids[i]))
        .expect("a token not seen before it");
    let stopped = legacy(json!({"stop_token_ids": [answer_ids[at]]})).await;
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop", "{stopped}");
    assert_eq!(tokens(&stopped), spelled[..at], "{stopped}");
    assert_eq!(stopped["usage"]["completion_tokens"], at + 1, "{stopped}");

    // The end token (SmolLM2's <|im_end|>, id 2) made the first pick: nothing to list,
    // one token counted, in llama.cpp's shape and OpenAI's, streamed and not.
    let forced = native(json!({"logit_bias": [[2, 100]]})).await;
    assert_eq!(
        (
            &forced["stop_type"],
            &forced["tokens"],
            &forced["tokens_predicted"]
        ),
        (&json!("eos"), &json!([]), &json!(1)),
        "{forced}"
    );
    assert_eq!(forced["content"], "", "{forced}");
    let ended = |stream: bool| {
        chat_body(
            "The sea is",
            json!({"temperature": 0, "max_tokens": 8, "logprobs": true,
                   "logit_bias": {"2": 100}, "stream": stream}),
        )
    };
    let whole = chat_ok(&server, &ended(false)).await;
    assert_eq!(whole["choices"][0]["finish_reason"], "stop", "{whole}");
    assert_eq!(content(&whole), "");
    assert_eq!(whole["usage"]["completion_tokens"], 1, "{whole}");
    assert_eq!(
        whole["choices"][0]["logprobs"]["content"],
        json!([]),
        "{whole}"
    );
    let (text, last) = stream(&server, ended(true)).await;
    assert_eq!(
        (text.as_str(), &last["usage"]["completion_tokens"]),
        ("", &json!(1))
    );
}

//! What clients of llama.cpp's server send, through the upstream engine to a scripted
//! OpenAI-compatible server: a token-id prompt goes as the ids (with no context length
//! configured, as by default), a GBNF `grammar` as it came, `n` > 1 as one request per
//! choice, each seeded `seed + i`, and a batch as one request per prompt;
//! `post_sampling_probs` is refused.

mod common;

use common::upstream::*;
use common::*;
use llmgate::bench::upstream::UpstreamScript;
use serde_json::{json, Value};

fn script(tokens: u32) -> UpstreamScript {
    UpstreamScript {
        tokens,
        ..UpstreamScript::default()
    }
}

#[tokio::test]
async fn token_prompts_grammars_and_choices_reach_the_upstream() {
    let upstream = start_upstream(script(2)).await;
    let server = gateway(upstream_config(&upstream.url)).await;

    let ids: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": [791, 6085, 315], "max_tokens": 2}),
    )
    .await;
    assert_eq!(ids["choices"][0]["text"], "tok0 tok1", "{ids}");
    let sent = upstream.received();
    assert_eq!(sent[0].body["prompt"], json!([791, 6085, 315]));

    let gbnf = "root ::= \"tok\" [0-9] (\" tok\" [0-9])*";
    let held: Value = post_json(&server, CHAT, &chat_body("hi", json!({"grammar": gbnf}))).await;
    assert_eq!(held["choices"][0]["finish_reason"], "stop", "{held}");
    let sent = upstream.received();
    assert_eq!(sent[1].body["grammar"], gbnf, "as it came");
    assert!(sent[1].body.get("response_format").is_none());

    let two: Value = post_json(&server, CHAT, &chat_body("hi", json!({"n": 2, "seed": 7}))).await;
    assert_eq!(two["choices"].as_array().map(Vec::len), Some(2), "{two}");
    let sent = upstream.received();
    let mut seeds: Vec<&Value> = sent[2..].iter().map(|s| &s.body["seed"]).collect();
    seeds.sort_by_key(|s| s.as_u64());
    assert_eq!(seeds, [&json!(7), &json!(8)], "one request per choice");
    assert!(sent[2..].iter().all(|s| s.body.get("n").is_none()));

    // A batch of prompts: one request per prompt.
    let batch: Value = post_json(
        &server,
        COMPLETIONS,
        &json!({"model": MODEL, "prompt": ["a", [791]], "max_tokens": 2}),
    )
    .await;
    assert_eq!(
        batch["choices"].as_array().map(Vec::len),
        Some(2),
        "{batch}"
    );
    let sent = upstream.received();
    let mut prompts: Vec<String> = sent[4..]
        .iter()
        .map(|s| s.body["prompt"].to_string())
        .collect();
    prompts.sort();
    assert_eq!(prompts, ["\"a\"", "[791]"]);

    // The upstream's log-probabilities are its model's: post-sampling ones are refused.
    let response = post(
        &server,
        CHAT,
        &chat_body("hi", json!({"logprobs": true, "post_sampling_probs": true})),
    )
    .await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["param"], "post_sampling_probs", "{error}");
}

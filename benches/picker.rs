//! What the gateway's seeded token picker costs per generated token, on the host.
//!
//! mistral.rs 0.8.1 copies each sequence's logits to host memory before any logits
//! processor runs (`Sampler::sample`, mistralrs-core sampler.rs line 1033), so on CPU and on
//! CUDA alike the picker works on a host tensor of the vocabulary's size; this is the
//! time it adds to every token, greedy and sampled, on SmolLM2's vocabulary (49,152).
//!
//! `cargo bench --bench picker` prints microseconds per token (p50, p95); `cargo test`
//! runs a few calls of each as a smoke test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llmgate::engine::grammar::{Grammar, Vocabulary};
use llmgate::engine::mistral::picker::{EndRules, PickedIds, Picker};
use llmgate::engine::{ResponseFormat, Sampling};
use mistralrs::{CustomLogitsProcessor, Device, Tensor};

const VOCAB: usize = 49_152;

/// Logits shaped like a language model's: most tokens far below a handful of likely ones.
fn model_like_logits() -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..VOCAB)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let noise = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let peak = if i % 4099 == 7 { 12.0 } else { 0.0 };
            noise * 8.0 - 4.0 + peak
        })
        .collect()
}

/// The default model's vocabulary and a grammar for any JSON object on it, when the
/// model file is there (`scripts/fetch-model`).
fn json_grammar(vocabulary: Option<&Vocabulary>) -> Option<Grammar> {
    vocabulary?
        .compile(&ResponseFormat::JsonObject)
        .expect("compiles")
}

fn per_token(name: &str, sampling: Sampling, vocabulary: Option<&Vocabulary>, calls: usize) {
    let logits = Tensor::from_vec(model_like_logits(), VOCAB, &Device::Cpu).expect("tensor");
    let picked = PickedIds::default();
    let constrained = vocabulary.is_some();
    let mut picker = Picker::new(
        &sampling,
        json_grammar(vocabulary),
        None,
        EndRules::default(),
        Arc::clone(&picked),
    );
    let mut context: Vec<u32> = (0..64).collect();
    let mut times: Vec<Duration> = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let out = picker.apply(&logits, &context);
        times.push(start.elapsed());
        match out {
            Ok(out) => assert_eq!(out.dims1().expect("1-d"), VOCAB),
            // A complete object allows only the end: start a new one, like a new request.
            Err(_) if constrained => {
                picker = Picker::new(
                    &sampling,
                    json_grammar(vocabulary),
                    None,
                    EndRules::default(),
                    Arc::clone(&picked),
                );
            }
            Err(error) => panic!("{error}"),
        }
        context.push(0);
    }
    if !constrained {
        assert_eq!(picked.lock().expect("ids").len(), calls);
    }
    times.sort_unstable();
    let us = |q: f64| times[((q * calls as f64) as usize).min(calls - 1)].as_secs_f64() * 1e6;
    println!(
        "{name:<34} p50 {:>7.1} us   p95 {:>7.1} us",
        us(0.5),
        us(0.95)
    );
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let calls = if benchmarking { 3000 } else { 3 };
    let sampled = |temperature: f64, top_p: f64| Sampling {
        temperature: Some(temperature),
        top_p: Some(top_p),
        seed: Some(7),
        ..Sampling::default()
    };
    per_token("greedy (temperature 0)", sampled(0.0, 1.0), None, calls);
    per_token("seeded, temperature 0.8", sampled(0.8, 1.0), None, calls);
    per_token(
        "seeded, temperature 0.8, top_p 0.9",
        sampled(0.8, 0.9),
        None,
        calls,
    );
    let top_k = Sampling {
        top_k: Some(40),
        min_p: Some(0.05),
        ..sampled(0.8, 1.0)
    };
    per_token("seeded, 0.8, top_k 40, min_p 0.05", top_k, None, calls);
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(llmgate::config::DEFAULT_MODEL_PATH);
    let facts = llmgate::engine::gguf::GgufFacts::read(&model).map_err(anyhow::Error::from);
    let Ok(vocabulary) = facts.and_then(|f| f.vocabulary()) else {
        println!("(no model file: the grammar cases need scripts/fetch-model)");
        return;
    };
    let started = Instant::now();
    let rounds = if benchmarking { 200 } else { 2 };
    for _ in 0..rounds {
        json_grammar(Some(&vocabulary));
    }
    println!(
        "{:<34} {:>7.1} us per request",
        "compile a json_object grammar",
        started.elapsed().as_secs_f64() * 1e6 / rounds as f64
    );
    per_token(
        "json_object grammar, greedy",
        sampled(0.0, 1.0),
        Some(&vocabulary),
        calls,
    );
    per_token(
        "json_object grammar, 0.8",
        sampled(0.8, 1.0),
        Some(&vocabulary),
        calls,
    );
}

//! Minimal reproduction of mistral.rs 0.8.1's batched-decode defect on CPU.
//!
//! Two greedy requests whose prompts have the same number of tokens are answered once
//! each on their own, then both at once with `max_batch_size = 2`. mistral.rs's scheduler
//! batches sequences of equal length, so the pair is prefilled together (correct) and
//! decoded together, where every row of the step gets the attention output of the last
//! row: `flash_attn_cpu_single_q` in `mistralrs-core/src/attention/backends/cpu.rs`
//! keeps one scratch slot per (tile, head) and none per batch row. The first token is
//! right, then the answers drift into each other.
//!
//! ```sh
//! cargo run --release --example batching_defect [-- MODEL.gguf]
//! ```
//! Exit status 0: batched answers equal the single ones; 1: they differ (the defect).

use std::path::PathBuf;
use std::process::ExitCode;

use llmgate::config::{DEFAULT_MODEL_ID, DEFAULT_MODEL_PATH};
use llmgate::engine::mistral::{MistralEngine, MistralSettings};
use llmgate::engine::{ChatMessage, Engine, EngineEvent, GenerationRequest, Role, Sampling};

const PROMPTS: [&str; 2] = [
    "What is the capital of France?",
    "What is the capital of Spain?",
];

fn request(prompt: &str) -> GenerationRequest {
    GenerationRequest {
        request_id: prompt.to_owned(),
        messages: vec![ChatMessage {
            role: Role::User,
            content: prompt.to_owned(),
        }],
        max_tokens: 24,
        sampling: Sampling {
            temperature: Some(0.0),
            ..Sampling::default()
        },
    }
}

/// The whole answer and the prompt's token count.
async fn answer(engine: &MistralEngine, prompt: &str) -> anyhow::Result<(String, u32)> {
    let mut generation = engine.generate(request(prompt)).await?;
    let mut text = String::new();
    while let Some(event) = generation.events.recv().await {
        match event {
            EngineEvent::Token { text: piece, .. } => text.push_str(&piece),
            EngineEvent::Finished { .. } => break,
            EngineEvent::Failed(error) => anyhow::bail!(error),
        }
    }
    Ok((text, generation.prompt_tokens))
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let model_path = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from(DEFAULT_MODEL_PATH), PathBuf::from);
    let engine = MistralEngine::load_now(MistralSettings {
        max_batch_size: 2,
        ..MistralSettings::new(model_path, DEFAULT_MODEL_ID)
    })
    .await?;
    let (alone_a, tokens_a) = answer(&engine, PROMPTS[0]).await?;
    let (alone_b, tokens_b) = answer(&engine, PROMPTS[1]).await?;
    anyhow::ensure!(
        tokens_a == tokens_b,
        "the prompts must have the same token count to share a batch ({tokens_a} vs {tokens_b})"
    );
    let (together_a, together_b) =
        tokio::join!(answer(&engine, PROMPTS[0]), answer(&engine, PROMPTS[1]));
    let (together_a, together_b) = (together_a?.0, together_b?.0);
    let mut same = true;
    for (prompt, alone, together) in [
        (PROMPTS[0], &alone_a, &together_a),
        (PROMPTS[1], &alone_b, &together_b),
    ] {
        println!("{prompt}\n  alone:    {alone:?}\n  together: {together:?}");
        same &= alone == together;
    }
    if same {
        println!("Batched answers equal the single ones: no defect.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("Batched answers differ from the single ones: the batched-decode defect.");
        Ok(ExitCode::from(1))
    }
}

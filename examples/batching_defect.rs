//! Minimal reproduction of mistral.rs 0.8.1's batched-decode defect on CPU.
//!
//! Two greedy requests whose prompts have the same number of tokens are answered once
//! each on their own, then both at once with `max_batch_size = 2` (the gateway's
//! [`canary`](llmgate::engine::mistral::canary)). mistral.rs's scheduler batches
//! sequences of equal length, so the pair is prefilled together (correct) and decoded
//! together, where every row of the step gets the attention output of the last row:
//! `flash_attn_cpu_single_q` in `mistralrs-core/src/attention/backends/cpu.rs` keeps one
//! scratch slot per (tile, head) and none per batch row. The first token is right, then
//! the answers drift into each other.
//!
//! ```sh
//! cargo run --release --example batching_defect [-- MODEL.gguf]
//! ```
//! Exit status 0: batched answers equal the single ones; 1: they differ (the defect).

use std::path::PathBuf;
use std::process::ExitCode;

use llmgate::config::{DEFAULT_MODEL_ID, DEFAULT_MODEL_PATH};
use llmgate::engine::mistral::{MistralEngine, MistralSettings};

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
    let outcome = engine.batching_check().await?;
    println!("{}", outcome.describe());
    if outcome.batched_equals_single() {
        println!("Batched answers equal the single ones: no defect.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("Batched answers differ from the single ones: the batched-decode defect.");
        Ok(ExitCode::from(1))
    }
}

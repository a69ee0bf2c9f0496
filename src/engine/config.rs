//! Settings of the in-process engines (mistral.rs, llama.cpp), shared by their models: the `[engine]`
//! table as `config` resolves it. Here, beside the engine that reads them, so the engine
//! needs nothing of `config`; `config` assembles them from flags, variables and the file.

use std::path::PathBuf;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Batch size on CPU: one sequence at a time, because mistral.rs 0.8.1 gives every row of a
/// batched CPU decode step the last row's attention (docs/engine.md, "Known engine defect: batching on CPU").
pub const DEFAULT_BATCH_CPU: usize = 1;
/// Batch size on CUDA, where the attention kernels are batched matmuls; the gateway checks
/// at start-up that batched answers equal single ones before it uses it (docs/gpu.md,
/// "Build for NVIDIA GPUs").
pub const DEFAULT_BATCH_CUDA: usize = 32;

#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    /// The id clients send in `model`; any other id is a 404.
    pub model_id: String,
    /// Sequences one model instance decodes together at most. `None` follows the device:
    /// [`DEFAULT_BATCH_CPU`] on CPU; on CUDA [`DEFAULT_BATCH_CUDA`] once a start-up check
    /// shows batched answers equal single ones, else 1.
    pub max_batch_size: Option<usize>,
    /// Largest `max_tokens` a request may ask for; more is a 400.
    pub max_tokens_cap: u32,
    /// Completion budget of a request that sets no `max_tokens`; `None`: what the
    /// context leaves after the prompt, at most `max_tokens_cap` (as vLLM does).
    pub default_max_tokens: Option<u32>,
    pub force_cpu: bool,
    /// Reuse KV caches of shared prompt prefixes (off: seeded answers stay reproducible).
    pub prefix_cache: bool,
    /// How quantized weights are held on CPU (see the engine settings table in docs/engine.md).
    pub weights: Weights,
    /// Compute threads; 0 means one per CPU core.
    pub threads: usize,
    /// Independent model instances that concurrent requests are spread over.
    pub replicas: usize,
    /// llama.cpp: tokens of context each sequence has; `None`: the model's trained
    /// context, at most 4096.
    pub context_length: Option<u32>,
}

/// How the model's quantized weights are held in memory on CPU; the engine passes it to
/// candle before the model loads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weights {
    /// As stored in the file: least memory; each matmul runs candle's block kernels.
    #[default]
    Quantized,
    /// Dequantized to f16 at load: dense matmuls, about 4x the memory of a 4-bit file.
    F16,
    /// Dequantized to f32 at load: the fastest prompt processing, the slowest decoding,
    /// about 8x the memory of a 4-bit file.
    F32,
}

impl Weights {
    pub fn as_str(self) -> &'static str {
        match self {
            Weights::Quantized => "quantized",
            Weights::F16 => "f16",
            Weights::F32 => "f32",
        }
    }
}

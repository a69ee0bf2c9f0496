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
    /// Reuse KV caches of shared prompt prefixes; unset: the engine's default (llama.cpp
    /// on, as its own server; mistral.rs off, where it would move seeded answers).
    pub prefix_cache: Option<bool>,
    /// How quantized weights are held on CPU (see the engine settings table in docs/engine.md).
    pub weights: Weights,
    /// Compute threads; 0 means one per CPU core.
    pub threads: usize,
    /// Independent model instances that concurrent requests are spread over.
    pub replicas: usize,
    /// llama.cpp: tokens of context each sequence has; `None`: the model's trained
    /// context, at most 4096.
    pub context_length: Option<u32>,
    /// llama.cpp: MiB of host memory for prompt caches cut from their sequence; `None`:
    /// 1024.
    pub prompt_stash_mb: Option<usize>,
    /// llamacpp: the chat template llama.cpp knows by this name, in place of the file's.
    pub chat_template: Option<String>,
    /// llamacpp: a Jinja chat template read from this file, in place of the file's.
    pub chat_template_file: Option<std::path::PathBuf>,
    /// llamacpp: whether the chat template is told to think where a request does not say.
    pub reasoning: ReasoningSwitch,
}

/// Whether a chat template with a thinking switch thinks where a request does not say
/// (llama-server's `--reasoning`): `off` gives it `enable_thinking: false`, as a request's
/// `chat_template_kwargs` or a `reasoning_effort` of `none` would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningSwitch {
    /// As the template says (llama.cpp's server gives it `enable_thinking: true`).
    #[default]
    Auto,
    On,
    Off,
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

/// What `engine = "auto"` (the default) chooses from: the in-process engines this binary
/// was built with, and whether it has CUDA and sees a GPU. Read once at start-up
/// ([`Host::detect`]); a value in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    /// Built with the mistral.rs engine (cargo feature `mistral`).
    pub mistral: bool,
    /// Built with the llama.cpp engine (cargo feature `llamacpp`).
    pub llamacpp: bool,
    /// Built with CUDA (`cuda`), a GPU is visible to NVML, and `engine.force_cpu` is off.
    pub cuda_gpu: bool,
}

/// The in-process engines `auto` picks between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InProcess {
    Mistral,
    Llamacpp,
}

impl Host {
    /// This binary on this machine.
    pub fn detect(force_cpu: bool) -> Self {
        Self {
            mistral: cfg!(feature = "mistral"),
            llamacpp: cfg!(feature = "llamacpp"),
            cuda_gpu: cfg!(feature = "cuda") && !force_cpu && crate::gpu::visible(),
        }
    }

    /// The engine `auto` stands for, and why, for the start-up log. On CPU llama.cpp:
    /// its server's kernels, several sequences per batch and chunked prefill make it
    /// 6 to 9 times faster than mistral.rs there (docs/engine.md, "Which engine").
    /// On a GPU in a CUDA build mistral.rs, whose CUDA path the gateway was designed
    /// around (paged attention, its batching checked by the canary). A build with only
    /// one of the two takes that one.
    pub fn auto_engine(&self) -> (InProcess, &'static str) {
        match (self.mistral, self.llamacpp) {
            (true, true) if self.cuda_gpu => (InProcess::Mistral, "a CUDA build on a GPU"),
            (true, true) => (InProcess::Llamacpp, "on CPU"),
            (true, false) => (InProcess::Mistral, "the only engine in this build"),
            (false, _) => (InProcess::Llamacpp, "the only engine in this build"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_llamacpp_on_cpu_and_mistral_on_a_cuda_gpu() {
        let host = |mistral, llamacpp, cuda_gpu| Host {
            mistral,
            llamacpp,
            cuda_gpu,
        };
        assert_eq!(host(true, true, false).auto_engine().0, InProcess::Llamacpp);
        assert_eq!(host(true, true, true).auto_engine().0, InProcess::Mistral);
        assert_eq!(host(true, false, false).auto_engine().0, InProcess::Mistral);
        assert_eq!(host(false, true, true).auto_engine().0, InProcess::Llamacpp);
    }
}

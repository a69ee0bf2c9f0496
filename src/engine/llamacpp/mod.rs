//! The llama.cpp engine: a GGUF model run in this process through llama.cpp (the
//! `llama-cpp-2` crate, which builds llama.cpp's C++ from its own sources). This module
//! and its children are the only ones that import `llama_cpp_2`.
//!
//! One thread per model owns the llama.cpp context and runs the decode loop ([`batch`]):
//! several sequences decoded together in one batch, each with its own KV cache; a new
//! request's prompt prefilled in chunks beside the others' decoding, so one long prompt
//! does not stall every other stream for its whole length; and, with
//! `engine.prefix_cache`, a finished sequence's KV cache kept for the next request that
//! shares its prefix (a system prompt). Each token is chosen by the gateway's own picker
//! ([`crate::engine::picking`]): seeds, structured output, log-probabilities and the end
//! rules behave as with mistral.rs, and a seeded request is decoded on its own, never in
//! a batch whose company could move its logits.
//!
//! - [`load`]: the file's facts and fingerprint, the model, the loop's thread;
//! - [`batch`]: the decode loop;
//! - [`stash`]: prompt caches kept in host memory after their slot is given up;
//! - [`text`]: a sequence's bytes to text, a character split across tokens held back.

mod batch;
mod load;
mod stash;
mod template;
mod text;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::gguf::InProcessModel;
use super::picking::{EndRules, TokenPicker};
use super::{
    reasoning, Backend, EngineError, Generation, GenerationRequest, Job, LoadedModel, Prompt,
    PromptTokens, Readiness, TokenizeRequest, Tokenized,
};
use crate::engine::config::{EngineConfig, ReasoningSwitch};
use crate::engine::known_token_ids;

/// Engine name and version, part of the system fingerprint: the bindings' version pins
/// the llama.cpp sources they build.
/// Both crates are pinned in `Cargo.toml`: llama.cpp's sources come with the second.
pub const ENGINE_NAME: &str = "llama.cpp (llama-cpp-2 0.1.160, llama-cpp-sys-2 0.1.161)";
/// Sequences decoded together when the config does not say [`LlamaCppSettings::sequences`].
pub const DEFAULT_SEQUENCES: usize = 4;
/// Each sequence's context when the config does not say: the model's trained context, at
/// most this (a 128k-token model's KV cache for four sequences would not fit most hosts).
pub const DEFAULT_CONTEXT_CAP: u32 = 4096;

/// Host memory for prompt caches cut from their sequence, by default: 1 GiB, some 45,000
/// tokens of SmolLM2-135M's keys and values (23 KiB a token), 2,000 of an 8B model's.
pub const DEFAULT_STASH_MB: usize = 1024;

/// Held, shared, by each decode loop whenever it is in llama.cpp (all but its wait for
/// work), and taken whole by [`stop_decoding`] as the process ends: the C++ destructors
/// that run at exit must not run under a decode. A SIGTERM during the start-up warm-up
/// ended the gateway with SIGSEGV in 2 of 10 tries.
static IN_LLAMA_CPP: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The read side of [`IN_LLAMA_CPP`], for a decode loop.
fn in_llama_cpp() -> std::sync::RwLockReadGuard<'static, ()> {
    IN_LLAMA_CPP.read().unwrap_or_else(|e| e.into_inner())
}

/// Waits until no decode loop is in llama.cpp and keeps them all out from then on: for
/// the end of the process, before its exit runs llama.cpp's destructors.
pub fn stop_decoding() {
    std::mem::forget(IN_LLAMA_CPP.write().unwrap_or_else(|e| e.into_inner()));
}

/// What the engine needs to load and run a model.
#[derive(Debug, Clone)]
pub struct LlamaCppSettings {
    pub model_path: PathBuf,
    /// The id clients use in `model`.
    pub model_id: String,
    /// Sequences decoded together in one batch, each with its own KV cache.
    pub sequences: usize,
    /// Tokens of context each sequence has; `None`: the model's, at most
    /// [`DEFAULT_CONTEXT_CAP`].
    pub context_length: Option<u32>,
    /// Compute threads; 0: one per core.
    pub threads: usize,
    /// Keep finished sequences' KV caches for the next request sharing their prefix.
    pub prefix_cache: bool,
    /// Bytes of host memory for prompt caches cut from their sequence (`stash`); 0:
    /// none. Used only with the prefix cache.
    pub stash_bytes: usize,
    /// Run on CPU even in a CUDA build.
    pub force_cpu: bool,
    /// A chat template llama.cpp knows by name, in place of the file's; `None`: the
    /// file's.
    pub chat_template: Option<String>,
    /// A Jinja chat template read from this file, in place of the file's.
    pub chat_template_file: Option<PathBuf>,
    /// `enable_thinking` where a request sets none (`engine.reasoning`).
    pub thinking: bool,
}

impl LlamaCppSettings {
    pub fn new(model_path: impl Into<PathBuf>, model_id: impl Into<String>) -> Self {
        Self {
            model_path: model_path.into(),
            model_id: model_id.into(),
            sequences: DEFAULT_SEQUENCES,
            context_length: None,
            threads: 0,
            prefix_cache: true,
            stash_bytes: DEFAULT_STASH_MB << 20,
            force_cpu: false,
            chat_template: None,
            chat_template_file: None,
            thinking: true,
        }
    }

    /// The settings `[engine]` gives a llama.cpp model: `max_batch_size` is its
    /// sequences (llama.cpp batches correctly on CPU, unlike mistral.rs 0.8.1).
    pub fn from_config(engine: &EngineConfig) -> Self {
        Self {
            model_path: engine.model_path.clone(),
            model_id: engine.model_id.clone(),
            sequences: engine.max_batch_size.unwrap_or(DEFAULT_SEQUENCES).max(1),
            context_length: engine.context_length,
            threads: engine.threads,
            // On, as in llama.cpp's own server: a seeded request never reuses a prefix,
            // so replays stay exact.
            prefix_cache: engine.prefix_cache.unwrap_or(true),
            stash_bytes: engine.prompt_stash_mb.unwrap_or(DEFAULT_STASH_MB) << 20,
            force_cpu: engine.force_cpu,
            chat_template: engine.chat_template.clone(),
            chat_template_file: engine.chat_template_file.clone(),
            thinking: engine.reasoning != ReasoningSwitch::Off,
        }
    }

    fn threads(&self) -> i32 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if self.threads == 0 {
            cores
        } else {
            self.threads
        };
        i32::try_from(threads).unwrap_or(1)
    }
}

/// The loaded model, as the request path uses it (the decode loop has its own handle).
struct Loaded {
    model: Arc<LlamaModel>,
    /// The chat template (the file's, or one llama.cpp knows by name); `None`: only text
    /// prompts can be served.
    template: Option<template::ChatTemplate>,
    /// Its facts, vocabulary and end tokens, as the front sees them.
    served: InProcessModel,
    /// Where requests go to the decode loop.
    jobs: std::sync::mpsc::Sender<batch::NewSequence>,
    /// The decode loop's thread has ended (a panic: it ends otherwise only with the engine).
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

pub struct LlamaCppEngine {
    loaded: OnceLock<Loaded>,
    /// Sequences the decode loop runs at once, each with its own KV cache.
    sequences: usize,
}

impl std::fmt::Debug for LlamaCppEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaCppEngine")
            .field(
                "model",
                &self.loaded.get().map(|l| l.served.info.id.as_str()),
            )
            .field("sequences", &self.sequences)
            .finish_non_exhaustive()
    }
}

impl LlamaCppEngine {
    fn empty(settings: &LlamaCppSettings) -> Self {
        Self {
            loaded: OnceLock::new(),
            sequences: settings.sequences.max(1),
        }
    }

    /// Starts loading the model in the background and returns at once. A file llama.cpp
    /// cannot load ends the process with the reason, as a mistral.rs model that fails to
    /// load does: a gateway without its model serves nothing.
    pub fn start(settings: LlamaCppSettings) -> Arc<Self> {
        let engine = Arc::new(Self::empty(&settings));
        let loader = Arc::clone(&engine);
        let engine_path = settings.model_path.clone();
        let span = tracing::Span::current();
        let spawned = std::thread::Builder::new()
            .name("llamacpp-load".into())
            .spawn(move || {
                let _entered = span.enter();
                match load::load(&settings) {
                    Ok(loaded) => {
                        tracing::info!(
                            model = %loaded.served.info.id,
                            context_length = loaded.served.info.context_length,
                            sequences = settings.sequences,
                            prefix_cache = settings.prefix_cache,
                            prompt_stash_mb = settings.stash_bytes >> 20,
                            system_fingerprint = %loaded.served.info.system_fingerprint,
                            "Model loaded in llama.cpp; ready to serve."
                        );
                        let _ = loader.loaded.set(loaded);
                    }
                    Err(error) => super::load_failed(&settings.model_path, &error),
                }
            });
        if let Err(error) = spawned {
            let error = anyhow::anyhow!("could not start the llama.cpp loader thread: {error}");
            super::load_failed(&engine_path, &error);
        }
        engine
    }

    /// Loads the model and waits until it is ready (benchmarks and tests). Errors: what
    /// llama.cpp or the file said.
    pub fn load_now(settings: LlamaCppSettings) -> anyhow::Result<Arc<Self>> {
        let engine = Self::empty(&settings);
        let _ = engine.loaded.set(load::load(&settings)?);
        Ok(Arc::new(engine))
    }
}

/// A prompt as llama.cpp's tokens.
struct Rendered {
    ids: Vec<u32>,
    /// The template left the model inside a thinking section.
    opens_thinking: bool,
}

/// The prompt as llama.cpp's tokens: a conversation rendered with the file's chat
/// template and `variables` (the assistant's turn opened when `generation_prompt`), then
/// tokenized with its special tokens read as such; a text prompt as it is, special-token
/// text taken as text; token ids as they came (the front has checked them against the
/// vocabulary).
fn tokenize_prompt(
    loaded: &Loaded,
    prompt: &Prompt,
    variables: &serde_json::Map<String, serde_json::Value>,
    add_special: bool,
    generation_prompt: bool,
) -> Result<Rendered, EngineError> {
    let (text, parse_special) = match prompt {
        Prompt::Chat(messages) => {
            let template = loaded
                .template
                .as_ref()
                .ok_or_else(|| EngineError::Unsupported {
                    param: "messages".into(),
                    reason:
                        "this model's file has no chat template; send a prompt to /v1/completions"
                            .into(),
                })?;
            let rendered =
                template.render(&loaded.model, messages, generation_prompt, variables)?;
            (rendered, true)
        }
        Prompt::Text(text) => (text.clone(), false),
        Prompt::Tokens(ids) => {
            return Ok(Rendered {
                ids: ids.clone(),
                opens_thinking: false,
            })
        }
    };
    let vocab = loaded.model.vocab();
    let ids = vocab.tokenize(text.as_bytes(), add_special, parse_special);
    Ok(Rendered {
        ids: ids
            .into_iter()
            .map(|t| u32::try_from(t.0).unwrap_or_default())
            .collect(),
        opens_thinking: parse_special && reasoning::opens_thinking(&text),
    })
}

#[async_trait]
impl Backend for LlamaCppEngine {
    fn name(&self) -> &'static str {
        "llamacpp"
    }

    /// Each sequence has its own region of the KV cache, one context long.
    fn model(&self) -> Option<LoadedModel> {
        let loaded = self.loaded.get()?;
        let vocab_size = u32::try_from(loaded.model.n_vocab()).unwrap_or_default();
        let template = loaded
            .template
            .as_ref()
            .map(template::ChatTemplate::traits)
            .unwrap_or_default();
        Some(LoadedModel {
            template,
            ..loaded.served.loaded(vocab_size, self.sequences)
        })
    }

    fn health(&self) -> Readiness {
        match self.loaded.get() {
            None => Readiness::Loading,
            Some(loaded) if loaded.stopped.load(Ordering::SeqCst) => Readiness::Down(
                "llama.cpp's decode loop has stopped (the log says why); restart the gateway"
                    .into(),
            ),
            Some(_) => Readiness::Ready,
        }
    }

    async fn count(&self, request: &GenerationRequest) -> Result<PromptTokens, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        let variables = template::variables(request);
        let Rendered {
            ids,
            opens_thinking,
        } = tokenize_prompt(loaded, &request.prompt, &variables, true, true)?;
        if ids.is_empty() {
            // Nothing to decode from (an empty text, a model that adds no start token).
            return Err(EngineError::InvalidParameter {
                param: "prompt".into(),
                message: "is empty: it gives no tokens to continue from".into(),
            });
        }
        Ok(PromptTokens {
            count: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            ids: Some(ids.into()),
            estimated: false,
            opens_thinking,
        })
    }

    async fn run(&self, job: Job) -> Result<Generation, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        let Job {
            request,
            prompt,
            grammar,
            claim,
            reported,
        } = job;
        let prompt_tokens = prompt.count;
        let ids = match prompt.ids {
            Some(ids) => ids,
            None => {
                let variables = template::variables(&request);
                tokenize_prompt(loaded, &request.prompt, &variables, true, true)?
                    .ids
                    .into()
            }
        };
        let started = std::time::Instant::now();
        let ends = EndRules::of(&request.sampling, &loaded.served.end_tokens, ids.len());
        let picker = TokenPicker::new(&request.sampling, grammar, request.top_logprobs, ends);
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let job = batch::NewSequence {
            prompt: ids,
            picker,
            request,
            events: events_tx,
            claim,
        };
        loaded
            .jobs
            .send(job)
            .map_err(|_| EngineError::Internal("the llama.cpp decode loop has stopped".into()))?;
        let (tx, rx) = mpsc::channel(32);
        tokio::spawn(forward(events_rx, tx).in_current_span());
        Ok(Generation {
            prompt_tokens,
            started,
            events: rx,
            reported,
        })
    }

    async fn tokenize(&self, request: TokenizeRequest) -> Result<Tokenized, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        let rendered = tokenize_prompt(
            loaded,
            &request.prompt,
            &template::inputs_variables(&request.template),
            request.add_special_tokens,
            request.add_generation_prompt,
        )?;
        Ok(loaded.served.tokenized(rendered.ids))
    }

    async fn detokenize(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        let n_vocab = u32::try_from(loaded.model.n_vocab()).unwrap_or_default();
        known_token_ids("tokens", &ids, |id| id < n_vocab)?;
        if ids.is_empty() {
            return Ok(String::new());
        }
        let tokens: Vec<LlamaToken> = ids
            .iter()
            .map(|&id| LlamaToken::new(i32::try_from(id).unwrap_or_default()))
            .collect();
        let bytes =
            loaded
                .model
                .vocab()
                .detokenize(&tokens, skip_special_tokens, !skip_special_tokens);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Hands the decode loop's events to the gateway as it takes them. The loop never waits
/// for a client: what a slow one has not taken waits here (at most the answer), and when
/// the gateway drops its stream this task ends, which the loop sees as the sequence
/// cancelled at its next step.
async fn forward(
    mut events: mpsc::UnboundedReceiver<super::EngineEvent>,
    tx: mpsc::Sender<super::EngineEvent>,
) {
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { return };
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            () = tx.closed() => return,
        }
    }
}

//! Loading a GGUF into llama.cpp: the file's hash and metadata first (the fingerprint,
//! the vocabulary, the end-of-sequence tokens), then the model, then the decode loop's
//! thread with its context, which answers once the context is made (a context that
//! cannot be made, too large a KV cache say, is a load failure, not a loop that dies
//! later).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;

use super::batch::{self, BatchShape};
use super::template::ChatTemplate;
use super::{LlamaCppSettings, Loaded, DEFAULT_CONTEXT_CAP, ENGINE_NAME};
use crate::engine::gguf::{GgufFacts, InProcessModel, ModelFile};

/// Tokens one decode call takes at most (llama.cpp's server and llama-cpp-python use
/// the same): a prompt longer than this is prefilled over several steps.
const BATCH_TOKENS: u32 = 512;
/// Tokens of one sequence's prompt prefilled in a step while other sequences decode: a
/// long prompt then costs each of them one such step at a time, not its whole prefill.
const PREFILL_CHUNK: u32 = 128;

/// The chat template llama.cpp knows as `name` (`engine.chat_template`), checked by
/// rendering a conversation with it: a name llama.cpp does not know is a start-up error.
fn named_template(model: &LlamaModel, name: &str) -> anyhow::Result<LlamaChatTemplate> {
    let template = LlamaChatTemplate::new(name)
        .map_err(|_| anyhow::anyhow!("engine.chat_template must not contain a NUL character"))?;
    let hi = LlamaChatMessage::new("user".into(), "Hi".into())?;
    model
        .apply_chat_template(&template, &[hi], true)
        .map_err(|_| {
            anyhow::anyhow!(
                "engine.chat_template '{name}' is not a chat template llama.cpp knows (names \
                 such as chatml, llama3, mistral-v7, gemma, command-r: docs/llama-cpp.md)"
            )
        })?;
    Ok(template)
}

/// llama.cpp's backend, initialised once per process however many models it serves.
fn backend() -> anyhow::Result<&'static LlamaBackend> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp's own log lines go to tracing (debug and above as it rates them).
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("llama.cpp's backend could not start: {e}"))
}

/// Making a context from a model writes to the model in llama.cpp (the bindings say
/// so): one at a time in the process.
static CONTEXTS: Mutex<()> = Mutex::new(());

pub(super) fn load(settings: &LlamaCppSettings) -> anyhow::Result<Loaded> {
    let path = &settings.model_path;
    let file = ModelFile::read(path)?;
    let (facts, vocabulary) = (&file.facts, file.vocabulary.clone());
    let backend = backend()?;
    let on_gpu = cfg!(feature = "cuda") && !settings.force_cpu;
    let mut params = LlamaModelParams::default();
    if on_gpu {
        params = params.with_n_gpu_layers(u32::MAX);
    }
    let model = LlamaModel::load_from_file(backend, path, &params).map_err(|e| {
        anyhow::anyhow!(
            "llama.cpp could not load {} ({} model): {e}",
            path.display(),
            facts.architecture()
        )
    })?;
    let model = Arc::new(model);
    let eos = end_of_generation(facts, &model);
    // A recurrent state cannot be cut back to a prefix: such models start every request
    // on an empty sequence.
    let reuse_prefixes = settings.prefix_cache && !model.is_recurrent() && !model.is_hybrid();
    if settings.prefix_cache && !reuse_prefixes {
        tracing::warn!(path = %path.display(), "The model keeps a recurrent state, which cannot be cut back to a shared prefix: the prefix cache is off for it.");
    }
    let trained = model.n_ctx_train();
    let context_length = settings
        .context_length
        .unwrap_or(trained.min(DEFAULT_CONTEXT_CAP))
        .max(16);
    let mut template = match (&settings.chat_template, &settings.chat_template_file) {
        (Some(name), _) => Some(ChatTemplate::Llama(named_template(&model, name)?)),
        (None, Some(file)) => Some(ChatTemplate::from_file(&model, file)?),
        (None, None) => ChatTemplate::of(&model, path),
    };
    if let Some(template) = &mut template {
        template.think_by_default(settings.thinking);
    }
    if template.is_none() {
        tracing::warn!(path = %path.display(), "The model's file has no chat template: only /v1/completions can be served.");
    }
    let sequences = settings.sequences.max(1);
    let shape = BatchShape {
        sequences,
        context: context_length,
        batch: BATCH_TOKENS,
        chunk: PREFILL_CHUNK,
        reuse_prefixes,
        stash_bytes: if reuse_prefixes {
            settings.stash_bytes
        } else {
            0
        },
    };
    let stopped = Arc::new(AtomicBool::new(false));
    let jobs = start_loop(
        Arc::clone(&model),
        settings,
        shape,
        vocabulary.clone(),
        Arc::clone(&stopped),
    )?;
    let device = if on_gpu { "cuda" } else { "cpu" };
    let info = file.info(
        &settings.model_id,
        context_length,
        ENGINE_NAME,
        device.into(),
    );
    Ok(Loaded {
        model,
        template,
        served: InProcessModel {
            info: Arc::new(info),
            vocabulary,
            end_tokens: eos,
        },
        jobs,
        stopped,
    })
}

/// Every token that ends an answer: the file's end-of-sequence ids and every token
/// llama.cpp ends generation on (`<|endoftext|>` beside `<|im_end|>`, `<|eom_id|>`, the
/// fill-in-the-middle ends, ...), so `ignore_eos` and `min_tokens` hold back all of them,
/// not only the ones the file names.
fn end_of_generation(facts: &GgufFacts, model: &LlamaModel) -> Arc<[u32]> {
    let vocab = model.vocab();
    let mut ids = facts.end_of_sequence_ids();
    for id in 0..model.n_vocab().max(0) {
        let Ok(unsigned) = u32::try_from(id) else {
            continue;
        };
        if vocab.is_eog(LlamaToken::new(id)) && !ids.contains(&unsigned) {
            ids.push(unsigned);
        }
    }
    ids.into()
}

/// Marks the decode loop stopped when its thread ends, a panic included, so the model
/// reads as not ready instead of failing every request behind a ready /ready.
struct Stopped(Arc<AtomicBool>);

impl Drop for Stopped {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("llama.cpp's decode loop panicked: the model serves nothing until the gateway restarts.");
        }
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Starts the decode loop on a thread of its own and waits until its context is made.
fn start_loop(
    model: Arc<LlamaModel>,
    settings: &LlamaCppSettings,
    shape: BatchShape,
    vocabulary: Option<Arc<crate::engine::grammar::Vocabulary>>,
    stopped: Arc<AtomicBool>,
) -> anyhow::Result<std::sync::mpsc::Sender<batch::NewSequence>> {
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
    let (made_tx, made_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let threads = settings.threads();
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name(format!("llamacpp-{}", settings.model_id))
        .spawn(move || {
            let _entered = span.enter();
            let params = LlamaContextParams::default()
                .with_n_ctx(NonZeroU32::new(shape.context * shape.sequences as u32))
                .with_n_batch(shape.batch)
                .with_n_ubatch(shape.batch)
                .with_n_seq_max(shape.sequences as u32)
                // Each sequence its own region of the cache: a sequence's cells, and so its
                // attention's order of sums, do not depend on its neighbours.
                .with_kv_unified(false)
                .with_n_threads(threads)
                .with_n_threads_batch(threads);
            let context = {
                let _one_at_a_time = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
                let Ok(backend) = backend() else {
                    let _ = made_tx.send(Err("llama.cpp's backend is not running".into()));
                    return;
                };
                model.new_context(backend, params)
            };
            let context = match context {
                Ok(context) => {
                    let _ = made_tx.send(Ok(()));
                    context
                }
                Err(error) => {
                    let _ = made_tx.send(Err(error.to_string()));
                    return;
                }
            };
            let _stopped = Stopped(stopped);
            let mut context = context;
            {
                let _in_llama_cpp = super::in_llama_cpp();
                warm_up(&mut context, &model);
            }
            batch::run(context, &model, vocabulary, jobs_rx, shape);
        })?;
    match made_rx.recv() {
        Ok(Ok(())) => Ok(jobs_tx),
        Ok(Err(error)) => Err(anyhow::anyhow!(
            "llama.cpp could not make a context of {} sequences x {} tokens: {error}",
            shape.sequences,
            shape.context
        )),
        Err(_) => Err(anyhow::anyhow!(
            "the llama.cpp decode loop's thread ended at start"
        )),
    }
}

/// Decodes a two-token batch and forgets it, as llama.cpp's server does at start: the
/// first real request would otherwise pay for the compute buffers' first use, the
/// weights' first reads and the thread pool's start (measured: 620 ms to the first
/// token and 720 ms per token after it, against 66 ms and 7 ms for the next request).
fn warm_up(ctx: &mut LlamaContext<'_>, model: &LlamaModel) {
    let vocab = model.vocab();
    let mut batch = llama_cpp_2::llama_batch::LlamaBatch::new(2, 1);
    let added = batch
        .add(vocab.bos(), 0, &[0], false)
        .and_then(|()| batch.add(vocab.eos(), 1, &[0], true));
    if added.is_ok() {
        if let Err(error) = ctx.decode(&mut batch) {
            tracing::debug!(error = %error, "The warm-up decode failed.");
        }
    }
    ctx.clear_kv_cache();
}

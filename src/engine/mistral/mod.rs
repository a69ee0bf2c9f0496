//! The mistral.rs engine: a GGUF model run in-process, with mistral.rs's own continuous
//! batching of concurrent requests. This is the only file that imports `mistralrs`.
//!
//! Loading happens in the background so the HTTP server can answer `/health` and a 503
//! from `/ready` while the weights load. Each request is sent to the engine as a streaming
//! chat request on its own response channel; a forwarder task turns mistral.rs responses
//! into [`EngineEvent`]s. When the gateway drops its [`TokenStream`](super::TokenStream), the forwarder drops
//! the mistral.rs receiver, and mistral.rs cancels the sequence at its next token.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use either::Either;
use mistralrs::{
    Constraint, CustomLogitsProcessor, DType, GgufModelBuilder, Model, NormalRequest, Request,
    RequestLike, Response, SamplingParams, StopTokens, Tensor, TextMessageRole, TextMessages,
};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use super::sampling::SeededSampler;
use super::{
    ChatMessage, Counted, Engine, EngineError, EngineEvent, EngineLoad, FinishReason, Generation,
    GenerationRequest, ModelInfo, Role, Usage,
};
use crate::fingerprint;

/// Engine name and version, part of the system fingerprint.
pub const ENGINE_NAME: &str = "mistral.rs 0.8.1";

/// What the adapter needs to load a model.
#[derive(Debug, Clone)]
pub struct MistralSettings {
    pub model_path: PathBuf,
    /// The id clients use in `model`.
    pub model_id: String,
    /// Sequences mistral.rs batches together at most. Keep it at 1 on CPU: mistral.rs
    /// 0.8.1 garbles the output of a sequence that joins a batch already decoding (see
    /// the README, "Known engine defect").
    pub max_batch_size: usize,
    /// Run on CPU even when built with CUDA.
    pub force_cpu: bool,
    /// Reuse the KV cache of earlier requests' shared prefixes. Saves prefill time on
    /// repeated system prompts, but a reused prefix was computed in another batch, so
    /// a seeded answer may then depend on what ran before it.
    pub prefix_cache: bool,
}

struct Loaded {
    model: Model,
    info: ModelInfo,
}

pub struct MistralEngine {
    loaded: OnceLock<Loaded>,
    /// One permit per sequence running in mistral.rs: requests wait here, in the gateway,
    /// where the wait is measured, rather than in mistral.rs's own queue.
    slots: Arc<Semaphore>,
    max_batch_size: usize,
    /// Requests waiting for a slot.
    waiting: Arc<AtomicUsize>,
}

impl MistralEngine {
    /// Starts loading the model in the background and returns at once. A load failure
    /// is logged and ends the process: a gateway without its model serves nothing.
    pub fn start(settings: MistralSettings) -> Arc<Self> {
        let engine = Arc::new(Self {
            loaded: OnceLock::new(),
            slots: Arc::new(Semaphore::new(settings.max_batch_size)),
            max_batch_size: settings.max_batch_size,
            waiting: Arc::default(),
        });
        let loader = Arc::clone(&engine);
        tokio::spawn(async move {
            match load(&settings).await {
                Ok(loaded) => {
                    tracing::info!(
                        model = %loaded.info.id,
                        context_length = loaded.info.context_length,
                        system_fingerprint = %loaded.info.system_fingerprint,
                        "Model loaded; ready to serve."
                    );
                    let _ = loader.loaded.set(loaded);
                }
                Err(error) => {
                    tracing::error!(path = %settings.model_path.display(), error = %format!("{error:#}"), "Could not load the model.");
                    std::process::exit(1);
                }
            }
        });
        engine
    }

    /// Loads the model and waits until it is ready (for benchmarks and tests).
    pub async fn load_now(settings: MistralSettings) -> anyhow::Result<Arc<Self>> {
        let loaded = load(&settings).await?;
        let engine = Self {
            loaded: OnceLock::new(),
            slots: Arc::new(Semaphore::new(settings.max_batch_size)),
            max_batch_size: settings.max_batch_size,
            waiting: Arc::default(),
        };
        let _ = engine.loaded.set(loaded);
        Ok(Arc::new(engine))
    }
}

async fn load(settings: &MistralSettings) -> anyhow::Result<Loaded> {
    let path = settings.model_path.clone();
    let file_sha256 =
        tokio::task::spawn_blocking(move || fingerprint::file_sha256(&path)).await??;
    let (dir, file) = split_model_path(&settings.model_path)?;
    let prefix_cache = settings.prefix_cache.then_some(16);
    let mut builder = GgufModelBuilder::new(dir, vec![file])
        .with_max_num_seqs(settings.max_batch_size)
        .with_prefix_cache_n(prefix_cache);
    if settings.force_cpu || !cfg!(feature = "cuda") {
        builder = builder.with_force_cpu();
    }
    let model = builder.build().await?;
    let context_length = model
        .max_sequence_length()?
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| anyhow::anyhow!("the model reports no context length"))?;
    let device = if settings.force_cpu || !cfg!(feature = "cuda") {
        "cpu"
    } else {
        "cuda"
    };
    let info = ModelInfo {
        id: settings.model_id.clone(),
        context_length,
        system_fingerprint: fingerprint::system_fingerprint(&file_sha256, ENGINE_NAME, device),
    };
    Ok(Loaded { model, info })
}

/// mistral.rs takes a GGUF model as a directory ("model id") and file names in it.
fn split_model_path(path: &Path) -> anyhow::Result<(String, String)> {
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .ok_or_else(|| anyhow::anyhow!("model path {} names no file", path.display()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir.to_string_lossy().into_owned(), file.to_owned()))
}

fn text_messages(messages: &[ChatMessage]) -> TextMessages {
    messages.iter().fold(TextMessages::new(), |acc, m| {
        let role = match m.role {
            Role::System => TextMessageRole::System,
            Role::User => TextMessageRole::User,
            Role::Assistant => TextMessageRole::Assistant,
        };
        acc.add_message(role, &m.content)
    })
}

/// Engine-side sampling: penalties and stops only. The token itself is chosen by the
/// gateway's seeded sampler (see [`picker`]), so mistral.rs decodes greedily over the
/// one token the picker leaves.
fn sampling_params(request: &GenerationRequest) -> SamplingParams {
    let s = &request.sampling;
    let mut params = SamplingParams::neutral();
    params.presence_penalty = s.presence_penalty;
    params.frequency_penalty = s.frequency_penalty;
    params.max_len = Some(request.max_tokens as usize);
    if !s.stop.is_empty() {
        params.stop_toks = Some(StopTokens::Seqs(s.stop.clone()));
    }
    params
}

/// Ids of the tokens the picker chose, drained by the forwarder as chunks arrive.
type PickedIds = Arc<Mutex<Vec<u32>>>;

/// A logits processor that picks the next token with the request's [`SeededSampler`]
/// (keyed by seed and position, so concurrent neighbours cannot change it), records its
/// id, and masks every other token. It runs after mistral.rs has applied penalties.
fn picker(request: &GenerationRequest, picked: PickedIds) -> Arc<dyn CustomLogitsProcessor> {
    let s = &request.sampling;
    let sampler = SeededSampler {
        // Without a seed the request is still sampled, from a fresh random stream.
        seed: s
            .seed
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0),
        // OpenAI's defaults: temperature 1, top_p 1.
        temperature: s.temperature.unwrap_or(1.0),
        top_p: s.top_p.unwrap_or(1.0),
    };
    Arc::new(
        move |logits: &Tensor, context: &[u32]| -> mistralrs::Result<Tensor> {
            let values: Vec<f32> = logits.to_dtype(DType::F32)?.to_vec1()?;
            let id = sampler.pick(&values, context.len() as u64);
            if let Ok(mut ids) = picked.lock() {
                ids.push(id);
            }
            let mut mask = vec![f32::NEG_INFINITY; values.len()];
            if let Some(slot) = mask.get_mut(id as usize) {
                *slot = 0.0;
            }
            Tensor::from_vec(mask, values.len(), logits.device())
        },
    )
}

#[async_trait]
impl Engine for MistralEngine {
    fn model_info(&self) -> Option<ModelInfo> {
        self.loaded.get().map(|l| l.info.clone())
    }

    fn load(&self) -> EngineLoad {
        EngineLoad {
            running: self
                .max_batch_size
                .saturating_sub(self.slots.available_permits()),
            waiting: self.waiting.load(Ordering::SeqCst),
        }
    }

    async fn generate(&self, request: GenerationRequest) -> Result<Generation, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        // Render the chat template and count the prompt before committing to a stream,
        // so a prompt that cannot fit is a clean 400 instead of a mid-stream failure.
        let prompt = loaded
            .model
            .tokenize(
                Either::Left(text_messages(&request.messages)),
                None,
                true,
                true,
                None,
            )
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let prompt_tokens = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        if prompt_tokens >= loaded.info.context_length {
            return Err(EngineError::ContextLengthExceeded {
                prompt_tokens,
                context_length: loaded.info.context_length,
            });
        }

        // Wait for a running slot; held by the forwarder until the sequence ends.
        let waiting = Counted::new(&self.waiting);
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| EngineError::Internal("the engine is shutting down".into()))?;
        drop(waiting);
        let (engine_tx, engine_rx) = mpsc::channel(32);
        let picked = PickedIds::default();
        let mut messages = text_messages(&request.messages);
        let normal = NormalRequest {
            messages: messages.take_messages(),
            sampling_params: sampling_params(&request),
            response: engine_tx,
            return_logprobs: false,
            is_streaming: true,
            id: 0,
            constraint: Constraint::None,
            suffix: None,
            tools: None,
            tool_choice: None,
            logits_processors: Some(vec![picker(&request, Arc::clone(&picked))]),
            return_raw_logits: false,
            web_search_options: None,
            model_id: None,
            truncate_sequence: false,
        };
        let sender = loaded
            .model
            .inner()
            .get_sender(None)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        sender
            .send(Request::Normal(Box::new(normal)))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?;

        let (tx, rx) = mpsc::channel(32);
        let budget = request.max_tokens;
        tokio::spawn(forward(engine_rx, picked, prompt_tokens, budget, tx, slot).in_current_span());
        Ok(Generation {
            prompt_tokens,
            events: rx,
        })
    }
}

/// Translates mistral.rs responses into engine events until the request ends or the
/// gateway drops its stream (which drops `engine_rx` and so cancels the sequence). The
/// running slot is freed when this returns.
async fn forward(
    mut engine_rx: mpsc::Receiver<Response>,
    picked: PickedIds,
    prompt_tokens: u32,
    max_tokens: u32,
    tx: mpsc::Sender<EngineEvent>,
    _slot: OwnedSemaphorePermit,
) {
    // Counted here as well, for a finish that arrives without usage.
    let mut tokens = Usage {
        prompt_tokens,
        completion_tokens: 0,
    };
    loop {
        let response = tokio::select! {
            r = engine_rx.recv() => r,
            () = tx.closed() => return,
        };
        let ids = picked
            .lock()
            .map(|mut ids| std::mem::take(&mut *ids))
            .unwrap_or_default();
        let Some(response) = response else {
            // mistral.rs 0.8.1 sends no final chunk when the last token completes no
            // character (an accented letter split across tokens, say): the sequence
            // ends and the channel closes. Finish it from our own count.
            tokens.completion_tokens += to_u32(ids.len());
            for event in closed_without_finish(ids, tokens, max_tokens) {
                let _ = tx.send(event).await;
            }
            return;
        };
        tokens.completion_tokens += to_u32(ids.len());
        for event in translate(response, ids, tokens) {
            let last = !matches!(event, EngineEvent::Token { .. });
            if tx.send(event).await.is_err() || last {
                return;
            }
        }
    }
}

/// What to report when mistral.rs closes a stream without a finish chunk: a finish with
/// our own count when tokens were generated, an error otherwise.
fn closed_without_finish(ids: Vec<u32>, counted: Usage, max_tokens: u32) -> Vec<EngineEvent> {
    if counted.completion_tokens == 0 {
        return vec![EngineEvent::Failed(EngineError::Internal(
            "the engine closed the stream without finishing".into(),
        ))];
    }
    tracing::warn!(
        completion_tokens = counted.completion_tokens,
        "The engine ended a sequence without a final chunk; finishing it from the gateway's count."
    );
    let reason = if counted.completion_tokens >= max_tokens {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let mut events = Vec::with_capacity(2);
    if !ids.is_empty() {
        events.push(EngineEvent::Token {
            text: String::new(),
            ids,
        });
    }
    events.push(EngineEvent::Finished {
        reason,
        usage: counted,
        prefill: None,
    });
    events
}

/// Events for one mistral.rs response; `ids` are the tokens picked since the last one and
/// `counted` the usage the forwarder counted itself, used when mistral.rs sends none.
fn translate(response: Response, ids: Vec<u32>, counted: Usage) -> Vec<EngineEvent> {
    match response {
        Response::Chunk(chunk) => {
            let mut events = Vec::with_capacity(2);
            let Some(choice) = chunk.choices.into_iter().next() else {
                return events;
            };
            let text = choice.delta.content.unwrap_or_default();
            if !text.is_empty() || !ids.is_empty() {
                events.push(EngineEvent::Token { text, ids });
            }
            if let Some(reason) = choice.finish_reason {
                let reason = match reason.as_str() {
                    "length" => FinishReason::Length,
                    "stop" => FinishReason::Stop,
                    // "canceled", "tool_calls"...: nothing this gateway asked for.
                    other => {
                        events.push(EngineEvent::Failed(EngineError::Internal(format!(
                            "the engine ended the sequence with '{other}'"
                        ))));
                        return events;
                    }
                };
                let (usage, prefill) = usage_of(chunk.usage);
                events.push(EngineEvent::Finished {
                    reason,
                    usage: usage.unwrap_or(counted),
                    prefill,
                });
            }
            events
        }
        Response::ValidationError(e) => {
            vec![EngineEvent::Failed(EngineError::Rejected(e.to_string()))]
        }
        Response::InternalError(e) => {
            vec![EngineEvent::Failed(EngineError::Internal(e.to_string()))]
        }
        Response::ModelError(message, _) => {
            vec![EngineEvent::Failed(EngineError::Internal(message))]
        }
        other => vec![EngineEvent::Failed(EngineError::Internal(format!(
            "unexpected engine response: {}",
            response_kind(&other)
        )))],
    }
}

fn response_kind(response: &Response) -> &'static str {
    match response {
        Response::Done(_) => "done",
        Response::CompletionChunk(_)
        | Response::CompletionDone(_)
        | Response::CompletionModelError(..) => "completion",
        _ => "other",
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Token counts and prefill time from the usage mistral.rs attaches to the last chunk.
fn usage_of(usage: Option<mistralrs::Usage>) -> (Option<Usage>, Option<Duration>) {
    let Some(u) = usage else {
        return (None, None);
    };
    let counts = Usage {
        prompt_tokens: to_u32(u.prompt_tokens),
        completion_tokens: to_u32(u.completion_tokens),
    };
    (
        Some(counts),
        Duration::try_from_secs_f32(u.total_prompt_time_sec).ok(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_close_after_tokens_is_a_finish_from_our_count() {
        let counted = Usage {
            prompt_tokens: 51,
            completion_tokens: 128,
        };
        let events = closed_without_finish(vec![7], counted, 128);
        assert_eq!(
            events,
            vec![
                EngineEvent::Token {
                    text: String::new(),
                    ids: vec![7]
                },
                EngineEvent::Finished {
                    reason: FinishReason::Length,
                    usage: counted,
                    prefill: None
                }
            ]
        );
        let early = closed_without_finish(
            vec![],
            Usage {
                completion_tokens: 5,
                ..counted
            },
            128,
        );
        assert!(matches!(
            early[0],
            EngineEvent::Finished {
                reason: FinishReason::Stop,
                ..
            }
        ));
        let nothing = closed_without_finish(
            vec![],
            Usage {
                completion_tokens: 0,
                ..counted
            },
            128,
        );
        assert!(matches!(nothing[0], EngineEvent::Failed(_)));
    }
}

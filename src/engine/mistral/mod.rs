//! The mistral.rs engine: a GGUF model run in-process. This module is the only one that
//! imports `mistralrs`.
//!
//! Loading happens in the background so the HTTP server can answer `/health` and a 503
//! from `/ready` while the weights load. Each request is sent to the engine as a streaming
//! chat request on its own response channel; a forwarder task ([`forward`]) turns
//! mistral.rs responses into [`EngineEvent`]s. When the gateway drops its
//! [`TokenStream`](super::TokenStream), the forwarder drops the mistral.rs receiver, and
//! mistral.rs cancels the sequence at its next step; the sequence's slot waits in its
//! picker until then ([`ParkedReplicaSlot`]).
//!
//! Requests wait for a slot in the gateway (where the wait is measured), then run on one
//! of `replicas` independent model instances: on CPU, where mistral.rs 0.8.1 cannot
//! batch correctly, replicas are how concurrent streams share the cores.
//! [`process`] holds the settings candle and rayon read once per process; [`prompt`]
//! renders and counts prompts on an instance's engine loop; [`watchdog`] restarts an
//! instance's engine thread that stopped.

pub mod canary;
mod forward;
mod load;
pub mod picker;
pub mod process;
mod prompt;
mod watchdog;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::engine::slots::{Claim, SlotQueue};

use async_trait::async_trait;
use futures_util::FutureExt;
use mistralrs::{
    Constraint, Model, NormalRequest, Request, RequestLike, RequestMessage, SamplingParams,
};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::gguf::InProcessModel;
use super::{
    Backend, EngineError, Generation, GenerationRequest, Job, LoadedModel, Prompt, PromptTokens,
    Readiness, Slots, TokenizeRequest, Tokenized,
};
use crate::engine::config::{EngineConfig, DEFAULT_BATCH_CPU, DEFAULT_BATCH_CUDA};
use crate::engine::known_token_ids;
use load::load;
use picker::{EndRules, PickedIds, Picker};
use prompt::{count_prompt, detached, text_messages, tokenize};

/// Engine name and version, part of the system fingerprint.
pub const ENGINE_NAME: &str = "mistral.rs 0.8.1";

/// What the adapter needs to load a model.
#[derive(Debug, Clone)]
pub struct MistralSettings {
    pub model_path: PathBuf,
    /// The id clients use in `model`.
    pub model_id: String,
    /// Sequences one model instance batches together at most. Keep it at 1 on CPU:
    /// mistral.rs 0.8.1 garbles sequences that share a decode step there (see
    /// docs/engine.md, "Known engine defect: batching on CPU").
    pub max_batch_size: usize,
    /// Before serving, run the [`canary`] and fall back to one sequence per instance if
    /// batched answers differ from single ones.
    pub verify_batching: bool,
    /// Independent model instances, each with its own weights, KV cache and engine
    /// thread; a request runs on the least busy one.
    pub replicas: usize,
    /// Run on CPU even when built with CUDA.
    pub force_cpu: bool,
    /// Reuse the KV cache of earlier requests' shared prefixes. Saves prefill time on
    /// repeated system prompts, but a reused prefix was computed in another batch, so
    /// a seeded answer may then depend on what ran before it.
    pub prefix_cache: bool,
}

impl MistralSettings {
    /// One instance, one sequence at a time, no prefix cache: the correct settings on CPU.
    pub fn new(model_path: impl Into<PathBuf>, model_id: impl Into<String>) -> Self {
        Self {
            model_path: model_path.into(),
            model_id: model_id.into(),
            max_batch_size: 1,
            verify_batching: false,
            replicas: 1,
            force_cpu: false,
            prefix_cache: false,
        }
    }

    /// The settings `engine` in the config describes. A batch size left to the device
    /// is 1 on CPU and, on CUDA, [`DEFAULT_BATCH_CUDA`] verified by the canary.
    pub fn from_config(engine: &EngineConfig) -> Self {
        let on_cpu = engine.force_cpu || !cfg!(feature = "cuda");
        let by_device = if on_cpu {
            DEFAULT_BATCH_CPU
        } else {
            DEFAULT_BATCH_CUDA
        };
        Self {
            model_path: engine.model_path.clone(),
            model_id: engine.model_id.clone(),
            max_batch_size: engine.max_batch_size.unwrap_or(by_device),
            verify_batching: engine.max_batch_size.is_none() && !on_cpu,
            replicas: engine.replicas,
            force_cpu: engine.force_cpu,
            // Off: mistral.rs's prefix cache would move seeded answers.
            prefix_cache: engine.prefix_cache.unwrap_or(false),
        }
    }

    /// Model instances to load: at least one.
    fn replica_count(&self) -> usize {
        self.replicas.max(1)
    }

    fn on_cpu(&self) -> bool {
        self.force_cpu || !cfg!(feature = "cuda")
    }
}

struct Loaded {
    /// At least one; each renders chat templates and counts prompt tokens too (the
    /// idlest, [`MistralEngine::idlest`]). Shared with the [`watchdog`] and with the
    /// tasks that wait out mistral.rs's answers ([`detached`]).
    replicas: Vec<Arc<Model>>,
    /// Whether each instance's engine thread runs ([`watchdog`]).
    health: Arc<watchdog::Health>,
    /// Its facts, vocabulary and end tokens, as the front sees them.
    served: InProcessModel,
}

pub struct MistralEngine {
    loaded: OnceLock<Loaded>,
    /// Sequences running on each replica, for the least busy one.
    running: Arc<Mutex<Vec<usize>>>,
    /// Sequences that may run at once (replicas x batch size, after the canary): the
    /// front's slots.
    sequences: AtomicUsize,
}

/// A running sequence's place on its replica, and the front's [`Claim`] (its slot and KV
/// positions); frees both when dropped.
struct ReplicaSlot {
    replica: usize,
    running: Arc<Mutex<Vec<usize>>>,
    claim: Claim,
}

impl ReplicaSlot {
    /// Counts `tokens` more positions in this sequence's KV cache.
    fn grow_by(&mut self, tokens: usize) {
        self.claim.holds(self.claim.held() + tokens);
    }
}

/// Where a sequence's [`ReplicaSlot`] goes when its client leaves: into the sequence's own
/// picker, which mistral.rs drops with the sequence. mistral.rs cancels a sequence at its
/// next step, when the answer finds no receiver (a long prompt's prefill is one step and
/// runs to its end), so the slot is freed when mistral.rs has let the sequence go, not
/// before: the next request waits for it in the gateway, where the wait is measured,
/// rather than unseen inside mistral.rs, and the KV figures stay true.
type ParkedReplicaSlot = Arc<Mutex<Option<ReplicaSlot>>>;

impl Drop for ReplicaSlot {
    fn drop(&mut self) {
        if let Ok(mut running) = self.running.lock() {
            running[self.replica] -= 1;
        }
    }
}

impl MistralEngine {
    fn empty(settings: &MistralSettings) -> Self {
        let replicas = settings.replica_count();
        Self {
            loaded: OnceLock::new(),
            running: Arc::new(Mutex::new(vec![0; replicas])),
            sequences: AtomicUsize::new(replicas * settings.max_batch_size),
        }
    }

    /// Starts loading the model in the background and returns at once. A load failure
    /// is logged and ends the process: a gateway without its model serves nothing.
    pub fn start(settings: MistralSettings) -> Arc<Self> {
        let engine = Arc::new(Self::empty(&settings));
        let loader = Arc::clone(&engine);
        tokio::spawn(async move {
            // A panic in mistral.rs's loader would end this task and leave a server that
            // answers model_not_ready for ever: it ends the process too, with the reason.
            let loaded = std::panic::AssertUnwindSafe(load(&settings))
                .catch_unwind()
                .await;
            let loaded = loaded.unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic without a message");
                Err(anyhow::anyhow!("the engine's loader panicked: {why}"))
            });
            match loaded {
                Ok(loaded) => {
                    if settings.verify_batching && settings.max_batch_size > 1 {
                        loader.verify_batching(&loaded, &settings).await;
                    }
                    tracing::info!(
                        model = %loaded.served.info.id,
                        context_length = loaded.served.info.context_length,
                        replicas = loaded.replicas.len(),
                        system_fingerprint = %loaded.served.info.system_fingerprint,
                        "Model loaded; ready to serve."
                    );
                    watch(&loaded);
                    let _ = loader.loaded.set(loaded);
                }
                Err(error) => super::load_failed(&settings.model_path, &error),
            }
        });
        engine
    }

    /// Runs the [`canary`] on a freshly loaded model; if batched answers are not the
    /// single ones (or the check cannot run), each instance serves one sequence at a time.
    async fn verify_batching(&self, loaded: &Loaded, settings: &MistralSettings) {
        let fall_back = |why: &str| {
            self.sequences
                .store(settings.replica_count(), Ordering::SeqCst);
            tracing::error!(
                max_batch_size = settings.max_batch_size,
                reason = why,
                "Batched decoding is not safe on this engine; serving one sequence per model instance. Set engine.max_batch_size to override."
            );
        };
        match canary::run(&Canary {
            engine: self,
            loaded,
            claims: SlotQueue::new(Slots::Unlimited),
        })
        .await
        {
            Ok(result) if result.batched_equals_single() => tracing::info!(
                max_batch_size = settings.max_batch_size,
                prompt_tokens = result.prompt_tokens,
                "Batched decoding checked: a batch of two gives the single answers."
            ),
            Ok(result) => fall_back(&result.describe()),
            Err(error) => fall_back(&format!("the check could not run: {error:#}")),
        }
    }

    /// The [`canary`] on the loaded model's first instance (for the reproduction in
    /// `examples/batching_defect` and the tests).
    pub async fn batching_check(&self) -> anyhow::Result<canary::Findings> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        canary::run(&Canary {
            engine: self,
            loaded,
            claims: SlotQueue::new(Slots::Unlimited),
        })
        .await
    }

    /// Loads the model and waits until it is ready (for benchmarks and tests).
    pub async fn load_now(settings: MistralSettings) -> anyhow::Result<Arc<Self>> {
        let engine = Self::empty(&settings);
        let loaded = load(&settings).await?;
        watch(&loaded);
        let _ = engine.loaded.set(loaded);
        Ok(Arc::new(engine))
    }

    /// The instance running the fewest sequences. Tokenizing goes there: mistral.rs
    /// reads its requests between two steps of an instance's loop, and one step is a
    /// whole prefill, so counting a prompt on a busy instance waited for another
    /// request's prefill while an idle one was at hand.
    fn idlest<'a>(&self, loaded: &'a Loaded) -> &'a Arc<Model> {
        let replica = self.running.lock().map_or(0, |running| {
            (0..running.len())
                .min_by_key(|&i| running[i])
                .unwrap_or_default()
        });
        &loaded.replicas[replica.min(loaded.replicas.len() - 1)]
    }

    /// Places a claimed sequence on the least busy replica, or on `pin`.
    fn place(&self, claim: Claim, pin: Option<usize>) -> Result<ReplicaSlot, EngineError> {
        let mut running = self
            .running
            .lock()
            .map_err(|_| EngineError::Internal("the slot table is poisoned".into()))?;
        // The front's slots guarantee some replica is below max_batch_size.
        let replica = pin.unwrap_or_else(|| {
            (0..running.len())
                .min_by_key(|&i| running[i])
                .unwrap_or_default()
        });
        running[replica] += 1;
        Ok(ReplicaSlot {
            replica,
            running: Arc::clone(&self.running),
            claim,
        })
    }
}

/// Engine-side sampling: penalties and the budget only. The token itself is chosen by
/// the gateway's seeded sampler (see [`picker`]), so mistral.rs decodes greedily over the
/// one token the picker leaves; stop sequences are the gateway's too
/// (`stream::stops`: mistral.rs 0.8.1 stops a token late and keeps the sequence).
fn sampling_params(request: &GenerationRequest) -> SamplingParams {
    let s = &request.sampling;
    let mut params = SamplingParams::neutral();
    params.presence_penalty = s.presence_penalty;
    params.frequency_penalty = s.frequency_penalty;
    params.repetition_penalty = s.repetition_penalty;
    params.max_len = Some(request.budget.tokens() as usize);
    params
}

/// The request mistral.rs runs: the prompt as its messages, streamed to `response`,
/// each token chosen by `picker`.
fn normal_request(
    request: &GenerationRequest,
    picker: Picker,
    response: mpsc::Sender<mistralrs::Response>,
) -> NormalRequest {
    let messages = match &request.prompt {
        Prompt::Chat(messages) => text_messages(messages).take_messages(),
        Prompt::Text(text) => RequestMessage::Completion {
            text: text.clone(),
            echo_prompt: false,
            best_of: None,
        },
        Prompt::Tokens(ids) => RequestMessage::CompletionTokens(ids.clone()),
    };
    NormalRequest {
        messages,
        sampling_params: sampling_params(request),
        response,
        return_logprobs: false,
        is_streaming: true,
        id: 0,
        constraint: Constraint::None,
        suffix: None,
        tools: None,
        tool_choice: None,
        logits_processors: Some(vec![Arc::new(picker)]),
        return_raw_logits: false,
        web_search_options: None,
        model_id: None,
        truncate_sequence: false,
    }
}

/// The canary's view of a loaded model: every sequence on the first instance, before
/// the front serves it (its claims are its own).
struct Canary<'a> {
    engine: &'a MistralEngine,
    loaded: &'a Loaded,
    claims: SlotQueue,
}

impl canary::Subject for Canary<'_> {
    async fn count(&self, request: &GenerationRequest) -> Result<u32, EngineError> {
        count_prompt(&self.loaded.replicas[0], &request.prompt).await
    }

    async fn start(
        &self,
        request: GenerationRequest,
        prompt_tokens: u32,
    ) -> Result<Generation, EngineError> {
        let job = Job {
            request,
            prompt: PromptTokens {
                count: prompt_tokens,
                ..PromptTokens::default()
            },
            grammar: None,
            claim: self.claims.claim().await?,
            reported: Arc::default(),
        };
        self.engine.start_on(self.loaded, job, Some(0)).await
    }
}

#[async_trait]
impl Backend for MistralEngine {
    fn name(&self) -> &'static str {
        "mistral"
    }

    /// Without paged attention (mistral.rs 0.8.1 on CPU, and as llmgate configures it on
    /// CUDA) each running sequence keeps its own KV cache of one position per token, up
    /// to the model's full context. A prefix cache (`engine.prefix_cache`) is not counted.
    fn model(&self) -> Option<LoadedModel> {
        let loaded = self.loaded.get()?;
        let vocab_size = loaded
            .served
            .vocabulary
            .as_ref()
            .map_or(u32::MAX, |v| u32::try_from(v.len()).unwrap_or(u32::MAX));
        let sequences = self.sequences.load(Ordering::SeqCst);
        Some(loaded.served.loaded(vocab_size, sequences))
    }

    fn health(&self) -> Readiness {
        match self.loaded.get() {
            None => Readiness::Loading,
            Some(loaded) if loaded.health.all_down() => Readiness::Down(
                "mistral.rs's engine thread has stopped (the log says why); it is restarting"
                    .into(),
            ),
            Some(_) => Readiness::Ready,
        }
    }

    async fn count(&self, request: &GenerationRequest) -> Result<PromptTokens, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        Ok(PromptTokens {
            count: count_prompt(self.idlest(loaded), &request.prompt).await?,
            ids: None,
            estimated: false,
            opens_thinking: false,
        })
    }

    async fn run(&self, job: Job) -> Result<Generation, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        self.start_on(loaded, job, None).await
    }

    async fn tokenize(&self, request: TokenizeRequest) -> Result<Tokenized, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        let ids = tokenize(self.idlest(loaded), &request).await?;
        Ok(loaded.served.tokenized(ids))
    }

    async fn detokenize(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, EngineError> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        known_token_ids("tokens", &ids, |id| {
            loaded
                .served
                .vocabulary
                .as_ref()
                .is_none_or(|v| v.spellings(&[id]).is_some())
        })?;
        detached(self.idlest(loaded), move |model| async move {
            model.detokenize(ids, skip_special_tokens).await
        })
        .await
    }
}

/// Starts the [`watchdog`] of a loaded model's engine threads; it ends with the model.
fn watch(loaded: &Loaded) {
    tokio::spawn(watchdog::watch(
        loaded.served.info.id.clone(),
        loaded.replicas.iter().map(Arc::downgrade).collect(),
        Arc::clone(&loaded.health),
    ));
}

impl MistralEngine {
    /// Ends every engine thread as a panic in mistral.rs would; the watchdog restarts
    /// them. For the tests of what a stopped engine does to `/ready` and to requests.
    #[doc(hidden)]
    pub async fn stop_engine_threads(&self) -> anyhow::Result<()> {
        let loaded = self.loaded.get().ok_or(EngineError::NotReady)?;
        watchdog::stop_threads(&loaded.replicas).await
    }

    /// Engine threads the watchdog has restarted since the model loaded.
    pub fn engine_restarts(&self) -> u64 {
        self.loaded.get().map_or(0, |l| l.health.restarts())
    }
}

impl MistralEngine {
    /// Sends a request [`count_prompt`] has counted to the engine, on the least busy
    /// replica or on `pin` (the canary needs two sequences on one). Works before the
    /// model is published as ready.
    async fn start_on(
        &self,
        loaded: &Loaded,
        job: Job,
        pin: Option<usize>,
    ) -> Result<Generation, EngineError> {
        let Job {
            request,
            prompt,
            grammar,
            claim,
            reported,
        } = job;
        let prompt_tokens = prompt.count;
        // The running slot, held by the forwarder until the sequence ends.
        let mut slot = self.place(claim, pin)?;
        slot.grow_by(prompt_tokens as usize);
        let started = std::time::Instant::now();
        let (engine_tx, engine_rx) = mpsc::channel(32);
        let picked = PickedIds::default();
        let parked = ParkedReplicaSlot::default();
        let ends = EndRules::of(
            &request.sampling,
            &loaded.served.end_tokens,
            prompt_tokens as usize,
        );
        let picker = Picker::new(
            &request.sampling,
            grammar,
            request.top_logprobs,
            ends,
            Arc::clone(&picked),
        )
        .parking(Arc::clone(&parked));
        let normal = normal_request(&request, picker, engine_tx);
        let sender = loaded.replicas[slot.replica]
            .inner()
            .get_sender(None)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        sender
            .send(Request::Normal(Box::new(normal)))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?;

        let (tx, rx) = mpsc::channel(32);
        let budget = request.budget.tokens();
        tokio::spawn(
            forward::forward(
                engine_rx,
                picked,
                loaded.served.vocabulary.clone(),
                prompt_tokens,
                budget,
                tx,
                (slot, parked),
            )
            .in_current_span(),
        );
        Ok(Generation {
            prompt_tokens,
            started,
            events: rx,
            reported,
        })
    }
}

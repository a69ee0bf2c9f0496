//! The model behind the gateway, seen through one trait.
//!
//! The HTTP layer hands the [`Engine`] a validated [`GenerationRequest`] and receives a
//! [`TokenStream`] of [`EngineEvent`]s. Dropping the stream cancels the generation.
//! Implementations:
//! - [`mistral`]: mistral.rs running a GGUF model in-process (the only module that
//!   imports `mistralrs`);
//! - [`llamacpp`]: llama.cpp running a GGUF model in-process, several sequences in one
//!   batch (the only module that imports `llama_cpp_2`);
//! - [`upstream`]: any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's server,
//!   a hosted API), streamed through over HTTP;
//! - [`scripted`]: programmable tokens, delays and failures, for tests and benchmarks.
//!
//! [`served`] maps each served model id to its engine.

pub mod config;
pub mod gguf;
pub mod grammar;
#[cfg(feature = "llamacpp")]
pub mod llamacpp;
#[cfg(feature = "mistral")]
pub mod mistral;
pub mod picking;
pub mod sampling;
pub mod scripted;
pub mod served;
pub mod upstream;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::tokens::{FinishReason, RepetitionBasis, TokenLogprob, Usage};

/// A generation request that has passed validation; everything here is within limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationRequest {
    /// The gateway's request id, for the engine's logs.
    pub request_id: String,
    pub prompt: Prompt,
    /// Completion-token budget, already capped by configuration.
    pub max_tokens: u32,
    /// Whether the client chose `max_tokens`. A chosen budget that does not fit the
    /// context is refused; the default one shrinks to what the prompt leaves
    /// ([`GenerationRequest::fit_to_context`]).
    pub max_tokens_set: bool,
    pub sampling: Sampling,
    /// Free text, or JSON the engine is held to while it decodes.
    pub response_format: ResponseFormat,
    /// `top_logprobs` when the client asked for logprobs (0: the picked tokens' only);
    /// `None`: not asked (each token's own log-probability is still reported, for the
    /// confidence figures).
    pub top_logprobs: Option<u8>,
    /// The W3C `traceparent` of the request's span, for an engine that continues the
    /// trace (an upstream server with OpenTelemetry on).
    pub traceparent: Option<String>,
    /// When the request must have ended (its request timeout): an upstream tries
    /// another endpoint only before then.
    pub deadline: Option<Instant>,
}

/// What the model continues: a conversation (rendered with the model's chat template) or
/// raw text (the legacy completions route).
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Chat(Vec::new())
    }
}

impl Prompt {
    /// A conversation of one user message.
    pub fn user(content: impl Into<String>) -> Self {
        Prompt::Chat(vec![ChatMessage {
            role: Role::User,
            content: content.into(),
        }])
    }

    /// The request field the prompt came in.
    pub fn param(&self) -> &'static str {
        match self {
            Prompt::Chat(_) => "messages",
            Prompt::Text(_) => "prompt",
        }
    }

    /// The text the answer responds to: the last user message, or the whole text.
    pub fn last_user_text(&self) -> &str {
        match self {
            Prompt::Chat(messages) => messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map_or("", |m| m.content.as_str()),
            Prompt::Text(text) => text,
        }
    }
}

/// The shape the answer must have.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ResponseFormat {
    #[default]
    Text,
    /// Any JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema (`{"type": "json_schema", ...}`).
    JsonSchema(serde_json::Value),
}

impl GenerationRequest {
    /// Fits the completion budget into the context left after a prompt of
    /// `prompt_tokens`, as OpenAI does: a prompt that fills the context, or a budget the
    /// client chose that does not fit beside the prompt, is refused; the default budget
    /// shrinks to what is left.
    pub fn fit_to_context(
        &mut self,
        prompt_tokens: u32,
        context_length: u32,
    ) -> Result<(), EngineError> {
        let left = context_length.saturating_sub(prompt_tokens);
        if left == 0 || (self.max_tokens_set && self.max_tokens > left) {
            return Err(EngineError::ContextLengthExceeded {
                prompt_tokens,
                max_tokens: self.max_tokens_set.then_some(self.max_tokens),
                context_length,
                prompt_param: self.prompt.param(),
            });
        }
        self.max_tokens = self.max_tokens.min(left);
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Sampling settings of one request. `None` means the engine's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// 0 means greedy decoding.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Only the `top_k` most likely tokens may be picked (vLLM and llama.cpp's extension).
    pub top_k: Option<u32>,
    /// Only tokens at least `min_p` times as likely as the most likely one may be picked.
    pub min_p: Option<f64>,
    /// Logits of tokens already in the prompt or the answer are divided by this (above 1
    /// discourages repeats), as in CTRL and vLLM.
    pub repetition_penalty: Option<f32>,
    /// Stop sequences; the output ends before the first one.
    pub stop: Vec<String>,
    /// vLLM's `ignore_eos`: the model's end-of-sequence tokens are never picked, so the
    /// answer runs to `max_tokens` (or a stop). Benchmark clients send it to fix the
    /// output length.
    pub ignore_eos: bool,
    /// vLLM's `min_tokens`: no end-of-sequence or `stop_token_ids` token before this
    /// many completion tokens.
    pub min_tokens: u32,
    /// vLLM's `stop_token_ids`: the answer ends when one of these tokens is picked; the
    /// token's own text is not part of it.
    pub stop_token_ids: Vec<u32>,
}

/// What the engine reports while it generates, in order: any number of `Token`s, then
/// exactly one `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Newly decoded text and the ids of the tokens behind it, in order. The text may be
    /// empty (a token that completes no character); ids may be empty when an engine
    /// reports several tokens' ids with a later event. `at`: when the engine handed it
    /// over, so the gateway's timings do not move with how fast the client reads.
    Token {
        text: String,
        ids: Vec<u32>,
        /// Each token's log-probability, in the order of `ids`; empty when the engine
        /// reports none.
        logprobs: Vec<TokenLogprob>,
        at: Instant,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(EngineError),
}

/// Why the engine could not take or finish a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("the model is still loading")]
    NotReady,
    #[error("the prompt has {prompt_tokens} tokens, the completion may have {max_tokens:?} and the model's context is {context_length}")]
    ContextLengthExceeded {
        prompt_tokens: u32,
        /// The completion budget the client asked for, when that is what does not fit.
        max_tokens: Option<u32>,
        context_length: u32,
        /// `messages` or `prompt`: what the client sent the prompt as.
        prompt_param: &'static str,
    },
    #[error("the engine rejected the request: {0}")]
    Rejected(String),
    /// A parameter the engine cannot use as given (a schema it cannot compile); the
    /// message is for the client.
    #[error("invalid '{param}': {message}")]
    InvalidParameter { param: String, message: String },
    /// A parameter this engine cannot honour at all.
    #[error("'{param}' is not available: {reason}")]
    Unsupported { param: String, reason: String },
    #[error("the engine failed: {0}")]
    Internal(String),
    /// An upstream server could not give the answer (see [`upstream::Fault`]).
    #[error("upstream: {0}")]
    Upstream(upstream::Fault),
}

/// A request whose prompt the engine has rendered and counted, with its completion budget
/// fitted into the context: what it will cost is known before it waits for a slot.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub request: GenerationRequest,
    /// Tokens of the prompt as the model sees it (chat template applied).
    pub prompt_tokens: u32,
    /// The compiled `response_format`, when the answer must be JSON.
    pub grammar: Option<grammar::Grammar>,
    /// Where an upstream's account of the answer will be, from before it is sent (a
    /// request that fails before its stream still says which endpoints it tried);
    /// `None` for an engine in this process.
    pub reported: Option<Arc<Reported>>,
    /// The prompt's token ids, where the engine counted them itself and decodes from
    /// them (llama.cpp): not tokenized twice.
    pub tokens: Option<Arc<[u32]>>,
}

/// What `/tokenize` turns into token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    pub prompt: Prompt,
    /// Let the tokenizer add its special tokens (a BOS, say) around the text.
    pub add_special_tokens: bool,
    /// End a rendered conversation with the assistant's turn opening, as a generation
    /// does (chat prompts only).
    pub add_generation_prompt: bool,
}

impl TokenizeRequest {
    /// How the engine counts a generation's prompt: `/tokenize` with its defaults gives
    /// the same ids, so `usage.prompt_tokens` matches it.
    pub fn as_generated(prompt: Prompt) -> Self {
        let chat = matches!(prompt, Prompt::Chat(_));
        Self {
            prompt,
            add_special_tokens: true,
            add_generation_prompt: chat,
        }
    }
}

impl Prepared {
    /// The most tokens the request can take: its prompt and its whole completion budget.
    pub fn token_budget(&self) -> u32 {
        self.prompt_tokens.saturating_add(self.request.max_tokens)
    }
}

/// Stream of events for one request. Dropping it tells the engine to stop generating.
pub type TokenStream = mpsc::Receiver<EngineEvent>;

/// A started generation.
#[derive(Debug)]
pub struct Generation {
    /// Tokens of the prompt as the model sees it (chat template applied); an upstream's
    /// own count arrives with its usage, this is the gateway's estimate.
    pub prompt_tokens: u32,
    /// When the engine started it: its slot was acquired (the end of its queue wait), or
    /// the request's first attempt was sent to the upstream.
    pub started: Instant,
    pub events: TokenStream,
    /// What an upstream said about its answer, filled in as its chunks arrive; `None`
    /// for an engine in this process.
    pub reported: Option<Arc<Reported>>,
}

/// An upstream's own account of one answer: the model it says answered, its
/// fingerprint, and how the gateway read its tokens. Each is set once, when it is
/// first known, and read when the request's record is written.
#[derive(Debug, Default)]
pub struct Reported {
    pub model: std::sync::OnceLock<String>,
    pub system_fingerprint: std::sync::OnceLock<String>,
    pub basis: std::sync::OnceLock<RepetitionBasis>,
    /// Set when the upstream sent no usage (llama.cpp's server ignores
    /// `include_usage`): the prompt's count is the gateway's estimate and the answer's
    /// is its chunks (or log-probabilities) counted.
    pub usage_estimated: std::sync::OnceLock<bool>,
    /// Which endpoints were tried, in order, and which one answered.
    pub route: std::sync::Mutex<Route>,
}

/// Where an upstream request went: every attempt, the last one the one that served it
/// (or failed last).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    pub attempts: Vec<Attempt>,
}

/// One attempt of a request at one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// The endpoint's base URL, without credentials.
    pub endpoint: String,
    /// Why it failed (a fault's kind); `None` for the attempt that answered.
    pub error_type: Option<&'static str>,
    /// The answer's TTFT and TPOT as the gateway measured them from this attempt's send
    /// (the replica's own, without the attempts before it); `None` until it answered.
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

impl Reported {
    /// What the route is now.
    pub fn route(&self) -> Route {
        self.route.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Whether an engine can take requests now, for `/ready` and `llmgate_upstream_up`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// The model is still loading.
    Loading,
    /// An upstream that the last probe or request could not reach, and why.
    Unreachable(String),
    /// An in-process engine that has stopped (its thread ended), and why; it may be
    /// restarting.
    Down(String),
}

/// Static facts about the served model, fixed once it is loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ModelInfo {
    /// The model id clients send in `model`.
    pub id: String,
    /// Context length in tokens (prompt + completion).
    pub context_length: u32,
    /// Identifies everything an answer depends on (see `fingerprint`).
    pub system_fingerprint: String,
    /// sha256 of the model file.
    pub sha256: String,
    /// The file's quantization, as GGUF names its file type (`Q8_0`).
    pub quant: String,
    /// Where it runs: `cpu/<weights>`, `cuda`, or `upstream`.
    pub device: String,
    /// The GPU, driver and CUDA version (empty on CPU and for upstreams).
    pub accelerator: crate::fingerprint::Accelerator,
    /// The server that answers for an upstream model; `None` in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamFacts>,
    /// When this gateway loaded the model (an upstream: when it set the model up), in
    /// Unix seconds: `/v1/models`'s `created`. Not part of what identifies an answer.
    #[serde(skip)]
    pub loaded_at: u64,
}

/// Where an upstream model is served, as the config names it (no credentials).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct UpstreamFacts {
    /// The base URL, without any user or password in it.
    pub url: String,
    /// The model name sent to it.
    pub model: String,
}

/// How busy the engine is right now, for the `requests_running` / `requests_waiting`
/// gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineLoad {
    /// Sequences being prefilled or decoded.
    pub running: usize,
    /// Requests waiting for a slot to start.
    pub waiting: usize,
}

/// How much of the engine's KV cache the running sequences hold: the model-server
/// protocol's KVCacheUtilization (`llmgate_kv_cache_usage_ratio`), for schedulers such as
/// the Gateway API Inference Extension's endpoint picker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCacheUse {
    /// Token positions the running sequences hold (prompt and output so far).
    pub used_tokens: u64,
    /// Token positions the engine can hold at once: its sequence slots times the context.
    pub capacity_tokens: u64,
}

impl KvCacheUse {
    /// `used / capacity`, in 0..=1; 0 when there is no capacity.
    pub fn ratio(&self) -> f64 {
        if self.capacity_tokens == 0 {
            return 0.0;
        }
        (self.used_tokens as f64 / self.capacity_tokens as f64).min(1.0)
    }
}

/// Counts itself in a shared number while it lives: `load` figures that stay right
/// whichever way a task ends (finished, failed, cancelled).
#[derive(Debug)]
pub(crate) struct Counted(Arc<AtomicUsize>);

impl Counted {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(count))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Which engine this is, as the config names it (`llamacpp`, `mistral`, `upstream`;
    /// `scripted` in tests): `/ready` shows it beside each model.
    fn name(&self) -> &'static str;

    /// The model's facts, or `None` while it is loading.
    fn model_info(&self) -> Option<Arc<ModelInfo>>;

    /// Sequences running and requests waiting in the engine now.
    fn load(&self) -> EngineLoad;

    /// Renders the prompt, counts its tokens and fits the completion budget into the
    /// context ([`GenerationRequest::fit_to_context`]). Errors: the model is not loaded,
    /// the prompt does not fit.
    async fn prepare(&self, request: GenerationRequest) -> Result<Prepared, EngineError>;

    /// Waits for a slot and starts generating. Errors here happen before any token;
    /// errors during generation arrive as [`EngineEvent::Failed`].
    async fn generate(&self, request: Prepared) -> Result<Generation, EngineError>;

    /// The token ids of a prompt, rendered as `request` says.
    async fn tokenize(&self, request: TokenizeRequest) -> Result<Vec<u32>, EngineError>;

    /// The text of token ids.
    async fn detokenize(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, EngineError>;

    /// How the vocabulary spells each id (`Ġthe`); `None` where the engine does not know
    /// its vocabulary or an id is not in it.
    fn spellings(&self, ids: &[u32]) -> Option<Vec<String>>;

    /// Whether the engine ends answers at `sampling.stop` itself. `false`: the gateway's
    /// stop screen (`stream::stops`) cuts them, as for mistral.rs, which stops a token
    /// late; an upstream is asked to stop and does.
    fn applies_stop_sequences(&self) -> bool {
        false
    }

    /// Whether `generate` waits in a queue of the gateway's for a slot, which the queue
    /// timeout bounds; `false` for an upstream, whose wait (its first byte) has its own.
    fn waits_in_queue(&self) -> bool {
        true
    }

    /// The KV cache in use, where the engine knows it; `None` (no series) for an engine
    /// whose cache is another process's, such as an upstream's.
    fn kv_cache(&self) -> Option<KvCacheUse> {
        None
    }

    /// Each endpoint of an upstream model as `/ready` and `/stats` show it; empty for
    /// an engine in this process.
    fn endpoints(&self) -> Vec<upstream::fleet::EndpointView> {
        Vec::new()
    }

    /// How an upstream model's requests are spread over its endpoints
    /// (`least_outstanding`, ...); `None` for an engine in this process.
    fn routing_policy(&self) -> Option<&'static str> {
        None
    }

    /// Whether requests can be served now.
    fn readiness(&self) -> Readiness {
        if self.model_info().is_some() {
            Readiness::Ready
        } else {
            Readiness::Loading
        }
    }
}

/// The first of `ids` the model does not know, as the error naming it (`param[i]`).
pub(crate) fn known_token_ids(
    param: &str,
    ids: &[u32],
    known: impl Fn(u32) -> bool,
) -> Result<(), EngineError> {
    match ids.iter().enumerate().find(|(_, &id)| !known(id)) {
        Some((at, bad)) => Err(EngineError::InvalidParameter {
            param: format!("{param}[{at}]"),
            message: format!("{bad} is not a token id of this model"),
        }),
        None => Ok(()),
    }
}

/// Ends the process because a model could not load: a gateway without its model serves
/// nothing. The reason goes to the log and, because the log's writer is not flushed by
/// an exit, to stderr as well, where an operator starting it by hand or a container's
/// runtime sees it.
#[cfg(any(feature = "mistral", feature = "llamacpp"))]
pub(crate) fn load_failed(path: &std::path::Path, error: &anyhow::Error) -> ! {
    let why = format!("{error:#}");
    tracing::error!(path = %path.display(), error = %why, "Could not load the model.");
    eprintln!(
        "llmgate: could not load the model {}: {why}",
        path.display()
    );
    std::process::exit(1);
}

/// Prepares and starts a request in one go (benchmarks and tests that have no use for
/// the step between).
pub async fn run(
    engine: &dyn Engine,
    request: GenerationRequest,
) -> Result<Generation, EngineError> {
    let prepared = engine.prepare(request).await?;
    engine.generate(prepared).await
}

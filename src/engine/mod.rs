//! The model behind the gateway: a [`Front`] written once over a narrow [`Backend`]
//! per engine.
//!
//! The HTTP layer hands the front a validated [`GenerationRequest`] and receives a
//! [`TokenStream`] of [`EngineEvent`]s. Dropping the stream cancels the generation. The
//! front ([`front`]) fits the [`Budget`] into the context, checks and compiles what the
//! model's vocabulary serves, and queues requests for the backend's slots ([`slots`]);
//! a backend ([`backend`]) counts and renders prompts, knows its vocabulary and end
//! tokens, and runs a job. Backends:
//! - [`mistral`]: mistral.rs running a GGUF model in-process (the only module that
//!   imports `mistralrs`);
//! - [`llamacpp`]: llama.cpp running a GGUF model in-process, several sequences in one
//!   batch (the only module that imports `llama_cpp_2`);
//! - [`upstream`]: any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's server,
//!   a hosted API), streamed through over HTTP;
//! - [`scripted`]: programmable tokens, delays and failures, for tests and benchmarks.
//!
//! [`served`] maps each served model id to its engine.

pub mod backend;
pub mod budget;
pub mod config;
pub mod front;
pub mod gguf;
pub mod grammar;
#[cfg(feature = "llamacpp")]
pub mod llamacpp;
#[cfg(feature = "mistral")]
pub mod mistral;
pub mod picking;
pub mod reasoning;
pub mod sampling;
pub mod scripted;
pub mod served;
pub mod slots;
pub mod toolcall;
pub mod tools;
pub mod upstream;

pub use backend::{Backend, Decoding, Job, LoadedModel, PromptTokens, TemplateTraits, Tokenized};
pub use budget::Budget;
pub use front::{Front, Prepared};
pub(crate) use slots::Counted;
pub use slots::Slots;
pub use tools::{
    ContentPart, Function, MediaKind, MediaPart, ToolCall, ToolCallDelta, ToolCalls, ToolChoice,
    Tools,
};

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::tokens::{FinishReason, RepetitionBasis, TokenLogprob, Usage};

/// A generation request that has passed validation; everything here is within limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationRequest {
    /// The gateway's request id, for the engine's logs.
    pub request_id: String,
    pub prompt: Prompt,
    /// The completion budget, within the model's cap; the front fits it into the
    /// context ([`Budget::fit`]).
    pub budget: Budget,
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
    /// The client gets the answer in one body (`stream: false`): until it ends nothing
    /// has reached the client, so an upstream may start it over at another replica.
    pub whole: bool,
    /// llama.cpp's `return_progress` (streamed answers): the engine reports how much of
    /// the prompt it has read ([`EngineEvent::Progress`]) as it reads it.
    pub return_progress: bool,
    /// The tools the model may call; `None` when the request offers none.
    pub tools: Option<Tools>,
    /// OpenAI's `reasoning_effort` (`minimal`, `low`, `medium`, `high`...), for a
    /// reasoning model; `None`: its default.
    pub reasoning_effort: Option<String>,
    /// How thinking is handed over by an engine in this process (llama-server's
    /// `reasoning_format`); `None`: [`ReasoningFormat::Auto`](reasoning::ReasoningFormat).
    pub reasoning_format: Option<reasoning::ReasoningFormat>,
    /// Variables for the model's chat template (`chat_template_kwargs`, as llama-server
    /// and vLLM take them: `enable_thinking` for Qwen3's).
    pub template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What the model continues: a conversation (rendered with the model's chat template),
/// raw text or token ids (the legacy completions route).
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
    /// Token ids, read as they are: nothing rendered, nothing added (no BOS).
    Tokens(Vec<u32>),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Chat(Vec::new())
    }
}

impl Prompt {
    /// A conversation of one user message.
    pub fn user(content: impl Into<String>) -> Self {
        Prompt::Chat(vec![ChatMessage::new(Role::User, content)])
    }

    /// The request field the prompt came in.
    pub fn param(&self) -> &'static str {
        match self {
            Prompt::Chat(_) => "messages",
            Prompt::Text(_) | Prompt::Tokens(_) => "prompt",
        }
    }

    /// The text the answer responds to: the last user message, or the whole text (none
    /// for token ids).
    pub fn last_user_text(&self) -> &str {
        match self {
            Prompt::Chat(messages) => messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map_or("", |m| m.content.as_str()),
            Prompt::Text(text) => text,
            Prompt::Tokens(_) => "",
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
    /// Text held to a GBNF grammar, as the client wrote it (llama.cpp's `grammar`;
    /// checked as GBNF when the request is read, see [`grammar::gbnf`]).
    Grammar(String),
    /// Text held to a grammar in llguidance's Lark: the gateway's own, for a tool-call
    /// format ([`toolcall::syntax`]); never read from a request.
    Lark(String),
}

/// One message of a conversation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatMessage {
    pub role: Role,
    /// Its text: the text parts joined by line breaks, as llama.cpp's server joins them.
    /// What the chat template renders, the redactor reads and the input hash covers.
    pub content: String,
    /// An assistant's calls of the client's tools.
    pub tool_calls: Vec<ToolCall>,
    /// A tool's result: the call it answers.
    pub tool_call_id: Option<String>,
    /// The participant's (or, in a legacy `function` message, the function's) name.
    pub name: Option<String>,
    /// Its content part by part, where a part is not text (an image, audio, a file);
    /// empty when the content is text alone.
    pub parts: Vec<ContentPart>,
}

impl ChatMessage {
    /// A message of text alone.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    System,
    #[default]
    User,
    Assistant,
    /// A tool's result, answering an assistant's call.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
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
    /// OpenAI's `logit_bias`: added to these tokens' logits before each pick, in id
    /// order.
    pub logit_bias: Vec<(u32, f32)>,
    /// llama.cpp's `post_sampling_probs`: each token's log-probability and alternatives
    /// are reported in the distribution it was drawn from (after the temperature and
    /// top_k, top_p, min_p), not the model's. The confidence figures keep the model's.
    pub post_sampling_probs: bool,
}

/// What the engine reports while it generates, in order: any number of `Token`s (and
/// `Reasoning` and `ToolCall` pieces, for a reasoning model or a tool call), then
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
    /// How much of the prompt the engine has read, for a request with `return_progress`:
    /// once as it starts (`processed` = `cached`, the prefix a cache held) and after each
    /// chunk of the prompt it reads. Before any `Token`; an engine may send none.
    Progress {
        /// The prompt's tokens.
        total: u32,
        /// Those a cache held, not read again.
        cached: u32,
        /// Those in the cache now, `cached` included.
        processed: u32,
    },
    /// Reasoning text (a reasoning model's thinking, outside the answer's content) that
    /// stands for `tokens` tokens, handed over `at`.
    Reasoning {
        text: String,
        tokens: u32,
        at: Instant,
    },
    /// A piece of a tool call (its header, or a fragment of its arguments) that stands
    /// for `tokens` tokens, handed over `at`.
    ToolCall {
        delta: ToolCallDelta,
        tokens: u32,
        at: Instant,
    },
    Failed(EngineError),
    /// Forget the answer so far: it starts over. Only for a request the client gets in
    /// one body ([`GenerationRequest::whole`]), whose upstream replica failed midway:
    /// another answers it.
    Restarted,
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

/// What `/tokenize` turns into token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    pub prompt: Prompt,
    /// Let the tokenizer add its special tokens (a BOS, say) around the text.
    pub add_special_tokens: bool,
    /// End a rendered conversation with the assistant's turn opening, as a generation
    /// does (chat prompts only).
    pub add_generation_prompt: bool,
    /// What the chat template is given beside the conversation, as a generation's
    /// (`/apply-template`'s `tools` and `chat_template_kwargs`).
    pub template: TemplateInputs,
}

/// What a chat template is given beside the conversation: the tools a template that
/// renders them lists, `chat_template_kwargs`, `reasoning_effort`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateInputs {
    pub tools: Option<Tools>,
    pub kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    pub reasoning_effort: Option<String>,
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
            template: TemplateInputs::default(),
        }
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
    /// What an upstream said about its answer, filled in as its chunks arrive; empty
    /// for an engine in this process.
    pub reported: Arc<Reported>,
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
    /// An in-process engine that has stopped (its thread ended), or an upstream whose
    /// every endpoint fails (hangs, answers 5xx), and why; it may come back.
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

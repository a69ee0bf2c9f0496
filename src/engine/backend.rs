//! What each engine implements: the narrow [`Backend`] trait. Everything engines share —
//! fitting the budget to the context, the checks after it, grammar compilation, the slot
//! queue, the running and waiting counts and the KV accounting — is the
//! [`Front`](super::front::Front)'s, written once above them.

use std::sync::Arc;

use async_trait::async_trait;

use super::grammar::{Grammar, Vocabulary};
use super::slots::{Claim, Slots};
use super::{
    EngineError, Generation, GenerationRequest, ModelInfo, Readiness, Reported, TokenizeRequest,
};

/// A loaded model as the front sees it: its facts and how its tokens are chosen.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    pub info: Arc<ModelInfo>,
    pub decoding: Decoding,
    pub slots: Slots,
    /// Whether the backend ends answers at `stop` itself (an upstream is asked to). `false`:
    /// the gateway's stop screen (`stream::stops`) cuts them, as for mistral.rs, which
    /// stops a token late.
    pub applies_stops: bool,
    /// Whether the backend takes what agents and multimodal clients send as it is
    /// (tools, tool calls and results, media parts, names, `reasoning_effort`) and
    /// reports tool calls and reasoning: an upstream. `false`: the front refuses them,
    /// naming each, rather than answer as if they were not there.
    pub passes_agents: bool,
    /// What the engine's chat template does with a request beyond its messages; all
    /// `false` where the gateway does not render it (an upstream gets them as sent).
    pub template: TemplateTraits,
    /// An upstream's endpoints, as `/ready` and `/stats` show them; `None` for an
    /// engine in this process.
    pub fleet: Option<Arc<dyn FleetView>>,
}

/// What a chat template rendered in this process does beyond writing the messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateTraits {
    /// It takes the request's `chat_template_kwargs` (a Jinja template).
    pub takes_kwargs: bool,
    /// It reads `reasoning_effort` or `enable_thinking`: a request's effort is honoured.
    pub thinking_switch: bool,
    /// It writes `<think>` sections: answers are split under `reasoning_format: auto`.
    pub thinks: bool,
    /// How it renders tools, and so how the model calls them.
    pub tool_format: super::toolcall::ToolFormat,
}

/// Who chooses each token of an answer.
#[derive(Debug, Clone)]
pub enum Decoding {
    /// The gateway's picker, over the model's logits in this process (llama.cpp,
    /// mistral.rs): the front compiles `response_format` into a grammar, refuses what
    /// the vocabulary cannot serve, and checks token ids against it.
    Picked {
        /// The tokens' bytes; `None` when the file's tokenizer is not one the grammar
        /// knows (no structured output, no log-probabilities then).
        vocabulary: Option<Arc<Vocabulary>>,
        /// Token ids the model has: `0..vocab_size`.
        vocab_size: u32,
        /// The tokens a sequence ends on, for `ignore_eos`, `min_tokens` and
        /// `stop_token_ids`.
        end_tokens: Arc<[u32]>,
    },
    /// Another server that samples on its own (an upstream), or the scripted engine:
    /// the request's parameters go to it as they are.
    Own,
}

/// A prompt as the backend counted it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptTokens {
    /// Tokens of the prompt as the model sees it (chat template applied).
    pub count: u32,
    /// The ids behind `count`, where the backend decodes from them (llama.cpp): the
    /// prompt is not tokenized twice.
    pub ids: Option<Arc<[u32]>>,
    /// The count is the gateway's estimate, not the model's own (an upstream renders and
    /// counts the prompt itself): the context is the upstream's to check.
    pub estimated: bool,
    /// The rendered prompt ends inside a thinking section its template opened: the
    /// answer starts as reasoning ([`reasoning`](super::reasoning)).
    pub opens_thinking: bool,
}

/// A prompt's token ids, as `/tokenize` answers them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tokenized {
    pub ids: Vec<u32>,
    /// How the vocabulary spells each id (`Ġthe`); `None` where the backend does not
    /// know its vocabulary.
    pub spellings: Option<Vec<String>>,
    /// Each id's bytes as they appear in text (llama.cpp's `piece`), where known.
    pub pieces: Option<Vec<Vec<u8>>>,
}

/// A request ready to run: prepared by the front and holding its slot.
#[derive(Debug)]
pub struct Job {
    pub request: GenerationRequest,
    pub prompt: PromptTokens,
    /// The compiled `response_format`, for a backend whose tokens the gateway picks.
    pub grammar: Option<Grammar>,
    /// The request's place among the running ones, and its KV positions: the backend
    /// keeps it until the sequence ends.
    pub claim: Claim,
    /// Where the backend writes its account of the answer (an upstream's route and
    /// model); empty for an engine in this process.
    pub reported: Arc<Reported>,
}

/// An engine as the front drives it. Implementations: `mistral`, `llamacpp`,
/// `upstream`, `scripted`.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Which engine this is, as the config names it (`llamacpp`, `mistral`, `upstream`;
    /// `scripted` in tests): `/ready` shows it beside each model.
    fn name(&self) -> &'static str;

    /// The loaded model, or `None` while it loads.
    fn model(&self) -> Option<LoadedModel>;

    /// Whether requests can be served now.
    fn health(&self) -> Readiness {
        if self.model().is_some() {
            Readiness::Ready
        } else {
            Readiness::Loading
        }
    }

    /// Renders a generation's prompt (with its template variables, where the engine
    /// renders one) and counts its tokens. Errors: the model is not loaded, the prompt
    /// cannot be rendered.
    async fn count(&self, request: &GenerationRequest) -> Result<PromptTokens, EngineError>;

    /// The token ids of a prompt, rendered as `request` says (`/tokenize`).
    async fn tokenize(&self, request: TokenizeRequest) -> Result<Tokenized, EngineError>;

    /// The text of token ids (`/detokenize`).
    async fn detokenize(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, EngineError>;

    /// Starts generating. Errors here happen before any token; errors during generation
    /// arrive as [`EngineEvent::Failed`](super::EngineEvent::Failed).
    async fn run(&self, job: Job) -> Result<Generation, EngineError>;
}

/// An upstream's endpoints as `/ready` and `/stats` show them: the one capability only
/// an upstream backend has, which its [`Front`](crate::engine::Front) carries.
pub trait FleetView: Send + Sync + std::fmt::Debug {
    /// How requests are spread over the endpoints (`least_outstanding`, ...).
    fn policy(&self) -> &'static str;
    /// Each endpoint's state now.
    fn endpoints(&self) -> Vec<EndpointView>;
}

/// What `/ready`, `/stats` and the metrics show of one endpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EndpointView {
    /// Its base URL, without credentials.
    pub endpoint: String,
    pub state: &'static str,
    /// Why it is out (the last fault's kind), or unreachable for `/ready`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether the last probe or request reached it.
    pub reachable: bool,
    /// Requests this gateway has in flight there.
    pub outstanding: usize,
    /// Decaying averages of this gateway's measurements there.
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    /// Times it has been ejected since it was last fully healthy.
    pub ejections: u32,
    /// Seconds until it is back in rotation, while it is out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub back_in_secs: Option<f64>,
    /// What its own `/metrics` last said (the `engine_metrics` policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_waiting: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_kv_cache: Option<f64>,
    /// Seconds since those figures were read: a replica whose scrapes fail keeps its
    /// last ones, which age.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_metrics_age_secs: Option<f64>,
    /// Scrapes of its `/metrics` that failed or named no queue.
    #[serde(skip_serializing_if = "is_zero")]
    pub scrape_failures: u64,
    /// What the drift canary last found there (a fleet with `canary_interval_secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryView>,
}

/// One replica's answers to the drift canary (fixed prompts, greedy and seeded): the same
/// as the majority of its peers', or not.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CanaryView {
    /// Unix seconds of the round.
    pub checked_at: u64,
    /// Answers to any prompt that differ from the majority's.
    pub drifting: bool,
    /// sha256 of its answers, in the prompts' order.
    pub output_hash: String,
    /// The `system_fingerprint` it reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// Each prompt where it parted from the majority: its answer and theirs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differing: Vec<DifferingAnswer>,
    /// Prompts it gave no answer to (the round counts only those it answered).
    #[serde(skip_serializing_if = "is_zero_usize")]
    pub unanswered: usize,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DifferingAnswer {
    pub prompt: String,
    pub answer: String,
    pub majority: String,
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

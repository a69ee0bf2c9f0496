//! A programmable engine for tests and benchmarks: it "generates" scripted tokens with
//! scripted delays and failures, and counts what it produced so tests can show that a
//! cancelled request stops producing.
//!
//! A request runs the script registered for its last message's text, or the default
//! script. Prompt tokens are counted as whitespace-separated words, which is enough to
//! exercise the context-length check. Token ids are a hash of each token's text, so a
//! script that repeats itself has a high repetition rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{
    Backend, Decoding, EngineError, EngineEvent, Generation, Job, LoadedModel, ModelInfo, Prompt,
    PromptTokens, ResponseFormat, Slots, TokenizeRequest, Tokenized,
};
use crate::tokens::{FinishReason, TokenLogprob, TokenText, Usage};

/// One scripted generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub steps: Vec<Step>,
    /// Finish reason when the steps run out before `max_tokens`.
    pub finish: FinishReason,
    /// How long `generate` waits before it starts the request, as a busy engine's queue.
    pub queued: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Wait `delay`, then emit a token with this text.
    Token { text: String, delay: Duration },
    /// Wait `delay`, then fail the generation.
    Fail { error: EngineError, delay: Duration },
}

impl Script {
    /// Tokens with the same delay before each, ending with `stop`.
    pub fn tokens<S: AsRef<str>>(texts: &[S], delay: Duration) -> Self {
        Self {
            steps: texts
                .iter()
                .map(|t| Step::Token {
                    text: t.as_ref().to_owned(),
                    delay,
                })
                .collect(),
            finish: FinishReason::Stop,
            queued: Duration::ZERO,
        }
    }

    /// The same script, started only after `queued` in the engine's queue.
    pub fn after_queue(mut self, queued: Duration) -> Self {
        self.queued = queued;
        self
    }

    /// Appends a failure after the scripted tokens.
    pub fn then_fail(mut self, error: EngineError) -> Self {
        self.steps.push(Step::Fail {
            error,
            delay: Duration::ZERO,
        });
        self
    }
}

pub struct ScriptedEngine {
    info: Arc<ModelInfo>,
    default_script: Script,
    by_prompt: HashMap<String, Script>,
    ready: AtomicBool,
    produced: Arc<AtomicU64>,
    cancelled: Arc<AtomicU64>,
    /// Sequences it runs at once; `None`: as many as come.
    slots: Option<usize>,
}

impl ScriptedEngine {
    pub fn new(info: ModelInfo, default_script: Script) -> Self {
        Self {
            info: Arc::new(info),
            default_script,
            by_prompt: HashMap::new(),
            ready: AtomicBool::new(true),
            produced: Arc::default(),
            cancelled: Arc::default(),
            slots: None,
        }
    }

    /// Runs at most `slots` sequences at once: the others wait in the front's queue.
    pub fn with_slots(mut self, slots: usize) -> Self {
        self.slots = Some(slots);
        self
    }

    /// Runs `script` for requests whose last message is exactly `prompt`.
    pub fn with_script(mut self, prompt: &str, script: Script) -> Self {
        self.by_prompt.insert(prompt.to_owned(), script);
        self
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Tokens emitted so far, over all requests.
    pub fn tokens_produced(&self) -> u64 {
        self.produced.load(Ordering::SeqCst)
    }

    /// Generations that stopped because their stream was dropped.
    pub fn generations_cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Backend for ScriptedEngine {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn model(&self) -> Option<LoadedModel> {
        self.ready.load(Ordering::SeqCst).then(|| LoadedModel {
            info: Arc::clone(&self.info),
            decoding: Decoding::Own,
            slots: self.slots.map_or(Slots::Unlimited, Slots::Sequences),
            applies_stops: false,
            passes_agents: false,
            template: crate::engine::TemplateTraits::default(),
            fleet: None,
        })
    }

    /// One prompt token per word.
    async fn count(&self, request: &super::GenerationRequest) -> Result<PromptTokens, EngineError> {
        let ids = self
            .tokenize(TokenizeRequest::as_generated(request.prompt.clone()))
            .await?
            .ids;
        Ok(PromptTokens {
            count: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            ids: None,
            estimated: false,
            opens_thinking: false,
        })
    }

    /// One token per word, whatever the flags; ids from [`token_id`].
    async fn tokenize(&self, request: TokenizeRequest) -> Result<Tokenized, EngineError> {
        if !self.ready.load(Ordering::SeqCst) {
            return Err(EngineError::NotReady);
        }
        let texts: Vec<&str> = match &request.prompt {
            Prompt::Chat(messages) => messages.iter().map(|m| m.content.as_str()).collect(),
            Prompt::Text(text) => vec![text.as_str()],
            Prompt::Tokens(ids) => {
                return Ok(Tokenized {
                    ids: ids.clone(),
                    spellings: None,
                    pieces: None,
                })
            }
        };
        let ids = texts
            .iter()
            .flat_map(|t| t.split_whitespace())
            .map(token_id)
            .collect();
        Ok(Tokenized {
            ids,
            spellings: None,
            pieces: None,
        })
    }

    async fn detokenize(&self, _ids: Vec<u32>, _skip: bool) -> Result<String, EngineError> {
        Err(EngineError::Unsupported {
            param: "tokens".into(),
            reason: "the scripted engine keeps no vocabulary".into(),
        })
    }

    async fn run(&self, job: Job) -> Result<Generation, EngineError> {
        let Job {
            request,
            prompt,
            claim,
            reported,
            ..
        } = job;
        if request.response_format != ResponseFormat::Text {
            return Err(EngineError::Unsupported {
                param: super::front::format_param(&request.response_format).into(),
                reason: "the scripted engine has no grammar".into(),
            });
        }
        let prompt_tokens = prompt.count;
        let last = match &request.prompt {
            Prompt::Chat(messages) => messages.last().map(|m| m.content.as_str()),
            Prompt::Text(text) => Some(text.as_str()),
            Prompt::Tokens(_) => None,
        };
        let script = last
            .and_then(|m| self.by_prompt.get(m))
            .unwrap_or(&self.default_script)
            .clone();
        if !script.queued.is_zero() {
            tokio::time::sleep(script.queued).await;
        }
        let started = std::time::Instant::now();
        let (tx, rx) = mpsc::channel(16);
        let produced = Arc::clone(&self.produced);
        let cancelled = Arc::clone(&self.cancelled);
        tokio::spawn(async move {
            let _claim = claim;
            let mut completion_tokens = 0u32;
            let mut reason = script.finish;
            for step in script.steps {
                if completion_tokens >= request.budget.tokens() {
                    reason = FinishReason::Length;
                    break;
                }
                match step {
                    Step::Token { text, delay } => {
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        let ids = vec![token_id(&text)];
                        let logprobs = vec![scripted_logprob(&text, request.top_logprobs)];
                        let at = std::time::Instant::now();
                        let event = EngineEvent::Token {
                            text,
                            ids,
                            logprobs,
                            at,
                        };
                        if tx.send(event).await.is_err() {
                            cancelled.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        produced.fetch_add(1, Ordering::SeqCst);
                        completion_tokens += 1;
                    }
                    Step::Fail { error, delay } => {
                        tokio::time::sleep(delay).await;
                        let _ = tx.send(EngineEvent::Failed(error)).await;
                        return;
                    }
                }
            }
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
                cached_tokens: None,
                reasoning_tokens: None,
            };
            let _ = tx.send(EngineEvent::Finished { reason, usage }).await;
        });
        Ok(Generation {
            prompt_tokens,
            started,
            events: rx,
            reported,
        })
    }
}

/// The scripted log-probabilities: a token of n bytes has log-probability -n/10, and its
/// alternatives (`alt1`, `alt2`...) each 1 less than the one before.
pub fn scripted_logprob(text: &str, top: Option<u8>) -> TokenLogprob {
    let logprob = -(text.len() as f32) / 10.0;
    let token = TokenText::from_bytes(text.as_bytes().to_vec());
    let n = usize::from(top.unwrap_or(0));
    let mut alternatives = vec![(token.clone(), logprob)];
    alternatives.extend((1..n).map(|i| {
        (
            TokenText::from_bytes(format!("alt{i}").into_bytes()),
            logprob - i as f32,
        )
    }));
    alternatives.truncate(n);
    TokenLogprob {
        sampled: None,
        token,
        logprob,
        top: alternatives,
    }
}

/// The scripted "vocabulary": equal texts get equal ids.
pub fn token_id(text: &str) -> u32 {
    text.bytes()
        .fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
}

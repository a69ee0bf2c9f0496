//! The front every engine sits behind: what a served model does with a request before
//! and around its backend, written once. [`Front::prepare`] counts the prompt (the
//! backend's work), fits the budget into the context, runs the checks that only the
//! fitted budget and the model's vocabulary allow, and compiles `response_format`;
//! [`Front::start`] waits for a slot in the [`SlotQueue`] and hands the [`Job`] to the
//! backend. The HTTP layer, the benchmarks and the tests all go through here, so the
//! scripted engine of the tests meets the rules the real engines do.

use std::sync::{Arc, OnceLock};

use super::backend::{
    Backend, Decoding, EndpointView, FleetView, Job, LoadedModel, PromptTokens, TemplateTraits,
    Tokenized,
};
use super::grammar::Grammar;
use super::reasoning::{ReasoningFormat, Splitter};
use super::slots::SlotQueue;
use super::slots::Slots;
use super::toolcall::{self, ToolFormat, ToolPlan};

use super::{
    EngineError, EngineEvent, EngineLoad, Generation, GenerationRequest, KvCacheUse, ModelInfo,
    Readiness, Reported, ResponseFormat, Sampling, TokenStream, TokenizeRequest,
};

/// A served model's engine, as everything above the engines uses it.
#[derive(Clone)]
pub struct Front {
    backend: Arc<dyn Backend>,
    /// Built when the model is first seen loaded: its slots are known then.
    queue: Arc<OnceLock<SlotQueue>>,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("engine", &self.backend.name())
            .finish_non_exhaustive()
    }
}

impl From<Arc<dyn Backend>> for Front {
    fn from(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            queue: Arc::default(),
        }
    }
}

/// Any engine, as its front.
impl<B: Backend> From<Arc<B>> for Front {
    fn from(engine: Arc<B>) -> Self {
        Self::from(engine as Arc<dyn Backend>)
    }
}

/// A request whose prompt is counted and whose budget is fitted into the context: what
/// it will cost is known before it waits for a slot.
#[derive(Debug)]
pub struct Prepared {
    pub request: GenerationRequest,
    pub prompt: PromptTokens,
    grammar: Option<Grammar>,
    /// How to read a tool call back from an engine in this process, for a request with
    /// tools ([`toolcall`](super::toolcall)).
    tool_plan: Option<ToolPlan>,
    /// How to split a model's thinking out of its answer, for an engine in this process
    /// ([`reasoning`](super::reasoning)); `None`: the answer is left whole.
    thinking: Option<Splitter>,
    /// Where the backend's account of the answer will be, from before it starts (a
    /// request an upstream refuses still says which endpoints it tried).
    pub reported: Arc<Reported>,
}

impl Prepared {
    /// Tokens of the prompt as the model sees it (an upstream's: the gateway's estimate).
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt.count
    }

    /// The most tokens the request can take: its prompt and its whole completion budget.
    pub fn token_budget(&self) -> u32 {
        self.prompt
            .count
            .saturating_add(self.request.budget.tokens())
    }
}

impl Front {
    /// Which engine this is (`llamacpp`, `mistral`, `upstream`, `scripted`).
    pub fn name(&self) -> &'static str {
        self.backend.name()
    }

    /// The model's facts, or `None` while it is loading.
    pub fn model_info(&self) -> Option<Arc<ModelInfo>> {
        self.backend.model().map(|m| m.info)
    }

    /// Whether requests can be served now.
    pub fn readiness(&self) -> Readiness {
        self.backend.health()
    }

    /// Each endpoint of an upstream model as `/ready` and `/stats` show it; empty for an
    /// engine in this process.
    pub fn endpoints(&self) -> Vec<EndpointView> {
        self.fleet().map(|f| f.endpoints()).unwrap_or_default()
    }

    /// How an upstream model's requests are spread over its endpoints; `None` for an
    /// engine in this process.
    pub fn routing_policy(&self) -> Option<&'static str> {
        self.fleet().map(|f| f.policy())
    }

    fn fleet(&self) -> Option<Arc<dyn FleetView>> {
        self.backend.model()?.fleet
    }

    /// The sequences the engine decodes at once, where it has slots in this process.
    pub fn sequences(&self) -> Option<usize> {
        match self.backend.model()?.slots {
            Slots::Sequences(n) => Some(n),
            Slots::Unlimited | Slots::Elsewhere => None,
        }
    }

    /// The tokens a sequence ends on (what `ignore_eos` keeps from being picked), where
    /// the gateway picks tokens; `None` for an engine that samples on its own.
    pub fn end_tokens(&self) -> Option<Arc<[u32]>> {
        match self.backend.model()?.decoding {
            Decoding::Picked { end_tokens, .. } => Some(end_tokens),
            Decoding::Own => None,
        }
    }

    /// Sequences running and requests waiting for a slot now.
    pub fn load(&self) -> EngineLoad {
        self.queue.get().map(SlotQueue::load).unwrap_or_default()
    }

    /// The KV cache the running sequences hold, where the engine's cache is in this
    /// process (an engine with slots).
    pub fn kv_cache(&self) -> Option<KvCacheUse> {
        let model = self.backend.model()?;
        self.queue(&model).kv_cache(model.info.context_length)
    }

    /// Whether [`Front::start`] waits in the gateway's queue for a slot (which the
    /// queue timeout bounds); `false` for an upstream, whose first byte has its own.
    pub fn waits_in_queue(&self) -> bool {
        self.backend
            .model()
            .is_none_or(|m| m.slots != Slots::Elsewhere)
    }

    /// The stop sequences the gateway's stop screen must cut answers at: none where
    /// the engine applies them itself.
    pub fn stops_to_screen(&self, sampling: &Sampling) -> Vec<String> {
        if self.backend.model().is_some_and(|m| m.applies_stops) {
            Vec::new()
        } else {
            sampling.stop.clone()
        }
    }

    fn queue<'a>(&'a self, model: &LoadedModel) -> &'a SlotQueue {
        self.queue.get_or_init(|| SlotQueue::new(model.slots))
    }

    /// Counts the prompt, fits the completion budget into the context and checks what
    /// the fitted budget and the vocabulary allow. Errors: the model is not loaded, the
    /// prompt or the budget does not fit, a parameter the model cannot serve.
    pub async fn prepare(&self, mut request: GenerationRequest) -> Result<Prepared, EngineError> {
        let model = self.backend.model().ok_or(EngineError::NotReady)?;
        // An upstream takes tools as they are; the gateway's picker holds a call to the
        // generic format; any other engine refuses them.
        let tool_plan = match (&model.decoding, model.passes_agents) {
            (_, true) => None,
            (Decoding::Picked { .. }, false) => {
                toolcall::plan(&mut request, model.template.tool_format)?
            }
            (Decoding::Own, false) => None,
        };
        if !model.passes_agents {
            text_only(&request, model.template)?;
        }
        let prompt = self.backend.count(&request).await?;
        // A tool call's answer a grammar holds has no thinking in it.
        let free = tool_plan.is_none() || request.response_format == ResponseFormat::Text;
        let thinking = match (&model.decoding, model.passes_agents) {
            (Decoding::Picked { .. }, false) if free => {
                let format = request.reasoning_format.unwrap_or(ReasoningFormat::Auto);
                let opened = prompt.opens_thinking;
                format
                    .splits(model.template.thinks, opened)
                    .then(|| Splitter::new(opened))
            }
            _ => None,
        };
        if !prompt.estimated {
            let context = model.info.context_length;
            let asked = request.budget;
            request.budget = asked.fit(prompt.count, context, request.prompt.param())?;
            let min_tokens = request.sampling.min_tokens;
            if min_tokens > request.budget.tokens() {
                return Err(EngineError::InvalidParameter {
                    param: "min_tokens".into(),
                    message: format!(
                        "{min_tokens} is more than the {} tokens the context leaves for the completion",
                        request.budget.tokens()
                    ),
                });
            }
        }
        let grammar = match &model.decoding {
            Decoding::Picked { .. } => picked::check(&request, &model.decoding).await?,
            // An engine that picks its own tokens (an upstream) reports its model's
            // log-probabilities; the gateway cannot tell what it drew from.
            Decoding::Own
                if request.sampling.post_sampling_probs && request.top_logprobs.is_some() =>
            {
                return Err(EngineError::Unsupported {
                    param: "post_sampling_probs".into(),
                    reason: "this model picks its own tokens (an upstream) and reports its \
                             model's log-probabilities; ask without post_sampling_probs"
                        .into(),
                })
            }
            Decoding::Own => None,
        };
        Ok(Prepared {
            request,
            prompt,
            grammar,
            tool_plan,
            thinking,
            reported: Arc::default(),
        })
    }

    /// Waits for a slot and starts generating. Errors here happen before any token;
    /// errors during generation arrive as [`EngineEvent::Failed`](super::EngineEvent::Failed).
    pub async fn start(&self, prepared: Prepared) -> Result<Generation, EngineError> {
        let model = self.backend.model().ok_or(EngineError::NotReady)?;
        let claim = self.queue(&model).claim().await?;
        let Prepared {
            request,
            prompt,
            grammar,
            tool_plan,
            thinking,
            reported,
        } = prepared;
        let mut generation = self
            .backend
            .run(Job {
                request,
                prompt,
                grammar,
                claim,
                reported,
            })
            .await?;
        if let Some(mut splitter) = thinking {
            generation.events = read_through(generation.events, move |e| splitter.on_event(e));
        }
        if let Some(plan) = tool_plan {
            let events = generation.events;
            generation.events = match plan.format.syntax() {
                Some(syntax) => {
                    let mut reading = toolcall::tagged::Reading::new(plan, syntax);
                    read_through(events, move |e| reading.on_event(e))
                }
                None => {
                    let mut reading = toolcall::stream::Reading::new(plan);
                    read_through(events, move |e| reading.on_event(e))
                }
            };
        }
        Ok(generation)
    }

    /// Prepares and starts a request in one go (benchmarks and tests that have no use
    /// for the step between).
    pub async fn run(&self, request: GenerationRequest) -> Result<Generation, EngineError> {
        let prepared = self.prepare(request).await?;
        self.start(prepared).await
    }

    /// The token ids of a prompt, rendered as `request` says.
    pub async fn tokenize(&self, request: TokenizeRequest) -> Result<Tokenized, EngineError> {
        self.backend.model().ok_or(EngineError::NotReady)?;
        self.backend.tokenize(request).await
    }

    /// The text of token ids.
    pub async fn detokenize(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, EngineError> {
        self.backend.model().ok_or(EngineError::NotReady)?;
        self.backend.detokenize(ids, skip_special_tokens).await
    }
}

/// The parameter a client holds the answer's shape with.
pub(crate) fn format_param(format: &ResponseFormat) -> &'static str {
    match format {
        ResponseFormat::Grammar(_) => super::grammar::GRAMMAR_PARAM,
        _ => "response_format",
    }
}

/// The engine's events read through `read` (which makes zero or more of each), in a task
/// between the engine and the request that ends (dropping the engine's stream, so
/// cancelling it) when the request's side goes away or the answer has ended.
fn read_through(
    mut events: TokenStream,
    mut read: impl FnMut(EngineEvent) -> Vec<EngineEvent> + Send + 'static,
) -> TokenStream {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let last = matches!(event, EngineEvent::Finished { .. } | EngineEvent::Failed(_));
            for out in read(event) {
                if tx.send(out).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    rx
}

/// Refuses what an engine that does not pass them on (one in this process) cannot
/// serve yet, naming it: tools and tool messages, media parts, participant names, and
/// `reasoning_effort` and `chat_template_kwargs` where its chat template takes none (an
/// upstream model gets them all as they were sent).
fn text_only(request: &GenerationRequest, template: TemplateTraits) -> Result<(), EngineError> {
    let refuse = |param: String, what: &str| {
        Err(EngineError::Unsupported {
            param,
            reason: format!(
                "{what} are not served by the engine in this process; a model served \
                 from an upstream (vLLM, llama-server --jinja, a hosted API) gets them"
            ),
        })
    };
    // A template that renders tools renders the calls and results of the history too.
    let renders_tools = template.tool_format != ToolFormat::Generic;
    if request.tools.is_some() && !renders_tools {
        let param = if request.tools.as_ref().is_some_and(|t| t.legacy) {
            "functions"
        } else {
            "tools"
        };
        return refuse(param.into(), "tool calls");
    }
    if request.reasoning_effort.is_some() && !template.thinking_switch {
        return Err(EngineError::Unsupported {
            param: "reasoning_effort".into(),
            reason: "this model's chat template has no thinking switch (it reads neither \
                     reasoning_effort nor enable_thinking); a reasoning model's template \
                     or an upstream takes it"
                .into(),
        });
    }
    if request.template_kwargs.is_some() && !template.takes_kwargs {
        return Err(EngineError::Unsupported {
            param: "chat_template_kwargs".into(),
            reason: "this engine renders its chat template itself, without variables from \
                     the request; llama.cpp with the file's Jinja template or an upstream \
                     takes them"
                .into(),
        });
    }
    let super::Prompt::Chat(messages) = &request.prompt else {
        return Ok(());
    };
    for (i, m) in messages.iter().enumerate() {
        if m.role == super::Role::Tool && !renders_tools {
            return refuse(format!("messages[{i}].role"), "tool results");
        }
        if !m.tool_calls.is_empty() && !renders_tools {
            return refuse(format!("messages[{i}].tool_calls"), "tool calls");
        }
        if m.name.is_some() && !(renders_tools && m.role == super::Role::Tool) {
            return refuse(format!("messages[{i}].name"), "participant names");
        }
        let media = m.parts.iter().enumerate().find_map(|(p, part)| match part {
            super::ContentPart::Media(media) => Some((p, media.kind)),
            super::ContentPart::Text(_) => None,
        });
        if let Some((p, kind)) = media {
            let param = format!("messages[{i}].content[{p}].{}", kind.as_str());
            return refuse(param, &format!("'{}' parts", kind.as_str()));
        }
    }
    Ok(())
}

/// The checks of a model whose tokens the gateway picks, and its grammar.
mod picked {
    use super::*;

    /// Refuses what the model's vocabulary cannot serve, and compiles
    /// `response_format` (off the async threads: a large schema takes a while).
    pub(super) async fn check(
        request: &GenerationRequest,
        decoding: &Decoding,
    ) -> Result<Option<Grammar>, EngineError> {
        let Decoding::Picked {
            vocabulary,
            vocab_size,
            end_tokens,
            ..
        } = decoding
        else {
            return Ok(None);
        };
        // Before the engine reads them: an id past the vocabulary is not a token, and
        // without the vocabulary the gateway cannot tell.
        if let super::super::Prompt::Tokens(ids) = &request.prompt {
            if vocabulary.is_none() {
                return Err(EngineError::Unsupported {
                    param: "prompt".into(),
                    reason: "token ids need a tokenizer the gateway reads; send text".into(),
                });
            }
            super::super::known_token_ids("prompt", ids, |id| id < *vocab_size)?;
        }
        let stop_token_ids = &request.sampling.stop_token_ids;
        if !stop_token_ids.is_empty() && end_tokens.is_empty() {
            return Err(EngineError::Unsupported {
                param: "stop_token_ids".into(),
                reason: "this model's file names no end-of-sequence token to stop with".into(),
            });
        }
        super::super::known_token_ids("stop_token_ids", stop_token_ids, |id| id < *vocab_size)?;
        if request.top_logprobs.is_some() && vocabulary.is_none() {
            return Err(EngineError::Unsupported {
                param: "logprobs".into(),
                reason: "this model's tokenizer is not one the gateway can spell tokens with"
                    .into(),
            });
        }
        match (vocabulary, &request.response_format) {
            (_, ResponseFormat::Text) => Ok(None),
            (Some(vocabulary), format) => {
                let (vocabulary, format) = (Arc::clone(vocabulary), format.clone());
                tokio::task::spawn_blocking(move || vocabulary.compile(&format))
                    .await
                    .map_err(|e| EngineError::Internal(e.to_string()))?
            }
            (None, format) => Err(EngineError::Unsupported {
                param: format_param(format).into(),
                reason: "this model's tokenizer is not one the gateway can build a grammar for"
                    .into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::scripted::{Script, ScriptedEngine};
    use crate::engine::{Budget, EngineEvent, Prompt, Sampling};

    /// The scripted engine (one token per word) with a 10-token context, each answer
    /// two tokens 50 ms apart.
    fn front(slots: Option<usize>) -> Front {
        let info = ModelInfo {
            id: "m".into(),
            context_length: 10,
            ..ModelInfo::default()
        };
        let script = Script::tokens(&["a", "b"], Duration::from_millis(50));
        let engine = ScriptedEngine::new(info, script);
        let engine = match slots {
            Some(n) => engine.with_slots(n),
            None => engine,
        };
        Front::from(Arc::new(engine))
    }

    fn request(words: &str, budget: Budget, min_tokens: u32) -> GenerationRequest {
        GenerationRequest {
            prompt: Prompt::user(words),
            budget,
            sampling: Sampling {
                min_tokens,
                ..Sampling::default()
            },
            ..GenerationRequest::default()
        }
    }

    #[tokio::test]
    async fn the_budget_is_fitted_and_checked_after_the_fit_for_every_engine() {
        let front = front(None);
        let fitted = front
            .prepare(request("one two three four", Budget::Cap(100), 0))
            .await
            .unwrap();
        assert_eq!(fitted.prompt_tokens(), 4);
        assert_eq!(
            fitted.request.budget,
            Budget::Cap(6),
            "what the context leaves"
        );
        assert_eq!(fitted.token_budget(), 10);

        let too_long = front
            .prepare(request("one two three four", Budget::Asked(7), 0))
            .await
            .unwrap_err();
        assert!(matches!(
            too_long,
            EngineError::ContextLengthExceeded {
                prompt_tokens: 4,
                max_tokens: Some(7),
                context_length: 10,
                prompt_param: "messages",
            }
        ));

        let unreachable = front
            .prepare(request("one two three four", Budget::Cap(100), 7))
            .await
            .unwrap_err();
        assert_eq!(
            unreachable,
            EngineError::InvalidParameter {
                param: "min_tokens".into(),
                message: "7 is more than the 6 tokens the context leaves for the completion".into(),
            }
        );
    }

    #[tokio::test]
    async fn requests_wait_for_a_slot_and_hold_it_until_their_answer_ends() {
        let bounded = tokio::time::timeout(Duration::from_secs(10), one_slot_for_two());
        bounded
            .await
            .expect("the second request ran once the first ended");
    }

    async fn one_slot_for_two() {
        let front = front(Some(1));
        assert!(front.waits_in_queue());
        let mut first = front.run(request("hi", Budget::Cap(8), 0)).await.unwrap();
        assert_eq!(
            front.load(),
            EngineLoad {
                running: 1,
                waiting: 0
            }
        );
        assert_eq!(front.kv_cache().unwrap().capacity_tokens, 10);

        let second = tokio::spawn({
            let front = front.clone();
            async move { front.run(request("hi", Budget::Cap(8), 0)).await }
        });
        while front.load().waiting == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            front.load(),
            EngineLoad {
                running: 1,
                waiting: 1
            }
        );
        while let Some(event) = first.events.recv().await {
            if matches!(event, EngineEvent::Finished { .. }) {
                break;
            }
        }
        drop(first);
        let mut second = second.await.unwrap().unwrap();
        while second.events.recv().await.is_some() {}
        while front.load() != EngineLoad::default() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

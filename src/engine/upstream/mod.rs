//! The upstream engine: any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's
//! server, Ollama, a hosted API) behind the gateway, streamed through.
//!
//! The gateway validates the client's request exactly as for its own engine, then
//! forwards it, always streamed with `include_usage` (whatever the client asked), so it
//! stamps every chunk on its own clock and counts tokens from the upstream's own usage.
//! It also asks for each token's log-probability (for the confidence figures and an
//! exact repetition rate) unless `logprobs = false`; a client that did not ask gets
//! none back. Stop sequences, seeds, sampling parameters, `response_format` and vLLM's
//! extensions are passed on; what the upstream refuses comes back naming the parameter.
//!
//! - [`wire`]: the request body and the chunks' shapes;
//! - [`stream`]: one answer read to its end, with its timeouts and the model check;
//! - [`fault`]: every way it can fail, each with its `error_type`;
//! - [`tokens`]: token ids for the repetition rate, and the model's tokenizer.
//!
//! A background probe (`GET <url>/models`) keeps [`Backend::health`] current, and
//! each request's own outcome updates it too: `/ready` reports each upstream, and a
//! down upstream leaves the gateway's other models serving.

pub mod attempts;
pub mod config;
pub mod fault;
pub mod fleet;
pub mod opening;
pub mod stream;
pub mod tokens;
pub mod wire;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokenizers::Tokenizer;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::{
    Backend, Decoding, EngineError, Generation, Job, LoadedModel, ModelInfo, Prompt, PromptTokens,
    Readiness, Slots, TokenizeRequest, Tokenized, UpstreamFacts,
};
use crate::clock::SharedClock;
use crate::engine::upstream::config::UpstreamConfig;
pub use fault::Fault;
use fleet::discovery::{self, Connections};
use fleet::{EndpointView, Fleet};

/// Engine name in the system fingerprint of an upstream model.
pub const ENGINE_NAME: &str = "upstream";

/// What the engine and each request's attempts share.
pub(crate) struct Shared {
    config: UpstreamConfig,
    fleet: Arc<Fleet>,
    info: Arc<ModelInfo>,
    tokenizer: Option<Arc<Tokenizer>>,
    /// What the answers' moments are read from.
    clock: SharedClock,
    /// The upstream refused to return log-probabilities the client had not asked for:
    /// the gateway stops asking (the confidence figures are then absent).
    logprobs_refused: AtomicBool,
}

pub struct UpstreamEngine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for UpstreamEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamEngine")
            .field("url", &self.shared.info.upstream)
            .field("fleet", &self.shared.fleet)
            .finish_non_exhaustive()
    }
}

impl UpstreamEngine {
    /// The engine for model `id` served by `config`'s upstream, with its endpoints'
    /// probe (and, as configured, their DNS refresh and metrics scrape) running in the
    /// background while the engine lives; its answers' moments are read from `clock`,
    /// the gateway's. Errors: the tokenizer cannot be read.
    pub fn start(
        id: &str,
        config: UpstreamConfig,
        clock: SharedClock,
    ) -> anyhow::Result<Arc<Self>> {
        let tokenizer = match &config.tokenizer {
            Some(path) => Some(Arc::new(tokens::load_tokenizer(path).map_err(|e| {
                anyhow::anyhow!("the tokenizer of model '{id}' ({}): {e:#}", path.display())
            })?)),
            None => None,
        };
        let urls: Vec<String> = config
            .urls
            .iter()
            .map(|u| fault::strip_credentials(u))
            .collect();
        let url = urls.join(",");
        let info = ModelInfo {
            id: id.to_owned(),
            context_length: config.context_length,
            system_fingerprint: crate::fingerprint::system_fingerprint(
                &url,
                &format!("{ENGINE_NAME} {}", config.model),
                ENGINE_NAME,
                &Default::default(),
            ),
            sha256: String::new(),
            quant: String::new(),
            device: ENGINE_NAME.to_owned(),
            accelerator: Default::default(),
            upstream: Some(UpstreamFacts {
                url,
                model: config.model.clone(),
            }),
            loaded_at: crate::clock::unix_seconds(std::time::SystemTime::now()),
        };
        let connections = Connections {
            connect_timeout: config.connect_timeout,
        };
        let fleet = discovery::start(config.urls.clone(), config.fleet.clone(), connections);
        let shared = Arc::new(Shared {
            config,
            fleet,
            info: Arc::new(info),
            tokenizer,
            clock,
            logprobs_refused: AtomicBool::new(false),
        });
        tokio::spawn(probe(Arc::downgrade(&shared)).in_current_span());
        if shared.fleet.config.canary.is_some() {
            tokio::spawn(canary(Arc::downgrade(&shared)).in_current_span());
        }
        Ok(Arc::new(Self { shared }))
    }
}

impl UpstreamEngine {
    /// Its fleet, while the engine lives: what the shared state syncs with other
    /// gateways (the `state` module).
    pub fn fleet(&self) -> std::sync::Weak<Fleet> {
        Arc::downgrade(&self.shared.fleet)
    }

    /// The served model's id.
    pub fn model_id(&self) -> &str {
        &self.shared.info.id
    }
}

/// Probes every endpoint each `probe_interval` while the engine lives. Any HTTP answer
/// but a refusal of the credentials means it is there: a server without `/models`
/// still serves, and one failing with 5xx is reached (its errors are counted per
/// request, and eject it after `eject_after_failures`). One that cannot be reached is
/// out of rotation at once.
async fn probe(shared: Weak<Shared>) {
    loop {
        let Some(this) = shared.upgrade() else {
            return;
        };
        let interval = this.config.probe_interval;
        let timeout = this.config.connect_timeout + Duration::from_secs(5);
        let probes = this.fleet.endpoints().into_iter().map(|endpoint| {
            let this = Arc::clone(&this);
            async move {
                let mut call = endpoint
                    .client
                    .get(format!("{}/models", endpoint.url))
                    .timeout(timeout);
                if let Some(key) = &this.config.api_key {
                    call = call.bearer_auth(key.expose());
                }
                // The probe's own wait is bounded; a silent upstream is as unreachable
                // as one that refuses the connection.
                let began = Instant::now();
                let fault = match call.send().await {
                    Ok(answer) if matches!(answer.status().as_u16(), 401 | 403) => {
                        Some(Fault::Auth {
                            status: answer.status().as_u16(),
                        })
                    }
                    Ok(_) => None,
                    Err(error) => Some(Fault::Unreachable(
                        Fault::from_transport(&error, began.elapsed()).to_string(),
                    )),
                };
                this.fleet.probed(&endpoint, fault.as_ref(), Instant::now());
            }
        });
        futures_util::future::join_all(probes).await;
        drop(this);
        tokio::time::sleep(interval).await;
    }
}

/// The drift canary's rounds ([`fleet::canary`]), while the engine lives: each prompt to
/// every endpoint, greedy and seeded, out of band (not counted as requests).
async fn canary(shared: Weak<Shared>) {
    loop {
        let Some(this) = shared.upgrade() else {
            return;
        };
        let Some(config) = this.fleet.config.canary.clone() else {
            return;
        };
        drop(this);
        tokio::time::sleep(config.every).await;
        let Some(this) = shared.upgrade() else {
            return;
        };
        let endpoints = this.fleet.endpoints();
        if endpoints.len() < 2 {
            // No peers to compare with: no verdict stands.
            this.fleet.canaries.set(Vec::new());
            continue;
        }
        let answers = endpoints.iter().map(|endpoint| {
            let this = &this;
            let config = &config;
            async move {
                let mut answers = Vec::with_capacity(config.prompts.len());
                for prompt in &config.prompts {
                    answers.push(ask_canary(this, endpoint, prompt, config.max_tokens).await);
                }
                (endpoint.label.clone(), answers)
            }
        });
        let round = futures_util::future::join_all(answers).await;
        let views = fleet::canary::judge(
            &config.prompts,
            &round,
            crate::clock::unix_seconds(std::time::SystemTime::now()),
            &this.fleet.canaries,
        );
        for (label, view) in views.iter().filter(|(_, v)| v.drifting) {
            tracing::warn!(
                model = %this.info.id,
                endpoint = %label,
                prompt = %view.differing[0].prompt,
                answer = %view.differing[0].answer,
                majority = %view.differing[0].majority,
                "A replica answers the drift canary differently from the majority of its peers."
            );
        }
        this.fleet.canaries.set(views);
    }
}

/// One canary prompt at one endpoint: its answer, or `None` when it gave none.
async fn ask_canary(
    shared: &Shared,
    endpoint: &fleet::Endpoint,
    prompt: &str,
    max_tokens: u32,
) -> Option<fleet::canary::Answer> {
    let config = &shared.config;
    let body = serde_json::json!({
        "model": config.model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "seed": fleet::canary::SEED,
        config.max_tokens_param.as_str(): max_tokens,
        // Streamed, as the gateway asks every upstream: some serve nothing else.
        "stream": true,
    });
    let mut call = endpoint
        .client
        .post(format!("{}/chat/completions", endpoint.url))
        .timeout(config.first_byte_timeout + Duration::from_secs(30))
        .json(&body);
    if let Some(key) = &config.api_key {
        call = call.bearer_auth(key.expose());
    }
    let response = call.send().await.ok()?.error_for_status().ok()?;
    let mut events = sse_stream::SseByteStream::new(response.bytes_stream());
    let (mut text, mut system_fingerprint) = (String::new(), None);
    while let Some(event) = futures_util::StreamExt::next(&mut events).await {
        let data = event.ok()?.data.unwrap_or_default();
        if data.trim() == "[DONE]" {
            return Some(fleet::canary::Answer {
                text,
                system_fingerprint,
            });
        }
        let Ok(chunk) = serde_json::from_str::<serde_json::Value>(&data) else {
            continue;
        };
        if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(delta);
        }
        if let Some(fingerprint) = chunk["system_fingerprint"].as_str() {
            system_fingerprint = Some(fingerprint.to_owned());
        }
    }
    // Cut before `[DONE]`: no answer to judge.
    None
}

#[async_trait]
impl Backend for UpstreamEngine {
    fn name(&self) -> &'static str {
        "upstream"
    }

    fn model(&self) -> Option<LoadedModel> {
        Some(LoadedModel {
            info: Arc::clone(&self.shared.info),
            decoding: Decoding::Own,
            slots: Slots::Elsewhere,
            applies_stops: true,
            passes_agents: true,
            template: crate::engine::TemplateTraits::default(),
            fleet: Some(Arc::clone(&self.shared.fleet) as Arc<dyn fleet::FleetView>),
        })
    }

    /// Ready while any endpoint is reachable and not failing; unreachable when none can
    /// be reached (why the first cannot); down when every one fails (hangs, answers 5xx).
    fn health(&self) -> Readiness {
        let fleet = &self.shared.fleet;
        if let Some(kind) = fleet.unreachable() {
            return Readiness::Unreachable(kind.to_owned());
        }
        match fleet.all_failing(Instant::now()) {
            Some(why) => Readiness::Down(why),
            None => Readiness::Ready,
        }
    }

    /// The gateway's estimate (the upstream renders and counts the prompt itself, and
    /// its count comes back in the usage); the context is the upstream's to check.
    async fn count(
        &self,
        request: &crate::engine::GenerationRequest,
    ) -> Result<PromptTokens, EngineError> {
        let texts: Vec<&str> = match &request.prompt {
            Prompt::Chat(messages) => messages.iter().map(|m| m.content.as_str()).collect(),
            Prompt::Text(text) => vec![text.as_str()],
            // The upstream reads these ids as they are; the context is still its to
            // check (the gateway may not know it).
            Prompt::Tokens(ids) => {
                return Ok(PromptTokens {
                    count: u32::try_from(ids.len()).unwrap_or(u32::MAX),
                    ids: None,
                    estimated: true,
                    opens_thinking: false,
                })
            }
        };
        Ok(PromptTokens {
            count: tokens::estimate(self.shared.tokenizer.as_deref(), &texts),
            ids: None,
            estimated: true,
            opens_thinking: false,
        })
    }

    /// With a tokenizer: a text prompt's ids (a chat needs the upstream's template,
    /// which the gateway does not have).
    async fn tokenize(&self, request: TokenizeRequest) -> Result<Tokenized, EngineError> {
        let tokenizer = self.tokenizer(request.prompt.param())?;
        let text = match &request.prompt {
            Prompt::Text(text) => text,
            Prompt::Tokens(ids) => {
                return Ok(Tokenized {
                    ids: ids.clone(),
                    spellings: None,
                    pieces: None,
                })
            }
            Prompt::Chat(_) => {
                return Err(EngineError::Unsupported {
                    param: "messages".into(),
                    reason: "an upstream model's chat template is the upstream's; send a prompt"
                        .into(),
                })
            }
        };
        let ids = tokenizer
            .encode(text.as_str(), request.add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let spellings = ids.iter().map(|&id| tokenizer.id_to_token(id)).collect();
        // Decoding one id at a time loses bytes (part of a character) and leading spaces,
        // so an upstream's pieces are not offered.
        Ok(Tokenized {
            ids,
            spellings,
            pieces: None,
        })
    }

    async fn detokenize(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, EngineError> {
        let tokenizer = self.tokenizer("tokens")?;
        crate::engine::known_token_ids("tokens", &ids, |id| tokenizer.id_to_token(id).is_some())?;
        tokenizer
            .decode(&ids, skip_special_tokens)
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    async fn run(&self, job: Job) -> Result<Generation, EngineError> {
        let Job {
            request,
            prompt,
            claim,
            reported,
            ..
        } = job;
        let (tx, rx) = mpsc::channel(32);
        let (opening, waiting) = opening::channel();
        let started = Instant::now();
        let job = attempts::RequestAttempts {
            shared: Arc::clone(&self.shared),
            request,
            prompt_tokens: prompt.count,
            reported: Arc::clone(&reported),
            tx,
            opening,
        };
        // The claim counts the request as running until its last attempt ends.
        tokio::spawn(
            async move {
                let _claim = claim;
                attempts::run(job).await;
            }
            .in_current_span(),
        );
        // A refusal (or every endpoint failing) within the window is answered as the
        // HTTP error it is; after it the stream has begun and a failure is its error
        // frame.
        if let Some(fault) = waiting.fault_within(opening::OPENING_WINDOW).await {
            tracing::info!(error = %fault, error_type = fault.kind().as_str(), "The upstream could not take the request.");
            return Err(EngineError::Upstream(fault));
        }
        Ok(Generation {
            prompt_tokens: prompt.count,
            started,
            events: rx,
            reported,
        })
    }
}

impl UpstreamEngine {
    /// The configured tokenizer, or why a request for `param` cannot be served.
    fn tokenizer(&self, param: &str) -> Result<&Tokenizer, EngineError> {
        self.shared
            .tokenizer
            .as_deref()
            .ok_or_else(|| EngineError::Unsupported {
                param: param.into(),
                reason: "this upstream model has no tokenizer configured (models.tokenizer)".into(),
            })
    }
}

impl fleet::FleetView for Fleet {
    fn policy(&self) -> &'static str {
        self.config.policy.as_str()
    }

    fn endpoints(&self) -> Vec<EndpointView> {
        self.views(Instant::now())
    }
}

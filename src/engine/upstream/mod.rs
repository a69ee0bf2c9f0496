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
//! A background probe (`GET <url>/models`) keeps [`Engine::readiness`] current, and
//! each request's own outcome updates it too: `/ready` reports each upstream, and a
//! down upstream leaves the gateway's other models serving.

pub mod config;
pub mod fault;
pub mod stream;
pub mod tokens;
pub mod wire;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::TryStreamExt;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use tokenizers::Tokenizer;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::{
    Counted, Engine, EngineError, EngineLoad, Generation, GenerationRequest, ModelInfo, Prepared,
    Prompt, Readiness, Reported, TokenizeRequest, UpstreamFacts,
};
use crate::engine::upstream::config::UpstreamConfig;
pub use fault::Fault;
use stream::{Patience, Reading};
use tokens::TokenReader;
use wire::Asks;

/// Engine name in the system fingerprint of an upstream model.
pub const ENGINE_NAME: &str = "upstream";

/// Most bytes of an error answer read (its message is all the gateway needs).
const ERROR_BODY_BYTES: usize = 16 << 10;
/// How long a stream's first chunk may take to say the request is refused before the
/// gateway answers 200 and streams: long enough for vLLM's check of `stop_token_ids` or a
/// `json_schema` (it comes before any prefill), short enough that a client does not
/// wait for its status line.
const REFUSAL_WINDOW: Duration = Duration::from_millis(250);

pub struct UpstreamEngine {
    config: UpstreamConfig,
    client: reqwest::Client,
    info: Arc<ModelInfo>,
    tokenizer: Option<Arc<Tokenizer>>,
    /// Streams being read now.
    running: Arc<AtomicUsize>,
    /// What the last probe or request found.
    state: Mutex<Readiness>,
    /// The upstream refused to return log-probabilities the client had not asked for:
    /// the gateway stops asking (the confidence figures are then absent).
    logprobs_refused: AtomicBool,
}

impl std::fmt::Debug for UpstreamEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamEngine")
            .field("url", &self.info.upstream)
            .finish_non_exhaustive()
    }
}

impl UpstreamEngine {
    /// The engine for model `id` served by `config`'s upstream, with its reachability
    /// probe running in the background (it stops when the engine is dropped). Errors: the
    /// tokenizer cannot be read, the HTTP client cannot be built.
    pub fn start(id: &str, config: UpstreamConfig) -> anyhow::Result<Arc<Self>> {
        let tokenizer = match &config.tokenizer {
            Some(path) => Some(Arc::new(tokens::load_tokenizer(path).map_err(|e| {
                anyhow::anyhow!("the tokenizer of model '{id}' ({}): {e:#}", path.display())
            })?)),
            None => None,
        };
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        let url = fault::strip_credentials(&config.url);
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
        let engine = Arc::new(Self {
            config,
            client,
            info: Arc::new(info),
            tokenizer,
            running: Arc::default(),
            state: Mutex::new(Readiness::Ready),
            logprobs_refused: AtomicBool::new(false),
        });
        tokio::spawn(probe(Arc::downgrade(&engine)).in_current_span());
        Ok(engine)
    }

    /// Records what the last probe or request found: `Some(fault)` when it could not
    /// reach the upstream or had its credentials refused (the one rule for both), `None`
    /// when the upstream answered. The reason `/ready` shows is the fault's kind; its
    /// words (addresses, resolver and TLS detail) go to the log only.
    fn reached(&self, fault: Option<&Fault>) {
        let state = match fault {
            Some(fault) => Readiness::Unreachable(fault.kind().to_owned()),
            None => Readiness::Ready,
        };
        if let Ok(mut current) = self.state.lock() {
            if *current != state {
                match fault {
                    Some(fault) => tracing::warn!(
                        model = %self.info.id,
                        error = %fault,
                        "The upstream cannot be reached; requests to its model fail until it answers again."
                    ),
                    None => tracing::info!(model = %self.info.id, "The upstream is reachable."),
                }
                *current = state;
            }
        }
    }

    fn headers(&self, request: &GenerationRequest) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &self.config.api_key {
            if let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", key.expose())) {
                value.set_sensitive(true);
                headers.insert(AUTHORIZATION, value);
            }
        }
        if let Some(traceparent) = request
            .traceparent
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            headers.insert("traceparent", traceparent);
        }
        // Only a UUID: llama.cpp's server refuses any other X-Request-ID with a 400.
        if let Ok(id) = uuid::Uuid::parse_str(&request.request_id) {
            if let Ok(value) = HeaderValue::from_str(&id.hyphenated().to_string()) {
                headers.insert("x-request-id", value);
            }
        }
        headers
    }

    /// Sends the request and waits for the answer's head, within the first-byte
    /// timeout; a connection that could not be made is tried once more.
    async fn send(
        &self,
        request: &GenerationRequest,
        asks: Asks,
    ) -> Result<(reqwest::Response, Instant), Fault> {
        let (route, body) = wire::request_body(request, &self.config, asks);
        let url = format!("{}{route}", self.config.url);
        let mut tried = 0;
        loop {
            tried += 1;
            let sent = Instant::now();
            let call = self
                .client
                .post(&url)
                .headers(self.headers(request))
                .json(&body)
                .send();
            let fault = match tokio::time::timeout(self.config.first_byte_timeout, call).await {
                Ok(Ok(response)) => return Ok((response, sent)),
                Ok(Err(error)) => Fault::from_transport(&error, sent.elapsed()),
                Err(_) => Fault::Timeout {
                    waited: self.config.first_byte_timeout,
                    first_byte: true,
                },
            };
            if fault.is_connect() && tried == 1 {
                tracing::info!(error = %fault, "Could not connect to the upstream; trying once more.");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return Err(fault);
        }
    }

    /// The fault an answer that is not a 2xx stream stands for.
    async fn refusal(response: reqwest::Response) -> Fault {
        let status = response.status();
        let retry_after = fault::retry_after(response.headers());
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        use futures_util::StreamExt;
        let read = async {
            while let Some(Ok(chunk)) = stream.next().await {
                body.extend_from_slice(&chunk);
                if body.len() >= ERROR_BODY_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
        Fault::from_answer(status, retry_after, &body)
    }
}

/// A refusal of what the gateway added to the client's request (streaming, usage, its
/// own ask for log-probabilities) is no mistake of the client's: it is the upstream
/// failing the gateway, a 502, not a 400 naming a parameter the client never sent.
fn gateways_own(fault: Fault, request: &GenerationRequest) -> Fault {
    let Fault::Refused { param, message } = &fault else {
        return fault;
    };
    let named = |p: &str| param.as_deref().is_some_and(|named| named.starts_with(p));
    let added = named("stream")
        || (request.top_logprobs.is_none() && (named("logprobs") || named("top_logprobs")));
    if added {
        return Fault::Failed {
            status: 400,
            retry_after: None,
            detail: format!("it refused what the gateway asks of every request: {message}"),
        };
    }
    fault
}

/// Whether a refusal is the upstream not doing log-probabilities.
fn refuses_logprobs(fault: &Fault) -> bool {
    match fault {
        Fault::Refused { param, message } => {
            param.as_deref().is_some_and(|p| p.contains("logprobs"))
                || message.to_ascii_lowercase().contains("logprobs")
        }
        _ => false,
    }
}

/// Probes the upstream every `probe_interval` until the engine is gone. Any HTTP answer
/// but a refusal of the credentials means it is there: a server without `/models`
/// still serves, and one failing with 5xx is reached (its errors are counted per
/// request, and `LlmgateUpstreamErrors` pages on them).
async fn probe(engine: Weak<UpstreamEngine>) {
    loop {
        let Some(this) = engine.upgrade() else {
            return;
        };
        let interval = this.config.probe_interval;
        let url = format!("{}/models", this.config.url);
        let mut call = this
            .client
            .get(&url)
            .timeout(this.config.connect_timeout + Duration::from_secs(5));
        if let Some(key) = &this.config.api_key {
            call = call.bearer_auth(key.expose());
        }
        // The probe's own wait is bounded; a silent upstream is as unreachable as one
        // that refuses the connection.
        let began = Instant::now();
        let fault = match call.send().await {
            Ok(answer) if matches!(answer.status().as_u16(), 401 | 403) => Some(Fault::Auth {
                status: answer.status().as_u16(),
            }),
            Ok(_) => None,
            Err(error) => Some(Fault::Unreachable(
                Fault::from_transport(&error, began.elapsed()).to_string(),
            )),
        };
        this.reached(fault.as_ref());
        drop(this);
        tokio::time::sleep(interval).await;
    }
}

#[async_trait]
impl Engine for UpstreamEngine {
    fn model_info(&self) -> Option<Arc<ModelInfo>> {
        Some(Arc::clone(&self.info))
    }

    fn load(&self) -> EngineLoad {
        EngineLoad {
            running: self.running.load(Ordering::SeqCst),
            waiting: 0,
        }
    }

    /// The prompt's tokens are the gateway's estimate (the upstream renders and counts
    /// them itself, and its count comes back in the usage); the context is the
    /// upstream's to check.
    async fn prepare(&self, request: GenerationRequest) -> Result<Prepared, EngineError> {
        let texts: Vec<&str> = match &request.prompt {
            Prompt::Chat(messages) => messages.iter().map(|m| m.content.as_str()).collect(),
            Prompt::Text(text) => vec![text.as_str()],
        };
        let prompt_tokens = tokens::estimate(self.tokenizer.as_deref(), &texts);
        Ok(Prepared {
            request,
            prompt_tokens,
            grammar: None,
        })
    }

    async fn generate(&self, prepared: Prepared) -> Result<Generation, EngineError> {
        let Prepared {
            request,
            prompt_tokens,
            ..
        } = prepared;
        let mut asks = Asks {
            logprobs: self.config.logprobs && !self.logprobs_refused.load(Ordering::Relaxed),
        };
        let (response, sent) = loop {
            let (response, sent) = match self.send(&request, asks).await {
                Ok(sent) => sent,
                Err(fault) => {
                    // A slow upstream is busy, not gone: only a failed connection counts.
                    if fault.is_connect() {
                        self.reached(Some(&fault));
                    }
                    return Err(EngineError::Upstream(fault));
                }
            };
            if response.status().is_success() {
                self.reached(None);
                break (response, sent);
            }
            let fault = Self::refusal(response).await;
            self.reached(matches!(fault, Fault::Auth { .. }).then_some(&fault));
            if asks.logprobs && request.top_logprobs.is_none() && refuses_logprobs(&fault) {
                tracing::warn!(model = %self.info.id, error = %fault, "The upstream does not return log-probabilities; asking no more (no confidence figures for this model).");
                self.logprobs_refused.store(true, Ordering::Relaxed);
                asks.logprobs = false;
                continue;
            }
            return Err(EngineError::Upstream(gateways_own(fault, &request)));
        };
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        if !content_type.starts_with("text/event-stream") {
            return Err(EngineError::Upstream(Fault::Protocol(format!(
                "the answer is '{content_type}', not an event stream"
            ))));
        }
        let (tx, rx) = mpsc::channel(32);
        let reported = Arc::new(Reported::default());
        let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
        let reading = Reading {
            body: Box::pin(response.bytes_stream().map_err(|e| e.to_string())),
            sent,
            patience: Patience {
                first_byte: self.config.first_byte_timeout,
                idle: self.config.idle_timeout,
            },
            expected_model: self.config.check_model.then(|| self.config.model.clone()),
            reported: Arc::clone(&reported),
            tokens: TokenReader::new(self.tokenizer.clone()),
            prompt_tokens,
            top_logprobs: usize::from(request.top_logprobs.unwrap_or(0)),
            // The budget holds whether or not the upstream was sent it: an upstream that
            // ignores `max_tokens` is cut at it (without one sent, the cap applies here and
            // the upstream's own default there).
            max_tokens: request.max_tokens,
            budget_sent: wire::sends_max_tokens(&request, &self.config),
            opened: Some(opened_tx),
            tx,
            running: Counted::new(&self.running),
        };
        tokio::spawn(stream::read(reading).in_current_span());
        // A refusal in the stream's first chunk is answered as the HTTP refusal it is,
        // when it comes within REFUSAL_WINDOW (vLLM's comes at once); after that the
        // stream has begun and a refusal is its error frame.
        if let Ok(Ok(Some(fault))) = tokio::time::timeout(REFUSAL_WINDOW, opened_rx).await {
            tracing::info!(error = %fault, "The upstream refused the request in its stream.");
            return Err(EngineError::Upstream(gateways_own(fault, &request)));
        }
        Ok(Generation {
            prompt_tokens,
            started: sent,
            events: rx,
            reported: Some(reported),
        })
    }

    /// With a tokenizer: a text prompt's ids (a chat needs the upstream's template,
    /// which the gateway does not have).
    async fn tokenize(&self, request: TokenizeRequest) -> Result<Vec<u32>, EngineError> {
        let Some(tokenizer) = &self.tokenizer else {
            return Err(EngineError::Unsupported {
                param: request.prompt.param().into(),
                reason: "this upstream model has no tokenizer configured (models.tokenizer)".into(),
            });
        };
        let Prompt::Text(text) = &request.prompt else {
            return Err(EngineError::Unsupported {
                param: "messages".into(),
                reason: "an upstream model's chat template is the upstream's; send a prompt".into(),
            });
        };
        tokenizer
            .encode(text.as_str(), request.add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    async fn detokenize(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, EngineError> {
        let Some(tokenizer) = &self.tokenizer else {
            return Err(EngineError::Unsupported {
                param: "tokens".into(),
                reason: "this upstream model has no tokenizer configured (models.tokenizer)".into(),
            });
        };
        if let Some((at, bad)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| tokenizer.id_to_token(id).is_none())
        {
            return Err(EngineError::InvalidParameter {
                param: format!("tokens[{at}]"),
                message: format!("{bad} is not a token id of this model"),
            });
        }
        tokenizer
            .decode(&ids, skip_special_tokens)
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    fn spellings(&self, ids: &[u32]) -> Option<Vec<String>> {
        let tokenizer = self.tokenizer.as_ref()?;
        ids.iter().map(|&id| tokenizer.id_to_token(id)).collect()
    }

    fn applies_stop_sequences(&self) -> bool {
        true
    }

    /// The wait in `generate` is the upstream's first byte, bounded by its own timeout,
    /// not a queue of the gateway's.
    fn waits_in_queue(&self) -> bool {
        false
    }

    fn readiness(&self) -> Readiness {
        self.state
            .lock()
            .map_or(Readiness::Ready, |state| state.clone())
    }
}

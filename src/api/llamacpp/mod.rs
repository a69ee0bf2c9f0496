//! llama.cpp's server's own API, for the clients written for it: `POST /completion`
//! (its native completion, on the same engines, timings, quality signals and semantic
//! log as `/v1/completions`: [`request`] reads its body as that route's), and the
//! read-only `GET /props` and `GET /slots` ([`meta`]). `/tokenize` and `/detokenize`
//! take llama.cpp's fields beside vLLM's, and `/apply-template` renders a conversation
//! (`api::tokens`).

pub mod meta;
pub mod request;

use serde_json::{json, Map, Value};

use super::AppState;
use crate::api::request::MAX_LOGIT_BIAS;
use crate::engine::{Prompt, TemplateInputs, TokenizeRequest};
use crate::error::ApiError;
use crate::stream::chunks::native::NativeMeta;
use request::{translate, BiasTarget};

/// llama.cpp's "no seed given: random" (`LLAMA_DEFAULT_SEED`): an unseeded request is
/// random unless the model has a `default_seed`.
pub const RANDOM_SEED: u64 = u32::MAX as u64;

/// A `/completion` body as the `/v1/completions` body that means the same, and what
/// shapes its answer. Biases given as text are turned into ids with the default
/// model's tokenizer (each token of the text gets the bias, as llama.cpp's server does).
pub async fn read_completion(body: &[u8], state: &AppState) -> Result<Read, ApiError> {
    let translated = translate(body)?;
    let mut out = translated.body;
    // llama.cpp's clients name no model: the route serves the default one.
    if !out.contains_key("model") {
        let default = state.models.default_model().id().to_owned();
        out.insert("model".into(), Value::String(default));
    }
    let mut biases: Map<String, Value> = Map::new();
    for (target, bias) in translated.bias {
        let ids = match target {
            BiasTarget::Id(id) => vec![id],
            BiasTarget::Text(text) => text_ids(state, &out, text, "logit_bias").await?,
        };
        for id in ids {
            biases.insert(id.to_string(), json!(bias));
        }
        // Each text may be many tokens; the route's limit holds for the ids.
        if biases.len() > MAX_LOGIT_BIAS {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("its texts make more than {MAX_LOGIT_BIAS} tokens"),
            ));
        }
    }
    if !biases.is_empty() {
        out.insert("logit_bias".into(), Value::Object(biases));
    }
    let mut meta = translated.meta;
    let prompt = out.remove("prompt").unwrap_or_default();
    let (prompt, texts) = read_prompts(state, &out, prompt).await?;
    out.insert("prompt".into(), prompt);
    let mut texts = texts.into_iter();
    meta.prompt = texts.next().unwrap_or_default();
    meta.more_prompts = texts.collect();
    Ok(Read {
        body: serde_json::to_vec(&out).map_err(|_| ApiError::Internal)?,
        meta,
        renamed: translated.renamed,
    })
}

/// A `/completion` body read as `/v1/completions`'s.
pub struct Read {
    pub body: Vec<u8>,
    pub meta: NativeMeta,
    /// (`/v1/completions`'s name, the client's): what an error renames.
    pub renamed: Vec<(&'static str, &'static str)>,
}

/// The model the request names (the default one when it names none it serves; that is
/// refused later).
fn served_for<'a>(
    state: &'a AppState,
    body: &Map<String, Value>,
) -> &'a crate::engine::served::ServedModel {
    body.get("model")
        .and_then(Value::as_str)
        .and_then(|name| state.limits.model(name).ok())
        .and_then(|policy| state.models.get(&policy.id))
        .unwrap_or_else(|| state.models.default_model())
}

/// The translated `prompt` as `/v1/completions` reads it (a text, token ids, or a list
/// of them: a batch), each mixed sequence of ids and texts made ids, and each prompt's
/// text (llama.cpp's answer repeats it; ids that are not the model's are refused later,
/// naming `prompt`).
async fn read_prompts(
    state: &AppState,
    body: &Map<String, Value>,
    prompt: Value,
) -> Result<(Value, Vec<String>), ApiError> {
    match prompt {
        Value::Array(items) if !request::is_sequence(&items) => {
            let mut prompts = Vec::with_capacity(items.len());
            let mut texts = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let (prompt, text) =
                    read_prompt(state, body, item, &format!("prompt[{i}]")).await?;
                prompts.push(prompt);
                texts.push(text);
            }
            Ok((Value::Array(prompts), texts))
        }
        one => {
            let (prompt, text) = read_prompt(state, body, one, "prompt").await?;
            Ok((prompt, vec![text]))
        }
    }
}

/// The most texts one prompt may mix among its token ids: each is tokenized on its own.
const MAX_PROMPT_TEXTS: usize = 64;

/// One prompt and its text: a text as it is; ids (texts among them tokenized, without
/// special tokens, in their place) and the text they make.
async fn read_prompt(
    state: &AppState,
    body: &Map<String, Value>,
    prompt: Value,
    param: &str,
) -> Result<(Value, String), ApiError> {
    let Value::Array(items) = prompt else {
        let text = prompt.as_str().unwrap_or_default().to_owned();
        return Ok((prompt, text));
    };
    let texts = items.iter().filter(|item| item.is_string()).count();
    if texts > MAX_PROMPT_TEXTS {
        return Err(ApiError::invalid(
            param,
            format!("{texts} texts among its ids are more than {MAX_PROMPT_TEXTS}"),
        ));
    }
    let mut ids = Vec::with_capacity(items.len());
    for item in &items {
        match item {
            Value::String(text) => ids.extend(text_ids(state, body, text.clone(), param).await?),
            id => ids.push(
                crate::api::request::token_ids(std::slice::from_ref(id)).ok_or_else(|| {
                    ApiError::invalid(param, "token ids are whole numbers from 0")
                })?[0],
            ),
        }
    }
    let text = served_for(state, body)
        .engine
        .detokenize(ids.clone(), false)
        .await
        .unwrap_or_default();
    Ok((json!(ids), text))
}

/// The ids of a text (a bias's, or a piece of a mixed prompt: `param`), in the
/// vocabulary of the model the request names.
async fn text_ids(
    state: &AppState,
    body: &Map<String, Value>,
    text: String,
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    let served = served_for(state, body);
    served.engine.model_info().ok_or(ApiError::NotReady)?;
    let request = TokenizeRequest {
        prompt: Prompt::Text(text),
        add_special_tokens: false,
        add_generation_prompt: false,
        template: TemplateInputs::default(),
    };
    let tokenized = served.engine.tokenize(request).await.map_err(|e| {
        ApiError::unsupported(
            param,
            format!(
                "a text here needs the model's tokenizer: {}",
                ApiError::from(e)
            ),
        )
    })?;
    Ok(tokenized.ids)
}

/// llama.cpp's `generation_settings`: the parameters the answer is made with, after
/// the gateway's defaults. `n_predict`: the most tokens the answer may have (the
/// request's, the model's default, or the server's cap; the context may leave fewer).
/// `logit_bias` lists, with `ignore_eos`, the model's end tokens at minus infinity
/// (JSON's null), as llama.cpp does: they are never picked.
pub fn generation_settings(
    request: &crate::api::request::ValidatedRequest,
    served: &crate::engine::served::ServedModel,
) -> Value {
    let generation = &request.generation;
    let s = &generation.sampling;
    let mut logit_bias: Vec<Value> = s
        .logit_bias
        .iter()
        .map(|(token, bias)| json!({"token": token, "bias": bias}))
        .collect();
    if s.ignore_eos {
        let ends = served.engine.end_tokens().unwrap_or_default();
        logit_bias.extend(
            ends.iter()
                .map(|token| json!({"token": token, "bias": null})),
        );
    }
    json!({
        "n_predict": generation.budget.tokens(),
        "seed": s.seed.unwrap_or(RANDOM_SEED),
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "stop": s.stop,
        "ignore_eos": s.ignore_eos,
        "logit_bias": logit_bias,
        "n_probs": generation.top_logprobs.unwrap_or(0),
        "stream": request.stream,
        "model": request.model,
    })
}

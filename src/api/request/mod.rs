//! The two generation requests, chat completions and legacy completions: the wire types
//! as OpenAI defines them, and their one-time conversion into a validated
//! [`ValidatedRequest`] ("parse, don't validate"). Every rejection names the offending
//! parameter in OpenAI's error shape.
//!
//! Parameters this server cannot honour are refused with a 400 naming them, never ignored;
//! the same parameters at their neutral values (`n: 1`, `tools: []`, `logprobs: false`...)
//! are accepted, because SDKs often send them. The sampling extensions vLLM and llama.cpp
//! clients send (`top_k`, `min_p`, `repetition_penalty`, and vLLM's `ignore_eos`,
//! `min_tokens`, `stop_token_ids`, which benchmark clients such as GuideLLM send on every
//! request) are honoured, unless the server runs with `--strict-params`, which refuses
//! them as OpenAI does.
//!
//! This module holds what both routes share (sampling, stops, budget, `response_format`,
//! the input hash); [`chat`] and [`completion`] their own fields; [`tokenize`] the
//! bodies of `/tokenize` and `/detokenize`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::engine::{Budget, GenerationRequest, Prompt, ResponseFormat, Sampling};
use crate::error::ApiError;
use format::{held_to, WireResponseFormat};

/// Longest stop sequence accepted. The gateway's stop screen (`stream::stops`) compares
/// every stop sequence with the text it holds at each token, so their length is a
/// per-token cost a client should not choose freely.
pub const MAX_STOP_CHARS: usize = 256;

/// Most stop sequences per request, as in OpenAI's API.
pub const MAX_STOPS: usize = 4;

/// Parameters vLLM and llama.cpp's server take beyond OpenAI's.
pub(super) const EXTENSIONS: &[&str] = &[
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "n_predict",
    "grammar",
    "json_schema",
    "timings_per_token",
    "post_sampling_probs",
    "return_progress",
];

/// Most `stop_token_ids` a request may list: each is looked up per picked token.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// Most tokens `logit_bias` may name: each is added to at every pick.
pub const MAX_LOGIT_BIAS: usize = 300;
/// Most choices (`n`) one request may ask for: each is a sequence of its own.
pub const MAX_CHOICES: u64 = 8;
/// The most prompts one `/v1/completions` request may batch.
pub const MAX_PROMPTS: usize = 32;

/// Refuses a batch of more than [`MAX_PROMPTS`] prompts, naming `prompt`.
pub fn batch_fits(prompts: usize) -> Result<(), ApiError> {
    if prompts > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("{prompts} prompts are more than the {MAX_PROMPTS} one request may batch"),
        ));
    }
    Ok(())
}

/// A validated generation request, from either route.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedRequest {
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`: send the usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// vLLM's `stream_options.continuous_usage_stats` (with `include_usage`): every
    /// chunk carries the usage so far.
    pub continuous_usage: bool,
    pub user: Option<String>,
    /// sha256 of the canonicalised request (see [`input_hash`]).
    pub input_hash: String,
    pub generation: GenerationRequest,
    /// Legacy completions' `echo`: the answer's text starts with the prompt.
    pub echo: bool,
    /// llama.cpp's `timings_per_token`: llama.cpp's timings in every chunk.
    pub timings_per_token: bool,
    /// OpenAI's `n`: how many choices to answer with (1 to [`MAX_CHOICES`]).
    pub choices: u32,
    /// `/v1/completions`' batch: the prompts after the first (`generation.prompt`), each
    /// answered with its own `n` choices.
    pub more_prompts: Vec<Prompt>,
    /// Answer in llama.cpp's server's shape (`POST /completion`).
    pub native: Option<Box<crate::stream::chunks::native::NativeMeta>>,
    /// (the name errors carry, the client's) for a parameter the client sent under
    /// llama.cpp's name: the engine's errors name what the client sent.
    pub renamed: Renamed,
}

/// Parameters the client sent under another name: (the name errors carry, the client's).
pub type Renamed = Vec<(&'static str, &'static str)>;

/// sha256 (hex) of the request as the model sees it: model, messages and every sampling
/// parameter after defaults are applied, in a fixed JSON layout. Two requests with the
/// same hash ask for the same thing, whatever their JSON spelling; a logged request can
/// be matched to its replay without storing the prompt.
pub fn input_hash(model: &str, generation: &GenerationRequest) -> String {
    #[derive(Serialize)]
    struct Canonical<'a> {
        model: &'a str,
        messages: Vec<(&'static str, &'a str)>,
        max_tokens: u32,
        temperature: Option<f64>,
        top_p: Option<f64>,
        seed: Option<u64>,
        presence_penalty: Option<f32>,
        frequency_penalty: Option<f32>,
        stop: &'a [String],
        #[serde(skip_serializing_if = "Option::is_none")]
        top_k: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        min_p: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        repetition_penalty: Option<f32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        response_format: Option<Value>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        ignore_eos: bool,
        #[serde(skip_serializing_if = "is_zero")]
        min_tokens: u32,
        #[serde(skip_serializing_if = "<[u32]>::is_empty")]
        stop_token_ids: &'a [u32],
        #[serde(skip_serializing_if = "<[(u32, f32)]>::is_empty")]
        logit_bias: &'a [(u32, f32)],
        /// Tools, tool calls, names and media: only where the request has any, so the
        /// hash of a plain conversation is what it always was.
        #[serde(skip_serializing_if = "Option::is_none")]
        agentic: Option<Value>,
    }
    let s = &generation.sampling;
    let ids: String;
    let messages = match &generation.prompt {
        Prompt::Chat(messages) => messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect(),
        // A raw prompt is its own kind of message, so it never hashes like a chat.
        Prompt::Text(text) => vec![("prompt", text.as_str())],
        // Ids, never the same message as a text that reads alike.
        Prompt::Tokens(tokens) => {
            ids = tokens
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            vec![("tokens", ids.as_str())]
        }
    };
    // Schemas are canonical JSON already (serde_json sorts no keys, so spell as sent).
    let format = match &generation.response_format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(Value::String("json_object".into())),
        ResponseFormat::JsonSchema(schema) => Some(schema.clone()),
        ResponseFormat::Grammar(gbnf) => Some(serde_json::json!({ "grammar": gbnf })),
        // The gateway's own, made after the hash from the tools it covers.
        ResponseFormat::Lark(_) => None,
    };
    let canonical = Canonical {
        model,
        messages,
        max_tokens: generation.budget.tokens(),
        temperature: s.temperature,
        top_p: s.top_p,
        seed: s.seed,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        stop: &s.stop,
        top_k: s.top_k,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        response_format: format,
        ignore_eos: s.ignore_eos,
        min_tokens: s.min_tokens,
        stop_token_ids: &s.stop_token_ids,
        logit_bias: &s.logit_bias,
        agentic: tools::canonical(generation),
    };
    // Serialising plain data into memory cannot fail.
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Parameters both routes share.
pub(super) const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "n",
    "logit_bias",
    "logprobs",
    "response_format",
];

/// What both routes share, read from the same object as the route's own fields. The
/// schema's bounds are the ones `validate` checks.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = GenerationParameters)]
pub(super) struct WireCommon {
    /// A served model's id (`GET /v1/models`).
    model: String,
    #[serde(default)]
    stream: Option<bool>,
    /// Only with `stream: true`.
    #[serde(default)]
    stream_options: Option<WireStreamOptions>,
    /// Completion budget; at most the server's cap, and what the context leaves.
    #[serde(default)]
    #[schema(minimum = 1)]
    max_tokens: Option<u32>,
    /// Choices to answer with, each decoded as a sequence of its own (a seeded request's
    /// choice `i` is seeded `seed + i`).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 8)]
    n: Option<u32>,
    /// llama.cpp's extension: `max_tokens` under its name (-1: as a request that sets
    /// none). Read into `max_tokens` before this struct ([`n_predict`]); here for the
    /// schema.
    #[serde(default)]
    #[schema(minimum = -1)]
    #[allow(dead_code)]
    n_predict: Option<i64>,
    #[serde(default)]
    #[schema(minimum = 0.0, maximum = 2.0)]
    temperature: Option<f64>,
    #[serde(default)]
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    #[serde(default)]
    #[schema(schema_with = stop_schema)]
    stop: Option<WireStop>,
    /// The same seed, parameters and prompt give the same answer (see
    /// `system_fingerprint`).
    #[serde(default)]
    seed: Option<i64>,
    /// The penalties are read as f64, as their bounds are: 2.0000000000000004 is past
    /// 2, yet would round to 2.0 as an f32.
    #[serde(default)]
    #[schema(minimum = -2.0, maximum = 2.0)]
    presence_penalty: Option<f64>,
    #[serde(default)]
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
    /// Kept only as a keyed hash in the semantic log.
    #[serde(default)]
    user: Option<String>,
    /// Extension: sample among the k likeliest tokens.
    #[serde(default)]
    #[schema(minimum = 1)]
    top_k: Option<u32>,
    /// Extension: drop tokens less likely than this share of the likeliest.
    #[serde(default)]
    #[schema(minimum = 0.0, maximum = 1.0)]
    min_p: Option<f64>,
    /// Extension: divides the logits of tokens already in the context (1: none).
    #[serde(default)]
    #[schema(exclusive_minimum = 0.0, maximum = 10.0)]
    repetition_penalty: Option<f64>,
    #[serde(default)]
    response_format: Option<WireResponseFormat>,
    /// llama.cpp's extension: a GBNF grammar the answer is held to (`root ::= ...`).
    #[serde(default)]
    grammar: Option<String>,
    /// llama.cpp's extension: a JSON Schema the answer is held to, as
    /// `response_format`'s `json_schema.schema`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    json_schema: Option<Value>,
    /// llama.cpp's extension: every streamed chunk carries llama.cpp's `timings` so far,
    /// and the last (or the answer) llama.cpp's figures beside the gateway's.
    #[serde(default)]
    timings_per_token: Option<bool>,
    /// llama.cpp's extension: log-probabilities (and alternatives) in the distribution
    /// each token is drawn from, after the temperature and top_k, top_p, min_p, not the
    /// model's.
    #[serde(default)]
    post_sampling_probs: Option<bool>,
    /// llama.cpp's extension: a streamed answer carries `prompt_progress` chunks while
    /// the engine reads the prompt (`total`, `cache`, `processed`, `time_ms`).
    #[serde(default)]
    return_progress: Option<bool>,
    /// vLLM's extension: generate until the budget, past the end-of-sequence token.
    #[serde(default)]
    ignore_eos: Option<bool>,
    /// vLLM's extension: no end-of-sequence or stop before this many tokens.
    #[serde(default)]
    min_tokens: Option<u32>,
    /// vLLM's extension: token ids that end the answer (up to 64).
    #[serde(default)]
    #[schema(max_items = 64)]
    stop_token_ids: Option<Vec<u32>>,
    /// Added to the logits of the tokens named (by id, as a string) before each pick:
    /// -100 to 100, up to 300 tokens.
    #[serde(default)]
    #[schema(value_type = Option<HashMap<String, f64>>)]
    logit_bias: Option<std::collections::BTreeMap<String, f64>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = StreamOptions)]
struct WireStreamOptions {
    /// A last chunk with the usage (and `timings`).
    #[serde(default)]
    include_usage: Option<bool>,
    #[serde(default)]
    include_obfuscation: Option<bool>,
    /// vLLM's: usage in every chunk (GuideLLM sends it).
    #[serde(default)]
    continuous_usage_stats: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum WireStop {
    One(String),
    Many(Vec<String>),
}

/// `stop`'s schema, written out: the derive cannot bound the strings inside an untagged
/// enum's variants. The bounds are the ones `validate` checks.
fn stop_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
    let sequence = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_STOP_CHARS))
    };
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .item(sequence())
        .item(
            ArrayBuilder::new()
                .items(sequence())
                .max_items(Some(MAX_STOPS)),
        )
        .description(Some(format!(
            "Up to {MAX_STOPS} sequences of 1 to {MAX_STOP_CHARS} characters; the answer ends before the first."
        )))
        .build()
        .into()
}

/// The body as a JSON object whose keys are all known to the route.
pub(super) fn object_of(
    body: &[u8],
    known: &[&[&str]],
    limits: &RequestLimits,
) -> Result<Map<String, Value>, ApiError> {
    let object: Map<String, Value> = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return Err(ApiError::InvalidJson(
                "the body must be a JSON object".into(),
            ))
        }
        Err(e) => return Err(ApiError::InvalidJson(e.to_string())),
    };
    let is_known = |key: &str| {
        known.iter().any(|list| list.contains(&key))
            || (!limits.strict_params && EXTENSIONS.contains(&key))
    };
    if let Some(unknown) = object.keys().find(|k| !is_known(k)) {
        return Err(ApiError::UnknownParameter(unknown.clone()));
    }
    let mut object = object;
    if let (None | Some(Value::Null), Some(only)) = (object.get("model"), limits.only_model()) {
        // llama.cpp's and vLLM's clients may name no model: one served model is the one.
        object.insert("model".to_owned(), Value::String(only.id.clone()));
    }
    Ok(object)
}

/// Reads `T` from the object; a wrong type or value is refused naming its path.
pub(super) fn read<T: serde::de::DeserializeOwned>(
    object: &Map<String, Value>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(object.clone())).map_err(|e| {
        let param = e.path().to_string();
        ApiError::invalid(param, in_words(&e.into_inner().to_string()))
    })
}

/// serde's message in a client's words: the gateway's own type names (`WireContent`,
/// `struct WirePart`) mean nothing to a client.
fn in_words(message: &str) -> String {
    const SHAPES: [(&str, &str); 4] = [
        (
            "WireContent",
            "must be a string, or an array of content parts ({\"type\": \"text\", \"text\": \"...\"}, {\"type\": \"image_url\", ...})",
        ),
        ("WirePrompt", "must be a string, or an array of one string"),
        ("WireStop", "must be a string, or an array of strings"),
        (
            "WireResponseFormat",
            "must be an object whose type is text, json_object or json_schema",
        ),
    ];
    if let Some(name) = message.strip_prefix("data did not match any variant of untagged enum ") {
        return SHAPES
            .iter()
            .find(|(wire, _)| *wire == name.trim())
            .map_or_else(
                || "has a value of the wrong type".to_owned(),
                |(_, words)| (*words).to_owned(),
            );
    }
    // "invalid type: string \"x\", expected struct WirePart" and the like.
    let mut words = message.to_owned();
    while let Some(at) = words.find("struct Wire") {
        let name = at + "struct ".len();
        let end = words[name..]
            .find(|c: char| !c.is_alphanumeric())
            .map_or(words.len(), |n| name + n);
        words.replace_range(at..end, "an object");
    }
    words
}

/// llama.cpp's `n_predict` (its clients send it to the OpenAI routes too) read as
/// `max_tokens`: -1 is a request that sets none.
pub(super) fn n_predict(object: &mut Map<String, Value>) -> Result<(), ApiError> {
    let Some(n) = object.remove("n_predict").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let budgets = ["max_tokens", "max_completion_tokens"];
    if budgets
        .iter()
        .any(|k| object.get(*k).is_some_and(|v| !v.is_null()))
    {
        return Err(ApiError::invalid(
            "n_predict",
            "send n_predict or max_tokens, not both",
        ));
    }
    match n.as_i64() {
        Some(-1) => Ok(()),
        Some(n) if n >= 1 => {
            object.insert("max_tokens".into(), Value::from(n));
            Ok(())
        }
        _ => Err(ApiError::invalid(
            "n_predict",
            "must be -1 (as a request that sets none) or at least 1",
        )),
    }
}

pub(super) fn require(object: &Map<String, Value>, keys: &[&str]) -> Result<(), ApiError> {
    for &required in keys {
        if object.get(required).is_none_or(Value::is_null) {
            return Err(ApiError::invalid(required, "this parameter is required"));
        }
    }
    Ok(())
}

/// Refuses features neither route serves when they are asked for.
pub(super) fn refuse_unsupported(object: &Map<String, Value>) -> Result<(), ApiError> {
    let get = |key: &str| object.get(key).filter(|v| !v.is_null());
    if let Some(n) = get("n") {
        if !n.as_u64().is_some_and(|n| (1..=MAX_CHOICES).contains(&n)) {
            return Err(ApiError::invalid(
                "n",
                format!("must be a whole number from 1 to {MAX_CHOICES}"),
            ));
        }
    }
    Ok(())
}

/// What a chat request adds to the generation that the input hash covers: its tools, its
/// reasoning effort and format, and its template variables (none for legacy
/// completions).
#[derive(Debug, Default)]
pub(super) struct Agentic {
    pub tools: Option<crate::engine::Tools>,
    pub reasoning_effort: Option<String>,
    pub reasoning_format: Option<crate::engine::reasoning::ReasoningFormat>,
    pub template_kwargs: Option<Map<String, Value>>,
}

/// Checks what both routes share and builds the request. `budget`: the parameter that
/// set the completion budget (for errors) and its value.
pub(super) fn validate(
    wire: WireCommon,
    prompt: Prompt,
    agentic: Agentic,
    budget: (&'static str, Option<u32>),
    limits: &RequestLimits,
    request_id: &str,
) -> Result<ValidatedRequest, ApiError> {
    let limits = limits.model(&wire.model)?;
    let (max_param, requested) = budget;
    if requested == Some(0) {
        return Err(ApiError::invalid(max_param, "must be at least 1"));
    }
    // The front shrinks all but an asked budget to what the context leaves.
    let budget = Budget::choose(requested, limits.default_max_tokens, limits.max_tokens_cap)
        .map_err(|cap| {
            let n = requested.unwrap_or_default();
            ApiError::invalid(
                max_param,
                format!("{n} is over this server's limit of {cap}"),
            )
        })?;

    let sampling = sampling(&wire, limits, budget.tokens())?;
    let stream = wire.stream.unwrap_or(false);
    let (include_usage, continuous_usage) = stream_options(&wire, stream)?;
    let choices = wire.n.unwrap_or(1);
    if choices > 1 && continuous_usage {
        return Err(ApiError::invalid(
            "stream_options.continuous_usage_stats",
            "is served with n = 1 only (each choice counts its own tokens)",
        ));
    }
    let (response_format, renamed) = held_to(wire.response_format, wire.json_schema, wire.grammar)?;

    let generation = GenerationRequest {
        request_id: request_id.to_owned(),
        prompt,
        budget,
        sampling,
        response_format,
        top_logprobs: None,
        traceparent: None,
        deadline: None,
        whole: !stream,
        return_progress: stream && wire.return_progress.unwrap_or(false),
        tools: agentic.tools,
        reasoning_effort: agentic.reasoning_effort,
        reasoning_format: agentic.reasoning_format,
        template_kwargs: agentic.template_kwargs,
    };
    Ok(ValidatedRequest {
        // Under the id it serves as, whatever name the request used.
        input_hash: input_hash(&limits.id, &generation),
        model: limits.id.clone(),
        stream,
        include_usage,
        continuous_usage,
        user: wire.user,
        generation,
        echo: false,
        timings_per_token: wire.timings_per_token.unwrap_or(false),
        choices,
        more_prompts: Vec::new(),
        native: None,
        renamed,
    })
}

/// The sampling parameters, each within its range, the served model's defaults filled
/// in where the request left one out. `max_tokens`: the completion budget, which
/// `min_tokens` may not exceed.
fn sampling(
    wire: &WireCommon,
    limits: &crate::engine::served::ModelPolicy,
    max_tokens: u32,
) -> Result<Sampling, ApiError> {
    let temperature = in_range("temperature", wire.temperature, 0.0, 2.0)?;
    let top_p = in_range("top_p", wire.top_p, 0.0, 1.0)?;
    if top_p == Some(0.0) {
        return Err(ApiError::invalid("top_p", "must be greater than 0"));
    }
    // The served model's defaults fill in only what the request left out.
    let temperature = temperature.or(limits.default_temperature);
    let top_p = top_p.or(limits.default_top_p);
    let presence_penalty = in_range("presence_penalty", wire.presence_penalty, -2.0, 2.0)?;
    let frequency_penalty = in_range("frequency_penalty", wire.frequency_penalty, -2.0, 2.0)?;
    if wire.top_k == Some(0) {
        return Err(ApiError::invalid(
            "top_k",
            "must be at least 1 (leave it out for no limit)",
        ));
    }
    let min_p = in_range("min_p", wire.min_p, 0.0, 1.0)?;
    let repetition_penalty = in_range("repetition_penalty", wire.repetition_penalty, 0.0, 10.0)?;
    if repetition_penalty == Some(0.0) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "must be greater than 0 (1 is none)",
        ));
    }
    let stop = stop_sequences(wire.stop.clone())?;
    let stop_token_ids = wire.stop_token_ids.clone().unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("at most {MAX_STOP_TOKEN_IDS} token ids are allowed"),
        ));
    }
    let logit_bias = logit_bias(wire.logit_bias.as_ref())?;
    let min_tokens = wire.min_tokens.unwrap_or(0);
    if min_tokens > max_tokens {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("{min_tokens} is more than the completion budget ({max_tokens})"),
        ));
    }
    Ok(Sampling {
        temperature,
        top_p,
        // Negative seeds are valid in OpenAI's API; the bits are what matter.
        seed: wire.seed.map(|s| s as u64).or(limits.default_seed),
        presence_penalty: presence_penalty.map(|p| p as f32),
        frequency_penalty: frequency_penalty.map(|p| p as f32),
        top_k: wire.top_k,
        min_p: min_p.filter(|&p| p > 0.0),
        repetition_penalty: repetition_penalty.map(|p| p as f32).filter(|&p| p != 1.0),
        stop,
        ignore_eos: wire.ignore_eos.unwrap_or(false),
        min_tokens,
        stop_token_ids,
        logit_bias,
        post_sampling_probs: wire.post_sampling_probs.unwrap_or(false),
    })
}

/// `logit_bias` as (token id, bias) pairs in id order, each checked: an id is a
/// non-negative integer (a JSON key, so a string), a bias from -100 to 100.
fn logit_bias(
    wire: Option<&std::collections::BTreeMap<String, f64>>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(wire) = wire else {
        return Ok(Vec::new());
    };
    if wire.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("at most {MAX_LOGIT_BIAS} tokens may be biased"),
        ));
    }
    let mut bias = wire
        .iter()
        .map(|(id, value)| {
            let id = id.trim().parse::<u32>().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("'{id}' is not a token id (a whole number, as a string)"),
                )
            })?;
            if !(-100.0..=100.0).contains(value) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("the bias of token {id} is {value}; it must be from -100 to 100"),
                ));
            }
            Ok((id, *value as f32))
        })
        .collect::<Result<Vec<_>, _>>()?;
    bias.sort_by_key(|(id, _)| *id);
    bias.dedup_by_key(|(id, _)| *id);
    Ok(bias)
}

/// `stop` as a list, within its limits: at most [`MAX_STOPS`] sequences, none empty,
/// none over [`MAX_STOP_CHARS`] characters.
fn stop_sequences(wire: Option<WireStop>) -> Result<Vec<String>, ApiError> {
    let stop = match wire {
        None => Vec::new(),
        Some(WireStop::One(s)) => vec![s],
        Some(WireStop::Many(v)) => v,
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop sequences are allowed"),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    if stop.iter().any(|s| s.chars().count() > MAX_STOP_CHARS) {
        return Err(ApiError::invalid(
            "stop",
            format!("each stop sequence must be at most {MAX_STOP_CHARS} characters"),
        ));
    }
    Ok(stop)
}

/// `stream_options`: whether the last chunk has the usage, and whether every chunk does
/// (vLLM's `continuous_usage_stats`). Allowed only on a streamed request.
fn stream_options(wire: &WireCommon, stream: bool) -> Result<(bool, bool), ApiError> {
    Ok(match &wire.stream_options {
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "stream_options",
                "only allowed when stream is true",
            ))
        }
        Some(options) => {
            let _ = options.include_obfuscation;
            let include = options.include_usage.unwrap_or(false);
            (
                include,
                include && options.continuous_usage_stats.unwrap_or(false),
            )
        }
        None => (false, false),
    })
}

/// `value` (as `f64`) when it lies within `min..=max`; else an `invalid_value` error
/// naming `param` and the range.
fn in_range(
    param: &str,
    value: Option<impl Into<f64>>,
    min: f64,
    max: f64,
) -> Result<Option<f64>, ApiError> {
    match value.map(Into::into) {
        Some(v) if !(min..=max).contains(&v) => Err(ApiError::invalid(
            param,
            format!("{v} is not between {min} and {max}"),
        )),
        other => Ok(other),
    }
}

mod chat;
mod completion;
mod format;
mod limits;
pub use limits::RequestLimits;
pub mod schema;
mod tokenize;
pub mod tools;
pub use chat::parse_chat_request;
use chat::{message, WireMessage};
pub use completion::parse_completion_request;
pub(crate) use completion::token_ids;
pub use tokenize::{
    parse_apply_template_request, parse_detokenize_request, parse_tokenize_request, Detokenize,
    Tokenize, WireDetokenize, WireTokenize,
};

#[cfg(test)]
mod tests;

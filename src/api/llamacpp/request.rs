//! A `POST /completion` body (llama.cpp's server's own) read as the `/v1/completions`
//! body that means the same, so it is validated, run, timed and logged by the same code.
//! llama.cpp's names map to OpenAI's (`n_predict` → `max_tokens`, `n_probs` →
//! `logprobs`, `repeat_penalty` → `repetition_penalty`, `json_schema` →
//! `response_format`); what the gateway does not serve is refused naming the parameter.

use serde_json::{json, Map, Value};

use crate::api::request::{batch_fits, MAX_LOGIT_BIAS, MAX_STOP_CHARS};
use crate::error::ApiError;
use crate::stream::chunks::native::NativeMeta;

/// Taken as they are: the same name and meaning on `/v1/completions`.
const SAME: &[&str] = &[
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "ignore_eos",
    "min_tokens",
    "model",
    "grammar",
    "json_schema",
    "timings_per_token",
    "post_sampling_probs",
    "return_progress",
];

/// Read here and not passed on.
const OWN: &[&str] = &[
    "prompt",
    "n_predict",
    "max_tokens",
    "n_probs",
    "repeat_penalty",
    "logit_bias",
    "cache_prompt",
    "backend_sampling",
    "id_slot",
    "return_tokens",
    "response_fields",
    "seed",
];

/// llama.cpp's other samplers and options, accepted at the value that turns them off
/// (llama.cpp's web UI sends every parameter, most of them off); any other value is
/// refused naming the parameter.
const NEUTRAL: &[(&str, f64)] = &[
    ("mirostat", 0.0),
    ("typical_p", 1.0),
    ("n_keep", 0.0),
    ("dry_multiplier", 0.0),
    ("xtc_probability", 0.0),
    ("dynatemp_range", 0.0),
    ("top_n_sigma", -1.0),
    ("n_discard", 0.0),
    ("n_indent", 0.0),
    ("t_max_predict_ms", 0.0),
];

/// Where a `/v1/completions` error names a parameter the client sent under llama.cpp's
/// name (`json_schema` and `grammar` are read under their own).
const RENAMED: &[(&str, &str)] = &[
    ("logprobs", "n_probs"),
    ("repetition_penalty", "repeat_penalty"),
];

/// A bias target before the tokenizer has turned its text into ids.
#[derive(Debug, Clone, PartialEq)]
pub enum BiasTarget {
    Id(u32),
    /// Every token of this text gets the bias.
    Text(String),
}

/// The body as `/v1/completions` reads it, what shapes the answer, and the biases whose
/// text still needs the tokenizer.
#[derive(Debug)]
pub struct Translated {
    pub body: Map<String, Value>,
    pub meta: NativeMeta,
    pub bias: Vec<(BiasTarget, f64)>,
    /// (`/v1/completions`'s name, the client's) for the parameters renamed.
    pub renamed: Vec<(&'static str, &'static str)>,
}

/// llama.cpp's `false` bias: the token is never picked (the gateway's floor, -100).
const NEVER: f64 = -100.0;

pub fn translate(body: &[u8]) -> Result<Translated, ApiError> {
    let object = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return Err(ApiError::InvalidJson(
                "the body must be a JSON object".into(),
            ))
        }
        Err(e) => return Err(ApiError::InvalidJson(e.to_string())),
    };
    neutral(&object)?;
    if let Some(unknown) = object.keys().find(|k| {
        !SAME.contains(&k.as_str())
            && !OWN.contains(&k.as_str())
            && !NEUTRAL.iter().any(|(name, _)| name == k)
    }) {
        return Err(ApiError::unsupported(
            unknown,
            format!(
                "POST /completion takes llama.cpp's common parameters; {unknown} is not \
                 served. POST /v1/completions is the OpenAI route"
            ),
        ));
    }
    let get = |key: &str| object.get(key).filter(|v| !v.is_null());
    let mut out: Map<String, Value> = SAME
        .iter()
        .filter_map(|&k| Some((k.to_owned(), get(k)?.clone())))
        .collect();

    out.insert("prompt".into(), prompt(get("prompt"))?);
    if let Some(n) = budget(get("n_predict"), get("max_tokens"))? {
        out.insert("max_tokens".into(), json!(n));
    }
    // llama.cpp's "random" seeds (-1, and its LLAMA_DEFAULT_SEED) are no seed, even
    // where the model has a default one.
    let random_seed = get("seed")
        .is_some_and(|s| s.as_i64() == Some(-1) || s.as_u64() == Some(super::RANDOM_SEED));
    if let Some(seed) = get("seed").filter(|_| !random_seed) {
        out.insert("seed".into(), seed.clone());
    }
    let mut renamed = RENAMED.to_vec();
    if get("n_predict").is_some() {
        renamed.push(("max_tokens", "n_predict"));
    }
    if let Some(n) = get("n_probs") {
        let n = n
            .as_u64()
            .ok_or_else(|| ApiError::invalid("n_probs", "must be a whole number, 0 to 20"))?;
        if n > 0 {
            out.insert("logprobs".into(), json!(n));
        }
    }
    if let Some(penalty) = get("repeat_penalty") {
        out.insert("repetition_penalty".into(), penalty.clone());
    }
    if get("id_slot").is_some_and(|v| v.as_i64() != Some(-1)) {
        return Err(ApiError::unsupported(
            "id_slot",
            "the gateway places each request itself (only -1 is served)",
        ));
    }
    // Neither changes an answer here, so both values of each are served alike: the
    // prefix cache, and where llama.cpp samples (its GPU backend or the CPU; the gateway's
    // own picker samples here).
    for switch in ["cache_prompt", "backend_sampling"] {
        if let Some(value) = get(switch) {
            value
                .as_bool()
                .ok_or_else(|| ApiError::invalid(switch, "must be true or false"))?;
        }
    }
    let bias = match get("logit_bias") {
        Some(value) => logit_bias(value)?,
        None => Vec::new(),
    };
    // The prompt's text is read_completion's to find (token ids are detokenized).
    let meta = NativeMeta {
        return_tokens: flag(get("return_tokens"), "return_tokens")?,
        random_seed,
        response_fields: response_fields(get("response_fields"))?,
        ..NativeMeta::default()
    };
    Ok(Translated {
        body: out,
        meta,
        bias,
        renamed,
    })
}

/// Refuses a llama.cpp option set to anything but the value that turns it off.
fn neutral(object: &Map<String, Value>) -> Result<(), ApiError> {
    for &(name, off) in NEUTRAL {
        let Some(value) = object.get(name).filter(|v| !v.is_null()) else {
            continue;
        };
        if value.as_f64() != Some(off) {
            return Err(ApiError::unsupported(
                name,
                format!(
                    "only {off} (off) is served on POST /completion; POST /v1/completions is \
                     the OpenAI route"
                ),
            ));
        }
    }
    Ok(())
}

/// The prompt, as llama.cpp's server reads it: one prompt (a string, token ids, or ids
/// and texts mixed into one sequence, or `{"prompt_string": ...}` without media), or a
/// list of them: a batch, answered with a list. A mixed sequence stays a list with text
/// in it, for [`super::read_completion`] to tokenize.
fn prompt(value: Option<&Value>) -> Result<Value, ApiError> {
    let value = value.ok_or_else(|| ApiError::invalid("prompt", "this parameter is required"))?;
    match value {
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::invalid("prompt", "must not be empty"))
        }
        Value::Array(items) if !is_sequence(items) => {
            batch_fits(items.len())?;
            let batch = items
                .iter()
                .enumerate()
                .map(|(i, item)| one_prompt(item, &format!("prompt[{i}]")))
                .collect::<Result<_, _>>()?;
            Ok(Value::Array(batch))
        }
        one => one_prompt(one, "prompt"),
    }
}

/// A list that is one prompt: token ids, with texts among them or not.
pub(super) fn is_sequence(items: &[Value]) -> bool {
    items.iter().any(Value::is_number)
        && items
            .iter()
            .all(|item| item.is_number() || item.is_string())
}

/// One prompt of a batch, or the request's only one; `param` names it in errors.
fn one_prompt(value: &Value, param: &str) -> Result<Value, ApiError> {
    match value {
        Value::String(text) => Ok(Value::String(text.clone())),
        Value::Array(items) if is_sequence(items) => Ok(value.clone()),
        Value::Object(parts) => {
            if parts.get("multimodal_data").is_some() {
                return Err(ApiError::unsupported(
                    format!("{param}.multimodal_data"),
                    "the served model reads text only",
                ));
            }
            match parts.get("prompt_string") {
                Some(Value::String(text)) => Ok(Value::String(text.clone())),
                _ => Err(ApiError::invalid(
                    format!("{param}.prompt_string"),
                    "must be the prompt's text",
                )),
            }
        }
        _ => Err(ApiError::invalid(
            param,
            "must be a string, a list of token ids (texts may be mixed in), \
             {\"prompt_string\": ...}, or a list of these (a batch)",
        )),
    }
}

/// `n_predict` (-1: as many as the context leaves) or `max_tokens`, not both.
fn budget(n_predict: Option<&Value>, max_tokens: Option<&Value>) -> Result<Option<u64>, ApiError> {
    match (n_predict, max_tokens) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "max_tokens",
            "send n_predict or max_tokens, not both",
        )),
        (Some(n), None) => match n.as_i64() {
            Some(-1) => Ok(None),
            Some(n) if n >= 1 => Ok(Some(n as u64)),
            _ => Err(ApiError::invalid(
                "n_predict",
                "must be -1 (as many as the context leaves) or at least 1",
            )),
        },
        (None, Some(n)) => n
            .as_u64()
            .filter(|&n| n >= 1)
            .map(Some)
            .ok_or_else(|| ApiError::invalid("max_tokens", "must be at least 1")),
        (None, None) => Ok(None),
    }
}

/// llama.cpp's `logit_bias`: `[[token, bias], ...]` or `{"token": bias}`, where a token
/// is an id or a text (each of its tokens biased) and a bias `false` means never.
fn logit_bias(value: &Value) -> Result<Vec<(BiasTarget, f64)>, ApiError> {
    let invalid = || {
        ApiError::invalid(
            "logit_bias",
            "must be [[token, bias], ...] or {\"token\": bias}: a token id or a text of 1 to \
             256 characters, a bias from -100 to 100 or false",
        )
    };
    let target = |token: &Value| match token {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(BiasTarget::Id),
        Value::String(text) => match text.parse::<u32>() {
            Ok(id) => Some(BiasTarget::Id(id)),
            Err(_) if text.is_empty() || text.chars().count() > MAX_STOP_CHARS => None,
            Err(_) => Some(BiasTarget::Text(text.clone())),
        },
        _ => None,
    };
    let bias = |bias: &Value| match bias {
        Value::Bool(false) => Some(NEVER),
        Value::Number(n) => n.as_f64().filter(|b| (-100.0..=100.0).contains(b)),
        _ => None,
    };
    let entries = match value {
        Value::Array(items) => items.len(),
        Value::Object(map) => map.len(),
        _ => 0,
    };
    // Checked before any text is tokenized: each text costs a tokenizer call.
    if entries > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("at most {MAX_LOGIT_BIAS} entries"),
        ));
    }
    let pairs: Vec<(BiasTarget, f64)> = match value {
        Value::Array(items) => items
            .iter()
            .map(|item| match item.as_array().map(Vec::as_slice) {
                Some([token, b]) => Some((target(token)?, bias(b)?)),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(invalid)?,
        Value::Object(map) => map
            .iter()
            .map(|(token, b)| Some((target(&Value::String(token.clone()))?, bias(b)?)))
            .collect::<Option<_>>()
            .ok_or_else(invalid)?,
        _ => return Err(invalid()),
    };
    Ok(pairs)
}

fn flag(value: Option<&Value>, name: &str) -> Result<bool, ApiError> {
    value.map_or(Ok(false), |v| {
        v.as_bool()
            .ok_or_else(|| ApiError::invalid(name, "must be true or false"))
    })
}

fn response_fields(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    value
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| {
            ApiError::invalid(
                "response_fields",
                "must be a list of field paths such as \"content\" or \"generation_settings/n_predict\"",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::request::MAX_PROMPTS;

    fn body(value: Value) -> Result<Translated, ApiError> {
        translate(value.to_string().as_bytes())
    }

    #[test]
    fn llama_cpp_names_become_openai_ones() {
        let t = body(json!({
            "prompt": "Hi", "n_predict": 8, "n_probs": 3, "repeat_penalty": 1.1,
            "temperature": 0.0, "cache_prompt": false, "backend_sampling": true, "id_slot": -1,
            "json_schema": {"type": "string"}, "return_tokens": true,
            "response_fields": ["content"],
        }))
        .expect("valid");
        assert_eq!(t.body["prompt"], "Hi");
        assert_eq!(t.body["max_tokens"], 8);
        assert_eq!(t.body["logprobs"], 3);
        assert_eq!(t.body["repetition_penalty"], 1.1);
        assert_eq!(
            t.body["json_schema"],
            json!({"type": "string"}),
            "read as it came"
        );
        assert!(t.body.get("cache_prompt").is_none());
        assert!(t.meta.return_tokens);
        assert_eq!(t.meta.response_fields, ["content"]);

        let endless = body(json!({
            "prompt": {"prompt_string": "Hi"}, "n_predict": -1, "seed": -1,
            "mirostat": 0, "typical_p": 1.0,
        }))
        .expect("valid");
        assert!(
            endless.body.get("max_tokens").is_none(),
            "-1: the default budget"
        );
        assert!(endless.body.get("seed").is_none(), "-1: random");
        assert!(
            endless.meta.random_seed,
            "random even where a default seed is set"
        );
        assert_eq!(endless.body["prompt"], "Hi");
        // One prompt, or a batch: /v1/completions reads both.
        for prompt in [
            json!(["Hi"]),
            json!([1, 2]),
            json!([1, "Hi", 2]),
            json!(["Hi", [1, "Hi"], [3]]),
        ] {
            let read = body(json!({"prompt": prompt})).expect("valid");
            assert_eq!(read.body["prompt"], prompt, "{prompt}");
        }
        let batch = body(json!({"prompt": [{"prompt_string": "a"}, "b"]})).expect("valid");
        assert_eq!(batch.body["prompt"], json!(["a", "b"]));
        assert!(endless.renamed.contains(&("max_tokens", "n_predict")));
        let seeded = body(json!({"prompt": "a", "seed": 7})).expect("valid");
        assert_eq!(seeded.body["seed"], 7);
        assert!(!seeded.meta.random_seed);
    }

    #[test]
    fn biases_take_ids_texts_and_false() {
        let listed = body(json!({"prompt": "a", "logit_bias": [[15, -100], [" the ", false]]}))
            .expect("valid");
        assert_eq!(
            listed.bias,
            [
                (BiasTarget::Id(15), -100.0),
                (BiasTarget::Text(" the ".into()), NEVER)
            ]
        );
        let mapped =
            body(json!({"prompt": "a", "logit_bias": {"15": 2, "book": -5}})).expect("valid");
        assert_eq!(
            mapped.bias,
            [
                (BiasTarget::Id(15), 2.0),
                (BiasTarget::Text("book".into()), -5.0)
            ]
        );
    }

    #[test]
    fn what_is_not_served_is_refused_by_name() {
        for (value, param) in [
            (json!({}), "prompt"),
            (json!({"prompt": []}), "prompt"),
            (json!({"prompt": [[1, 2], true]}), "prompt[1]"),
            (json!({"prompt": ["a", [[1]]]}), "prompt[1]"),
            (json!({"prompt": vec!["a"; MAX_PROMPTS + 1]}), "prompt"),
            (
                json!({"prompt": ["a", {"prompt_string": 1}]}),
                "prompt[1].prompt_string",
            ),
            (json!({"prompt": "a", "id_slot": 1}), "id_slot"),
            (json!({"prompt": "a", "mirostat": 2}), "mirostat"),
            (json!({"prompt": "a", "n_predict": 0}), "n_predict"),
            (
                json!({"prompt": "a", "n_predict": 4, "max_tokens": 4}),
                "max_tokens",
            ),
            (json!({"prompt": "a", "logit_bias": [[1]]}), "logit_bias"),
            (
                json!({"prompt": "a", "logit_bias": [[1, 101]]}),
                "logit_bias",
            ),
            (
                json!({"prompt": "a", "logit_bias": [["", 1]]}),
                "logit_bias",
            ),
            (
                json!({"prompt": "a", "logit_bias": [["x".repeat(257), 1]]}),
                "logit_bias",
            ),
            (json!({"prompt": "a", "mirostat": 1}), "mirostat"),
            (
                json!({"prompt": {"prompt_string": "a", "multimodal_data": ["x"]}}),
                "prompt.multimodal_data",
            ),
        ] {
            let error = body(value.clone()).expect_err(&value.to_string());
            assert_eq!(error.param(), Some(param), "{value}: {error}");
        }
        let error = body(json!({"prompt": "a", "samplers": ["top_k"]})).expect_err("refused");
        assert!(error.to_string().contains("/v1/completions"), "{error}");
        let many: Vec<Value> = (0..=MAX_LOGIT_BIAS).map(|i| json!([i, 1])).collect();
        let error = body(json!({"prompt": "a", "logit_bias": many})).expect_err("too many");
        assert_eq!(error.param(), Some("logit_bias"));
    }
}

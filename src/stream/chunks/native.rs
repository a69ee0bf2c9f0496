//! llama.cpp's server's own answer shape, for `POST /completion` (`api::llamacpp`): the
//! fields its clients read, from the same run, timings and quality signals as an
//! OpenAI answer. A stream sends one frame per piece of text and a last one with
//! `"stop": true` and the timings, and no `[DONE]` (llama.cpp's server sends none on
//! this route).
//!
//! ```text
//! data: {"index":0,"content":" the","tokens":[260],"stop":false,"id_slot":-1,"tokens_predicted":1,"tokens_evaluated":8}
//! data: {"index":0,"content":"","tokens":[],"stop":true,...,"stop_type":"limit","timings":{...},"llmgate":{...}}
//! ```
//!
//! `timings` holds llama.cpp's figures (`prompt_n`, `prompt_ms`, `predicted_n`, ...),
//! computed from the gateway's own measurements; `llmgate` holds those measurements and
//! the quality signals as the OpenAI routes' `timings` does.

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::record::ResponseTimings;
use crate::stream::Ending;
use crate::tokens::{FinishReason, TokenLogprob, TokenText, Usage};

/// What a `/completion` request asked of its answer's shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NativeMeta {
    /// llama.cpp's `generation_settings`: the parameters the answer was made with.
    pub generation_settings: Value,
    /// The prompt as given.
    pub prompt: String,
    /// A batch's other prompts, as given: each is answered as a request of its own.
    pub more_prompts: Vec<String>,
    /// The request asked for a random seed (`seed` -1): the model's default seed does
    /// not apply.
    pub random_seed: bool,
    /// Prompt tokens (`tokens_evaluated`).
    pub prompt_tokens: u32,
    /// `return_tokens`: the non-streamed answer lists its token ids (a stream's frames
    /// always do).
    pub return_tokens: bool,
    /// `response_fields`: only these fields (paths such as `generation_settings/n_predict`)
    /// in the non-streamed answer; empty: all.
    pub response_fields: Vec<String>,
}

/// One text frame: its text, the ids of the tokens that arrived since the last frame,
/// and (with `n_probs`) their log-probabilities. Borrowed and serialised as it is: it
/// is built once per piece of text.
#[derive(Serialize)]
pub struct TokenFrame<'a> {
    index: u32,
    content: &'a str,
    tokens: &'a [u32],
    stop: bool,
    tokens_predicted: u32,
    tokens_evaluated: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_probabilities: Option<Vec<Probability<'a>>>,
    /// With `timings_per_token`: llama.cpp's timings so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<LlamaTimings>,
    /// With `return_progress`, in a frame of its own: how much of the prompt is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_progress: Option<PromptProgress>,
}

/// llama.cpp's `prompt_progress`: `processed` of the prompt's `total` tokens read so
/// far, `cache` of them from a cache (not read again), `time_ms` since reading began.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PromptProgress {
    pub total: u32,
    pub cache: u32,
    pub processed: u32,
    pub time_ms: f64,
}

/// A `return_progress` frame in llama.cpp's shape: no text, the prompt's progress.
pub fn progress_frame(meta: &NativeMeta, progress: PromptProgress) -> TokenFrame<'static> {
    TokenFrame {
        prompt_progress: Some(progress),
        ..token_frame(meta, "", &[], 0, None, None)
    }
}

pub fn token_frame<'a>(
    meta: &NativeMeta,
    text: &'a str,
    ids: &'a [u32],
    predicted: u32,
    logprobs: Option<&'a [TokenLogprob]>,
    timings: Option<LlamaTimings>,
) -> TokenFrame<'a> {
    TokenFrame {
        index: 0,
        content: text,
        tokens: ids,
        stop: false,
        tokens_predicted: predicted,
        tokens_evaluated: meta.prompt_tokens,
        completion_probabilities: logprobs.map(probabilities),
        timings,
        prompt_progress: None,
    }
}

/// The last frame of a stream, or (with the whole `content` and `ids`) the non-streamed
/// answer.
pub struct Final<'a> {
    pub model: &'a str,
    pub content: &'a str,
    /// Whether the whole answer has a line break (a stream's last frame has no text).
    pub has_new_line: bool,
    pub ids: &'a [u32],
    /// llama.cpp's `stop_type` ([`stop_type`]) and the stop sequence that ended it.
    pub stop_type: &'static str,
    pub stopping_word: Option<&'a str>,
    pub usage: Usage,
    pub report: &'a ResponseTimings,
    pub logprobs: Option<&'a [TokenLogprob]>,
}

impl Final<'_> {
    pub fn to_value(&self, meta: &NativeMeta) -> Value {
        let Usage {
            prompt_tokens,
            completion_tokens,
            ..
        } = self.usage;
        let mut body = json!({
            "index": 0,
            "content": self.content,
            "tokens": self.ids,
            "stop": true,
            "model": self.model,
            "tokens_predicted": completion_tokens,
            "tokens_evaluated": prompt_tokens,
            "generation_settings": meta.generation_settings,
            "prompt": meta.prompt,
            "has_new_line": self.has_new_line,
            // The gateway never cuts a prompt to fit (a prompt too long is refused).
            "truncated": false,
            "stop_type": self.stop_type,
            "stopping_word": self.stopping_word.unwrap_or_default(),
            "tokens_cached": prompt_tokens + completion_tokens,
            "timings": LlamaTimings::of(self.report, self.usage),
            "llmgate": self.report,
        });
        if let Some(tokens) = self.logprobs {
            body["completion_probabilities"] =
                serde_json::to_value(probabilities(tokens)).unwrap_or(Value::Null);
        }
        body
    }
}

/// llama.cpp's `stop_type`: `word` (a stop sequence), `eos` (the model ended it),
/// `limit` (the budget or the context); `degenerated` where the gateway's degeneration
/// guard ended it, which llama.cpp's server has no name for.
pub fn stop_type(ending: &Ending, word: Option<&str>) -> &'static str {
    match ending {
        Ending::Finished {
            reason: FinishReason::Length,
            ..
        } => "limit",
        Ending::Finished { .. } if word.is_some() => "word",
        Ending::Finished { .. } => "eos",
        Ending::Degenerated => "degenerated",
        Ending::Failed { .. } => "none",
    }
}

/// The non-streamed answer: [`Final`] with every token id when asked for, cut down to
/// `response_fields` when those are named.
pub fn body(meta: &NativeMeta, answer: &Final<'_>) -> Value {
    let ids: &[u32] = if meta.return_tokens { answer.ids } else { &[] };
    let body = Final { ids, ..*answer }.to_value(meta);
    if meta.response_fields.is_empty() {
        return body;
    }
    let picked: Map<String, Value> = meta
        .response_fields
        .iter()
        .filter_map(|path| {
            let value = path
                .split('/')
                .try_fold(&body, |value, key| value.get(key))?;
            Some((path.clone(), value.clone()))
        })
        .collect();
    Value::Object(picked)
}

/// llama.cpp's `timings`, from the gateway's measurements: the prompt's share is the
/// engine's time to the first token, the prediction's the time from the first token to
/// the last (the TPOT times the tokens after the first). A figure with nothing to divide
/// by is null.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LlamaTimings {
    cache_n: u32,
    prompt_n: u32,
    prompt_ms: f64,
    prompt_per_token_ms: Option<f64>,
    prompt_per_second: Option<f64>,
    predicted_n: u32,
    predicted_ms: f64,
    predicted_per_token_ms: Option<f64>,
    predicted_per_second: Option<f64>,
}

impl LlamaTimings {
    /// `prompt_tokens` of which `cached` came from the prefix cache, read in
    /// `prompt_ms`; `predicted` tokens, the first to the last in `predicted_ms`.
    pub fn new(
        prompt_tokens: u32,
        cached: u32,
        prompt_ms: f64,
        predicted: u32,
        predicted_ms: f64,
    ) -> Self {
        let prompt_n = prompt_tokens.saturating_sub(cached);
        let after_first = predicted.saturating_sub(1);
        let per = |ms: f64, n: u32| (n > 0).then(|| ms / f64::from(n));
        let rate = |ms: f64, n: u32| (ms > 0.0).then(|| f64::from(n) * 1e3 / ms);
        Self {
            cache_n: cached,
            prompt_n,
            prompt_ms,
            prompt_per_token_ms: per(prompt_ms, prompt_n),
            prompt_per_second: rate(prompt_ms, prompt_n),
            predicted_n: predicted,
            predicted_ms,
            predicted_per_token_ms: per(predicted_ms, after_first),
            predicted_per_second: rate(predicted_ms, after_first),
        }
    }

    /// A finished answer's, from its record's timings.
    pub fn of(report: &ResponseTimings, usage: Usage) -> Self {
        let t = &report.timings;
        let predicted = t.output_tokens;
        Self::new(
            usage.prompt_tokens,
            usage.cached_tokens.unwrap_or(0),
            t.engine_ttft_ms.or(t.ttft_ms).unwrap_or(0.0),
            predicted,
            t.tpot_ms.unwrap_or(0.0) * f64::from(predicted.saturating_sub(1)),
        )
    }
}

/// One entry of `completion_probabilities`: a token (its id where the engine picked it
/// here; an upstream's come as text) with its log-probability and bytes, and its
/// alternatives, each the same less its own alternatives. With `post_sampling_probs`,
/// llama.cpp's other shape: `prob` and `top_probs`, in the distribution the token was
/// drawn from.
#[derive(Serialize)]
pub struct Probability<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u32>,
    token: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprob: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prob: Option<f32>,
    bytes: &'a [u8],
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<Vec<Probability<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_probs: Option<Vec<Probability<'a>>>,
}

fn probabilities(tokens: &[TokenLogprob]) -> Vec<Probability<'_>> {
    fn entry(token: &TokenText, logprob: f32, post_sampling: bool) -> Probability<'_> {
        Probability {
            id: token.id,
            token: &token.text,
            logprob: (!post_sampling).then_some(logprob),
            prob: post_sampling.then(|| logprob.exp()),
            bytes: &token.bytes,
            top_logprobs: None,
            top_probs: None,
        }
    }
    tokens
        .iter()
        .map(|t| {
            let post = t.sampled.is_some();
            let top = t
                .top
                .iter()
                .map(|(alt, lp)| entry(alt, *lp, post))
                .collect();
            let (top_logprobs, top_probs) = if post {
                (None, Some(top))
            } else {
                (Some(top), None)
            };
            Probability {
                top_logprobs,
                top_probs,
                ..entry(&t.token, t.shown(), post)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> NativeMeta {
        NativeMeta {
            generation_settings: json!({"n_predict": 8, "seed": 42}),
            prompt: "Hi".into(),
            prompt_tokens: 3,
            ..NativeMeta::default()
        }
    }

    fn answer<'a>(report: &'a ResponseTimings, ids: &'a [u32]) -> Final<'a> {
        Final {
            model: "m",
            content: "a\nb",
            has_new_line: true,
            ids,
            stop_type: "limit",
            stopping_word: None,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: Some(1),
                reasoning_tokens: None,
            },
            report,
            logprobs: None,
        }
    }

    #[test]
    fn the_answer_has_llama_cpp_fields_and_ours() {
        let report = crate::stream::chunks::tests::timings();
        let body = body(&meta(), &answer(&report, &[5, 6]));
        assert_eq!(body["content"], "a\nb");
        assert_eq!(body["tokens"], json!([]), "ids only with return_tokens");
        assert_eq!(body["stop_type"], "limit");
        assert_eq!(body["has_new_line"], true);
        assert_eq!(
            body["timings"]["prompt_n"], 2,
            "the cached token is not evaluated"
        );
        assert_eq!(body["timings"]["cache_n"], 1);
        assert_eq!(body["generation_settings"]["seed"], 42);
        assert!(body["llmgate"].is_object());

        let with_ids = NativeMeta {
            return_tokens: true,
            ..meta()
        };
        assert_eq!(
            super::body(&with_ids, &answer(&report, &[5, 6]))["tokens"],
            json!([5, 6])
        );
    }

    #[test]
    fn response_fields_keep_only_the_paths_named() {
        let report = crate::stream::chunks::tests::timings();
        let picked = NativeMeta {
            response_fields: vec![
                "content".into(),
                "generation_settings/n_predict".into(),
                "no/such".into(),
            ],
            ..meta()
        };
        assert_eq!(
            body(&picked, &answer(&report, &[])),
            json!({"content": "a\nb", "generation_settings/n_predict": 8})
        );
    }

    #[test]
    fn the_stop_type_says_what_ended_the_answer() {
        let finished = |reason| Ending::Finished {
            reason,
            usage: Usage::default(),
        };
        assert_eq!(stop_type(&finished(FinishReason::Length), None), "limit");
        assert_eq!(stop_type(&finished(FinishReason::Stop), None), "eos");
        assert_eq!(stop_type(&finished(FinishReason::Stop), Some("\n")), "word");
        assert_eq!(stop_type(&Ending::Degenerated, None), "degenerated");
    }

    #[test]
    fn a_frame_carries_its_text_and_ids() {
        let frame = serde_json::to_value(token_frame(&meta(), " the", &[260], 1, None, None))
            .expect("serialises");
        assert_eq!(frame["tokens"], json!([260]));
        assert_eq!(frame["stop"], false);
        assert!(frame.get("completion_probabilities").is_none());
    }
}

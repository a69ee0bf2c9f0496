//! The upstream's wire format: the request body the gateway sends ([`request`]), and
//! the chunks it reads back, in OpenAI's chat and legacy completion shapes and the
//! variations real servers send (vLLM's empty-choices usage chunk, LiteLLM's `delta: {}`
//! one, llama.cpp's server's logprobs, `reasoning_content` or `reasoning`, tool calls).

mod request;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

pub use request::{request_body, Asks};

use crate::engine::ToolCallDelta;
use crate::tokens::{TokenLogprob, TokenText, Usage};

/// One streamed chunk, chat or legacy. Its names borrow from the data line where no
/// escape is in them: a chunk is parsed per token, and most of it is not kept.
#[derive(Debug, Deserialize)]
pub struct WireChunk<'a> {
    #[serde(default, borrow)]
    pub model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub system_fingerprint: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Vec<WireChoice<'a>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    /// vLLM and others put an error object in a chunk when generation fails.
    #[serde(default)]
    error: Option<Value>,
    #[serde(default, borrow)]
    object: Option<Cow<'a, str>>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireChoice<'a> {
    #[serde(default)]
    delta: Option<WireDelta>,
    /// Legacy completions.
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    /// A reasoning model's thinking: `reasoning_content` (vLLM before 0.10, llama.cpp's
    /// server, DeepSeek's API) or `reasoning` (vLLM since, OpenRouter).
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

/// A piece of a tool call as servers stream it (OpenAI's framing; llama.cpp's server
/// may send a whole call in one piece).
#[derive(Debug, Deserialize)]
struct WireToolCall {
    /// Which call; some servers leave it out when there is one.
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Debug, Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
    /// vLLM (with `--enable-prompt-tokens-details`), llama.cpp's server and OpenAI say
    /// how much of the prompt came from their cache.
    #[serde(default)]
    prompt_tokens_details: Option<WirePromptDetails>,
    /// OpenAI, vLLM and others say how many completion tokens were reasoning.
    #[serde(default)]
    completion_tokens_details: Option<WireCompletionDetails>,
}

#[derive(Debug, Deserialize)]
struct WireCompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct WirePromptDetails {
    #[serde(default)]
    cached_tokens: Option<u32>,
}

/// What one chunk carries for the answer.
#[derive(Debug, Default, PartialEq)]
pub struct Piece {
    pub text: String,
    /// Reasoning, outside the content.
    pub reasoning: String,
    /// Pieces of tool calls.
    pub tool_calls: Vec<ToolCallDelta>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// An error reported in the stream.
    pub error: Option<StreamError>,
}

/// An error object in a stream: vLLM's `{"error": {"message", "param", "code": 400}}`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StreamError {
    pub message: String,
    /// The HTTP status it stands for (`code`, a number or a numeric string), if any.
    pub status: Option<u16>,
    pub param: Option<String>,
}

impl StreamError {
    fn of(error: &Value) -> Self {
        let code = error.get("code");
        let status = code
            .and_then(Value::as_u64)
            .or_else(|| code.and_then(Value::as_str).and_then(|c| c.parse().ok()))
            .and_then(|c| u16::try_from(c).ok());
        Self {
            message: error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_owned),
            status,
            param: error
                .get("param")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }
    }
}

impl<'a> WireChunk<'a> {
    pub fn parse(data: &'a str) -> Result<Self, String> {
        serde_json::from_str(data).map_err(|e| {
            let shown: String = data.chars().take(120).collect();
            format!("a data line that is not a chunk ({e}): {shown}")
        })
    }

    /// The answer's part in this chunk (choice 0; the gateway asks for one).
    pub fn piece(self) -> Piece {
        let error = match (&self.error, self.object.as_deref()) {
            (Some(error), _) => Some(StreamError::of(error)),
            (None, Some("error")) => Some(StreamError {
                message: self.message.clone().unwrap_or_default(),
                ..StreamError::default()
            }),
            _ => None,
        };
        let usage = self.usage.map(|u| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
            reasoning_tokens: u
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .filter(|&n| n > 0),
        });
        let Some(choice) = self.choices.into_iter().next() else {
            return Piece {
                usage,
                error,
                ..Piece::default()
            };
        };
        let (content, reasoning, tool_calls) = match choice.delta {
            Some(d) => (
                d.content,
                d.reasoning_content.or(d.reasoning).unwrap_or_default(),
                d.tool_calls.unwrap_or_default(),
            ),
            None => (None, String::new(), Vec::new()),
        };
        let text = content.or(choice.text).unwrap_or_default();
        let mut piece = Piece {
            text,
            reasoning,
            tool_calls: tool_calls.into_iter().map(WireToolCall::delta).collect(),
            logprobs: choice
                .logprobs
                .as_ref()
                .map(logprobs_of)
                .unwrap_or_default(),
            finish_reason: choice.finish_reason.map(Cow::into_owned),
            usage,
            error,
        };
        piece.drop_end_token();
        piece
    }
}

impl WireToolCall {
    fn delta(self) -> ToolCallDelta {
        let (name, arguments) = match self.function {
            Some(f) => (f.name, f.arguments.unwrap_or_default()),
            None => (None, String::new()),
        };
        ToolCallDelta {
            index: self.index.unwrap_or(0),
            id: self.id,
            name,
            arguments,
        }
    }
}

impl Piece {
    /// The end token is no part of the content (docs/api.md, "The end token"), but an
    /// upstream may list its log-probability (vLLM lists the token its answer stopped
    /// on; llama.cpp's server and OpenAI do not). In the chunk that says the answer
    /// stopped, the last entry is the end token when the entries before it spell the
    /// chunk's text and it adds none of its own: no bytes at all (decoded without
    /// special tokens), or text the content does not have (`<|im_end|>`).
    fn drop_end_token(&mut self) {
        if self.finish_reason.as_deref() != Some("stop") {
            return;
        }
        let Some((last, before)) = self.logprobs.split_last() else {
            return;
        };
        let spelled = before
            .iter()
            .map(|t| t.token.text.as_str())
            .collect::<String>();
        if spelled == self.text && (last.token.bytes.is_empty() || !last.token.text.is_empty()) {
            self.logprobs.pop();
        }
    }
}

/// Log-probabilities in either shape: chat's `{"content": [{token, logprob, bytes,
/// top_logprobs}]}` or legacy's `{"tokens", "token_logprobs", "top_logprobs"}`.
fn logprobs_of(value: &Value) -> Vec<TokenLogprob> {
    if let Some(content) = value.get("content").and_then(Value::as_array) {
        return content.iter().filter_map(chat_logprob).collect();
    }
    let (Some(tokens), Some(logprobs)) = (
        value.get("tokens").and_then(Value::as_array),
        value.get("token_logprobs").and_then(Value::as_array),
    ) else {
        return Vec::new();
    };
    let tops = value.get("top_logprobs").and_then(Value::as_array);
    tokens
        .iter()
        .zip(logprobs)
        .enumerate()
        .filter_map(|(i, (token, logprob))| {
            let text = token.as_str()?;
            let mut top: Vec<(TokenText, f32)> = tops
                .and_then(|t| t.get(i))
                .and_then(Value::as_object)
                .map(|alternatives| {
                    alternatives
                        .iter()
                        .filter_map(|(t, lp)| Some((spelled(t, None), lp.as_f64()? as f32)))
                        .collect()
                })
                .unwrap_or_default();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            Some(TokenLogprob {
                sampled: None,
                token: spelled(text, None),
                logprob: logprob.as_f64().unwrap_or(f64::NEG_INFINITY) as f32,
                top,
            })
        })
        .collect()
}

fn chat_logprob(entry: &Value) -> Option<TokenLogprob> {
    let token = entry.get("token")?.as_str()?;
    let logprob = entry.get("logprob")?.as_f64()? as f32;
    let top = entry
        .get("top_logprobs")
        .and_then(Value::as_array)
        .map(|alternatives| {
            alternatives
                .iter()
                .filter_map(|a| {
                    let text = a.get("token")?.as_str()?;
                    Some((
                        spelled(text, a.get("bytes")),
                        a.get("logprob")?.as_f64()? as f32,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(TokenLogprob {
        sampled: None,
        token: spelled(token, entry.get("bytes")),
        logprob,
        top,
    })
}

/// A token's text and bytes: the `bytes` array when the upstream sends one (a token that
/// is part of a character), else the text's own.
fn spelled(text: &str, bytes: Option<&Value>) -> TokenText {
    let bytes = bytes
        .and_then(Value::as_array)
        .and_then(|b| {
            b.iter()
                .map(|v| v.as_u64().and_then(|n| u8::try_from(n).ok()))
                .collect::<Option<Vec<u8>>>()
        })
        .unwrap_or_else(|| text.as_bytes().to_vec());
    TokenText {
        text: text.to_owned(),
        bytes,
        id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::upstream::config::UpstreamConfig;
    use crate::engine::{Budget, ChatMessage, GenerationRequest, Prompt, Role, Sampling};
    use serde_json::json;

    #[test]
    fn the_body_streams_with_usage_and_forwards_what_was_set() {
        let request = GenerationRequest {
            prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, "hi")]),
            budget: Budget::Asked(16),
            sampling: Sampling {
                temperature: Some(0.0),
                seed: Some(7),
                stop: vec!["\n".into()],
                ignore_eos: true,
                ..Sampling::default()
            },
            ..GenerationRequest::default()
        };
        let config = test_config();
        let (route, body) = request_body(&request, &config, Asks { logprobs: true });
        assert_eq!(route, "/chat/completions");
        assert_eq!(
            body,
            json!({
                "model": "up",
                "messages": [{"role": "user", "content": "hi"}],
                "logprobs": true,
                "top_logprobs": 1,
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 16,
                "temperature": 0.0,
                "seed": 7,
                "stop": ["\n"],
                "ignore_eos": true,
            })
        );
        let unset = GenerationRequest {
            prompt: Prompt::Text("Once".into()),
            budget: Budget::Cap(2048),
            top_logprobs: Some(3),
            ..GenerationRequest::default()
        };
        let (route, body) = request_body(&unset, &config, Asks { logprobs: false });
        assert_eq!(route, "/completions");
        assert_eq!(body["logprobs"], 3);
        assert!(body.get("max_tokens").is_none(), "the upstream's default");
        let reasoning = UpstreamConfig {
            max_tokens_param: "max_completion_tokens".into(),
            ..test_config()
        };
        let defaulted = GenerationRequest {
            budget: Budget::ModelDefault(2048),
            ..unset
        };
        let (_, body) = request_body(&defaulted, &reasoning, Asks { logprobs: false });
        assert_eq!(
            body["max_completion_tokens"], 2048,
            "the model's default is sent"
        );
        assert!(body.get("max_tokens").is_none());
    }

    fn test_config() -> UpstreamConfig {
        UpstreamConfig {
            urls: vec!["http://up/v1".into()],
            model: "up".into(),
            api_key: None,
            tokenizer: None,
            logprobs: true,
            connect_timeout: std::time::Duration::from_secs(1),
            first_byte_timeout: std::time::Duration::from_secs(1),
            idle_timeout: std::time::Duration::from_secs(1),
            probe_interval: std::time::Duration::from_secs(10),
            context_length: 0,
            check_model: true,
            max_tokens_param: "max_tokens".into(),
            fleet: Default::default(),
        }
    }

    #[test]
    fn chunks_of_each_shape_give_their_piece() {
        let chat = WireChunk::parse(r#"{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" Paris"},"logprobs":{"content":[{"token":" Paris","logprob":-0.25,"bytes":[32,80,97,114,105,115],"top_logprobs":[]}]},"finish_reason":null}]}"#).expect("chunk");
        assert_eq!(chat.model.as_deref(), Some("m"));
        let piece = chat.piece();
        assert_eq!(piece.text, " Paris");
        assert_eq!(piece.logprobs.len(), 1);
        assert_eq!(piece.logprobs[0].logprob, -0.25);

        let usage = WireChunk::parse(
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#,
        )
        .expect("chunk")
        .piece();
        assert_eq!(
            usage.usage,
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 3,
                cached_tokens: None,
                reasoning_tokens: None,
            })
        );
        let cached = WireChunk::parse(
            r#"{"choices":[],"usage":{"prompt_tokens":37,"completion_tokens":24,"prompt_tokens_details":{"cached_tokens":25}}}"#,
        )
        .expect("chunk")
        .piece();
        assert_eq!(
            cached.usage.and_then(|u| u.cached_tokens),
            Some(25),
            "llama.cpp's server"
        );
        let litellm = WireChunk::parse(r#"{"choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#)
            .expect("chunk")
            .piece();
        assert_eq!(litellm.text, "");
        assert!(litellm.usage.is_some());

        let legacy = WireChunk::parse(r#"{"choices":[{"text":" is","index":0,"logprobs":{"tokens":[" is"],"token_logprobs":[-1.5],"top_logprobs":[{" is":-1.5," was":-2.0}],"text_offset":[0]},"finish_reason":"length"}]}"#)
            .expect("chunk")
            .piece();
        assert_eq!(legacy.text, " is");
        assert_eq!(legacy.finish_reason.as_deref(), Some("length"));
        assert_eq!(legacy.logprobs[0].top[0].0.text, " is", "likeliest first");

        let error = WireChunk::parse(r#"{"error":{"message":"CUDA out of memory","code":500}}"#)
            .expect("chunk")
            .piece();
        let error = error.error.expect("an error");
        assert_eq!(
            (error.message.as_str(), error.status),
            ("CUDA out of memory", Some(500))
        );
        let refusal = WireChunk::parse(
            r#"{"error":{"message":"out of vocabulary","param":"stop_token_ids","code":"400"}}"#,
        )
        .expect("chunk")
        .piece()
        .error
        .expect("an error");
        assert_eq!(
            (refusal.status, refusal.param.as_deref()),
            (Some(400), Some("stop_token_ids"))
        );
        assert!(WireChunk::parse("not json").is_err());
    }

    #[test]
    fn the_end_token_an_upstream_lists_is_not_content() {
        let tokens = |piece: &Piece| -> Vec<String> {
            piece
                .logprobs
                .iter()
                .map(|t| t.token.text.clone())
                .collect()
        };
        // vLLM's last chunk: the end token, spelled, with no text of its own.
        let spelled = WireChunk::parse(r#"{"choices":[{"index":0,"delta":{"content":""},"logprobs":{"content":[{"token":"<|im_end|>","logprob":-0.01,"bytes":[60,124,105,109,95,101,110,100,124,62],"top_logprobs":[]}]},"finish_reason":"stop"}]}"#)
            .expect("chunk")
            .piece();
        assert!(spelled.logprobs.is_empty(), "{:?}", tokens(&spelled));
        // The same in a chunk that also ends the text, and decoded to nothing.
        let after_text = WireChunk::parse(r#"{"choices":[{"index":0,"delta":{"content":" sea."},"logprobs":{"content":[{"token":" sea","logprob":-0.1,"bytes":[32,115,101,97]},{"token":".","logprob":-0.2,"bytes":[46]},{"token":"","logprob":-0.01,"bytes":[]}]},"finish_reason":"stop"}]}"#)
            .expect("chunk")
            .piece();
        assert_eq!(tokens(&after_text), [" sea", "."]);
        // The last token of the text is content, stopped or not; so is every token of
        // an answer cut at its length.
        let last_word = WireChunk::parse(r#"{"choices":[{"index":0,"delta":{"content":"."},"logprobs":{"content":[{"token":".","logprob":-0.2,"bytes":[46]}]},"finish_reason":"stop"}]}"#)
            .expect("chunk")
            .piece();
        assert_eq!(tokens(&last_word), ["."]);
        let cut = WireChunk::parse(r#"{"choices":[{"index":0,"delta":{"content":""},"logprobs":{"content":[{"token":"<|im_end|>","logprob":-0.01,"bytes":[60]}]},"finish_reason":"length"}]}"#)
            .expect("chunk")
            .piece();
        assert_eq!(cut.logprobs.len(), 1, "only a stop has an end token");
    }
}

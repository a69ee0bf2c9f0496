//! The chunk assembler: a pure state machine that turns engine events into OpenAI
//! `chat.completion.chunk` frames, byte for byte as OpenAI sends them:
//!
//! ```text
//! data: {... "choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}
//! data: {... "choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}
//! data: {... "choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}
//! data: {... "choices":[],"usage":{...},"timings":{...}}      (only with include_usage)
//! data: [DONE]
//! ```
//!
//! With `include_usage`, every chunk carries `"usage":null` until the usage chunk, as
//! OpenAI does. `timings` rides on the last chunk before `[DONE]`: the usage chunk when
//! there is one, the finish-reason chunk otherwise. It never reads a clock or does I/O:
//! the producer (`stream::producer`) stamps and sends what this returns.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use utoipa::ToSchema;

pub mod native;

use super::logprobs::{ChatLogprobs, TextLogprobs};
use crate::engine::{ToolCall, ToolCallDelta};
use crate::error::ApiError;
use crate::record::ResponseTimings;
use crate::tokens::{FinishReason, TokenLogprob, Usage};

pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";
pub const KEEPALIVE_FRAME: &[u8] = b": keep-alive\n\n";

/// Identity shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `chatcmpl-<request id>` or `cmpl-<request id>`.
    pub id: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub shape: Shape,
    /// Legacy completions' `echo`: the prompt, sent before the answer.
    pub echo: Option<String>,
    /// Answer in llama.cpp's server's own shape (`POST /completion`), not OpenAI's.
    pub native: Option<Box<native::NativeMeta>>,
    /// The request offered the legacy `functions`: a call is a `function_call`, and the
    /// answer ends with `finish_reason: "function_call"`.
    pub legacy_functions: bool,
}

impl ResponseMeta {
    /// Characters the response text holds before the answer (the echoed prompt).
    fn echoed_chars(&self) -> usize {
        self.echo.as_deref().map_or(0, |p| p.chars().count())
    }

    /// How the answer says it ended: a tool call under its legacy name where the
    /// request used the legacy `functions`.
    fn finish_word(&self, reason: FinishReason) -> &'static str {
        match reason {
            FinishReason::ToolCalls if self.legacy_functions => "function_call",
            reason => reason.as_str(),
        }
    }
}

/// Which of OpenAI's two answer shapes: chat messages, or the legacy completions' text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `chat.completion(.chunk)`: a role, then content deltas.
    Chat,
    /// `text_completion`: text pieces, no role.
    Text,
}

impl Shape {
    fn object(self, streamed: bool) -> &'static str {
        match (self, streamed) {
            (Shape::Chat, true) => "chat.completion.chunk",
            (Shape::Chat, false) => "chat.completion",
            (Shape::Text, _) => "text_completion",
        }
    }

    /// The id's prefix, as OpenAI makes them.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Shape::Chat => "chatcmpl-",
            Shape::Text => "cmpl-",
        }
    }
}

pub struct ChunkAssembler {
    meta: ResponseMeta,
    include_usage: bool,
    /// The client asked for `logprobs`: content chunks carry their tokens'.
    logprobs: bool,
    /// Where the next chunk's legacy `text_offset`s count from (see
    /// [`TextLogprobs::end`]).
    text_offset: usize,
    /// Characters of text sent so far, the echo included (counted with `logprobs`).
    sent_chars: usize,
    /// vLLM's `continuous_usage_stats`: every chunk carries the usage so far (this);
    /// `None` when off.
    continuous_usage: Option<Usage>,
    /// llama.cpp's shape: the ids of the tokens not yet in a frame, each with where its
    /// engine text began in the answer (characters), so those a stop sequence cuts off
    /// are dropped with their text; how many tokens there have been; how many characters
    /// of engine text; whether a line break went out.
    ids: Vec<(u32, usize)>,
    predicted: u32,
    engine_chars: usize,
    new_line: bool,
    /// llama.cpp's `timings_per_token`: content frames carry llama.cpp's timings so far
    /// (the last given to [`ChunkAssembler::timed`]); `None` when off.
    per_token: Option<Option<native::LlamaTimings>>,
    /// When the first `return_progress` report came: the engine began reading the prompt.
    reading_since: Option<std::time::Instant>,
}

/// One `data:` frame of a stream (`chat.completion.chunk` or `text_completion`).
#[derive(Serialize, ToSchema)]
#[schema(as = CompletionChunk)]
pub(crate) struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'a str,
    #[schema(value_type = Vec<ChunkChoice>)]
    choices: &'a [ChunkChoice<'a>],
    /// Outer `None`: no field (usage not requested); `Some(None)`: `"usage":null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<UsageBody>, required = false)]
    usage: Option<Option<UsageBody>>,
    /// The last chunk's: the request's timings and quality signals. With llama.cpp's
    /// `timings_per_token`, every content chunk's: llama.cpp's figures so far (`prompt_n`,
    /// `prompt_ms`, `predicted_n`, `predicted_ms`, `predicted_per_second`, ...), and the
    /// last chunk's carries them beside the gateway's.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ResponseTimings>, required = false)]
    timings: Option<ChunkTimings<'a>>,
    /// llama.cpp's `return_progress`: how much of the prompt the engine has read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<native::PromptProgress>, required = false)]
    prompt_progress: Option<native::PromptProgress>,
}

/// What a chunk's or an answer's `timings` holds.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ChunkTimings<'a> {
    /// The last chunk's: the gateway's timings and quality signals.
    Last(&'a ResponseTimings),
    /// With `timings_per_token`, the last chunk's: the same, and llama.cpp's figures.
    LastWithLlama {
        #[serde(flatten)]
        ours: &'a ResponseTimings,
        #[serde(flatten)]
        llama: native::LlamaTimings,
    },
    /// With `timings_per_token`, a content chunk's: llama.cpp's figures so far.
    SoFar(native::LlamaTimings),
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum ChunkChoice<'a> {
    Chat {
        index: u32,
        delta: Delta<'a>,
        logprobs: Option<ChatLogprobs<'a>>,
        finish_reason: Option<&'static str>,
    },
    Text {
        text: &'a str,
        index: u32,
        logprobs: Option<TextLogprobs<'a>>,
        finish_reason: Option<&'static str>,
    },
}

#[derive(Default, Serialize, ToSchema)]
pub(crate) struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    content: Option<&'a str>,
    /// A reasoning model's thinking, outside the content (as vLLM, llama-server and
    /// DeepSeek's API send it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    reasoning_content: Option<&'a str>,
    /// A piece of a tool call: the first of a call carries its id and name.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = Option<Vec<ToolCallPiece>>)]
    tool_calls: Option<[ToolCallPiece<'a>; 1]>,
    /// The legacy `functions`' call, piece by piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = Option<FunctionPiece>)]
    function_call: Option<FunctionPiece<'a>>,
}

/// One piece of a streamed tool call, as OpenAI frames it.
#[derive(Serialize, ToSchema)]
pub(crate) struct ToolCallPiece<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    kind: Option<&'static str>,
    function: FunctionPiece<'a>,
}

/// A function's name (in a call's first piece) and a fragment of its arguments.
#[derive(Serialize, ToSchema)]
pub(crate) struct FunctionPiece<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// OpenAI's `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
#[schema(as = Usage)]
pub struct UsageBody {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// `cached_tokens`: prompt tokens read from the prefix cache; left out where the
    /// engine does not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// `reasoning_tokens`: those of the completion a reasoning model spent thinking;
    /// left out without reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// OpenAI's `usage.completion_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: u32,
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl From<Usage> for UsageBody {
    fn from(u: Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
            prompt_tokens_details: u
                .cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
            completion_tokens_details: u
                .reasoning_tokens
                .map(|reasoning_tokens| CompletionTokensDetails { reasoning_tokens }),
        }
    }
}

impl ChunkAssembler {
    pub fn new(meta: ResponseMeta, include_usage: bool) -> Self {
        Self {
            text_offset: meta.echoed_chars(),
            sent_chars: meta.echoed_chars(),
            meta,
            include_usage,
            logprobs: false,
            continuous_usage: None,
            ids: Vec::new(),
            predicted: 0,
            engine_chars: 0,
            new_line: false,
            per_token: None,
            reading_since: None,
        }
    }

    /// llama.cpp's `timings_per_token`: each content frame carries llama.cpp's timings
    /// so far, and the last one them beside the gateway's.
    pub fn with_timings_per_token(mut self, on: bool) -> Self {
        self.per_token = on.then_some(None);
        self
    }

    /// Whether content frames carry timings (the producer then gives them, before
    /// each frame, to [`ChunkAssembler::timed`]).
    pub fn wants_timings(&self) -> bool {
        self.per_token.is_some()
    }

    /// llama.cpp's timings so far, for the next content frames.
    pub fn timed(&mut self, so_far: native::LlamaTimings) {
        if let Some(slot) = self.per_token.as_mut() {
            *slot = Some(so_far);
        }
    }

    /// The ids of the tokens an engine event brought with `text` (llama.cpp's shape
    /// lists them in the frame that carries their text).
    pub fn tokens_arrived(&mut self, ids: &[u32], text: &str) {
        if self.meta.native.is_some() {
            let at = self.engine_chars;
            self.ids.extend(ids.iter().map(|&id| (id, at)));
            self.predicted += ids.len() as u32;
            self.engine_chars += text.chars().count();
        }
    }

    /// Every chunk carries the usage so far (vLLM's `continuous_usage_stats`), from
    /// `prompt_tokens` and the counts [`ChunkAssembler::count`] is given.
    pub fn with_continuous_usage(mut self, on: bool, prompt_tokens: u32) -> Self {
        self.continuous_usage = (on && self.include_usage).then_some(Usage {
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: None,
            reasoning_tokens: None,
        });
        self
    }

    /// The usage so far, for the next chunks when they carry it.
    pub fn count(&mut self, usage: Usage) {
        if let Some(so_far) = self.continuous_usage.as_mut() {
            *so_far = usage;
        }
    }

    /// Content chunks carry their tokens' log-probabilities.
    pub fn with_logprobs(mut self, logprobs: bool) -> Self {
        self.logprobs = logprobs;
        self
    }

    /// The frame before any token: for chat, the assistant role with empty content; for
    /// text completions, the echoed prompt when `echo` asked for it, else none.
    pub fn first_frame(&self) -> Option<Bytes> {
        if self.meta.native.is_some() {
            return None;
        }
        match self.meta.shape {
            Shape::Chat => Some(self.frame(
                &[self.choice(Some("assistant"), Some(""), None, &[])],
                self.null_usage(),
                None,
            )),
            Shape::Text => self.meta.echo.as_deref().map(|prompt| {
                let echo = ChunkChoice::Text {
                    text: prompt,
                    index: 0,
                    logprobs: None,
                    finish_reason: None,
                };
                self.frame(&[echo], self.null_usage(), None)
            }),
        }
    }

    /// A content frame for text, with the log-probabilities (when asked for) of the
    /// waiting `tokens` whose text it completes; those go from `tokens`, the others wait
    /// for a later frame (text held back for a stop sequence, a character split across
    /// tokens). `None` for empty text: nothing to send.
    pub fn token_frame(&mut self, text: &str, tokens: &mut Vec<TokenLogprob>) -> Option<Bytes> {
        if text.is_empty() {
            return None;
        }
        // A token goes with the frame that completes its text, not simply the next one:
        // the producer holds text back for stop sequences, and an engine may hand over
        // tokens ahead of their text (mistral.rs's sampler runs ahead of its responses).
        // Characters and offsets are counted only for a client that gets them.
        let mut complete = tokens.len();
        if self.logprobs {
            self.sent_chars += text.chars().count();
            complete = TextLogprobs {
                tokens,
                start: self.text_offset,
            }
            .ended_by(self.sent_chars);
        }
        let frame = match &self.meta.native {
            Some(native) => {
                let logprobs = self.logprobs.then_some(&tokens[..complete]);
                let ids: Vec<u32> = self.ids.drain(..).map(|(id, _)| id).collect();
                self.new_line |= text.contains('\n');
                sse_json(&native::token_frame(
                    native,
                    text,
                    &ids,
                    self.predicted,
                    logprobs,
                    self.per_token.flatten(),
                ))
            }
            None => self.frame(
                &[self.choice(None, Some(text), None, &tokens[..complete])],
                self.null_usage(),
                self.per_token.flatten().map(ChunkTimings::SoFar),
            ),
        };
        if self.logprobs {
            self.text_offset = TextLogprobs {
                tokens: &tokens[..complete],
                start: self.text_offset,
            }
            .end();
        }
        tokens.drain(..complete);
        Some(frame)
    }

    /// A frame of reasoning; `None` where the shape has no place for it (legacy
    /// completions, llama.cpp's `/completion`) or there is no text.
    pub fn reasoning_frame(&self, text: &str) -> Option<Bytes> {
        if text.is_empty() || !self.chats() {
            return None;
        }
        let delta = Delta {
            reasoning_content: Some(text),
            ..Delta::default()
        };
        Some(self.frame(&[self.chat_choice(delta, None)], self.null_usage(), None))
    }

    /// A frame with a piece of a tool call, as OpenAI frames it (`function_call` for the
    /// legacy `functions`); `None` outside the chat shape.
    pub fn tool_call_frame(&self, piece: &ToolCallDelta) -> Option<Bytes> {
        if !self.chats() {
            return None;
        }
        let function = FunctionPiece {
            name: piece.name.as_deref(),
            arguments: &piece.arguments,
        };
        let delta = if self.meta.legacy_functions {
            Delta {
                function_call: Some(function),
                ..Delta::default()
            }
        } else {
            Delta {
                tool_calls: Some([ToolCallPiece {
                    index: piece.index,
                    id: piece.id.as_deref(),
                    kind: piece.id.as_ref().map(|_| "function"),
                    function,
                }]),
                ..Delta::default()
            }
        };
        Some(self.frame(&[self.chat_choice(delta, None)], self.null_usage(), None))
    }

    /// Whether frames are OpenAI's chat chunks (the only shape with reasoning and tools).
    fn chats(&self) -> bool {
        self.meta.shape == Shape::Chat && self.meta.native.is_none()
    }

    /// llama.cpp's `return_progress` frame: `processed` of the prompt's `total` tokens
    /// read, `cached` of them from a cache, `time_ms` since the engine began reading it.
    /// In OpenAI's shapes, a chunk whose choice carries nothing, as llama-server sends.
    pub fn progress_frame(&mut self, total: u32, cached: u32, processed: u32) -> Bytes {
        let began = *self
            .reading_since
            .get_or_insert_with(std::time::Instant::now);
        let progress = native::PromptProgress {
            total,
            cache: cached,
            processed,
            time_ms: began.elapsed().as_secs_f64() * 1e3,
        };
        if let Some(native) = &self.meta.native {
            return sse_json(&native::progress_frame(native, progress));
        }
        self.chunk(
            &[self.choice(None, None, None, &[])],
            self.null_usage(),
            None,
            Some(progress),
        )
    }

    /// Drops the tokens a stop sequence cut off: those that begin after the `answer`
    /// (the whole answer text, as it ends) and so are not part of it.
    pub fn drop_cut_tokens(&mut self, tokens: &mut Vec<TokenLogprob>, answer: &str) {
        let answer_chars = answer.chars().count();
        self.ids.retain(|&(_, at)| at < answer_chars);
        let end = self.meta.echoed_chars() + answer_chars;
        let keep = TextLogprobs {
            tokens,
            start: self.text_offset,
        }
        .begun_before(end);
        tokens.truncate(keep);
    }

    /// The frames that end a successful response, `[DONE]` included. `tokens`: those no
    /// content frame carried (their text was empty, or never reached the client's text:
    /// an end-of-sequence token, or one a control token's spelling held back).
    /// `stop`: llama.cpp's `stop_type` and the stop sequence that matched, for its shape.
    pub fn finish_frames(
        &self,
        reason: FinishReason,
        usage: Usage,
        timings: &ResponseTimings,
        tokens: &[TokenLogprob],
        stop: (&'static str, Option<&str>),
    ) -> Vec<Bytes> {
        if let Some(native) = &self.meta.native {
            let ids: Vec<u32> = self.ids.iter().map(|&(id, _)| id).collect();
            let last = native::Final {
                model: &self.meta.model,
                content: "",
                has_new_line: self.new_line,
                ids: &ids,
                stop_type: stop.0,
                stopping_word: stop.1,
                usage,
                report: timings,
                logprobs: self.logprobs.then_some(tokens),
            };
            return vec![sse_json(&last.to_value(native))];
        }
        let finish = [self.choice(None, None, Some(self.meta.finish_word(reason)), tokens)];
        let last = || match self.per_token {
            Some(_) => ChunkTimings::LastWithLlama {
                ours: timings,
                llama: native::LlamaTimings::of(timings, usage),
            },
            None => ChunkTimings::Last(timings),
        };
        let mut frames = Vec::with_capacity(3);
        if self.include_usage {
            let usage_now = self.continuous_usage.map(|_| UsageBody::from(usage));
            frames.push(self.frame(&finish, Some(usage_now), None));
            frames.push(self.frame(&[], Some(Some(usage.into())), Some(last())));
        } else {
            frames.push(self.frame(&finish, None, Some(last())));
        }
        frames.push(Bytes::from_static(DONE_FRAME));
        frames
    }

    /// A failure mid-stream: one error frame, then `[DONE]` (none in llama.cpp's shape,
    /// whose clients read every frame as JSON).
    pub fn error_frames(&self, error: &ApiError) -> Vec<Bytes> {
        let mut frames = vec![sse_json(&error.body())];
        if self.meta.native.is_none() {
            frames.push(Bytes::from_static(DONE_FRAME));
        }
        frames
    }

    /// The `usage` of a chunk before the last: `null`, the usage so far when every chunk
    /// carries it, or no field when usage was not asked for.
    fn null_usage(&self) -> Option<Option<UsageBody>> {
        match self.continuous_usage {
            Some(so_far) => Some(Some(so_far.into())),
            None => self.include_usage.then_some(None),
        }
    }

    fn frame(
        &self,
        choices: &[ChunkChoice<'_>],
        usage: Option<Option<UsageBody>>,
        timings: Option<ChunkTimings<'_>>,
    ) -> Bytes {
        self.chunk(choices, usage, timings, None)
    }

    fn chunk(
        &self,
        choices: &[ChunkChoice<'_>],
        usage: Option<Option<UsageBody>>,
        timings: Option<ChunkTimings<'_>>,
        prompt_progress: Option<native::PromptProgress>,
    ) -> Bytes {
        sse_json(&Chunk {
            id: &self.meta.id,
            object: self.meta.shape.object(true),
            created: self.meta.created,
            model: &self.meta.model,
            system_fingerprint: &self.meta.system_fingerprint,
            choices,
            usage,
            timings,
            prompt_progress,
        })
    }

    fn choice<'a>(
        &self,
        role: Option<&'static str>,
        content: Option<&'a str>,
        finish_reason: Option<&'static str>,
        tokens: &'a [TokenLogprob],
    ) -> ChunkChoice<'a> {
        match self.meta.shape {
            Shape::Chat => ChunkChoice::Chat {
                index: 0,
                delta: Delta {
                    role,
                    content,
                    ..Delta::default()
                },
                // A chunk without tokens (the role, a bare finish) has `null`, as OpenAI's.
                logprobs: (self.logprobs && !tokens.is_empty()).then_some(ChatLogprobs(tokens)),
                finish_reason,
            },
            Shape::Text => ChunkChoice::Text {
                text: content.unwrap_or(""),
                index: 0,
                logprobs: (self.logprobs && !tokens.is_empty()).then_some(TextLogprobs {
                    tokens,
                    start: self.text_offset,
                }),
                finish_reason,
            },
        }
    }
}

impl ChunkAssembler {
    /// A chat choice with `delta` and no log-probabilities.
    fn chat_choice<'a>(
        &self,
        delta: Delta<'a>,
        finish_reason: Option<&'static str>,
    ) -> ChunkChoice<'a> {
        ChunkChoice::Chat {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        }
    }
}

/// `data: <json>\n\n`, serialised straight into the frame buffer.
pub(crate) fn sse_json<T: Serialize>(value: &T) -> Bytes {
    let mut buf = BytesMut::with_capacity(256).writer();
    buf.get_mut().put_slice(b"data: ");
    // Serialising these plain structs into memory cannot fail.
    let _ = serde_json::to_writer(&mut buf, value);
    let mut buf = buf.into_inner();
    buf.put_slice(b"\n\n");
    buf.freeze()
}

/// The non-streamed response: `chat.completion` or `text_completion`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub system_fingerprint: &'a str,
    #[schema(value_type = Vec<CompletionChoice>)]
    pub choices: [CompletionChoice<'a>; 1],
    pub usage: UsageBody,
    /// The gateway's timings and quality signals; with llama.cpp's `timings_per_token`,
    /// llama.cpp's figures beside them.
    #[schema(value_type = ResponseTimings)]
    pub timings: ChunkTimings<'a>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum CompletionChoice<'a> {
    Chat {
        index: u32,
        message: Message<'a>,
        logprobs: Option<ChatLogprobs<'a>>,
        finish_reason: &'static str,
    },
    Text {
        /// The answer, after the prompt when `echo` asked for it.
        text: Cow<'a, str>,
        index: u32,
        logprobs: Option<TextLogprobs<'a>>,
        finish_reason: &'static str,
    },
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AssistantMessage)]
pub struct Message<'a> {
    pub role: &'static str,
    /// `null` when the answer is tool calls alone, as OpenAI's.
    pub content: Option<&'a str>,
    #[schema(value_type = Option<String>)]
    pub refusal: Option<()>,
    /// A reasoning model's thinking.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<ToolCallBody<'a>>>,
    /// The legacy `functions`' call.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = Option<Object>)]
    pub function_call: Option<FunctionBody<'a>>,
}

/// A whole tool call of a non-streamed answer.
#[derive(Debug, Serialize)]
pub struct ToolCallBody<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionBody<'a>,
}

#[derive(Debug, Serialize)]
pub struct FunctionBody<'a> {
    pub name: &'a str,
    pub arguments: &'a str,
}

/// What a non-streamed answer holds besides its content.
#[derive(Debug, Clone, Copy, Default)]
pub struct SideParts<'a> {
    pub reasoning: &'a str,
    pub tool_calls: &'a [ToolCall],
}

impl<'a> Completion<'a> {
    /// `logprobs`: every token's, when the client asked for them.
    pub fn new(
        meta: &'a ResponseMeta,
        content: &'a str,
        reason: FinishReason,
        usage: Usage,
        timings: &'a ResponseTimings,
        logprobs: Option<&'a [TokenLogprob]>,
    ) -> Self {
        let choice = match meta.shape {
            Shape::Chat => CompletionChoice::Chat {
                index: 0,
                message: Message {
                    role: "assistant",
                    content: Some(content),
                    refusal: None,
                    reasoning_content: None,
                    tool_calls: None,
                    function_call: None,
                },
                logprobs: logprobs.map(ChatLogprobs),
                finish_reason: meta.finish_word(reason),
            },
            Shape::Text => CompletionChoice::Text {
                text: match &meta.echo {
                    Some(prompt) => Cow::Owned(format!("{prompt}{content}")),
                    None => Cow::Borrowed(content),
                },
                index: 0,
                logprobs: logprobs.map(|tokens| TextLogprobs {
                    tokens,
                    start: meta.echoed_chars(),
                }),
                finish_reason: reason.as_str(),
            },
        };
        Self {
            id: &meta.id,
            object: meta.shape.object(false),
            created: meta.created,
            model: &meta.model,
            system_fingerprint: &meta.system_fingerprint,
            choices: [choice],
            usage: usage.into(),
            timings: ChunkTimings::Last(timings),
        }
    }

    /// The answer's reasoning and tool calls, in its message (`legacy`: the call as the
    /// legacy `function_call`).
    pub fn with_side(mut self, side: SideParts<'a>, legacy: bool) -> Self {
        let CompletionChoice::Chat { message, .. } = &mut self.choices[0] else {
            return self;
        };
        if !side.reasoning.is_empty() {
            message.reasoning_content = Some(side.reasoning);
        }
        if side.tool_calls.is_empty() {
            return self;
        }
        if message.content == Some("") {
            message.content = None;
        }
        let body = |call: &'a ToolCall| FunctionBody {
            name: &call.name,
            arguments: &call.arguments,
        };
        if legacy {
            message.function_call = side.tool_calls.first().map(body);
        } else {
            message.tool_calls = Some(
                side.tool_calls
                    .iter()
                    .map(|call| ToolCallBody {
                        id: &call.id,
                        kind: "function",
                        function: body(call),
                    })
                    .collect(),
            );
        }
        self
    }

    /// With llama.cpp's `timings_per_token` (`on`): the timings carry llama.cpp's
    /// figures too, as a stream's last chunk does.
    pub fn with_llama_timings(mut self, on: bool, usage: Usage) -> Self {
        if let (true, ChunkTimings::Last(ours)) = (on, &self.timings) {
            self.timings = ChunkTimings::LastWithLlama {
                ours,
                llama: native::LlamaTimings::of(ours, usage),
            };
        }
        self
    }
}

#[cfg(test)]
mod tests;

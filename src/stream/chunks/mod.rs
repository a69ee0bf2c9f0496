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

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

mod completion;
mod frames;
pub mod native;

pub use completion::{
    Completion, CompletionChoice, FunctionBody, Message, SideParts, ToolCallBody,
};
pub(crate) use frames::{Chunk, ChunkChoice, Delta, FunctionPiece, ToolCallPiece};
pub use frames::{ChunkTimings, CompletionTokensDetails, PromptTokensDetails, UsageBody};

use super::logprobs::{ChatLogprobs, TextLogprobs};
use crate::engine::ToolCallDelta;
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
    /// The request offered tools: the answer may be calls alone, whose message has
    /// `content: null`, so the first frame says only the role (an SDK's accumulator then
    /// gives the same message as the whole answer).
    pub offers_tools: bool,
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
                &[self.choice(
                    Some("assistant"),
                    (!self.meta.offers_tools).then_some(""),
                    None,
                    &[],
                )],
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

#[cfg(test)]
mod tests;

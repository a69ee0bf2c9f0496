//! The non-streamed answer (`chat.completion` or `text_completion`): the same parts a
//! stream carries, in one body, with the reasoning and tool calls in its message.

use std::borrow::Cow;

use serde::Serialize;
use utoipa::ToSchema;

use super::{native, ChunkTimings, ResponseMeta, Shape, UsageBody};
use crate::engine::ToolCall;
use crate::record::ResponseTimings;
use crate::stream::logprobs::{ChatLogprobs, TextLogprobs};
use crate::tokens::{FinishReason, TokenLogprob, Usage};

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

//! The shapes of a stream's frames as OpenAI (and vLLM, llama.cpp's server) write them:
//! the chunk, its choices and deltas (content, reasoning, pieces of tool calls), and the
//! `usage` object. The assembler ([`super::ChunkAssembler`]) fills them in.

use serde::Serialize;
use utoipa::ToSchema;

use super::native;
use crate::record::ResponseTimings;
use crate::stream::logprobs::{ChatLogprobs, TextLogprobs};
use crate::tokens::Usage;

/// One `data:` frame of a stream (`chat.completion.chunk` or `text_completion`).
#[derive(Serialize, ToSchema)]
#[schema(as = CompletionChunk)]
pub(crate) struct Chunk<'a> {
    pub(super) id: &'a str,
    pub(super) object: &'static str,
    pub(super) created: u64,
    pub(super) model: &'a str,
    pub(super) system_fingerprint: &'a str,
    #[schema(value_type = Vec<ChunkChoice>)]
    pub(super) choices: &'a [ChunkChoice<'a>],
    /// Outer `None`: no field (usage not requested); `Some(None)`: `"usage":null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<UsageBody>, required = false)]
    pub(super) usage: Option<Option<UsageBody>>,
    /// The last chunk's: the request's timings and quality signals. With llama.cpp's
    /// `timings_per_token`, every content chunk's: llama.cpp's figures so far (`prompt_n`,
    /// `prompt_ms`, `predicted_n`, `predicted_ms`, `predicted_per_second`, ...), and the
    /// last chunk's carries them beside the gateway's.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ResponseTimings>, required = false)]
    pub(super) timings: Option<ChunkTimings<'a>>,
    /// llama.cpp's `return_progress`: how much of the prompt the engine has read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<native::PromptProgress>, required = false)]
    pub(super) prompt_progress: Option<native::PromptProgress>,
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
    pub(super) role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub(super) content: Option<&'a str>,
    /// A reasoning model's thinking, outside the content (as vLLM, llama-server and
    /// DeepSeek's API send it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub(super) reasoning_content: Option<&'a str>,
    /// A piece of a tool call: the first of a call carries its id and name.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = Option<Vec<ToolCallPiece>>)]
    pub(super) tool_calls: Option<[ToolCallPiece<'a>; 1]>,
    /// The legacy `functions`' call, piece by piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = Option<FunctionPiece>)]
    pub(super) function_call: Option<FunctionPiece<'a>>,
}

/// One piece of a streamed tool call, as OpenAI frames it.
#[derive(Serialize, ToSchema)]
pub(crate) struct ToolCallPiece<'a> {
    pub(super) index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub(super) id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub(super) kind: Option<&'static str>,
    pub(super) function: FunctionPiece<'a>,
}

/// A function's name (in a call's first piece) and a fragment of its arguments.
#[derive(Serialize, ToSchema)]
pub(crate) struct FunctionPiece<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub(super) name: Option<&'a str>,
    pub(super) arguments: &'a str,
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

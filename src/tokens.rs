//! The vocabulary every layer shares about generated text: a token's text and bytes, its
//! log-probability, why an answer finished, the token counts of a request, and what the
//! repetition rate's token ids are. Engines produce these; the stream, the quality
//! signals, the records and the semantic log read them. A leaf: it uses nothing of the
//! crate, so none of those layers depends on the engines to speak of tokens.

/// A token as text: its UTF-8 bytes (which may be part of a character) and their lossy
/// reading, as OpenAI's `logprobs` give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenText {
    pub text: String,
    pub bytes: Vec<u8>,
    /// The token's id, where the engine picked it here (llama.cpp's `n_probs` lists
    /// it); `None` for an upstream's tokens, which come as text.
    pub id: Option<u32>,
}

impl TokenText {
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            id: None,
        }
    }

    /// The same token, known by its id.
    pub fn with_id(self, id: u32) -> Self {
        Self {
            id: Some(id),
            ..self
        }
    }
}

/// How likely the model found a picked token, and the likeliest alternatives when the
/// request asked for them. Natural log of the probability in the distribution the token
/// was picked from: after the penalties and any grammar mask, before temperature (so it
/// does not depend on the sampling settings).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: TokenText,
    /// Under the model (temperature 1): what the confidence figures read.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens, most likely first (with `sampled`, in the
    /// distribution the token was drawn from).
    pub top: Vec<(TokenText, f32)>,
    /// llama.cpp's `post_sampling_probs`: the token's log-probability in the
    /// distribution it was drawn from (after the temperature and the top_k, top_p and
    /// min_p filters), which the client is shown instead of `logprob`.
    pub sampled: Option<f32>,
}

impl TokenLogprob {
    /// The log-probability the client is shown: the drawn distribution's where it was
    /// asked for, the model's otherwise.
    pub fn shown(&self) -> f32 {
        self.sampled.unwrap_or(self.logprob)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End of sequence or a stop sequence.
    Stop,
    /// `max_tokens` or the model's context length was reached.
    Length,
    /// The model called tools (a legacy `functions` request: `function_call`).
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens read from a cache of an earlier prompt rather than computed: the
    /// llama.cpp engine's prefix cache, or what an upstream reported; `None` where the
    /// engine does not say.
    pub cached_tokens: Option<u32>,
    /// Completion tokens a reasoning model spent thinking (`completion_tokens_details.
    /// reasoning_tokens`); `None` where there was no reasoning or the engine does not say.
    pub reasoning_tokens: Option<u32>,
}

/// What the token ids behind the repetition rate are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RepetitionBasis {
    /// The engine's own token ids (in this process).
    #[default]
    TokenIds,
    /// The tokens an upstream reported with their log-probabilities: each distinct
    /// token is one id, which is seq-rep-n over the model's tokens without its tokenizer.
    LogprobTokens,
    /// The answer's text tokenized again with the model's tokenizer (`tokenizer.json`
    /// or a GGUF's vocabulary), chunk by chunk.
    Tokenizer,
    /// Whitespace-separated words: neither log-probabilities nor a tokenizer were there.
    Words,
}

impl RepetitionBasis {
    pub const ALL: [RepetitionBasis; 4] = [
        RepetitionBasis::TokenIds,
        RepetitionBasis::LogprobTokens,
        RepetitionBasis::Tokenizer,
        RepetitionBasis::Words,
    ];

    /// The in-process default, left out of the `timings` object.
    pub fn is_token_ids(&self) -> bool {
        *self == RepetitionBasis::TokenIds
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RepetitionBasis::TokenIds => "token_ids",
            RepetitionBasis::LogprobTokens => "logprob_tokens",
            RepetitionBasis::Tokenizer => "tokenizer",
            RepetitionBasis::Words => "words",
        }
    }
}

//! The kinds of output a token can be (docs/timings.md, "Reasoning and tool calls"):
//! reasoning, answer, or a piece of a tool call; and the moments of each kind, from
//! which the request's `answer_ttft_ms`, `reasoning_ms`, `tool_call_ttft_ms`,
//! `tool_calls_done_ms` and the per-kind token counts and TPOT are worked out.

use std::time::Duration;

use serde::Serialize;

/// What a token of the output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// A reasoning model's thinking (`reasoning_content`).
    Reasoning,
    /// The answer's content.
    Answer,
    /// A tool call's header or a fragment of its arguments.
    ToolCall,
}

/// The engine stamps of one kind's tokens.
#[derive(Debug, Clone, Copy, Default)]
struct Stamps {
    first: Option<Duration>,
    last: Option<Duration>,
    /// Tokens counted as they came (not kept for the answer, whose count is what the
    /// others leave of the usage).
    tokens: u32,
}

impl Stamps {
    fn push(&mut self, at: Duration, tokens: u32) {
        self.first.get_or_insert(at);
        self.last = Some(at);
        self.tokens += tokens;
    }

    /// TPOT over this kind's own first and last token.
    fn tpot(&self, tokens: u32) -> Option<Duration> {
        match (self.first, self.last) {
            (Some(first), Some(last)) if tokens >= 2 => {
                Some(last.saturating_sub(first) / (tokens - 1))
            }
            _ => None,
        }
    }
}

/// The moments of each kind of output of one request, on the gateway's clock.
#[derive(Debug, Clone, Default)]
pub struct KindClock {
    reasoning: Stamps,
    answer: Stamps,
    tool: Stamps,
    /// Frames handed to the transport (or, for an answer given in one body, pieces
    /// arriving): the first answer and tool-call ones, the last tool-call one. The first
    /// of any kind is the request's TTFT, which the timer keeps.
    first_answer_frame: Option<Duration>,
    first_tool_frame: Option<Duration>,
    last_tool_frame: Option<Duration>,
}

/// Output tokens by kind, summing to `output_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TokensByKind {
    pub reasoning: u32,
    pub answer: u32,
    pub tool_calls: u32,
}

/// TPOT of each kind over its own first and last token; `None` below two tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TpotByKind {
    pub reasoning: Option<f64>,
    pub answer: Option<f64>,
    pub tool_calls: Option<f64>,
}

/// What [`KindClock::figures`] works out, in durations since `t_recv` where a moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindFigures {
    pub answer_ttft: Option<Duration>,
    pub reasoning: Option<Duration>,
    /// Reasoning tokens the gateway counted (an engine's own count wins where it gives
    /// one).
    pub reasoning_tokens: Option<u32>,
    pub tool_call_ttft: Option<Duration>,
    pub tool_calls_done: Option<Duration>,
    /// Only when the output had a kind besides the answer.
    pub by_kind: Option<(TokensByKind, [Option<Duration>; 3])>,
}

impl KindClock {
    /// The engine handed over `tokens` tokens of `kind`, stamped `at`.
    pub fn engine_output(&mut self, kind: OutputKind, at: Duration, tokens: u32) {
        self.stamps(kind).push(at, tokens);
    }

    /// A frame carrying output of `kind` was handed over at `at`.
    pub fn frame_sent(&mut self, kind: OutputKind, at: Duration) {
        match kind {
            OutputKind::Answer => {
                self.first_answer_frame.get_or_insert(at);
            }
            OutputKind::ToolCall => {
                self.first_tool_frame.get_or_insert(at);
                self.last_tool_frame = Some(at);
            }
            OutputKind::Reasoning => {}
        }
    }

    /// Whether the output so far has a kind besides the answer.
    pub fn mixed(&self) -> bool {
        self.reasoning.first.is_some() || self.tool.first.is_some()
    }

    fn stamps(&mut self, kind: OutputKind) -> &mut Stamps {
        match kind {
            OutputKind::Reasoning => &mut self.reasoning,
            OutputKind::Answer => &mut self.answer,
            OutputKind::ToolCall => &mut self.tool,
        }
    }

    /// The figures, with `t_recv` the request's arrival, `output_tokens` the usage's and
    /// `reported_reasoning` the engine's own count of reasoning tokens.
    pub fn figures(
        &self,
        t_recv: Duration,
        output_tokens: u32,
        reported_reasoning: Option<u32>,
    ) -> KindFigures {
        let since = |t: Option<Duration>| t.map(|t| t.saturating_sub(t_recv));
        // Reasoning lasts until output of another kind follows it, else to its last token.
        let reasoning = self.reasoning.first.map(|first| {
            let next = [self.answer.first, self.tool.first]
                .into_iter()
                .flatten()
                .filter(|&t| t >= first)
                .min();
            next.or(self.reasoning.last)
                .unwrap_or(first)
                .saturating_sub(first)
        });
        let counted = (self.reasoning.first.is_some()).then_some(self.reasoning.tokens);
        let reasoning_tokens = reported_reasoning.or(counted);
        let by_kind = self.mixed().then(|| {
            let reasoning = reasoning_tokens.unwrap_or(0).min(output_tokens);
            let tool_calls = self.tool.tokens.min(output_tokens - reasoning);
            let tokens = TokensByKind {
                reasoning,
                answer: output_tokens - reasoning - tool_calls,
                tool_calls,
            };
            let tpot = [
                self.reasoning.tpot(tokens.reasoning),
                self.answer.tpot(tokens.answer),
                self.tool.tpot(tokens.tool_calls),
            ];
            (tokens, tpot)
        });
        KindFigures {
            // A plain answer's is its TTFT: said once, as `ttft_ms`.
            answer_ttft: since(self.first_answer_frame).filter(|_| self.mixed()),
            reasoning,
            reasoning_tokens,
            tool_call_ttft: since(self.first_tool_frame),
            tool_calls_done: since(self.last_tool_frame),
            by_kind,
        }
    }
}

/// The figures of a reasoning model's and a tool call's output (docs/timings.md,
/// "Reasoning and tool calls"); each left out where it does not apply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct KindTimings {
    /// Request received -> the first frame with answer content (after any reasoning).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub answer_ttft_ms: Option<f64>,
    /// The first reasoning token -> the first token of another kind (or the last
    /// reasoning token, when nothing follows).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub reasoning_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub reasoning_tokens: Option<u32>,
    /// Request received -> the first frame with a tool-call delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub tool_call_ttft_ms: Option<f64>,
    /// Request received -> the frame with the last tool call's last argument fragment:
    /// when an agent can run its tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub tool_calls_done_ms: Option<f64>,
    /// Output tokens of each kind, when there was more than the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub output_tokens_by_kind: Option<TokensByKind>,
    /// TPOT of each kind over its own tokens, when there was more than the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub tpot_ms_by_kind: Option<TpotByKind>,
}

impl From<KindFigures> for KindTimings {
    fn from(f: KindFigures) -> Self {
        let ms = super::ms;
        let (tokens, tpot) = match f.by_kind {
            Some((tokens, [reasoning, answer, tool_calls])) => (
                Some(tokens),
                Some(TpotByKind {
                    reasoning: reasoning.map(ms),
                    answer: answer.map(ms),
                    tool_calls: tool_calls.map(ms),
                }),
            ),
            None => (None, None),
        };
        Self {
            answer_ttft_ms: f.answer_ttft.map(ms),
            reasoning_ms: f.reasoning.map(ms),
            reasoning_tokens: f.reasoning_tokens,
            tool_call_ttft_ms: f.tool_call_ttft.map(ms),
            tool_calls_done_ms: f.tool_calls_done.map(ms),
            output_tokens_by_kind: tokens,
            tpot_ms_by_kind: tpot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn reasoning_then_answer_is_timed_by_kind() {
        let mut clock = KindClock::default();
        for t in [100, 110, 120] {
            clock.engine_output(OutputKind::Reasoning, ms(t), 1);
            clock.frame_sent(OutputKind::Reasoning, ms(t + 1));
        }
        for t in [300, 320] {
            clock.engine_output(OutputKind::Answer, ms(t), 1);
            clock.frame_sent(OutputKind::Answer, ms(t + 1));
        }
        let f = clock.figures(ms(0), 5, None);
        assert_eq!(f.answer_ttft, Some(ms(301)));
        assert_eq!(
            f.reasoning,
            Some(ms(200)),
            "first reasoning token to the first answer token"
        );
        assert_eq!(f.reasoning_tokens, Some(3));
        assert_eq!(f.tool_call_ttft, None);
        let (tokens, tpot) = f.by_kind.expect("mixed");
        assert_eq!(
            (tokens.reasoning, tokens.answer, tokens.tool_calls),
            (3, 2, 0)
        );
        assert_eq!(tpot, [Some(ms(10)), Some(ms(20)), None]);
        // The engine's own count wins.
        assert_eq!(
            clock
                .figures(ms(0), 5, Some(4))
                .by_kind
                .expect("mixed")
                .0
                .answer,
            1
        );
    }

    #[test]
    fn tool_calls_are_timed_to_their_last_fragment() {
        let mut clock = KindClock::default();
        for t in [50, 60, 70, 80] {
            clock.engine_output(OutputKind::ToolCall, ms(t), 1);
            clock.frame_sent(OutputKind::ToolCall, ms(t + 2));
        }
        let f = clock.figures(ms(10), 4, None);
        assert_eq!(f.tool_call_ttft, Some(ms(42)));
        assert_eq!(f.tool_calls_done, Some(ms(72)));
        assert_eq!(f.answer_ttft, None, "no content");
        assert_eq!(f.reasoning, None);
        assert_eq!(f.by_kind.expect("mixed").0.tool_calls, 4);
    }

    #[test]
    fn a_plain_answer_has_no_shares() {
        let mut clock = KindClock::default();
        clock.engine_output(OutputKind::Answer, ms(5), 1);
        clock.frame_sent(OutputKind::Answer, ms(6));
        let f = clock.figures(ms(0), 1, None);
        assert_eq!(f.answer_ttft, None, "said once, as the TTFT");
        assert!(f.by_kind.is_none());
    }
}

//! The answer as read so far: a state machine fed each SSE event of an upstream's
//! stream with the moment it was parsed, and the end of its body. It says what to hand
//! on and whether, and how, the answer ended; it reads no clock and does no I/O (the
//! loop in [`super::read`] waits, stamps and sends), so its rules are tested on canned
//! events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Answered;
use crate::engine::upstream::fault::Fault;
use crate::engine::upstream::tokens::TokenReader;
use crate::engine::upstream::wire::{Piece, StreamError, WireChunk};
use crate::engine::{Budget, EngineEvent, Reported};
use crate::tokens::{FinishReason, Usage};

/// What the request asks of its answer: the rules every chunk is held to.
#[derive(Debug, Clone)]
pub(crate) struct Terms {
    /// The model the answer must say it is, when the config checks it.
    pub expected_model: Option<String>,
    /// Alternatives the client asked for per token (the upstream may be asked for more).
    pub top_logprobs: usize,
    /// The answer's budget: it ends with `length` at this many tokens, whatever the
    /// upstream does. When the upstream was sent it too ([`Budget::sent`]), it may end
    /// the answer itself (with its own finish and usage), and only content past the
    /// budget is cut.
    pub budget: Budget,
    /// The gateway's estimate of the prompt's tokens, until the upstream's usage arrives.
    pub prompt_tokens: u32,
}

/// What the stream has said about how the answer ends.
#[derive(Debug, Default)]
pub(super) struct StreamEnd {
    pub(super) finish: Option<FinishReason>,
    pub(super) usage: Option<Usage>,
    /// Tokens seen: log-probabilities where there are any, else chunks with text.
    pub(super) tokens: u32,
}

/// What one event of the stream leads to, in this order: the opening told, a token
/// handed on, the reading stopped.
#[derive(Debug, Default)]
pub(super) struct EventEffects {
    /// The event was a good chunk: the request has opened.
    pub opened: bool,
    /// Reasoning to hand on, before the content.
    pub reasoning: Option<EngineEvent>,
    /// Content to hand on.
    pub token: Option<EngineEvent>,
    /// Pieces of tool calls to hand on, after the content.
    pub tool_calls: Vec<EngineEvent>,
    /// The answer ended with this event.
    pub stop: Option<Stop>,
}

impl EventEffects {
    /// An event that ends the reading and hands nothing on.
    pub(super) fn stop(stop: Stop) -> Self {
        EventEffects {
            stop: Some(stop),
            ..EventEffects::default()
        }
    }
}

/// Why reading the stream stops.
#[derive(Debug)]
pub(super) enum Stop {
    /// The answer is whole. With `drain`, it ended on its finish and usage and its
    /// `[DONE]` is still to come: read on to it, so the connection can be reused.
    Whole { drain: bool },
    /// The answer failed (its text not yet scrubbed).
    Failed(Fault),
}

/// The answer as read so far, and the rules it is read by.
pub(super) struct AnswerSoFar {
    terms: Terms,
    /// Where the upstream's own account of the answer goes (its model, fingerprint,
    /// token basis, whether its usage was estimated).
    reported: Arc<Reported>,
    tokens: TokenReader,
    ending: StreamEnd,
    /// When the request was sent (the time to the first content counts from here).
    sent: Instant,
    /// When content first and last arrived, and how many tokens came after the first.
    first_content: Option<Instant>,
    last_content: Instant,
    later_tokens: u32,
    /// Log-probabilities of tokens that spell nothing, in a chunk of their own: llama.cpp's
    /// server lists the end token so, before the chunk that says the answer stopped. Held
    /// until the next chunk tells whether they were that.
    maybe_end: Vec<crate::tokens::TokenLogprob>,
}

impl AnswerSoFar {
    /// An answer to a request sent at `sent`, nothing of it read yet.
    pub(super) fn new(
        terms: Terms,
        reported: Arc<Reported>,
        tokens: TokenReader,
        sent: Instant,
    ) -> Self {
        AnswerSoFar {
            terms,
            reported,
            tokens,
            ending: StreamEnd::default(),
            sent,
            first_content: None,
            last_content: sent,
            maybe_end: Vec::new(),
            later_tokens: 0,
        }
    }

    /// Whether any content was handed on (a failure then is the stream's, not the
    /// request's: no other endpoint may answer instead).
    pub(super) fn handed_on(&self) -> bool {
        self.first_content.is_some()
    }

    /// One SSE event, its `name` and `data`, parsed at `at`.
    pub(super) fn on_event(&mut self, name: &str, data: &str, at: Instant) -> EventEffects {
        if name == "error" {
            return EventEffects::stop(Stop::Failed(Fault::Stream(clipped(data))));
        }
        let data = data.trim();
        if data == "[DONE]" {
            return EventEffects::stop(self.ended(false));
        }
        let chunk = match WireChunk::parse(data) {
            Ok(chunk) => chunk,
            Err(message) => return EventEffects::stop(Stop::Failed(Fault::Protocol(message))),
        };
        let expected = self.terms.expected_model.as_deref();
        if let Some(fault) = check_model(&chunk, expected, &self.reported) {
            return EventEffects::stop(Stop::Failed(fault));
        }
        let mut piece = chunk.piece();
        for lp in &mut piece.logprobs {
            lp.top.truncate(self.terms.top_logprobs);
        }
        if let Some(error) = piece.error {
            return EventEffects::stop(Stop::Failed(self.error_frame(error)));
        }
        self.on_piece(piece, at)
    }

    /// The body ended.
    pub(super) fn on_body_end(&mut self) -> Stop {
        self.ended(false)
    }

    /// An error object in the stream: before any content, a 400 is the upstream
    /// refusing the request.
    fn error_frame(&self, error: StreamError) -> Fault {
        match error.status {
            Some(400 | 422) if self.ending.tokens == 0 => Fault::Refused {
                param: error.param,
                message: clipped(&error.message),
            },
            _ => Fault::Stream(clipped(&error.message)),
        }
    }

    /// A good chunk's part of the answer: its usage, its content within the budget, its
    /// finish.
    fn on_piece(&mut self, mut piece: Piece, at: Instant) -> EventEffects {
        let mut step = EventEffects {
            opened: true,
            ..EventEffects::default()
        };
        if let Some(usage) = piece.usage {
            self.ending.usage = Some(usage);
        }
        self.hold_end_token(&mut piece);
        let max_tokens = self.terms.budget.tokens();
        // Reasoning and tool calls count against the budget too (they are output), one
        // token per piece: their chunks carry no log-probabilities to count by.
        if !piece.reasoning.is_empty() {
            if self.ending.tokens >= max_tokens {
                return self.cut_at_budget(step, max_tokens);
            }
            self.output(1, at);
            step.reasoning = Some(EngineEvent::Reasoning {
                text: std::mem::take(&mut piece.reasoning),
                tokens: 1,
                at,
            });
        }
        for delta in std::mem::take(&mut piece.tool_calls) {
            self.output(1, at);
            step.tool_calls.push(EngineEvent::ToolCall {
                delta,
                tokens: 1,
                at,
            });
        }
        if !piece.text.is_empty() || !piece.logprobs.is_empty() {
            if self.ending.tokens >= max_tokens {
                return self.cut_at_budget(step, max_tokens);
            }
            within_budget(&mut piece, max_tokens - self.ending.tokens);
            step.token = Some(self.content(piece.text, piece.logprobs, at));
        }
        if let Some(reason) = piece.finish_reason {
            self.ending.finish = Some(finish_reason(&reason));
        }
        if self.ending.finish.is_some() && self.ending.usage.is_some() {
            // Everything the answer needs is here: finish now, read [DONE] after.
            step.stop = Some(self.ended(true));
        } else if self.terms.budget.sent().is_none()
            && self.ending.finish.is_none()
            && self.ending.tokens >= max_tokens
        {
            // The gateway's cap, where the upstream was sent none (its own default
            // applies there): the answer ends, and the connection with it.
            tracing::debug!(
                max_tokens,
                "The upstream's answer reached the cap; stopped."
            );
            self.ending.finish = Some(FinishReason::Length);
            step.stop = Some(self.ended(false));
        }
        step
    }

    /// The end token is no part of the content (docs/api.md, "The end token"). An
    /// upstream that lists it in the chunk that stops is read by
    /// [`Piece`](crate::engine::upstream::wire::Piece)'s own check; one that lists it in
    /// a chunk of its own just before (llama.cpp's server: no text, no bytes, no finish)
    /// is held here, and given back to the answer unless the next chunk stops it.
    fn hold_end_token(&mut self, piece: &mut Piece) {
        let held = std::mem::take(&mut self.maybe_end);
        let spells_nothing = piece.finish_reason.is_none()
            && piece.text.is_empty()
            && piece.reasoning.is_empty()
            && piece.tool_calls.is_empty()
            && !piece.logprobs.is_empty()
            && piece.logprobs.iter().all(|t| t.token.bytes.is_empty());
        if spells_nothing {
            self.maybe_end = std::mem::take(&mut piece.logprobs);
        }
        if !held.is_empty() && piece.finish_reason.as_deref() != Some("stop") {
            piece.logprobs.splice(0..0, held);
        }
    }

    /// Output past the budget the upstream was sent: it ignores max_tokens. The answer
    /// ends at the budget, and the connection is dropped.
    fn cut_at_budget(&mut self, mut step: EventEffects, max_tokens: u32) -> EventEffects {
        tracing::warn!(
            max_tokens,
            "The upstream went on past the max_tokens it was sent; the answer ends there."
        );
        self.ending.finish = Some(FinishReason::Length);
        step.stop = Some(self.ended(false));
        step
    }

    /// `count` tokens of output arrived at `at`: counted and timed.
    fn output(&mut self, count: u32, at: Instant) {
        self.ending.tokens += count;
        match self.first_content {
            None => {
                self.first_content = Some(at);
                self.later_tokens = count - 1;
            }
            Some(_) => self.later_tokens += count,
        }
        self.last_content = at;
    }

    /// Content within the budget, counted and timed: the event that hands it on.
    fn content(
        &mut self,
        text: String,
        logprobs: Vec<crate::tokens::TokenLogprob>,
        at: Instant,
    ) -> EngineEvent {
        let (ids, basis) = self.tokens.ids(&text, &logprobs);
        let _ = self.reported.basis.set(basis);
        let count = if logprobs.is_empty() {
            1
        } else {
            u32::try_from(logprobs.len()).unwrap_or(u32::MAX)
        };
        self.output(count, at);
        EngineEvent::Token {
            text,
            ids,
            logprobs,
            at,
        }
    }

    /// The stream is over: whole, when it said how it finished (or sent its usage).
    fn ended(&mut self, drain: bool) -> Stop {
        match end_of_stream(&self.ending) {
            Ok(ending) => {
                self.ending = ending;
                Stop::Whole { drain }
            }
            Err(fault) => Stop::Failed(fault),
        }
    }

    /// The ids the token reader still held, at `at`, once the answer is whole: the
    /// event that hands them on, if there are any.
    pub(super) fn flush(&mut self, at: Instant) -> Option<EngineEvent> {
        let (ids, basis) = self.tokens.finish();
        // An answer without text still says what its (empty) rate would have been over.
        let _ = self.reported.basis.set(basis);
        (!ids.is_empty()).then(|| EngineEvent::Token {
            text: String::new(),
            ids,
            logprobs: Vec::new(),
            at,
        })
    }

    /// A whole answer's figures, as this gateway measured them, and its last event.
    pub(super) fn answered(self) -> (Answered, EngineEvent) {
        let usage = self.ending.usage.unwrap_or_else(|| {
            tracing::debug!(
                completion_tokens = self.ending.tokens,
                "The upstream sent no usage; counting the answer's tokens from its chunks."
            );
            let _ = self.reported.usage_estimated.set(true);
            Usage {
                prompt_tokens: self.terms.prompt_tokens,
                completion_tokens: self.ending.tokens,
                cached_tokens: None,
                reasoning_tokens: None,
            }
        });
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let answered = Answered {
            tokens: usage.completion_tokens,
            ttft_ms: self.first_content.map(|at| ms(at - self.sent)),
            tpot_ms: self
                .first_content
                .filter(|_| self.later_tokens > 0)
                .map(|first| ms(self.last_content - first) / f64::from(self.later_tokens)),
        };
        let last = EngineEvent::Finished {
            reason: self.ending.finish.unwrap_or(FinishReason::Stop),
            usage,
        };
        (answered, last)
    }
}

/// A piece of several tokens that would pass the budget keeps the first `left` of them,
/// and the text they spell (when they spell the start of it; otherwise all of it: the
/// count stays exact, a few characters may pass).
fn within_budget(piece: &mut Piece, left: u32) {
    let left = usize::try_from(left).unwrap_or(usize::MAX);
    if piece.logprobs.len() <= left {
        return;
    }
    piece.logprobs.truncate(left);
    let spelled: String = piece
        .logprobs
        .iter()
        .map(|t| t.token.text.as_str())
        .collect();
    if piece.text.starts_with(&spelled) {
        piece.text = spelled;
    }
}

/// An upstream's words, scrubbed whole and then cut to a length fit for a log line or
/// a document (a key across the cut would leave a prefix nothing recognises).
fn clipped(text: &str) -> String {
    crate::secret::scrub(text).chars().take(200).collect()
}

/// The stream is over (`[DONE]`, the end of the body, or a finish with its usage).
fn end_of_stream(ending: &StreamEnd) -> Result<StreamEnd, Fault> {
    match ending.finish {
        Some(finish) => Ok(StreamEnd {
            finish: Some(finish),
            usage: ending.usage,
            tokens: ending.tokens,
        }),
        None if ending.usage.is_some() => Ok(StreamEnd {
            finish: Some(FinishReason::Stop),
            usage: ending.usage,
            tokens: ending.tokens,
        }),
        None => Err(Fault::Cut(format!(
            "no finish_reason after {} tokens",
            ending.tokens
        ))),
    }
}

/// The first model a chunk names is the answer's; a chunk that names another than the
/// one asked for ends it.
fn check_model(chunk: &WireChunk, expected: Option<&str>, reported: &Reported) -> Option<Fault> {
    // Scrubbed once: every chunk names them, the first is kept.
    if let Some(fingerprint) = &chunk.system_fingerprint {
        reported
            .system_fingerprint
            .get_or_init(|| clipped(fingerprint));
    }
    let got = chunk.model.as_deref().filter(|m| !m.is_empty())?;
    reported.model.get_or_init(|| clipped(got));
    let expected = expected?;
    if same_model(expected, got) {
        return None;
    }
    Some(Fault::ModelMismatch {
        expected: expected.to_owned(),
        got: clipped(got),
    })
}

/// `got` is `expected`, or a dated or numbered snapshot of it as hosted APIs answer:
/// `gpt-4o-2024-08-06` or `gpt-4-0613` for `gpt-4`, `claude-3-5-sonnet-20241022`,
/// `gemini-1.5-pro-002`, `model@20240229`. Another model with a longer name
/// (`gpt-4o-mini` for `gpt-4o`) is not.
pub fn same_model(expected: &str, got: &str) -> bool {
    if got == expected {
        return true;
    }
    let Some(rest) = got.strip_prefix(expected) else {
        return false;
    };
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    match rest.split_at_checked(1) {
        Some(("-", date)) if date.len() == 10 => {
            let parts: Vec<&str> = date.split('-').collect();
            matches!(parts.as_slice(), [y, m, d] if digits(y, 4) && digits(m, 2) && digits(d, 2))
        }
        Some(("-", number)) => digits(number, 3) || digits(number, 4) || digits(number, 8),
        Some(("@", number)) => digits(number, 3) || digits(number, 8),
        _ => false,
    }
}

/// OpenAI's finish reasons and the others servers send; anything but a length limit or
/// a tool call is a stop (`content_filter` too: the answer ended there).
fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "length" | "max_tokens" | "model_length" => FinishReason::Length,
        "stop" | "eos" | "eos_token" | "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        other => {
            tracing::info!(finish_reason = other, "The upstream ended the answer with a finish reason OpenAI's API does not have; reported as stop.");
            FinishReason::Stop
        }
    }
}

#[cfg(test)]
mod tests;

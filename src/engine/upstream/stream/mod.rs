//! One upstream answer, read as it streams: SSE events to [`EngineEvent`]s, with the
//! timeouts, the model check and the usage that make every fault a clear ending.
//!
//! Each event is stamped as it is parsed, before it waits for the gateway to take it,
//! so the gateway's timings are those of the upstream's bytes reaching it. When the
//! gateway drops its stream (the client left, the stop screen or guard ended the
//! answer), this task returns, the response is dropped and its connection closed, which
//! is how an upstream learns to stop generating (vLLM aborts the request on disconnect).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::fault::Fault;
use super::opening::Opening;
use super::tokens::TokenReader;
use super::wire::{Chunk, Piece};
use crate::engine::{EngineError, EngineEvent, Reported};
use crate::tokens::{FinishReason, Usage};
pub use transport::Patience;
use transport::{next_in_time, Lines, Next, ReadError};

mod transport;

/// How long a finished answer's connection is read on to its `[DONE]`, so it can be
/// reused (an unread body closes it).
const DRAIN: Duration = Duration::from_secs(2);

/// An answer's bytes as they arrive.
pub type Body = futures_util::stream::BoxStream<'static, Result<bytes::Bytes, String>>;

/// Everything the reading task needs; moved into it.
pub(crate) struct Reading {
    /// The answer's body as it arrives (a transport error as its text).
    pub body: Body,
    /// When the request was sent (the first-byte deadline counts from here).
    pub sent: Instant,
    pub patience: Patience,
    /// The model the answer must say it is, when the config checks it.
    pub expected_model: Option<String>,
    pub reported: Arc<Reported>,
    pub tokens: TokenReader,
    /// The gateway's estimate, until the upstream's usage arrives.
    pub prompt_tokens: u32,
    /// Alternatives the client asked for per token (the upstream may be asked for more).
    pub top_logprobs: usize,
    /// The answer's budget: it ends with `length` at this many tokens, whatever the
    /// upstream does (the request's `max_tokens`, or the cap when none was sent).
    pub max_tokens: u32,
    /// The upstream was sent the budget too: it may end the answer itself (with its own
    /// finish and usage), and only content past the budget is cut.
    pub budget_sent: bool,
    pub tx: mpsc::Sender<EngineEvent>,
    /// Told the answer's figures once it is read to its end, before its last event
    /// goes to the client: the endpoint's health, averages and in-flight count are up
    /// to date when the client sends its next request.
    pub on_answered: Option<OnAnswered>,
}

/// An answer read to its end (or to its budget), as this gateway measured it: from
/// sending to the first content, and between contents after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Answered {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    /// Tokens of the answer (the upstream's count, or its chunks').
    pub tokens: u32,
}

pub(crate) type OnAnswered = Box<dyn FnOnce(Answered) + Send>;

/// How reading an answer ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Read to its end (or to its budget); its figures went to `on_answered`.
    Answered,
    /// The gateway stopped taking it (the client left, the stop screen or guard ended
    /// it).
    Left,
    /// Failed after content was handed on: its error event is sent.
    FailedMidway(Fault),
    /// Failed before anything was handed on (a refusal in its first chunk, vLLM's way
    /// for some parameters, included): the caller tries elsewhere or reports it.
    Unsent(Fault),
}

/// What the stream has said about how the answer ends.
#[derive(Debug, Default)]
struct Ending {
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// Tokens seen: log-probabilities where there are any, else chunks with text.
    tokens: u32,
}

/// Reads the answer to its end, sending events until the gateway stops taking them;
/// `opening` is told once the first chunk is good.
pub(crate) async fn read(r: Reading, opening: &mut Opening) -> Ended {
    let Reading {
        body,
        sent,
        patience,
        expected_model,
        reported,
        mut tokens,
        prompt_tokens,
        top_logprobs,
        max_tokens,
        budget_sent,
        tx,
        on_answered,
    } = r;
    // Microseconds after `sent` of the last byte received, for the idle deadline.
    let last_byte = Arc::new(AtomicU64::new(0));
    let stamp = Arc::clone(&last_byte);
    let mut lines = Lines::default();
    let bytes = body.map(move |chunk| {
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        stamp.store(micros.max(1), Ordering::Relaxed);
        lines.push(chunk.map_err(ReadError::Transport)?)
    });
    let mut events = bytes.eventsource();
    let mut ending = Ending::default();
    // Whether the stream was read to its end (then the connection can be reused).
    let mut read_to_end = true;
    // When content first and last arrived, and how many tokens came after the first.
    let mut first_content: Option<Instant> = None;
    let mut last_content = sent;
    let mut later_tokens = 0u32;
    let outcome = loop {
        let event = match next_in_time(&mut events, &last_byte, sent, patience, &tx).await {
            Next::Event(Ok(event)) => event,
            Next::Event(Err(error)) => {
                break Err(match error {
                    eventsource_stream::EventStreamError::Transport(ReadError::Transport(e)) => {
                        Fault::Cut(format!("the connection failed: {e}"))
                    }
                    other => Fault::Protocol(other.to_string()),
                })
            }
            Next::End => break end_of_stream(&ending),
            Next::Late(fault) => break Err(fault),
            // The gateway dropped the answer: dropping the response tells the upstream.
            Next::Gone => return Ended::Left,
        };
        if event.event == "error" {
            break Err(Fault::Stream(clipped(&event.data)));
        }
        let data = event.data.trim();
        if data == "[DONE]" {
            break end_of_stream(&ending);
        }
        let chunk = match Chunk::parse(data) {
            Ok(chunk) => chunk,
            Err(message) => break Err(Fault::Protocol(message)),
        };
        if let Some(fault) = check_model(&chunk, expected_model.as_deref(), &reported) {
            break Err(fault);
        }
        let at = Instant::now();
        let mut piece = chunk.piece();
        for lp in &mut piece.logprobs {
            lp.top.truncate(top_logprobs);
        }
        if let Some(error) = piece.error {
            let fault = match error.status {
                // Before any content: the upstream refused the request, as a 400 says.
                Some(400 | 422) if ending.tokens == 0 => Fault::Refused {
                    param: error.param,
                    message: clipped(&error.message),
                },
                _ => Fault::Stream(clipped(&error.message)),
            };
            break Err(fault);
        }
        opening.opened();
        if let Some(usage) = piece.usage {
            ending.usage = Some(usage);
        }
        if !piece.text.is_empty() || !piece.logprobs.is_empty() {
            if ending.tokens >= max_tokens {
                // Content past the budget the upstream was sent: it ignores max_tokens.
                // The answer ends at the budget, and the connection is dropped.
                tracing::warn!(
                    max_tokens,
                    "The upstream went on past the max_tokens it was sent; the answer ends there."
                );
                ending.finish = Some(FinishReason::Length);
                break end_of_stream(&ending);
            }
            within_budget(&mut piece, max_tokens - ending.tokens);
            let (ids, basis) = tokens.ids(&piece.text, &piece.logprobs);
            let _ = reported.basis.set(basis);
            let count = if piece.logprobs.is_empty() {
                1
            } else {
                u32::try_from(piece.logprobs.len()).unwrap_or(u32::MAX)
            };
            ending.tokens += count;
            match first_content {
                None => {
                    first_content = Some(at);
                    later_tokens = count - 1;
                }
                Some(_) => later_tokens += count,
            }
            last_content = at;
            let event = EngineEvent::Token {
                text: piece.text,
                ids,
                logprobs: piece.logprobs,
                at,
            };
            if tx.send(event).await.is_err() {
                return Ended::Left;
            }
        }
        if let Some(reason) = piece.finish_reason {
            ending.finish = Some(finish_reason(&reason));
        }
        if ending.finish.is_some() && ending.usage.is_some() {
            // Everything the answer needs is here: finish now, read [DONE] after.
            read_to_end = false;
            break end_of_stream(&ending);
        }
        if !budget_sent && ending.finish.is_none() && ending.tokens >= max_tokens {
            // The gateway's cap, where the upstream was sent none (its own default
            // applies there): the answer ends, and the connection with it.
            tracing::debug!(
                max_tokens,
                "The upstream's answer reached the cap; stopped."
            );
            ending.finish = Some(FinishReason::Length);
            break end_of_stream(&ending);
        }
    };
    // The upstream's own words (an error event, a refusal) may quote secrets.
    let ending = match outcome.map_err(Fault::scrubbed) {
        Ok(ending) => ending,
        // Nothing handed on: another endpoint may answer instead.
        Err(fault) if first_content.is_none() => return Ended::Unsent(fault),
        Err(fault) => {
            tracing::warn!(error = %fault, error_type = fault.kind().as_str(), "The upstream's stream failed.");
            let failed = EngineEvent::Failed(EngineError::Upstream(fault.clone()));
            let _ = tx.send(failed).await;
            return Ended::FailedMidway(fault);
        }
    };
    let (ids, basis) = tokens.finish();
    // An answer without text still says what its (empty) rate would have been over.
    let _ = reported.basis.set(basis);
    if !ids.is_empty() {
        let flush = EngineEvent::Token {
            text: String::new(),
            ids,
            logprobs: Vec::new(),
            at: Instant::now(),
        };
        if tx.send(flush).await.is_err() {
            return Ended::Left;
        }
    }
    let usage = ending.usage.unwrap_or_else(|| {
        tracing::debug!(
            completion_tokens = ending.tokens,
            "The upstream sent no usage; counting the answer's tokens from its chunks."
        );
        let _ = reported.usage_estimated.set(true);
        Usage {
            prompt_tokens,
            completion_tokens: ending.tokens,
        }
    });
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let answered = Answered {
        tokens: usage.completion_tokens,
        ttft_ms: first_content.map(|at| ms(at - sent)),
        tpot_ms: first_content
            .filter(|_| later_tokens > 0)
            .map(|first| ms(last_content - first) / f64::from(later_tokens)),
    };
    if let Some(on_answered) = on_answered {
        on_answered(answered);
    }
    let last = EngineEvent::Finished {
        reason: ending.finish.unwrap_or(FinishReason::Stop),
        usage,
    };
    let _ = tx.send(last).await;
    drop(tx);
    if !read_to_end {
        let drained = async { while events.next().await.is_some() {} };
        let _ = tokio::time::timeout(DRAIN, drained).await;
    }
    Ended::Answered
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

/// The events an answer whose bytes arrive as `body` gives the gateway, read to the end
/// with no model check, no tokenizer and minutes of patience: what the fuzz target
/// `upstream_stream` and the parser's regression tests drive.
pub async fn events_of(body: Body, max_tokens: u32, top_logprobs: usize) -> Vec<EngineEvent> {
    let (tx, mut rx) = mpsc::channel(32);
    let failures = tx.clone();
    let reading = Reading {
        body,
        sent: Instant::now(),
        patience: Patience {
            first_byte: Duration::from_secs(600),
            idle: Duration::from_secs(600),
        },
        expected_model: None,
        reported: Arc::new(Reported::default()),
        tokens: TokenReader::new(None),
        prompt_tokens: 0,
        top_logprobs,
        max_tokens,
        budget_sent: false,
        tx,
        on_answered: None,
    };
    let reader = tokio::spawn(async move {
        // What a request with nowhere else to go gets: the failure as its last event.
        if let Ended::Unsent(fault) = read(reading, &mut Opening::none()).await {
            let _ = failures
                .send(EngineEvent::Failed(EngineError::Upstream(fault)))
                .await;
        }
    });
    let mut events = Vec::new();
    while let Some(event) = rx.recv().await {
        events.push(event);
    }
    let _ = reader.await;
    events
}

/// An upstream's own text, cut to a length fit for a log line or a document.
/// An upstream's words, scrubbed whole and then cut (a key across the cut would leave a
/// prefix nothing recognises).
fn clipped(text: &str) -> String {
    crate::secret::scrub(text).chars().take(200).collect()
}

/// The stream is over (`[DONE]`, the end of the body, or a finish with its usage).
fn end_of_stream(ending: &Ending) -> Result<Ending, Fault> {
    match ending.finish {
        Some(finish) => Ok(Ending {
            finish: Some(finish),
            usage: ending.usage,
            tokens: ending.tokens,
        }),
        None if ending.usage.is_some() => Ok(Ending {
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
fn check_model(chunk: &Chunk, expected: Option<&str>, reported: &Reported) -> Option<Fault> {
    if let Some(fingerprint) = &chunk.system_fingerprint {
        let _ = reported.system_fingerprint.set(clipped(fingerprint));
    }
    let got = chunk.model.as_deref().filter(|m| !m.is_empty())?;
    let _ = reported.model.set(clipped(got));
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

/// OpenAI's finish reasons and the others servers send; anything but a length limit is
/// a stop (`content_filter` too: the answer ended there).
fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "length" | "max_tokens" | "model_length" => FinishReason::Length,
        "stop" | "eos" | "eos_token" | "end_turn" | "stop_sequence" => FinishReason::Stop,
        other => {
            tracing::info!(finish_reason = other, "The upstream ended the answer with a finish reason OpenAI's API does not have; reported as stop.");
            FinishReason::Stop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_past_the_budget_keeps_the_tokens_within_it_and_their_text() {
        let token = |t: &str| crate::tokens::TokenLogprob {
            token: crate::tokens::TokenText::from_bytes(t.as_bytes().to_vec()),
            logprob: -0.5,
            top: Vec::new(),
        };
        let mut piece = Piece {
            text: "a b c".into(),
            logprobs: vec![token("a"), token(" b"), token(" c")],
            ..Piece::default()
        };
        within_budget(&mut piece, 2);
        assert_eq!((piece.text.as_str(), piece.logprobs.len()), ("a b", 2));
        // Tokens that do not spell the text: the count is cut, the text kept.
        let mut odd = Piece {
            text: "xyz".into(),
            logprobs: vec![token("a"), token("b")],
            ..Piece::default()
        };
        within_budget(&mut odd, 1);
        assert_eq!((odd.text.as_str(), odd.logprobs.len()), ("xyz", 1));
        let mut within = Piece {
            text: "a".into(),
            logprobs: vec![token("a")],
            ..Piece::default()
        };
        within_budget(&mut within, 5);
        assert_eq!(within.text, "a");
    }

    #[test]
    fn dated_names_are_the_same_model_and_longer_names_are_not() {
        assert!(same_model("gpt-4o", "gpt-4o"));
        assert!(same_model("gpt-4o", "gpt-4o-2024-08-06"));
        assert!(same_model("gpt-4", "gpt-4-0613"));
        assert!(same_model(
            "claude-3-5-sonnet",
            "claude-3-5-sonnet-20241022"
        ));
        assert!(same_model("gemini-1.5-pro", "gemini-1.5-pro-002"));
        assert!(same_model("claude", "claude@20250101"));
        assert!(!same_model("gpt-4o", "gpt-4o-mini"));
        assert!(!same_model("llama-3.1-8b", "llama-3.1-8b-instruct"));
        assert!(!same_model("gpt-4o", "gpt-4o2"));
        assert!(!same_model("gpt-4o", "gpt-4o-2024-8-6"));
        assert!(!same_model("smollm2", "llama"));
    }

    #[test]
    fn a_stream_without_a_finish_is_cut() {
        let cut = end_of_stream(&Ending {
            tokens: 3,
            ..Ending::default()
        });
        assert!(matches!(cut, Err(Fault::Cut(_))));
        let done = end_of_stream(&Ending {
            finish: Some(FinishReason::Length),
            tokens: 3,
            ..Ending::default()
        })
        .expect("finished");
        assert_eq!(done.finish, Some(FinishReason::Length));
        assert_eq!(finish_reason("eos"), FinishReason::Stop);
        assert_eq!(finish_reason("length"), FinishReason::Length);
    }
}

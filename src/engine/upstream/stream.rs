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
use super::tokens::TokenReader;
use super::wire::Chunk;
use crate::engine::{Counted, EngineError, EngineEvent, FinishReason, Reported, Usage};

/// How long one answer may keep the gateway waiting.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// From sending the request to the first byte of the stream.
    pub first_byte: Duration,
    /// Between any two bytes after that.
    pub idle: Duration,
}

/// Everything the reading task needs; moved into it.
pub(crate) struct Reading {
    pub response: reqwest::Response,
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
    pub tx: mpsc::Sender<EngineEvent>,
    /// Counts this stream as running while the task lives.
    pub running: Counted,
}

/// What the stream has said about how the answer ends.
#[derive(Debug, Default)]
struct Ending {
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// Tokens seen: log-probabilities where there are any, else chunks with text.
    tokens: u32,
}

/// Reads the answer to its end, sending events until the gateway stops taking them.
pub(crate) async fn read(r: Reading) {
    let Reading {
        response,
        sent,
        patience,
        expected_model,
        reported,
        mut tokens,
        prompt_tokens,
        top_logprobs,
        tx,
        running: _running,
    } = r;
    // Microseconds after `sent` of the last byte received, for the idle deadline.
    let last_byte = Arc::new(AtomicU64::new(0));
    let stamp = Arc::clone(&last_byte);
    let bytes = response.bytes_stream().inspect(move |_| {
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        stamp.store(micros.max(1), Ordering::Relaxed);
    });
    let mut events = bytes.eventsource();
    let mut ending = Ending::default();
    let outcome = loop {
        let event = match next_in_time(&mut events, &last_byte, sent, patience).await {
            Ok(Some(Ok(event))) => event,
            Ok(Some(Err(error))) => {
                break Err(match error {
                    eventsource_stream::EventStreamError::Transport(e) => {
                        Fault::Cut(format!("the connection failed: {e}"))
                    }
                    other => Fault::Protocol(other.to_string()),
                })
            }
            Ok(None) => break end_of_stream(&ending),
            Err(fault) => break Err(fault),
        };
        if event.event == "error" {
            break Err(Fault::Stream(event.data.chars().take(200).collect()));
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
        if let Some(message) = piece.error {
            break Err(Fault::Stream(message));
        }
        if let Some(usage) = piece.usage {
            ending.usage = Some(usage);
        }
        if !piece.text.is_empty() || !piece.logprobs.is_empty() {
            let (ids, basis) = tokens.ids(&piece.text, &piece.logprobs);
            let _ = reported.basis.set(basis);
            ending.tokens += if piece.logprobs.is_empty() {
                1
            } else {
                u32::try_from(piece.logprobs.len()).unwrap_or(u32::MAX)
            };
            let event = EngineEvent::Token {
                text: piece.text,
                ids,
                logprobs: piece.logprobs,
                at,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
        if let Some(reason) = piece.finish_reason {
            ending.finish = Some(finish_reason(&reason));
        }
        if ending.finish.is_some() && ending.usage.is_some() {
            // Everything the answer needs is here; [DONE] would add nothing but time.
            break end_of_stream(&ending);
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
            return;
        }
    }
    let last = match outcome {
        Ok(ending) => {
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
            EngineEvent::Finished {
                reason: ending.finish.unwrap_or(FinishReason::Stop),
                usage,
            }
        }
        Err(fault) => {
            tracing::warn!(error = %fault, error_type = fault.kind(), "The upstream's stream failed.");
            EngineEvent::Failed(EngineError::Upstream(fault))
        }
    };
    let _ = tx.send(last).await;
}

/// The next SSE event, or the fault of waiting too long for bytes.
async fn next_in_time<S>(
    events: &mut S,
    last_byte: &AtomicU64,
    sent: Instant,
    patience: Patience,
) -> Result<Option<S::Item>, Fault>
where
    S: futures_util::Stream + Unpin,
{
    loop {
        let last = last_byte.load(Ordering::Relaxed);
        let (deadline, first_byte) = if last == 0 {
            (sent + patience.first_byte, true)
        } else {
            (sent + Duration::from_micros(last) + patience.idle, false)
        };
        tokio::select! {
            event = events.next() => return Ok(event),
            () = tokio::time::sleep_until(deadline.into()) => {
                // Bytes that did not complete an event (a keep-alive comment) move the
                // deadline; none at all is the fault.
                if last_byte.load(Ordering::Relaxed) == last {
                    let waited = if first_byte { patience.first_byte } else { patience.idle };
                    return Err(Fault::Timeout { waited, first_byte });
                }
            }
        }
    }
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
        let _ = reported.system_fingerprint.set(fingerprint.clone());
    }
    let got = chunk.model.as_deref().filter(|m| !m.is_empty())?;
    let _ = reported.model.set(got.to_owned());
    let expected = expected?;
    if same_model(expected, got) {
        return None;
    }
    Some(Fault::ModelMismatch {
        expected: expected.to_owned(),
        got: got.chars().take(200).collect(),
    })
}

/// `got` is `expected`, or a dated or versioned name of it (`gpt-4o-2024-08-06` for
/// `gpt-4o`), as hosted APIs answer.
pub fn same_model(expected: &str, got: &str) -> bool {
    got == expected
        || got
            .strip_prefix(expected)
            .is_some_and(|rest| rest.starts_with('-') || rest.starts_with('@'))
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
    fn dated_names_are_the_same_model() {
        assert!(same_model("gpt-4o", "gpt-4o"));
        assert!(same_model("gpt-4o", "gpt-4o-2024-08-06"));
        assert!(same_model("claude", "claude@20250101"));
        assert!(!same_model("gpt-4o", "gpt-4o2"));
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

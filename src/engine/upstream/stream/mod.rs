//! One upstream answer, read as it streams: SSE events to [`EngineEvent`]s, with the
//! timeouts, the model check and the usage that make every fault a clear ending.
//!
//! Each event is stamped as it is parsed, before it waits for the gateway to take it,
//! so the gateway's timings are those of the upstream's bytes reaching it. When the
//! gateway drops its stream (the client left, the stop screen or guard ended the
//! answer), this task returns, the response is dropped and its connection closed, which
//! is how an upstream learns to stop generating (vLLM aborts the request on disconnect).
//!
//! - `answer`: what each event means, as a state machine with no clock and no I/O;
//! - `transport`: the bytes before they are events, their waits and sizes, and the
//!   moments they arrive at on the injected clock;
//! - `read`, here: the thin loop between them and the gateway.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sse_stream::{Sse, SseByteStream};
use tokio::sync::mpsc;

use super::fault::Fault;
use super::opening::Opening;
use super::tokens::TokenReader;
use crate::clock::SharedClock;
use crate::engine::{Budget, EngineError, EngineEvent, Reported};
pub use answer::same_model;
pub(crate) use answer::Terms;
use answer::{AnswerSoFar, EventEffects, Stop};
pub use transport::Patience;
use transport::{next_in_time, ready, stamped, LastByte, Next, ReadError, Timeline, Watch};

mod answer;
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
    /// What every later moment of the answer is read from.
    pub clock: SharedClock,
    pub patience: Patience,
    /// The rules the answer is read by: its model, budget and alternatives.
    pub terms: Terms,
    pub reported: Arc<Reported>,
    pub tokens: TokenReader,
    pub tx: mpsc::Sender<EngineEvent>,
    /// Told the answer's figures once it is read to its end, before its last event
    /// goes to the client: the endpoint's health, averages and in-flight count are up
    /// to date when the client sends its next request.
    pub on_answered: Option<OnAnswered>,
    /// The client gets the answer in one body: a failure after content is one the
    /// client has not seen ([`AttemptEnd::FailedUnseen`]).
    pub whole: bool,
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
pub(crate) enum AttemptEnd {
    /// Read to its end (or to its budget); its figures went to `on_answered`.
    Answered,
    /// The gateway stopped taking it (the client left, the stop screen or guard ended
    /// it).
    Left,
    /// Failed after content was handed on: its error event is sent.
    FailedMidway(Fault),
    /// Failed after content was handed on to a request whose client gets the answer in
    /// one body, so has seen none of it: no error event is sent, and the answer may
    /// start over elsewhere.
    FailedUnseen(Fault),
    /// Failed before anything was handed on (a refusal in its first chunk, vLLM's way
    /// for some parameters, included): the caller tries elsewhere or reports it.
    Unsent(Fault),
}

/// Reads the answer to its end, sending events until the gateway stops taking them;
/// `opening` is told once the first chunk is good. The waiting, stamping and sending
/// are here; what each event means is [`AnswerSoFar`]'s.
pub(crate) async fn read(r: Reading, opening: &mut Opening) -> AttemptEnd {
    let timeline = Timeline::new(r.clock, r.sent);
    let last_byte = Arc::new(LastByte::default());
    let mut events = SseByteStream::new(stamped(r.body, &timeline, &last_byte));
    let mut answer = AnswerSoFar::new(r.terms, r.reported, r.tokens, r.sent);
    let (tx, whole) = (r.tx, r.whole);
    let mut watch = Watch::new(&tx);
    let mut held = Held::default();
    let drain = loop {
        let next = match ready(&mut events, &mut watch) {
            Some(next) => next,
            None => {
                // Nothing more came with those bytes: what is held goes before the wait.
                if let Some(token) = held.take() {
                    if tx.send(token).await.is_err() {
                        return AttemptEnd::Left;
                    }
                }
                next_in_time(&mut events, &last_byte, &timeline, r.patience, &mut watch).await
            }
        };
        let step = match next {
            // A block with no data (an `id:` or `retry:` alone) is no event, as in a
            // browser's EventSource.
            Next::Event(Ok(Sse { data: None, .. })) => continue,
            Next::Event(Ok(Sse {
                event,
                data: Some(data),
                ..
            })) => {
                // Stamped when its bytes came, not when it was parsed: the parsing is
                // the gateway's time (its `overhead_ms`), not the upstream's.
                let arrived = last_byte.arrived(&timeline);
                answer.on_event(event.as_deref().unwrap_or("message"), &data, arrived)
            }
            Next::Event(Err(error)) => EventEffects::stop(Stop::Failed(unreadable(error))),
            Next::End => EventEffects::stop(answer.on_body_end()),
            Next::Late(fault) => EventEffects::stop(Stop::Failed(fault)),
            // The gateway dropped the answer: dropping the response tells the upstream.
            Next::Gone => return AttemptEnd::Left,
        };
        if step.opened {
            opening.opened();
        }
        let output = step
            .reasoning
            .into_iter()
            .chain(step.token)
            .chain(step.tool_calls);
        for event in output {
            if let Some(earlier) = held.add(event) {
                if tx.send(earlier).await.is_err() {
                    return AttemptEnd::Left;
                }
            }
        }
        // An ending sends all that is held before it: a failure after content is the
        // stream's, and the content it follows must have reached the gateway.
        if let Some(last) = step.stop.as_ref().and_then(|_| held.take()) {
            if tx.send(last).await.is_err() {
                return AttemptEnd::Left;
            }
        }
        match step.stop {
            None => {}
            Some(Stop::Whole { drain }) => break drain,
            Some(Stop::Failed(fault)) => return failed(&answer, fault, &tx, whole).await,
        }
    };
    if let Some(flush) = answer.flush(timeline.now()) {
        if tx.send(flush).await.is_err() {
            return AttemptEnd::Left;
        }
    }
    let (answered, last) = answer.answered();
    if let Some(on_answered) = r.on_answered {
        on_answered(answered);
    }
    let _ = tx.send(last).await;
    drop(watch);
    drop(tx);
    if drain {
        let drained = async { while events.next().await.is_some() {} };
        let _ = tokio::time::timeout(DRAIN, drained).await;
    }
    AttemptEnd::Answered
}

/// Content whose bytes came in one read, handed on as one token event: a non-streamed
/// request's answer, which an upstream sends at once, crosses to the gateway in one or
/// two events instead of one per token. Tokens from different reads are never merged,
/// so every event's moment is its bytes' own, and the timings see bunched tokens as the
/// one chunk they arrived as.
#[derive(Default)]
struct Held(Option<EngineEvent>);

impl Held {
    /// Holds `token` with what is held when their bytes came together; what is held from
    /// an earlier read is returned, to go first.
    fn add(&mut self, token: EngineEvent) -> Option<EngineEvent> {
        match (self.0.take(), token) {
            (
                Some(EngineEvent::Token {
                    mut text,
                    mut ids,
                    mut logprobs,
                    at,
                }),
                EngineEvent::Token {
                    text: more,
                    ids: more_ids,
                    logprobs: more_logprobs,
                    at: same,
                },
            ) if at == same => {
                text.push_str(&more);
                ids.extend(more_ids);
                logprobs.extend(more_logprobs);
                self.0 = Some(EngineEvent::Token {
                    text,
                    ids,
                    logprobs,
                    at,
                });
                None
            }
            (earlier, token) => {
                self.0 = Some(token);
                earlier
            }
        }
    }

    fn take(&mut self) -> Option<EngineEvent> {
        self.0.take()
    }
}

/// Bytes that could not be read as events: the connection's failure, too many of them,
/// or not UTF-8.
fn unreadable(error: sse_stream::Error) -> Fault {
    match error {
        sse_stream::Error::Body(e) => match e.downcast::<ReadError>().map(|e| *e) {
            Ok(ReadError::Transport(e)) => Fault::Cut(format!("the connection failed: {e}")),
            Ok(oversized) => Fault::Protocol(oversized.to_string()),
            Err(other) => Fault::Protocol(other.to_string()),
        },
        sse_stream::Error::Utf8Parse(e) => Fault::Protocol(format!("the stream is not UTF-8: {e}")),
        other => Fault::Protocol(format!("the stream is not SSE: {other}")),
    }
}

/// A failed answer: unsent while nothing was handed on (another endpoint may answer
/// instead), otherwise ended with its error event.
async fn failed(
    answer: &AnswerSoFar,
    fault: Fault,
    tx: &mpsc::Sender<EngineEvent>,
    whole: bool,
) -> AttemptEnd {
    // The upstream's own words (an error event, a refusal) may quote secrets.
    let fault = fault.scrubbed();
    if !answer.handed_on() {
        return AttemptEnd::Unsent(fault);
    }
    if whole {
        return AttemptEnd::FailedUnseen(fault);
    }
    tracing::warn!(error = %fault, error_type = fault.kind().as_str(), "The upstream's stream failed.");
    let failed = EngineEvent::Failed(EngineError::Upstream(fault.clone()));
    let _ = tx.send(failed).await;
    AttemptEnd::FailedMidway(fault)
}

/// The events an answer whose bytes arrive as `body` gives the gateway, read to the end
/// with no model check, no tokenizer and minutes of patience: what the fuzz target
/// `upstream_stream` and the parser's regression tests drive.
pub async fn events_of(body: Body, max_tokens: u32, top_logprobs: usize) -> Vec<EngineEvent> {
    let (tx, mut rx) = mpsc::channel(32);
    let failures = tx.clone();
    // Made before the send moment, which it then reads exactly.
    let clock = Arc::new(crate::clock::MonotonicClock::new());
    let reading = Reading {
        body,
        sent: Instant::now(),
        clock,
        patience: Patience {
            first_byte: Duration::from_secs(600),
            idle: Duration::from_secs(600),
        },
        terms: Terms {
            expected_model: None,
            top_logprobs,
            budget: Budget::Cap(max_tokens),
            prompt_tokens: 0,
        },
        reported: Arc::new(Reported::default()),
        tokens: TokenReader::new(None),
        tx,
        on_answered: None,
        whole: false,
    };
    let reader = tokio::spawn(async move {
        // What a request with nowhere else to go gets: the failure as its last event.
        if let AttemptEnd::Unsent(fault) = read(reading, &mut Opening::none()).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of an answer whose body arrives as `reads`, each `apart` after the one
    /// before.
    async fn events(reads: Vec<bytes::Bytes>, apart: Duration) -> Vec<EngineEvent> {
        let body = futures_util::stream::iter(reads)
            .then(move |read| async move {
                if !apart.is_zero() {
                    tokio::time::sleep(apart).await;
                }
                Ok::<_, String>(read)
            })
            .boxed();
        events_of(body, 100, 0).await
    }

    /// The text and the ending of an answer whose body arrives as `reads`.
    async fn read_back(reads: Vec<bytes::Bytes>) -> (String, String) {
        let mut text = String::new();
        let mut end = String::new();
        for event in events(reads, Duration::ZERO).await {
            match event {
                EngineEvent::Token { text: t, .. } => text.push_str(&t),
                other => end = format!("{other:?}"),
            }
        }
        (text, end)
    }

    const CHUNK_A: &str =
        r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#;

    #[tokio::test]
    async fn sse_framing_as_a_browser_reads_it() {
        // CRLF and lone CR endings, a byte-order mark, keep-alive comments, an `id:`
        // block with no data, an `event:` left unnamed (message) and data on two lines
        // joined with LF inside a JSON string's whitespace.
        let body = bytes::Bytes::from(format!(
            "\u{feff}: keep-alive\r\n\r\nid: 7\r\n\r\ndata: {CHUNK_A}\r\n\r\n\
             data: {{\"choices\":[{{\"index\":0,\r\ndata: \"delta\":{{\"content\":\"lo\"}},\
             \"finish_reason\":\"stop\"}}]}}\r\r: ping\n\ndata: [DONE]\n\n"
        ));
        let (whole, end) = read_back(vec![body.clone()]).await;
        assert_eq!(whole, "Hello");
        assert!(end.starts_with("Finished"), "{end}");
        // The same bytes one at a time: nothing depends on where they were cut.
        let bytes = (0..body.len()).map(|i| body.slice(i..=i)).collect();
        assert_eq!(read_back(bytes).await, (whole, end));
    }

    /// The content events of an answer whose reads (each a list of content chunks)
    /// arrive 5 ms apart.
    async fn contents(reads: &[&[&str]]) -> Vec<String> {
        let chunk = |text: &&str| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\
                 \"finish_reason\":null}}]}}\n\n"
            )
        };
        let mut bodies: Vec<bytes::Bytes> = reads
            .iter()
            .map(|read| read.iter().map(chunk).collect::<String>().into())
            .collect();
        bodies.push(bytes::Bytes::from_static(b"data: [DONE]\n\n"));
        events(bodies, Duration::from_millis(5))
            .await
            .into_iter()
            .filter_map(|event| match event {
                EngineEvent::Token { text, .. } if !text.is_empty() => Some(text),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn content_that_came_in_one_read_is_one_event_and_other_reads_are_not_joined() {
        assert_eq!(contents(&[&["a", "b", "c"]]).await, ["abc"]);
        assert_eq!(
            contents(&[&["a"], &["b", "c"], &["d"]]).await,
            ["a", "bc", "d"]
        );
    }

    #[tokio::test]
    async fn bytes_that_are_not_utf8_are_a_protocol_fault() {
        let body = bytes::Bytes::from_static(b"data: {\"choices\":[\xff\xfe]}\n\n");
        let (text, end) = read_back(vec![body]).await;
        assert_eq!(text, "");
        assert!(end.contains("Protocol") && end.contains("UTF-8"), "{end}");
    }
}

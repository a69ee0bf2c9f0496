//! The bytes of one upstream answer, before they are events: the waits they may take
//! ([`Patience`], enforced by [`next_in_time`]), the sizes they may have ([`Lines`]),
//! and the moments they arrive at, on the injected clock ([`Timeline`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::clock::SharedClock;
use crate::engine::upstream::fault::Fault;
use crate::engine::EngineEvent;

/// How long one answer may keep the gateway waiting.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// From sending the request to the first byte of the stream.
    pub first_byte: Duration,
    /// Between any two bytes after that.
    pub idle: Duration,
}

/// Longest SSE line accepted (a chunk with 20 alternatives per token is a few KiB).
pub(super) const MAX_LINE_BYTES: usize = 256 << 10;
/// Most bytes one answer may stream.
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Why the bytes could not be read.
#[derive(Debug)]
pub(super) enum ReadError {
    Transport(String),
    Oversized(&'static str),
}

impl std::error::Error for ReadError {}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Transport(e) => write!(f, "{e}"),
            ReadError::Oversized(what) => f.write_str(what),
        }
    }
}

/// Hands on only whole lines, so the SSE parser never re-reads a partial one (it would
/// on every chunk, quadratic in the line's length), and bounds a line and the answer.
#[derive(Debug, Default)]
pub(super) struct Lines {
    partial: bytes::BytesMut,
    total: usize,
}

impl Lines {
    pub(super) fn push(&mut self, chunk: bytes::Bytes) -> Result<bytes::Bytes, ReadError> {
        self.total += chunk.len();
        if self.total > MAX_ANSWER_BYTES {
            return Err(ReadError::Oversized("the answer is over 64 MiB"));
        }
        // Most reads end at a line's end: handed on as they are, not copied.
        if self.partial.is_empty() && chunk.last() == Some(&b'\n') {
            return Ok(chunk);
        }
        self.partial.extend_from_slice(&chunk);
        match self.partial.iter().rposition(|&b| b == b'\n') {
            Some(end) => Ok(self.partial.split_to(end + 1).freeze()),
            None if self.partial.len() > MAX_LINE_BYTES => {
                Err(ReadError::Oversized("an SSE line is over 256 KiB"))
            }
            None => Ok(bytes::Bytes::new()),
        }
    }
}

/// An answer's moments on the injected clock, as the `Instant`s its events carry: the
/// moment the request was sent and the clock's reading then pin the one to the other.
#[derive(Debug, Clone)]
pub(super) struct Timeline {
    sent: Instant,
    /// The clock's reading when the request was sent.
    sent_reading: Duration,
    clock: SharedClock,
}

impl Timeline {
    pub(super) fn new(clock: SharedClock, sent: Instant) -> Self {
        Timeline {
            sent,
            sent_reading: clock.at(sent),
            clock,
        }
    }

    /// The time since the request was sent.
    pub(super) fn since_sent(&self) -> Duration {
        self.clock.now().saturating_sub(self.sent_reading)
    }

    /// Now, as the moment an event carries.
    pub(super) fn now(&self) -> Instant {
        self.sent + self.since_sent()
    }
}

/// When the last byte of the answer arrived, after the request was sent; shared by the
/// body, which marks it, and the wait, which reads it.
#[derive(Debug, Default)]
pub(super) struct LastByte {
    /// Microseconds after sending, at least 1; 0 while no byte has come.
    micros: AtomicU64,
}

impl LastByte {
    fn mark(&self, since_sent: Duration) {
        let micros = u64::try_from(since_sent.as_micros()).unwrap_or(u64::MAX);
        self.micros.store(micros.max(1), Ordering::Relaxed);
    }

    fn since_sent(&self) -> Option<Duration> {
        match self.micros.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// When the last bytes came, as the moment an event carries; now if none has.
    pub(super) fn arrived(&self, timeline: &Timeline) -> Instant {
        self.since_sent()
            .map_or_else(|| timeline.now(), |since| timeline.sent + since)
    }
}

/// The answer's body in whole lines ([`Lines`]), each arrival marked on `last_byte`.
pub(super) fn stamped(
    body: super::Body,
    timeline: &Timeline,
    last_byte: &Arc<LastByte>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, ReadError>> {
    let (timeline, last_byte) = (timeline.clone(), Arc::clone(last_byte));
    let mut lines = Lines::default();
    body.map(move |chunk| {
        last_byte.mark(timeline.since_sent());
        lines.push(chunk.map_err(ReadError::Transport)?)
    })
}

/// One wait for bytes: until `deadline` after the request was sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Wait {
    pub(super) deadline: Duration,
    /// How long the upstream is given.
    waited: Duration,
    /// Whether it is the wait for the first byte.
    first_byte: bool,
}

impl Wait {
    /// The fault of a deadline passed with no byte since it was set.
    pub(super) fn late(self) -> Fault {
        Fault::Timeout {
            waited: self.waited,
            first_byte: self.first_byte,
        }
    }
}

impl Patience {
    /// The wait for the next bytes of an answer whose last byte came `last_byte` after
    /// sending (none yet: the first byte's wait), asked for `called` after sending. The
    /// idle deadline counts from the last byte or the call, whichever is later: time
    /// spent waiting for the gateway to take an event is not the upstream's silence.
    pub(super) fn wait(self, last_byte: Option<Duration>, called: Duration) -> Wait {
        match last_byte {
            None => Wait {
                deadline: self.first_byte,
                waited: self.first_byte,
                first_byte: true,
            },
            Some(last) => Wait {
                deadline: last.max(called) + self.idle,
                waited: self.idle,
                first_byte: false,
            },
        }
    }
}

/// What waiting for the next event gave.
pub(super) enum Next<E> {
    Event(E),
    /// The body ended.
    End,
    /// Nothing arrived in time.
    Late(Fault),
    /// The gateway stopped taking events (the client left, the answer was ended).
    Gone,
}

/// What one answer's waits are watched with, made once per answer and not per event: a
/// timer armed per event and a fresh registration for the gateway leaving cost more
/// than the event they guard.
pub(super) struct Watch<'a> {
    /// Fires at the earliest deadline that may have passed: a later one is not armed
    /// until this fires (the wheel is touched once per idle period, not per event).
    alarm: Pin<Box<tokio::time::Sleep>>,
    /// Resolves when the gateway stops taking events.
    gone: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
}

impl<'a> Watch<'a> {
    pub(super) fn new(tx: &'a mpsc::Sender<EngineEvent>) -> Self {
        Watch {
            alarm: Box::pin(tokio::time::sleep(Duration::from_secs(86_400))),
            gone: Box::pin(tx.closed()),
        }
    }
}

/// The next SSE event if it needs no wait: one already parsed, or parsed from bytes
/// already read (an answer that came in one read: all of a non-streamed request's
/// events, most of a fast upstream's), taken without a timer or a clock read; or the
/// gateway no longer listening. `None`: [`next_in_time`] must wait for it.
pub(super) fn ready<S>(events: &mut S, watch: &mut Watch<'_>) -> Option<Next<S::Item>>
where
    S: futures_util::Stream + Unpin,
{
    if futures_util::FutureExt::now_or_never(watch.gone.as_mut()).is_some() {
        return Some(Next::Gone);
    }
    futures_util::FutureExt::now_or_never(events.next()).map(|e| e.map_or(Next::End, Next::Event))
}

/// The next SSE event once bytes come, or why there is none: the end, too long a wait
/// for bytes ([`Patience::wait`]), or the gateway no longer listening.
pub(super) async fn next_in_time<S>(
    events: &mut S,
    last_byte: &LastByte,
    timeline: &Timeline,
    patience: Patience,
    watch: &mut Watch<'_>,
) -> Next<S::Item>
where
    S: futures_util::Stream + Unpin,
{
    let called = timeline.since_sent();
    loop {
        let last = last_byte.since_sent();
        let wait = patience.wait(last, called);
        let due = tokio::time::Instant::now() + wait.deadline.saturating_sub(timeline.since_sent());
        if watch.alarm.deadline() > due {
            watch.alarm.as_mut().reset(due);
        }
        tokio::select! {
            biased;
            event = events.next() => return event.map_or(Next::End, Next::Event),
            () = watch.gone.as_mut() => return Next::Gone,
            () = watch.alarm.as_mut() => {
                // Armed for an earlier deadline than this wait's: wait on to this one.
                if tokio::time::Instant::now() < due {
                    watch.alarm.as_mut().reset(due);
                    continue;
                }
                // Bytes that completed no event (a keep-alive comment) move the
                // deadline; none at all is the fault.
                if last_byte.since_sent() == last {
                    return Next::Late(wait.late());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_lines_reach_the_parser_and_both_sizes_are_bounded() {
        let mut lines = Lines::default();
        let a = lines
            .push(bytes::Bytes::from_static(b"data: {\"a\""))
            .expect("bounded");
        assert!(a.is_empty(), "half a line waits");
        let b = lines
            .push(bytes::Bytes::from_static(b":1}\n\ndata: x"))
            .expect("bounded");
        assert_eq!(&b[..], b"data: {\"a\":1}\n\n");
        let long = bytes::Bytes::from(vec![b'x'; MAX_LINE_BYTES + 1]);
        assert!(matches!(lines.push(long), Err(ReadError::Oversized(_))));
        let mut total = Lines::default();
        let chunk = bytes::Bytes::from(vec![b'\n'; 1 << 20]);
        let pushed = (0..70)
            .map(|_| total.push(chunk.clone()).is_ok())
            .filter(|ok| *ok)
            .count();
        assert_eq!(pushed, 64, "64 MiB and no more");
    }

    #[test]
    fn the_first_byte_has_its_own_wait_and_idleness_counts_from_the_later_of_byte_and_call() {
        let patience = Patience {
            first_byte: Duration::from_secs(30),
            idle: Duration::from_secs(5),
        };
        let timeout = |secs, first_byte| Fault::Timeout {
            waited: Duration::from_secs(secs),
            first_byte,
        };
        let first = patience.wait(None, Duration::from_secs(2));
        assert_eq!(first.deadline, Duration::from_secs(30));
        assert_eq!(first.late(), timeout(30, true));
        let byte = Some(Duration::from_secs(3));
        let idle = patience.wait(byte, Duration::from_secs(1));
        assert_eq!(idle.deadline, Duration::from_secs(8));
        // The gateway took 10 s to take the last event: the upstream's silence counts
        // from then.
        let slow = patience.wait(byte, Duration::from_secs(10));
        assert_eq!(slow.deadline, Duration::from_secs(15));
        assert_eq!(slow.late(), timeout(5, false));
    }

    #[test]
    fn moments_follow_the_injected_clock() {
        let clock = Arc::new(crate::clock::ManualClock::new());
        let sent = Instant::now();
        let timeline = Timeline::new(clock.clone(), sent);
        assert_eq!(timeline.now(), sent);
        clock.advance(Duration::from_millis(250));
        assert_eq!(timeline.since_sent(), Duration::from_millis(250));
        assert_eq!(timeline.now(), sent + Duration::from_millis(250));
        let last_byte = LastByte::default();
        assert_eq!(last_byte.since_sent(), None);
        assert_eq!(
            last_byte.arrived(&timeline),
            sent + Duration::from_millis(250)
        );
        last_byte.mark(timeline.since_sent());
        assert_eq!(last_byte.since_sent(), Some(Duration::from_millis(250)));
        clock.advance(Duration::from_millis(40));
        assert_eq!(
            last_byte.arrived(&timeline),
            sent + Duration::from_millis(250),
            "an event parsed later carries its bytes' moment"
        );
    }
}

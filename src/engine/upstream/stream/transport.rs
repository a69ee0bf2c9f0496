//! The bytes of one upstream answer, before they are events: the waits they may take
//! ([`Patience`], enforced by [`next_in_time`]) and the sizes they may have ([`Lines`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

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

/// The next SSE event, or why there is none: the end, too long a wait for bytes, or the
/// gateway no longer listening. The idle deadline counts from the last byte or from
/// this call, whichever is later: time spent waiting for the gateway to take an event
/// is not the upstream's silence.
pub(super) async fn next_in_time<S>(
    events: &mut S,
    last_byte: &AtomicU64,
    sent: Instant,
    patience: Patience,
    tx: &mpsc::Sender<EngineEvent>,
) -> Next<S::Item>
where
    S: futures_util::Stream + Unpin,
{
    let called = sent.elapsed();
    loop {
        let last = last_byte.load(Ordering::Relaxed);
        let (deadline, first_byte) = if last == 0 {
            (sent + patience.first_byte, true)
        } else {
            let since = Duration::from_micros(last).max(called);
            (sent + since + patience.idle, false)
        };
        tokio::select! {
            biased;
            event = events.next() => return event.map_or(Next::End, Next::Event),
            () = tx.closed() => return Next::Gone,
            () = tokio::time::sleep_until(deadline.into()) => {
                // Bytes that completed no event (a keep-alive comment) move the
                // deadline; none at all is the fault.
                if last_byte.load(Ordering::Relaxed) == last {
                    let waited = if first_byte { patience.first_byte } else { patience.idle };
                    return Next::Late(Fault::Timeout { waited, first_byte });
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
}

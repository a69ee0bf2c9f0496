//! From engine events to bytes on the wire, with every frame timed.
//!
//! - [`chunks`]: the pure assembler (engine events -> OpenAI chunk frames).
//! - [`producer`]: the per-request task that drains the engine, stamps each frame with
//!   the clock as it is handed to the transport, sends keep-alives, notices a departed
//!   client, and leaves one [`RequestRecord`] when the request ends.
//!
//! [`RequestRecord`]: crate::record::RequestRecord

pub mod chunks;
pub mod producer;

use std::sync::Arc;

use crate::admission::Permit;
use crate::clock::SharedClock;
use crate::engine::{FinishReason, Usage};
use crate::record::{RequestObserver, RequestRecord, Status};
use crate::timing::{RequestTimer, Timings};

/// One admitted request on its way through the engine. If it is dropped before
/// [`Run::finish`] (the client left, the handler was dropped), it records itself as
/// cancelled: every request leaves exactly one record.
pub struct Run {
    pub request_id: String,
    pub model: String,
    pub stream: bool,
    pub clock: SharedClock,
    pub timer: RequestTimer,
    /// Token events received so far; the usage of a cancelled request.
    pub tokens_seen: u32,
    observer: Arc<dyn RequestObserver>,
    recorded: bool,
    _permit: Permit,
}

/// How a request ended, for its record.
pub enum Ending {
    Finished {
        reason: FinishReason,
        usage: Usage,
        timings: Timings,
    },
    Failed {
        kind: &'static str,
        timings: Timings,
    },
}

impl Run {
    pub fn new(
        request_id: String,
        model: String,
        stream: bool,
        clock: SharedClock,
        timer: RequestTimer,
        observer: Arc<dyn RequestObserver>,
        permit: Permit,
    ) -> Self {
        Self {
            request_id,
            model,
            stream,
            clock,
            timer,
            tokens_seen: 0,
            observer,
            recorded: false,
            _permit: permit,
        }
    }

    /// Timings as of now, for a request that ends without engine usage.
    pub fn timings_now(&self) -> Timings {
        self.timer.finish(self.clock.now(), self.tokens_seen, None)
    }

    pub fn finish(mut self, ending: Ending) {
        let (status, error_kind, finish_reason, usage, timings) = match ending {
            Ending::Finished {
                reason,
                usage,
                timings,
            } => (Status::Ok, None, Some(reason), usage, timings),
            Ending::Failed { kind, timings } => (
                Status::Error,
                Some(kind),
                None,
                self.partial_usage(),
                timings,
            ),
        };
        self.record(status, error_kind, finish_reason, usage, timings);
    }

    fn partial_usage(&self) -> Usage {
        Usage {
            prompt_tokens: 0,
            completion_tokens: self.tokens_seen,
        }
    }

    fn record(
        &mut self,
        status: Status,
        error_kind: Option<&'static str>,
        finish_reason: Option<FinishReason>,
        usage: Usage,
        timings: Timings,
    ) {
        self.recorded = true;
        self.observer.observe(&RequestRecord {
            request_id: std::mem::take(&mut self.request_id),
            model: std::mem::take(&mut self.model),
            stream: self.stream,
            status,
            error_kind,
            finish_reason,
            usage,
            timings,
        });
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.recorded {
            let timings = self.timings_now();
            let usage = self.partial_usage();
            self.record(Status::Cancelled, None, None, usage, timings);
        }
    }
}

//! From engine events to bytes on the wire, with every frame timed.
//!
//! - [`chunks`]: the pure assembler (engine events -> OpenAI chunk frames).
//! - [`logprobs`]: token log-probabilities in the chat and legacy shapes.
//! - [`stops`]: stop sequences, cut by the gateway as the text streams.
//! - [`producer`]: the per-request task that drains the engine, stamps each frame with
//!   the clock as it is handed to the transport, sends keep-alives, notices a departed
//!   client, and leaves one [`RequestRecord`] when the request ends.
//!
//! [`Run`] is the state one admitted request carries through either path.

pub mod chunks;
pub mod logprobs;
pub mod producer;
pub mod stops;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crate::admission::Permit;
use crate::clock::SharedClock;
use crate::engine::{ToolCall, ToolCallDelta, ToolCalls};
use crate::quality::QualityTracker;
use crate::record::{
    AgentRecord, Answer, Ended, Origin, RequestParams, RequestRecord, ResponseTimings, Status,
    UpstreamRecord,
};
use crate::telemetry::trace::RequestTrace;
use crate::telemetry::Telemetry;
use crate::timing::{OutputKind, RequestTimer, Timings};
use crate::tokens::{FinishReason, TokenLogprob, Usage};
use stops::StopScreen;

/// Who a request is and what it asked for, for its record.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// Who sent it and how it asked, for the record.
    pub origin: Origin,
    /// The `id` of the response (`chatcmpl-…`, `cmpl-…`).
    pub response_id: String,
    pub input_hash: String,
    pub seed: Option<u64>,
    /// The served model's facts, for the record.
    pub served: Arc<crate::engine::ModelInfo>,
    pub prompt_tokens: u32,
    pub params: RequestParams,
    /// The last user message, for the semantic log's redacted excerpt.
    pub prompt: String,
    /// The client's `user` field, for the semantic log's keyed hash.
    pub user: Option<String>,
    /// The stop sequences the gateway screens (none when the engine applies them).
    pub stop: Vec<String>,
    /// What an upstream says of its answer as it streams; `None` in this process.
    pub reported: Option<Arc<crate::engine::Reported>>,
    /// The names of the tools the request offered (none: no tools).
    pub tools_offered: Vec<String>,
}

/// One admitted request on its way through the engine. If it is dropped before
/// [`Run::finish`] (the client left, the handler was dropped), it records itself as
/// cancelled: every request leaves exactly one record.
pub struct Run {
    pub info: RunInfo,
    clock: SharedClock,
    timer: RequestTimer,
    quality: QualityTracker,
    telemetry: Arc<Telemetry>,
    /// Taken when the record is written.
    trace: Option<RequestTrace>,
    /// The `request` span whose fields every log line of this request carries.
    log_span: tracing::Span,
    stops: StopScreen,
    /// What the output holds besides the answer's content: reasoning, tool calls, and
    /// the tokens they stand for.
    side: SideOutput,
    _permit: Permit,
}

/// Reasoning and tool calls, as they arrive: not the answer's content, so neither
/// screened for stops nor scored (docs/timings.md, quality signals).
#[derive(Debug, Default)]
struct SideOutput {
    reasoning: String,
    /// Of `tokens`, those of reasoning.
    reasoning_tokens: u32,
    tool_calls: ToolCalls,
    tokens: u32,
}

/// What one token event means for the answer.
pub struct Arrival<'a> {
    /// Text the client may have now (see [`StopScreen`]).
    pub text: Cow<'a, str>,
    /// The answer ends here: a stop sequence is complete or the degeneration guard
    /// tripped. The generation should stop.
    pub end: Option<Ending>,
    /// A stop sequence cut the text: the tokens that begin after the cut are not the
    /// answer's, and their log-probabilities are not returned.
    pub cut: bool,
}

/// How a request ended.
pub enum Ending {
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    /// The degeneration guard stopped it.
    Degenerated,
    Failed {
        kind: &'static str,
    },
}

impl Run {
    pub fn new(
        info: RunInfo,
        clock: SharedClock,
        timer: RequestTimer,
        quality: QualityTracker,
        telemetry: Arc<Telemetry>,
        trace: RequestTrace,
        permit: Permit,
    ) -> Self {
        Self {
            stops: StopScreen::new(&info.stop),
            info,
            clock,
            timer,
            quality,
            telemetry,
            trace: Some(trace),
            log_span: tracing::Span::current(),
            side: SideOutput::default(),
            _permit: permit,
        }
    }

    /// The engine starts the answer over ([`crate::engine::EngineEvent::Restarted`]):
    /// what came before is not the answer.
    pub fn restart(&mut self) {
        self.timer.restart_answer();
        self.quality.restart();
        self.stops.restart();
        self.side = SideOutput::default();
    }

    /// Reasoning the engine handed over `at`, standing for `tokens` tokens.
    pub fn reasoning_arrived(&mut self, text: &str, tokens: u32, at: std::time::Instant) {
        self.output_arrived(OutputKind::Reasoning, tokens, at);
        self.side.reasoning.push_str(text);
        self.side.reasoning_tokens += tokens;
    }

    /// A piece of a tool call the engine handed over `at`, standing for `tokens` tokens.
    pub fn tool_call_arrived(
        &mut self,
        delta: &ToolCallDelta,
        tokens: u32,
        at: std::time::Instant,
    ) {
        self.output_arrived(OutputKind::ToolCall, tokens, at);
        self.side.tool_calls.push(delta);
    }

    fn output_arrived(&mut self, kind: OutputKind, tokens: u32, at: std::time::Instant) {
        let produced = self.clock.at(at);
        self.timer.engine_output(kind, produced, tokens);
        self.timer
            .delivered(self.clock.now().saturating_sub(produced));
        self.side.tokens += tokens;
    }

    /// The reasoning so far.
    pub fn reasoning(&self) -> &str {
        &self.side.reasoning
    }

    /// The tool calls so far, put together from their pieces.
    pub fn tool_calls(&self) -> &[ToolCall] {
        &self.side.tool_calls.0
    }

    /// A frame carrying output of `kind` has just been handed to the transport (for an
    /// answer given in one body: the output reached the gateway).
    pub fn frame_sent(&mut self, kind: OutputKind) {
        self.timer.frame_sent(kind, self.clock.now());
    }

    /// A token event the engine handed over `at` arrived.
    pub fn token_arrived<'a>(
        &mut self,
        text: &'a str,
        ids: &[u32],
        logprobs: &[TokenLogprob],
        at: std::time::Instant,
    ) -> Arrival<'a> {
        // The engine's own timing: when it produced text, held back or not.
        let produced = self.clock.at(at);
        self.timer.engine_token(produced, !text.is_empty());
        if !text.is_empty() {
            self.timer
                .delivered(self.clock.now().saturating_sub(produced));
        }
        let mut screened = self.stops.push(text);
        let degenerated = self.quality.push(&screened.text, ids, logprobs);
        let end = if screened.stopped {
            Some(Ending::Finished {
                reason: FinishReason::Stop,
                usage: self.usage_so_far(),
            })
        } else if degenerated {
            // The answer ends here; what waited for a stop that did not come is its.
            let rest = self.release_held_text();
            screened.text.to_mut().push_str(&rest);
            Some(Ending::Degenerated)
        } else {
            None
        };
        Arrival {
            text: screened.text,
            end,
            cut: screened.stopped,
        }
    }

    /// The answer ends without a stop sequence (the engine finished, or the guard
    /// stopped it): the text held back for one is the answer's end.
    pub fn release_held_text(&mut self) -> String {
        let rest = self.stops.finish();
        self.quality.push(&rest, &[], &[]);
        rest
    }

    /// The transport waited `waited` for the client (see [`RequestTimer::client_waited`]).
    pub fn client_waited(&mut self, waited: Duration) {
        self.timer.client_waited(waited);
    }

    /// The gateway's clock, for the transport's own stamps.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// A frame with content has just been handed to the transport.
    pub fn content_sent(&mut self) {
        self.timer.content_sent(self.clock.now());
    }

    /// The engine's last event arrived: what follows is the gateway's own work.
    pub fn engine_done(&mut self) {
        self.timer.engine_done(self.clock.now());
    }

    /// The answer so far.
    /// The stop sequence that ended the answer, if one did.
    pub fn stop_word(&self) -> Option<&str> {
        self.stops.matched()
    }

    pub fn text(&self) -> &str {
        self.quality.text()
    }

    /// llama.cpp's timings so far (`timings_per_token`); `None` before the first token.
    /// The prefix cache's share is known only at the end: until then the whole prompt
    /// counts as read.
    pub fn llama_timings_so_far(&self) -> Option<chunks::native::LlamaTimings> {
        let (prompt, decoding) = self.timer.decoding_so_far()?;
        let usage = self.usage_so_far();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Some(chunks::native::LlamaTimings::new(
            usage.prompt_tokens,
            0,
            ms(prompt),
            usage.completion_tokens,
            ms(decoding),
        ))
    }

    /// Usage of a request that ends without the engine's count: the tokens seen so far.
    pub fn usage_so_far(&self) -> Usage {
        Usage {
            prompt_tokens: self.info.prompt_tokens,
            completion_tokens: u32::try_from(self.quality.token_ids().len())
                .unwrap_or(u32::MAX)
                .saturating_add(self.side.tokens),
            cached_tokens: None,
            reasoning_tokens: None,
        }
    }

    /// The finish reason and usage an answer that ended so reports: the engine's when it
    /// finished, else `stop` with the tokens seen so far (the guard cut it).
    pub fn reason_and_usage(&self, ending: &Ending) -> (FinishReason, Usage) {
        let (reason, mut usage) = match ending {
            Ending::Finished { reason, usage } => (*reason, *usage),
            _ => (FinishReason::Stop, self.usage_so_far()),
        };
        // The engine's count where it gave one, else the gateway's.
        if usage.reasoning_tokens.is_none() && !self.side.reasoning.is_empty() {
            usage.reasoning_tokens = Some(self.side.reasoning_tokens);
        }
        (reason, usage)
    }

    /// Latency and quality as of now, for a response body.
    pub fn report(&mut self, ending: &Ending) -> ResponseTimings {
        let tokens = match ending {
            Ending::Finished { usage, .. } => {
                self.timer.reasoning_reported(usage.reasoning_tokens);
                usage.completion_tokens
            }
            Ending::Degenerated | Ending::Failed { .. } => self.usage_so_far().completion_tokens,
        };
        let mut quality = self.quality.finish();
        if let Some(basis) = self.info.reported.as_ref().and_then(|r| r.basis.get()) {
            quality.repetition_basis = *basis;
        }
        ResponseTimings {
            timings: self.timer.finish(self.clock.now(), tokens),
            quality,
            upstream: self
                .info
                .reported
                .as_deref()
                .map(crate::record::Replica::of),
        }
    }

    /// Records the request as ended, with timings as of now, and returns them.
    pub fn finish(mut self, ending: Ending) -> Timings {
        let report = self.report(&ending);
        let timings = report.timings.clone();
        let (status, error_kind, finish_reason, usage) = match ending {
            Ending::Finished { reason, usage, .. } => (Status::Ok, None, Some(reason), usage),
            Ending::Degenerated => (
                Status::Ok,
                None,
                Some(FinishReason::Stop),
                self.usage_so_far(),
            ),
            Ending::Failed { kind } => (Status::Error, Some(kind), None, self.usage_so_far()),
        };
        self.record(status, error_kind, finish_reason, usage, report);
        timings
    }

    /// Records the request as cancelled by the gateway for `reason`, which becomes its
    /// `error.type` (a stalled client: [`names::CLIENT_STALLED`](crate::names)).
    pub fn cancel(mut self, reason: &'static str) {
        self.record_cancelled(Some(reason));
    }

    fn record_cancelled(&mut self, reason: Option<&'static str>) {
        let ending = Ending::Failed {
            kind: reason.unwrap_or(crate::names::CANCELLED),
        };
        let report = self.report(&ending);
        let usage = self.usage_so_far();
        self.record(Status::Cancelled, reason, None, usage, report);
    }

    fn record(
        &mut self,
        status: Status,
        error_kind: Option<&'static str>,
        finish_reason: Option<FinishReason>,
        usage: Usage,
        report: ResponseTimings,
    ) {
        let Some(trace) = self.trace.take() else {
            return;
        };
        let _entered = self.log_span.clone().entered();
        let agent = self.agent_record();
        let output_hash = crate::record::output_hash(self.quality.text());
        let t_end = self.timer.received() + Duration::from_secs_f64(report.timings.e2e_ms / 1000.0);
        let phases = self.timer.phases(t_end);
        let info = &mut self.info;
        let ended = Ended {
            status,
            error_kind,
            timings: report.timings,
            phases,
            trace: trace.ids,
            received_at: trace.received_at(),
            upstream: info.reported.as_deref().map(UpstreamRecord::of),
        };
        let answer = Answer {
            response_id: Some(std::mem::take(&mut info.response_id)),
            finish_reason,
            usage,
            quality: Some(report.quality),
            input_hash: Some(std::mem::take(&mut info.input_hash)),
            output_hash: Some(output_hash),
            seed: info.seed,
            served: Some(Arc::clone(&info.served)),
            params: info.params,
            itl_gaps: self.timer.take_gaps(),
            user: info.user.take(),
            prompt: Some(std::mem::take(&mut info.prompt)),
            response: Some(self.quality.text().to_owned()),
            agent,
        };
        let record = RequestRecord::new(std::mem::take(&mut info.origin), ended, answer);
        self.telemetry
            .request_ended(&record, trace, self.clock.as_ref());
    }
}

impl Run {
    /// The record's account of tools and reasoning; `None` when there was neither.
    fn agent_record(&mut self) -> Option<AgentRecord> {
        let side = std::mem::take(&mut self.side);
        if self.info.tools_offered.is_empty()
            && side.tool_calls.is_empty()
            && side.reasoning.is_empty()
        {
            return None;
        }
        Some(AgentRecord {
            offered: std::mem::take(&mut self.info.tools_offered),
            calls: side.tool_calls.0,
            reasoning_chars: side.reasoning.chars().count(),
        })
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.trace.is_some() {
            self.record_cancelled(None);
        }
    }
}

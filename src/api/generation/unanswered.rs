//! A generation request's record before its [`Run`](crate::stream::Run) takes it over.

use std::sync::Arc;

use actix_web::web;

use super::AppState;
use crate::error::ApiError;
use crate::record::{
    Answer, Ended, Origin, QuotaHold, RequestRecord, ShadowLink, SplitLink, Status, UpstreamRecord,
};
use crate::telemetry::trace::RequestTrace;
use crate::timing::RequestTimer;

/// A request not yet handed to a [`Run`]: if it is refused, or dropped before it reaches
/// the engine (the client left while it waited for a slot, the server is stopping), it
/// still leaves its one record — as cancelled in the second case.
pub(super) struct Unanswered {
    pub(super) operation: &'static str,
    pub(super) state: web::Data<AppState>,
    pub(super) request_id: String,
    pub(super) api_key_id: Option<String>,
    /// The served model the request named, once its body is parsed.
    pub(super) model: Option<String>,
    /// Whether it asked for a stream, once its body is parsed.
    pub(super) stream: bool,
    pub(super) t_recv: std::time::Duration,
    /// Taken by the `Run` once the engine has the request.
    pub(super) trace: Option<RequestTrace>,
    /// An upstream's account, once the request is prepared: where it was tried.
    pub(super) reported: Option<Arc<crate::engine::Reported>>,
    /// What it holds of its key's quotas once charged, released by its record.
    pub(super) quota_hold: Option<QuotaHold>,
    /// The pair it is one side of, when its model is shadowed.
    pub(super) shadow: Option<ShadowLink>,
    /// The A/B split it named and the variant chosen, for its record; and the variant
    /// again for the response's `x-llmgate-variant` (this one is not taken).
    pub(super) split: Option<SplitLink>,
    pub(super) variant: Option<String>,
}

impl Unanswered {
    /// A request received at `t_recv`, before its body says what it asks for.
    pub(super) fn new(
        operation: &'static str,
        state: web::Data<AppState>,
        request_id: String,
        api_key_id: Option<String>,
        t_recv: std::time::Duration,
        trace: RequestTrace,
    ) -> Self {
        Self {
            operation,
            state,
            request_id,
            api_key_id,
            model: None,
            stream: false,
            t_recv,
            trace: Some(trace),
            reported: None,
            quota_hold: None,
            shadow: None,
            split: None,
            variant: None,
        }
    }

    /// Records the request as refused with `error`, or as cancelled without one.
    pub(super) fn record(&mut self, error: Option<&ApiError>) {
        let Some(trace) = self.trace.take() else {
            return;
        };
        let state = &self.state;
        let timer = RequestTimer::start(self.t_recv);
        let timings = timer.finish(state.clock.now(), 0);
        let t_end = self.t_recv + std::time::Duration::from_secs_f64(timings.e2e_ms / 1000.0);
        // A request for another model is not counted under a served one.
        let model = match (error, self.model.take()) {
            (Some(ApiError::ModelNotFound(_)), _) => crate::names::MODEL_NONE.to_owned(),
            (_, Some(model)) => model,
            (_, None) => state.models.label_for_unknown().to_owned(),
        };
        let origin = Origin {
            request_id: std::mem::take(&mut self.request_id),
            operation: self.operation,
            api_key_id: self.api_key_id.take(),
            model,
            stream: self.stream,
            quota_hold: self.quota_hold.take(),
            // A client's request recorded here never reached its engine, so its copy was
            // never sent: it pairs with nothing. A copy's own record keeps its side.
            shadow: self
                .shadow
                .take()
                .filter(|link| link.side == crate::record::ShadowSide::Candidate),
            split: self.split.take(),
        };
        let ended = Ended {
            status: if error.is_some() {
                Status::Error
            } else {
                Status::Cancelled
            },
            error_kind: error.map(ApiError::kind),
            timings,
            phases: timer.phases(t_end),
            trace: trace.ids,
            received_at: trace.received_at(),
            upstream: self.reported.as_deref().map(UpstreamRecord::of),
        };
        let record = RequestRecord::new(origin, ended, Answer::default());
        state
            .telemetry
            .request_ended(&record, trace, state.clock.as_ref());
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        self.record(None);
    }
}

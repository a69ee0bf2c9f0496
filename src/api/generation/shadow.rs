//! Shadowing on the request path: a copy of a picked request goes to its model's
//! candidate in the background (`crate::shadow`), along the same path as a client's
//! request (admitted, started, answered, recorded), with its answer read to the end and
//! dropped. The client's request waits for nothing of it.

use actix_web::http::header::HeaderMap;
use actix_web::web;

use super::{Charged, GenerationRoute, Handling, Unanswered};
use crate::api::request::ValidatedRequest;
use crate::api::AppState;
use crate::auth::limits::RateHeaders;
use crate::record::ShadowLink;
use crate::stream::producer::Deadline;
use crate::timing::RequestTimer;

/// Sends a copy of `parsed` to its model's candidate when the request is one of the
/// shadow's share and there is room; the client's request (`pending`) then names the
/// pair.
pub(super) fn launch(route: GenerationRoute, parsed: &ValidatedRequest, pending: &mut Unanswered) {
    let state = &pending.state;
    let Some(shadow) = state.shadows.of(&parsed.model) else {
        return;
    };
    if !shadow.picks() {
        return;
    }
    let admission = &state.admission;
    let permit = match shadow.try_start(admission.in_flight(), admission.limit()) {
        Ok(permit) => permit,
        Err(reason) => {
            state
                .telemetry
                .metrics
                .shadow_dropped(&shadow.primary, &shadow.candidate, reason);
            return;
        }
    };
    let (primary, candidate) = shadow.links(&pending.request_id);
    pending.shadow = Some(primary);
    let mut copy = parsed.clone();
    copy.model = shadow.candidate.clone();
    let state = state.clone();
    // On this worker's own thread, as the request itself: an answer (`HttpResponse`)
    // does not move between threads.
    actix_web::rt::spawn(async move {
        run(route, state, copy, candidate).await;
        drop(permit);
    });
}

/// The copy's whole life: its record names the pair, and no key is charged for it.
async fn run(
    route: GenerationRoute,
    state: web::Data<AppState>,
    parsed: ValidatedRequest,
    link: ShadowLink,
) {
    let t_recv = state.clock.now();
    let request_id = format!("{}-shadow", link.pair_id);
    let deadline = Deadline {
        at: tokio::time::Instant::now() + state.timeouts.request,
        limit: state.timeouts.request,
        cut_off: state.lifecycle.cut_off(),
    };
    let trace = state
        .telemetry
        .start_request(&HeaderMap::new(), state.clock.system_time());
    let mut pending = Unanswered {
        operation: route.operation(),
        state: state.clone(),
        request_id: request_id.clone(),
        api_key_id: None,
        model: Some(parsed.model.clone()),
        stream: parsed.stream,
        t_recv,
        trace: Some(trace),
        reported: None,
        quota_hold: None,
        shadow: Some(link),
        split: None,
        variant: None,
    };
    let mut rate = RateHeaders::default();
    let mut handling = Handling {
        route,
        state: &state,
        request_id: &request_id,
        charged: Charged {
            caller: None,
            headers: &mut rate,
        },
        timer: RequestTimer::start(t_recv),
        deadline: deadline.clone(),
        pending: &mut pending,
    };
    let answered = async {
        let admitted = handling.admit(parsed)?;
        let started = handling.start(admitted).await?;
        super::respond(started, &state, deadline).await
    };
    match answered.await {
        // Read to its end as a client would, so the answer is timed as the client's is.
        Ok(response) => drop(actix_web::body::to_bytes(response.into_body()).await),
        Err(super::Failure::Refused(error)) => pending.record(Some(&error)),
        Err(super::Failure::Recorded(_)) => {}
    }
}

//! Shadowing on the request path: a copy of a picked request goes to its model's
//! candidate in the background (`crate::shadow`), along the same path as a client's
//! request (admitted, started, answered, recorded), with its answer read to the end and
//! dropped. The client's request waits for nothing of it, and a copy gives way to
//! clients: it is not sent while the gateway is crowded, and is stopped when it becomes
//! so ([`Shadow::crowded`], looked at every [`SHED_CHECK`]).

use actix_web::http::header::HeaderMap;
use actix_web::web;

use std::sync::Arc;
use std::time::Duration;

use super::{Charged, GenerationRoute, Handling, Unanswered};
use crate::admission::Permit;
use crate::api::request::ValidatedRequest;
use crate::api::AppState;
use crate::auth::limits::RateHeaders;
use crate::record::ShadowLink;
use crate::shadow::Shadow;
use crate::stream::producer::Deadline;
use crate::timing::RequestTimer;

/// How often a running copy looks whether it must make way for clients.
const SHED_CHECK: Duration = Duration::from_millis(20);

/// Whether `shadow`'s copies must make way for clients now.
fn crowded(state: &AppState, shadow: &Shadow) -> bool {
    let admission = &state.admission;
    let waiting = state
        .models
        .get(&shadow.candidate)
        .map_or(0, |served| served.engine.load().waiting);
    shadow.crowded(admission.in_flight(), admission.limit(), waiting)
}

/// A request picked for a copy: its model is shadowed and it is one of the share.
pub(super) struct Picked {
    shadow: Arc<Shadow>,
    copy: ValidatedRequest,
    state: web::Data<AppState>,
}

/// A copy with its place taken, to be sent once the client's request has started.
pub(super) struct Reserved {
    picked: Picked,
    route: GenerationRoute,
    permit: Permit,
    link: ShadowLink,
}

/// Whether `parsed` is one of its model's shadow's share: then a copy of it, for the
/// candidate (before the client's request is admitted, which sets its own deadline and
/// trace on it).
pub(super) fn pick(state: &web::Data<AppState>, parsed: &ValidatedRequest) -> Option<Picked> {
    let shadow = state.shadows.of(&parsed.model)?;
    if !shadow.picks() {
        return None;
    }
    let mut copy = parsed.clone();
    copy.model = shadow.candidate.clone();
    Some(Picked {
        shadow: Arc::clone(shadow),
        copy,
        state: web::Data::clone(state),
    })
}

impl Picked {
    /// Takes the copy's place, once the client's request is admitted: under the
    /// shadow's own cap, and only while the gateway is not crowded
    /// ([`Shadow::crowded`]) nor draining; otherwise the copy is dropped and counted.
    /// The client's request (`pending`) then names the pair.
    pub(super) fn reserve(
        self,
        route: GenerationRoute,
        pending: &mut Unanswered,
    ) -> Option<Reserved> {
        let state = &self.state;
        let crowded = state.lifecycle.is_draining() || crowded(state, &self.shadow);
        let started = self.shadow.try_start(crowded);
        let permit = match started {
            Ok(permit) => permit,
            Err(reason) => {
                let (primary, candidate) = (&self.shadow.primary, &self.shadow.candidate);
                state
                    .telemetry
                    .metrics
                    .shadow_dropped(primary, candidate, reason);
                return None;
            }
        };
        let (primary, candidate) = self.shadow.links();
        state.telemetry.shadow_pairs.open(&primary.pair_id);
        pending.shadow = Some(primary);
        Some(Reserved {
            picked: self,
            route,
            permit,
            link: candidate,
        })
    }
}

impl Reserved {
    /// Sends the copy, on this worker's own thread as the request itself: an answer
    /// (`HttpResponse`) does not move between threads.
    pub(super) fn launch(self) {
        let Picked {
            shadow,
            copy,
            state,
        } = self.picked;
        actix_web::rt::spawn(async move {
            let pair_id = self.link.pair_id.clone();
            let copy = run(self.route, state.clone(), copy, self.link, self.permit);
            tokio::pin!(copy);
            let mut every = tokio::time::interval(SHED_CHECK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    () = &mut copy => return,
                    _ = every.tick() => {
                        // Marked first: the copy's record, made as it is dropped, and
                        // the client's are then compared with nothing. A copy whose
                        // record is in already has ended: it is read to its end.
                        let pairs = &state.telemetry.shadow_pairs;
                        if crowded(&state, &shadow) && pairs.shed(&pair_id) {
                            let metrics = &state.telemetry.metrics;
                            metrics.shadow_dropped(&shadow.primary, &shadow.candidate, "shed");
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// The copy's whole life: its record names the pair, and no key is charged for it.
async fn run(
    route: GenerationRoute,
    state: web::Data<AppState>,
    mut parsed: ValidatedRequest,
    link: ShadowLink,
    permit: Permit,
) {
    let t_recv = state.clock.now();
    let request_id = format!("{}-shadow", link.pair_id);
    // The candidate's `x-request-id` is the pair's id (a UUID), not the client's: one
    // server serving both models must not see one id twice.
    parsed.generation.request_id = link.pair_id.clone();
    let deadline = Deadline::from_now(state.timeouts.request, state.lifecycle.cut_off());
    let trace = state
        .telemetry
        .start_request(&HeaderMap::new(), state.clock.system_time());
    let mut pending = Unanswered::new(
        route.operation(),
        state.clone(),
        request_id.clone(),
        None,
        t_recv,
        trace,
    );
    pending.model = Some(parsed.model.clone());
    pending.stream = parsed.stream;
    pending.shadow = Some(link);
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
        let admitted = handling.admitted(parsed, permit)?;
        let started = handling.start(admitted).await?;
        super::respond::respond(started, &state, deadline).await
    };
    match answered.await {
        // Read to its end as a client would, so the answer is timed as the client's is.
        Ok(response) => drop(actix_web::body::to_bytes(response.into_body()).await),
        Err(super::Failure::Refused(error)) => pending.record(Some(&error)),
        Err(super::Failure::Recorded(_)) => {}
    }
}

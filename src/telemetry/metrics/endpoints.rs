//! Every replica of an upstream model measured on its own: TTFT and TPOT per endpoint
//! (from each request's record, the same figures as the model's), attempts by outcome
//! (failovers show as attempts with an error type), and each scrape's reading of the
//! endpoint's state and load.
//!
//! The `endpoint` label is a base URL without credentials: a model's `urls`, or the
//! addresses its DNS name resolves to. A replica that leaves a DNS name keeps its last
//! series until the gateway restarts (a few per pod rollout).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::families::{Buckets, TOKEN_BUCKETS, TTFT_BUCKETS};
use crate::engine::upstream::fleet::{EndpointView, State};
use crate::names;
use crate::record::RequestRecord;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EndpointLabels {
    pub(super) model: String,
    pub(super) endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AttemptLabels {
    pub(super) model: String,
    pub(super) endpoint: String,
    /// `none` for the attempt that answered, else the fault's kind.
    pub(super) error_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub(super) model: String,
    pub(super) endpoint: String,
    pub(super) state: &'static str,
}

type EndpointHistograms = Family<EndpointLabels, Histogram, Buckets>;

#[derive(Debug, Clone)]
pub(super) struct EndpointMetrics {
    ttft: EndpointHistograms,
    tpot: EndpointHistograms,
    attempts: Family<AttemptLabels, Counter>,
    state: Family<StateLabels, Gauge>,
    outstanding: Family<EndpointLabels, Gauge>,
}

impl EndpointMetrics {
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self {
            ttft: Family::new_with_constructor(Buckets(TTFT_BUCKETS)),
            tpot: Family::new_with_constructor(Buckets(TOKEN_BUCKETS)),
            attempts: Family::default(),
            state: Family::default(),
            outstanding: Family::default(),
        };
        r.register(
            names::ENDPOINT_TIME_TO_FIRST_TOKEN,
            "Upstream models: TTFT of the requests each endpoint (replica) served",
            m.ttft.clone(),
        );
        r.register(
            names::ENDPOINT_TIME_PER_OUTPUT_TOKEN,
            "Upstream models: TPOT of the requests each endpoint (replica) served",
            m.tpot.clone(),
        );
        r.register(
            names::ENDPOINT_ATTEMPTS,
            "Upstream models: attempts at each endpoint, by the fault that failed them (none: it answered); a request that failed over counts one per endpoint tried",
            m.attempts.clone(),
        );
        r.register(
            names::ENDPOINT_STATE,
            "Upstream models: 1 for each endpoint's routing state (up, ejected, readmitting, rate_limited), 0 for the others",
            m.state.clone(),
        );
        r.register(
            names::ENDPOINT_OUTSTANDING,
            "Upstream models: requests this gateway has in flight at each endpoint",
            m.outstanding.clone(),
        );
        m
    }

    /// One finished request: its figures under the endpoint that served it, and each
    /// attempt it made.
    pub(super) fn observe(&self, model: &str, r: &RequestRecord) {
        let Some(upstream) = &r.upstream else {
            return;
        };
        for attempt in &upstream.attempts {
            self.attempts
                .get_or_create(&AttemptLabels {
                    model: model.to_owned(),
                    endpoint: attempt.endpoint.clone(),
                    error_type: attempt.error_type.unwrap_or(names::LABEL_NONE),
                })
                .inc();
        }
        let served = upstream.attempts.last().filter(|a| a.error_type.is_none());
        let Some(served) = served else {
            return;
        };
        let labels = EndpointLabels {
            model: model.to_owned(),
            endpoint: served.endpoint.clone(),
        };
        if let Some(ttft) = r.timings.ttft_ms {
            self.ttft.get_or_create(&labels).observe(ttft / 1000.0);
        }
        if let Some(tpot) = r.timings.tpot_ms {
            self.tpot.get_or_create(&labels).observe(tpot / 1000.0);
        }
    }

    /// Each endpoint's state and load now, as a scrape reads them.
    pub(super) fn refresh(&self, endpoints: &[(String, Vec<EndpointView>)]) {
        for (model, views) in endpoints {
            for view in views {
                let labels = EndpointLabels {
                    model: model.clone(),
                    endpoint: view.endpoint.clone(),
                };
                // Series exist from the first scrape, so an alert over them sees 0s.
                drop(self.ttft.get_or_create(&labels));
                drop(self.tpot.get_or_create(&labels));
                self.outstanding
                    .get_or_create(&labels)
                    .set(i64::try_from(view.outstanding).unwrap_or(i64::MAX));
                for state in State::ALL {
                    self.state
                        .get_or_create(&StateLabels {
                            model: model.clone(),
                            endpoint: view.endpoint.clone(),
                            state: state.as_str(),
                        })
                        .set(i64::from(view.state == state.as_str()));
                }
            }
        }
    }
}

//! Every replica of an upstream model measured on its own: TTFT and TPOT per endpoint
//! (from each request's record, the same figures as the model's), attempts by outcome
//! (failovers show as attempts with an error type), and each scrape's reading of the
//! endpoint's state and load.
//!
//! The `endpoint` label is a base URL without credentials: a model's `urls`, or the
//! addresses its DNS name resolves to. A replica that leaves the fleet (a pod gone from
//! a DNS name) has its series removed at the next scrape, so a rollout leaves no
//! `ejected` state behind to alert on, and the label set stays bounded by the replicas
//! there are.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::families::{declare_families, label_sets, Buckets, TOKEN_BUCKETS, TTFT_BUCKETS};
use crate::engine::upstream::fault::FaultKind;
use crate::engine::upstream::fleet::{EndpointState, EndpointView};
use crate::names;
use crate::record::RequestRecord;

label_sets! {
    EndpointLabels { model: String, endpoint: String }
    AttemptLabels {
        model: String,
        endpoint: String,
        /// `none` for the attempt that answered, else the fault's kind.
        error_type: &'static str,
    }
    StateLabels { model: String, endpoint: String, state: &'static str }
}

type EndpointHistograms = Family<EndpointLabels, Histogram, Buckets>;

declare_families! {
    /// The per-endpoint families, one field each.
    struct EndpointFamilies {
        ttft: EndpointHistograms = Family::new_with_constructor(Buckets(TTFT_BUCKETS)),
            names::ENDPOINT_TIME_TO_FIRST_TOKEN,
            "Upstream models: TTFT of each endpoint's (replica's) answers, from the attempt's send to its first content reaching the gateway";
        tpot: EndpointHistograms = Family::new_with_constructor(Buckets(TOKEN_BUCKETS)),
            names::ENDPOINT_TIME_PER_OUTPUT_TOKEN,
            "Upstream models: TPOT of each endpoint's (replica's) answers, as they reached the gateway";
        attempts: Family<AttemptLabels, Counter> = Family::default(),
            names::ENDPOINT_ATTEMPTS,
            "Upstream models: attempts at each endpoint, by the fault that failed them (none: it answered); a request that failed over counts one per endpoint tried";
        state: Family<StateLabels, Gauge> = Family::default(),
            names::ENDPOINT_STATE,
            "Upstream models: 1 for each endpoint's routing state (up, ejected, readmitting, rate_limited), 0 for the others";
        drifting: Family<EndpointLabels, Gauge> = Family::default(),
            names::ENDPOINT_DRIFTING,
            "Upstream models: 1 while an endpoint's answers to the drift canary (greedy, seeded) differ from the majority of its peers', else 0";
        outstanding: Family<EndpointLabels, Gauge> = Family::default(),
            names::ENDPOINT_OUTSTANDING,
            "Upstream models: requests this gateway has in flight at each endpoint";
        scrape_failures: Family<EndpointLabels, Counter> = Family::default(),
            names::ENDPOINT_SCRAPE_FAILURES,
            "Upstream models with the engine_metrics policy: scrapes of each endpoint's own /metrics that failed or named no queue (its last figures then age; /stats gives their age)";
    }
}

#[derive(Debug, Clone)]
pub(super) struct EndpointMetrics {
    families: EndpointFamilies,
    /// The endpoints the last scrape saw, whose series exist.
    known: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<EndpointLabels>>>,
}

impl EndpointMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            families: EndpointFamilies::register(registry),
            known: Default::default(),
        }
    }

    /// One finished request: its figures under the endpoint that served it, and each
    /// attempt it made.
    pub(super) fn observe(&self, model: &str, r: &RequestRecord) {
        let f = &self.families;
        let Some(upstream) = &r.upstream else {
            return;
        };
        for attempt in &upstream.attempts {
            f.attempts
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
        // The replica's own figures, from its attempt's send to its first content and
        // between contents: a failover before it is not its doing.
        if let Some(ttft) = served.ttft_ms {
            f.ttft.get_or_create(&labels).observe(ttft / 1000.0);
        }
        if let Some(tpot) = served.tpot_ms {
            f.tpot.get_or_create(&labels).observe(tpot / 1000.0);
        }
    }

    /// Each endpoint's state and load now, as a scrape reads them.
    pub(super) fn refresh(&self, endpoints: &[(String, Vec<EndpointView>)]) {
        let f = &self.families;
        let now: std::collections::HashSet<EndpointLabels> = endpoints
            .iter()
            .flat_map(|(model, views)| {
                views.iter().map(|v| EndpointLabels {
                    model: model.clone(),
                    endpoint: v.endpoint.clone(),
                })
            })
            .collect();
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        for gone in known.difference(&now) {
            self.forget(gone);
        }
        *known = now;
        drop(known);
        for (model, views) in endpoints {
            for view in views {
                let labels = EndpointLabels {
                    model: model.clone(),
                    endpoint: view.endpoint.clone(),
                };
                // Series exist from the first scrape, so an alert over them sees 0s.
                drop(f.ttft.get_or_create(&labels));
                drop(f.tpot.get_or_create(&labels));
                f.drifting
                    .get_or_create(&labels)
                    .set(i64::from(view.canary.as_ref().is_some_and(|c| c.drifting)));
                f.outstanding
                    .get_or_create(&labels)
                    .set(i64::try_from(view.outstanding).unwrap_or(i64::MAX));
                let failures = f.scrape_failures.get_or_create(&labels);
                let counted = failures.get();
                if view.scrape_failures > counted {
                    failures.inc_by(view.scrape_failures - counted);
                }
                for state in EndpointState::ALL {
                    f.state
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

    /// Removes every series of an endpoint that left the fleet.
    fn forget(&self, gone: &EndpointLabels) {
        let f = &self.families;
        f.ttft.remove(gone);
        f.tpot.remove(gone);
        f.outstanding.remove(gone);
        f.drifting.remove(gone);
        f.scrape_failures.remove(gone);
        for state in EndpointState::ALL {
            f.state.remove(&StateLabels {
                model: gone.model.clone(),
                endpoint: gone.endpoint.clone(),
                state: state.as_str(),
            });
        }
        for error_type in
            std::iter::once(names::LABEL_NONE).chain(FaultKind::ALL.map(FaultKind::as_str))
        {
            f.attempts.remove(&AttemptLabels {
                model: gone.model.clone(),
                endpoint: gone.endpoint.clone(),
                error_type,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(endpoint: &str, state: &'static str) -> EndpointView {
        EndpointView {
            endpoint: endpoint.into(),
            state,
            reason: None,
            reachable: true,
            outstanding: 0,
            ttft_ms: None,
            tpot_ms: None,
            ejections: 0,
            back_in_secs: None,
            engine_waiting: None,
            engine_kv_cache: None,
            engine_metrics_age_secs: None,
            scrape_failures: 0,
            canary: None,
        }
    }

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
        text
    }

    #[test]
    fn a_replica_that_left_takes_its_series_with_it() {
        let mut registry = Registry::default();
        let metrics = EndpointMetrics::register(&mut registry);
        let fleet = |views| vec![("m".to_owned(), views)];
        metrics.refresh(&fleet(vec![
            view("http://10.0.0.1:8000/v1", "up"),
            view("http://10.0.0.2:8000/v1", "ejected"),
        ]));
        let before = exposition(&registry);
        assert!(before.contains(
            r#"endpoint_state{model="m",endpoint="http://10.0.0.2:8000/v1",state="ejected"} 1"#
        ));
        // The ejected pod is gone from the DNS name (a rollout): nothing of it is left
        // to alert on.
        metrics.refresh(&fleet(vec![view("http://10.0.0.1:8000/v1", "up")]));
        let after = exposition(&registry);
        assert!(!after.contains("10.0.0.2"), "{after}");
        assert!(after.contains(
            r#"endpoint_state{model="m",endpoint="http://10.0.0.1:8000/v1",state="up"} 1"#
        ));
    }
}

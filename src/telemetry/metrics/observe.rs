//! What writes the metrics: each finished request's record, the trace and
//! semantic-log pipelines as they work, and the point-in-time readings of each scrape.

use std::sync::atomic::Ordering;

use super::families::*;
use super::{names, Metrics, SemlogEvent, Snapshot, TraceReason};
use crate::quality::Quality;
use crate::record::RequestRecord;
use crate::telemetry::error_type;

impl Metrics {
    /// Counts one finished request. `exemplar` is the trace id to attach to its latency
    /// observations: pass it only when that trace is exported, so every exemplar links
    /// to a trace that exists.
    pub fn observe(&self, r: &RequestRecord, exemplar: Option<&str>) {
        let model = ModelLabel {
            model: if self.models.contains(&r.model) {
                r.model.clone()
            } else {
                names::MODEL_NONE.to_owned()
            },
        };
        self.count_request(&model, r);
        self.observe_latencies(&model, r, exemplar);
        self.endpoints.observe(&model.model, r);
        if let Some(q) = &r.quality {
            self.observe_quality(&model, q, r.usage.completion_tokens > 0);
        }
        self.count_quota(r);
    }

    /// A shadowed request's two sides, compared.
    pub fn observe_comparison(&self, c: &crate::shadow::compare::Comparison) {
        let f = &self.families;
        let pair = PairLabels {
            primary: c.primary.model.clone(),
            candidate: c.candidate.model.clone(),
        };
        f.shadow_compared
            .get_or_create(&PairOutcomeLabels {
                primary: pair.primary.clone(),
                candidate: pair.candidate.clone(),
                outcome: c.outcome(),
            })
            .inc();
        let Some(difference) = &c.difference else {
            return;
        };
        let seconds = |ms: f64| ms / 1000.0;
        for (family, delta) in [
            (&f.shadow_ttft_delta, c.delta(|s| s.ttft_ms)),
            (&f.shadow_tpot_delta, c.delta(|s| s.tpot_ms)),
            (&f.shadow_e2e_delta, c.delta(|s| Some(s.e2e_ms))),
        ] {
            if let Some(delta) = delta {
                family.get_or_create(&pair).observe(seconds(delta));
            }
        }
        f.shadow_edit_distance
            .get_or_create(&pair)
            .observe(difference.edit_distance);
    }

    /// A request picked for shadowing whose copy was not sent; `reason` is one of
    /// `crate::shadow::DROP_REASONS`.
    pub fn shadow_dropped(&self, primary: &str, candidate: &str, reason: &'static str) {
        self.dropped_copies(primary, candidate, reason).inc();
    }

    /// A shadow pair's counters, at zero, so that they show before the first request.
    pub fn shadow_pair(&self, primary: &str, candidate: &str) {
        for reason in crate::shadow::DROP_REASONS {
            drop(self.dropped_copies(primary, candidate, reason));
        }
    }

    fn dropped_copies(
        &self,
        primary: &str,
        candidate: &str,
        reason: &'static str,
    ) -> impl std::ops::Deref<Target = prometheus_client::metrics::counter::Counter> + '_ {
        self.families
            .shadow_dropped
            .get_or_create(&PairReasonLabels {
                primary: primary.to_owned(),
                candidate: candidate.to_owned(),
                reason,
            })
    }

    /// An answer's tokens counted against its key's quotas (a request that held some:
    /// its key has quotas), as `auth::QuotaCounter` counts them.
    fn count_quota(&self, r: &RequestRecord) {
        let (Some(_), Some(key)) = (&r.quota_hold, &r.api_key_id) else {
            return;
        };
        let tokens = r.quota_tokens();
        if tokens == 0 {
            return;
        }
        self.families
            .quota_tokens
            .get_or_create(&KeyLabel {
                api_key_id: key.clone(),
            })
            .inc_by(tokens);
    }

    /// The request by its outcome, and its tokens in and out.
    fn count_request(&self, model: &ModelLabel, r: &RequestRecord) {
        let f = &self.families;
        f.requests
            .get_or_create(&RequestLabels {
                model: model.model.clone(),
                status: r.status.as_str(),
                finish_reason: r
                    .finish_reason
                    .map_or(names::LABEL_NONE, |reason| reason.as_str()),
                error_type: error_type(r).unwrap_or(names::LABEL_NONE),
                traffic: if r.is_shadow_copy() {
                    names::TRAFFIC_SHADOW
                } else {
                    names::TRAFFIC_CLIENT
                },
            })
            .inc();
        f.prompt_tokens
            .get_or_create(model)
            .inc_by(u64::from(r.usage.prompt_tokens));
        f.generation_tokens
            .get_or_create(model)
            .inc_by(u64::from(r.usage.completion_tokens));
    }

    /// The request's latencies, in seconds; the exemplar goes with TTFT, TPOT and e2e.
    fn observe_latencies(&self, model: &ModelLabel, r: &RequestRecord, exemplar: Option<&str>) {
        let f = &self.families;
        let t = &r.timings;
        let exemplar = || {
            exemplar.map(|trace_id| TraceExemplar {
                trace_id: trace_id.to_owned(),
            })
        };
        if let Some(ttft) = t.ttft_ms {
            f.ttft
                .get_or_create(model)
                .observe(ttft / 1000.0, exemplar(), None);
        }
        if let Some(tpot) = t.tpot_ms {
            f.tpot
                .get_or_create(model)
                .observe(tpot / 1000.0, exemplar(), None);
        }
        f.e2e
            .get_or_create(model)
            .observe(t.e2e_ms / 1000.0, exemplar(), None);
        if let Some(upstream) = t.upstream_ttft_ms {
            f.upstream_ttft
                .get_or_create(model)
                .observe(upstream / 1000.0);
        }
        if let Some(queue) = t.queue_ms {
            f.queue.get_or_create(model).observe(queue / 1000.0);
        }
        let kinds = [
            (&f.answer_ttft, t.kinds.answer_ttft_ms),
            (&f.reasoning, t.kinds.reasoning_ms),
            (&f.tool_call_ttft, t.kinds.tool_call_ttft_ms),
            (&f.tool_calls_done, t.kinds.tool_calls_done_ms),
        ];
        for (family, ms) in kinds {
            if let Some(ms) = ms {
                family.get_or_create(model).observe(ms / 1000.0);
            }
        }
        f.overhead
            .get_or_create(model)
            .observe(t.overhead_ms / 1000.0);
        if !r.itl_gaps.is_empty() {
            let itl = f.itl.get_or_create(model);
            for gap in &r.itl_gaps {
                itl.observe(gap.as_secs_f64());
            }
        }
    }

    /// What the quality checks found in the answer; its repetition only when it has
    /// tokens (`answered`).
    fn observe_quality(&self, model: &ModelLabel, q: &Quality, answered: bool) {
        let f = &self.families;
        if answered {
            f.repetition.get_or_create(model).observe(q.repetition_rate);
            f.repetition_basis
                .get_or_create(&BasisLabels {
                    model: model.model.clone(),
                    basis: q.repetition_basis.as_str(),
                })
                .inc();
        }
        if let Some(mean) = q.mean_logprob {
            f.mean_logprob.get_or_create(model).observe(-mean);
        }
        if let Some(share) = q.low_confidence_share {
            f.low_confidence.get_or_create(model).observe(share);
        }
        if q.refusal {
            f.refusals.get_or_create(model).inc();
        }
        if q.degenerated {
            f.degenerations.get_or_create(model).inc();
        }
    }

    /// Counts a tail-sampling decision about one trace.
    pub fn trace_decided(&self, reason: TraceReason, kept: bool) {
        let f = &self.families;
        let family = if kept {
            &f.traces_sampled
        } else {
            &f.traces_dropped
        };
        family.get_or_create(&ReasonLabel::from(reason)).inc();
    }

    /// Counts a span dropped before its trace was decided.
    pub fn span_dropped(&self, reason: TraceReason) {
        self.families
            .trace_spans_dropped
            .get_or_create(&ReasonLabel::from(reason))
            .inc();
    }

    /// Counts `n` semantic-log documents to which `event` happened.
    pub fn semlog_count(&self, event: SemlogEvent, n: u64) {
        let f = &self.families;
        let counter = match event {
            SemlogEvent::Queued => &f.semlog_queued,
            SemlogEvent::Indexed => &f.semlog_indexed,
            SemlogEvent::Duplicate => &f.semlog_duplicates,
            SemlogEvent::Retried => &f.semlog_retried,
            SemlogEvent::DeadLettered => &f.semlog_dead_lettered,
            SemlogEvent::Deferred => &f.semlog_deferred,
        };
        counter.inc_by(n);
    }

    /// Counts NDJSON files the size cap deleted; `kind` is one of [`SEMLOG_FILE_KINDS`].
    pub fn semlog_files_deleted(&self, kind: &'static str, n: u64) {
        if n > 0 {
            self.families
                .semlog_files_deleted
                .get_or_create(&KindLabel { kind })
                .inc_by(n);
        }
    }

    /// Whether the shared state's Redis answers.
    pub fn state_up(&self, up: bool) {
        self.families
            .state_up
            .get_or_create(&BackendLabel { backend: "redis" })
            .set(i64::from(up));
    }

    /// The shared state's failure reasons, at zero, once it has a backend.
    pub fn state_reasons(&self, reasons: impl IntoIterator<Item = &'static str>) {
        for reason in reasons {
            drop(
                self.families
                    .state_failures
                    .get_or_create(&ReasonLabel { reason }),
            );
        }
    }

    /// Counts a call to the shared state that gave no answer; `reason` is a
    /// shared-state failure's (`timeout`, `error`).
    pub fn state_failure(&self, reason: &'static str) {
        self.families
            .state_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a lost document; `reason` is one of [`SEMLOG_DROP_REASONS`].
    pub fn semlog_dropped(&self, reason: &'static str) {
        self.families
            .semlog_dropped
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// The semantic log's own label values, at zero: the kinds its redaction knows and
    /// the steps of its set-up (the pipeline names them as it starts; the metrics take
    /// them as labels and know nothing of the pipeline).
    pub fn semlog_zero_series(
        &self,
        redaction_kinds: &[&'static str],
        setup_steps: &[&'static str],
    ) {
        let f = &self.families;
        for &kind in redaction_kinds {
            drop(f.semlog_redactions.get_or_create(&KindLabel { kind }));
        }
        for &step in setup_steps {
            drop(f.semlog_setup_problems.get_or_create(&StepLabel { step }));
        }
    }

    /// Counts `n` values of `kind` that one document's redaction replaced.
    pub fn semlog_redactions(&self, kind: &'static str, n: u32) {
        self.families
            .semlog_redactions
            .get_or_create(&KindLabel { kind })
            .inc_by(u64::from(n));
    }

    /// Counts a set-up step the cluster refused for good.
    pub fn semlog_setup_problem(&self, step: &'static str) {
        self.families
            .semlog_setup_problems
            .get_or_create(&StepLabel { step })
            .inc();
    }

    /// The cluster the set-up found (its product and version) and what it applied (the
    /// lifecycle, a data stream or not): one series.
    pub fn semlog_target(
        &self,
        product: &'static str,
        version: &str,
        lifecycle: &'static str,
        data_stream: bool,
    ) {
        let f = &self.families;
        f.semlog_target.clear();
        f.semlog_target
            .get_or_create(&TargetLabels {
                product,
                version: version.chars().take(32).collect(),
                lifecycle,
                data_stream: if data_stream { "true" } else { "false" },
            })
            .set(1);
    }

    pub fn semlog_ready(&self, ready: bool) {
        self.families.semlog_ready.set(i64::from(ready));
    }

    pub fn semlog_bulk_latency(&self, took: std::time::Duration) {
        self.families
            .semlog_bulk_latency
            .observe(took.as_secs_f64());
    }

    /// Copies point-in-time readings into the gauges.
    pub fn refresh(&self, s: &Snapshot) {
        let f = &self.families;
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        f.running.set(gauge(s.running as u64));
        f.waiting.set(gauge(s.waiting as u64));
        f.in_flight.set(gauge(s.in_flight as u64));
        if let Some(rss) = s.resident_memory_bytes {
            f.resident_memory.set(gauge(rss));
        }
        for gpu in &s.gpu_memory {
            let label = GpuLabel {
                gpu: gpu.index.to_string(),
            };
            f.gpu_memory.get_or_create(&label).set(gauge(gpu.used));
            f.gpu_memory_total
                .get_or_create(&label)
                .set(gauge(gpu.total));
        }
        // One series per model: a reload under another fingerprint replaces the old.
        let labels: Vec<ModelLabels> = s.models.iter().map(|m| ModelLabels::of(m)).collect();
        if labels.iter().any(|l| f.model_info.get(l).is_none()) {
            f.model_info.clear();
            for l in &labels {
                f.model_info.get_or_create(l).set(1);
            }
        }
        for (model, kv) in &s.kv_caches {
            f.kv_cache_usage
                .get_or_create(&ModelLabel {
                    model: model.clone(),
                })
                .set(kv.ratio());
        }
        self.endpoints.refresh(&s.endpoints);
        for (model, up) in &s.upstreams {
            f.upstream_up
                .get_or_create(&ModelLabel {
                    model: model.clone(),
                })
                .set(i64::from(*up));
        }
        f.semlog_queue_depth.set(gauge(s.semlog_queue_depth as u64));
        f.semlog_spooled_bytes.set(gauge(s.semlog_spooled_bytes));
        let seen = self
            .log_lines_dropped_seen
            .fetch_max(s.log_lines_dropped, Ordering::Relaxed);
        if s.log_lines_dropped > seen {
            f.log_lines_dropped.inc_by(s.log_lines_dropped - seen);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::KvCacheUse;
    use crate::telemetry::metrics::ExpositionFormat;

    #[test]
    fn the_kv_cache_gauge_is_the_share_of_positions_held_per_model() {
        let metrics = Metrics::for_models(&["local", "remote"], &["remote"]);
        let held = |used_tokens, capacity_tokens| KvCacheUse {
            used_tokens,
            capacity_tokens,
        };
        metrics.refresh(&Snapshot {
            kv_caches: vec![("local".into(), held(512, 4096))],
            ..Snapshot::default()
        });
        let text = metrics.encode(ExpositionFormat::Prometheus).expect("text");
        assert!(
            text.contains("llmgate_kv_cache_usage_ratio{model=\"local\"} 0.125"),
            "{text}"
        );
        // An upstream's cache is another process's: no series rather than a made-up 0.
        assert!(!text.contains("kv_cache_usage_ratio{model=\"remote\"}"));
        assert_eq!(held(9, 8).ratio(), 1.0, "capped at 1");
        assert_eq!(held(0, 0).ratio(), 0.0, "no capacity, nothing held");
    }
}

//! How the sink is doing, for the operator: `/ready`'s `semlog` (degraded and why, for
//! how long, documents queued and the oldest one's age, dead letters and drops since the
//! start), the `llmgate_semlog_ready` gauge (0 while degraded), and log lines that say
//! so without flooding: the first trouble at once, then at most one line per
//! [`LOG_EVERY`] with the counts since the last, and one when the sink recovers.
//!
//! Degraded never makes the gateway unready: documents wait in the spool, and a gateway
//! that stopped answering because its log sink is down would turn a logging problem
//! into an outage.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::telemetry::metrics::{Metrics, SemlogEvent};

/// Log lines about the same trouble are at least this far apart.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Why documents are not going out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    /// No answer: connection refused, DNS, TLS, timeout.
    Unreachable,
    /// A cluster block: `index.blocks.write`, `read_only_allow_delete` after the disk
    /// flood stage, a cluster-wide block.
    Blocked,
    /// 429: the cluster asks the gateway to slow down.
    Throttled,
    /// 5xx, or shards not available.
    Unavailable,
    /// The write index is closed.
    Closed,
    /// 401, 403 for the credentials, 404 for the index: fixed on the operator's side.
    Refused,
    /// The set-up (policy, templates) has not gone through yet.
    SetUp,
    /// The spool is full: new documents are dropped.
    SpoolFull,
    /// The cluster takes requests but refuses the documents themselves (a mapping or
    /// parsing conflict): they go to the dead-letter file, none is indexed.
    Rejected,
}

impl Trouble {
    /// What it means, for `/ready` (which needs no key): the cluster's own words, which
    /// may name users, roles and indices, stay in the log.
    pub fn describe(self) -> &'static str {
        match self {
            Trouble::Unreachable => "the cluster does not answer (connection, DNS, TLS or timeout)",
            Trouble::Blocked => "the index is blocked for writes (index.blocks.write, or the disk flood stage's read_only_allow_delete)",
            Trouble::Throttled => "the cluster asks the gateway to slow down (429)",
            Trouble::Unavailable => "the cluster fails (5xx or shards unavailable)",
            Trouble::Closed => "the write index is closed",
            Trouble::Refused => "the cluster refuses the gateway's credentials or privileges, or the index is missing",
            Trouble::SetUp => "the cluster has not been set up yet (it does not answer or asks to wait)",
            Trouble::SpoolFull => "the spool is full (semlog.spool_max_bytes): new documents are dropped",
            Trouble::Rejected => "the cluster refuses the documents themselves (a mapping or parsing conflict): they go to the dead-letter file, for llmgate semlog replay once it is fixed",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Trouble::Unreachable => "unreachable",
            Trouble::Blocked => "blocked",
            Trouble::Throttled => "throttled",
            Trouble::Unavailable => "unavailable",
            Trouble::Closed => "index_closed",
            Trouble::Refused => "refused",
            Trouble::SetUp => "set_up",
            Trouble::SpoolFull => "spool_full",
            Trouble::Rejected => "rejected",
        }
    }
}

/// The sink's health, shared by the indexer (which reports), the request path (spool
/// drops) and `/ready` (which reads).
#[derive(Debug)]
pub struct SinkHealth {
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The trouble now, and since when (the cluster's words go to the log only).
    trouble: Option<(Trouble, Instant)>,
    /// Since the start.
    dead_letters: u64,
    dropped: u64,
    retried: u64,
    /// Since the last log line about them (see [`LOG_EVERY`]).
    unlogged: Unlogged,
    last_line: Option<Instant>,
    /// When the oldest document still queued was made (ms since the epoch), as the
    /// indexer last read it.
    oldest_ms: Option<i64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Unlogged {
    retried: u64,
    dead_letters: u64,
    dropped: u64,
}

impl SinkHealth {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Mutex::default(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `documents` could not go out for `trouble` (`reason`: the cluster's words, short)
    /// and are retried: counted here for `/ready` and in `llmgate_semlog_retried_total`,
    /// one count for both.
    pub fn trouble(&self, trouble: Trouble, reason: &str, documents: usize) {
        self.metrics
            .semlog_count(SemlogEvent::Retried, documents as u64);
        let mut inner = self.lock();
        inner.retried += documents as u64;
        inner.unlogged.retried += documents as u64;
        // Since the first trouble: one that changes kind (timeouts between 429s) is the
        // same bad spell.
        let first = inner.trouble.is_none();
        let since = inner.trouble.map_or_else(Instant::now, |(_, since)| since);
        inner.trouble = Some((trouble, since));
        self.metrics.semlog_ready(false);
        if let Some(counts) = inner.take_line(first) {
            let for_s = since.elapsed().as_secs();
            drop(inner);
            tracing::warn!(
                trouble = trouble.as_str(),
                reason,
                for_s,
                retried = counts.retried,
                dead_lettered = counts.dead_letters,
                dropped = counts.dropped,
                "The semantic-log sink is degraded; documents wait in the spool and are retried."
            );
        }
    }

    /// A batch whose every document the cluster refused went to the dead-letter file:
    /// degraded until documents are indexed again (the dead letters are logged as they
    /// come, [`SinkHealth::dead_lettered`]).
    pub fn rejecting(&self) {
        let mut inner = self.lock();
        // The cluster answers now: what it does is refuse, whatever the spell began as.
        let since = inner.trouble.map_or_else(Instant::now, |(_, since)| since);
        inner.trouble = Some((Trouble::Rejected, since));
        self.metrics.semlog_ready(false);
    }

    /// A line for the counts no line has said yet, when one is due: called every
    /// [`LOG_EVERY`], so a dead letter or a drop after the last line is logged within
    /// that window, not at the next event, however long that takes.
    pub fn log_due(&self) {
        let mut inner = self.lock();
        let pending = inner.unlogged;
        if pending.dead_letters + pending.dropped + pending.retried == 0 {
            return;
        }
        let Some(counts) = inner.take_line(false) else {
            return;
        };
        let trouble = inner.trouble.map(|(t, _)| t.as_str());
        drop(inner);
        tracing::warn!(
            trouble,
            retried = counts.retried,
            dead_lettered = counts.dead_letters,
            dropped = counts.dropped,
            "Semantic-log documents were retried, dead-lettered or dropped since the last line."
        );
    }

    /// A batch went through with documents indexed (or already there): the trouble is
    /// over.
    pub fn delivered(&self) {
        let mut inner = self.lock();
        let Some((trouble, since)) = inner.trouble.take() else {
            // Counts no line has said yet (a dead letter soon after another line).
            let pending = inner.unlogged;
            if pending.dead_letters + pending.dropped > 0 {
                if let Some(counts) = inner.take_line(false) {
                    drop(inner);
                    tracing::warn!(
                        dead_lettered = counts.dead_letters,
                        dropped = counts.dropped,
                        "Semantic-log documents were dead-lettered or dropped since the last line."
                    );
                }
            }
            return;
        };
        // Under the lock, so a drop that degrades the sink again cannot be overwritten.
        self.metrics.semlog_ready(true);
        let counts = inner.take_line(true).unwrap_or_default();
        drop(inner);
        tracing::info!(
            trouble = trouble.as_str(),
            after_s = since.elapsed().as_secs(),
            retried = counts.retried,
            dead_lettered = counts.dead_letters,
            dropped = counts.dropped,
            "The semantic-log sink recovered."
        );
    }

    /// The cluster refused a document for good; it went to the dead-letter file.
    pub fn dead_lettered(&self, id: &str, status: u16, error_type: &str, reason: &str) {
        let mut inner = self.lock();
        inner.dead_letters += 1;
        inner.unlogged.dead_letters += 1;
        let Some(counts) = inner.take_line(false) else {
            return;
        };
        drop(inner);
        tracing::warn!(
            id,
            status,
            error_type,
            reason,
            dead_lettered = counts.dead_letters,
            "The cluster refused documents; they are in the dead-letter file (llmgate semlog replay sends them again)."
        );
    }

    /// A document was dropped on the request path (the spool was full or failed):
    /// counted in `llmgate_semlog_dropped_total{reason}` and here.
    pub fn dropped(&self, why: &'static str) {
        self.metrics.semlog_dropped(why);
        let mut inner = self.lock();
        inner.dropped += 1;
        inner.unlogged.dropped += 1;
        if why == "spool_full" && inner.trouble.is_none() {
            inner.trouble = Some((Trouble::SpoolFull, Instant::now()));
            self.metrics.semlog_ready(false);
        }
        let Some(counts) = inner.take_line(false) else {
            return;
        };
        drop(inner);
        tracing::error!(
            reason = why,
            dropped = counts.dropped,
            "Semantic-log documents were dropped: the spool could not take them."
        );
    }

    /// When the oldest queued document was made (ms since the epoch), or `None` when
    /// the spool is empty.
    pub fn oldest(&self, at_ms: Option<i64>) {
        self.lock().oldest_ms = at_ms;
    }

    /// The sink's part of `/ready`: `queued` documents are in the spool now.
    pub fn to_json(&self, queued: u64) -> Value {
        let inner = self.lock();
        let oldest_age_s = match (queued, inner.oldest_ms) {
            (0, _) | (_, None) => None,
            (_, Some(at)) => {
                let now = chrono::Utc::now().timestamp_millis();
                Some(((now - at).max(0) as f64 / 1000.0).round())
            }
        };
        let mut value = json!({
            "state": if inner.trouble.is_some() { "degraded" } else { "ok" },
            "queued": queued,
            "oldest_queued_age_s": oldest_age_s,
            "retried": inner.retried,
            "dead_letters": inner.dead_letters,
            "dropped": inner.dropped,
        });
        if let Some((trouble, since)) = &inner.trouble {
            value["problem"] = json!({
                "kind": trouble.as_str(),
                "reason": trouble.describe(),
                "for_s": since.elapsed().as_secs(),
            });
        }
        value
    }
}

fn due(last: Option<Instant>) -> bool {
    last.is_none_or(|at| at.elapsed() >= LOG_EVERY)
}

impl Inner {
    /// The counts since the last line, when a line is due now or `now` says one is
    /// written anyway (the first trouble, a recovery); it then counts as written.
    fn take_line(&mut self, now: bool) -> Option<Unlogged> {
        if !now && !due(self.last_line) {
            return None;
        }
        self.last_line = Some(Instant::now());
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trouble_degrades_until_a_delivery_and_counts_since_the_start() {
        let health = SinkHealth::new(Arc::new(Metrics::for_models(&["m"], &[])));
        assert_eq!(health.to_json(0)["state"], "ok");
        health.trouble(
            Trouble::Blocked,
            "index [x] blocked by: [FORBIDDEN/8/index write (api)]",
            18,
        );
        health.trouble(Trouble::Blocked, "still blocked", 18);
        health.dead_lettered("a", 400, "document_parsing_exception", "failed to parse");
        health.oldest(Some(chrono::Utc::now().timestamp_millis() - 61_000));
        let json = health.to_json(18);
        assert_eq!(json["state"], "degraded");
        assert_eq!(json["problem"]["kind"], "blocked");
        // The cluster's words stay in the log: /ready needs no key.
        assert_eq!(json["problem"]["reason"], Trouble::Blocked.describe());
        assert_eq!(json["retried"], 36);
        assert_eq!(json["dead_letters"], 1);
        assert_eq!(json["queued"], 18);
        assert!(
            json["oldest_queued_age_s"].as_f64().unwrap() >= 61.0,
            "{json}"
        );
        health.delivered();
        let json = health.to_json(0);
        assert_eq!(json["state"], "ok");
        assert!(json.get("problem").is_none());
        assert!(json["oldest_queued_age_s"].is_null());
        assert_eq!(json["dead_letters"], 1, "counts are since the start");
        health.dropped("spool_full");
        assert_eq!(health.to_json(0)["problem"]["kind"], "spool_full");
    }
}

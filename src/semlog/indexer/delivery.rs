//! Delivering one batch to its destination: the look-up of documents that may already be
//! in the stream ([`held`]), the `_bulk` request, and what its answer leaves (indexed,
//! already there, to retry, dead-lettered, split). The loop around it, the spool and the
//! set-up are the indexer's ([`super`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{backoff, Destination, Indexer, Tally};
use crate::semlog::document::Encoded;
use crate::semlog::elasticsearch::{BulkResult, Cluster, Item};
use crate::semlog::files::{refusal_line, RotatingFile};
use crate::semlog::health::Trouble;
use crate::semlog::held::{self, Lookup};
use crate::telemetry::metrics::{Metrics, SemlogEvent};

/// How a delivery attempt ended.
pub(super) enum Delivery {
    Done,
    /// The cluster is unavailable: these documents were not delivered.
    Unavailable(Vec<Encoded>),
}

/// What a `_bulk` answer leaves of a batch.
enum Settled {
    /// Nothing more to send of it: indexed, dead-lettered, or split into the queue.
    Done,
    /// These documents to send again, not before `retry_after` where the cluster said.
    Retry {
        docs: Vec<Encoded>,
        retry_after: Option<Duration>,
    },
}

impl Indexer {
    /// Delivers one batch, retrying what is worth retrying.
    pub(super) async fn deliver(
        &mut self,
        docs: Vec<Encoded>,
        rng: &mut rand_chacha::ChaCha8Rng,
    ) -> Delivery {
        self.tally = Tally::default();
        let cluster = match &mut self.destination {
            Destination::Files(files) => return write_files(files, &self.metrics, docs),
            Destination::Elasticsearch(cluster) => Arc::clone(cluster),
        };
        // Batches still to send; a 413 splits one into two.
        let mut queue = vec![docs];
        let mut undelivered = Vec::new();
        while let Some(pending) = queue.pop() {
            if undelivered.is_empty() {
                undelivered = self.send_batch(&cluster, pending, &mut queue, rng).await;
            } else {
                // The cluster is unavailable: the other pieces wait with the first.
                undelivered.extend(pending);
            }
        }
        if undelivered.is_empty() {
            Delivery::Done
        } else {
            Delivery::Unavailable(undelivered)
        }
    }

    /// Sends one batch until every document is settled or the attempts run out; returns
    /// the documents left undelivered. The halves of a batch too large go to `queue`.
    async fn send_batch(
        &mut self,
        cluster: &Cluster,
        mut pending: Vec<Encoded>,
        queue: &mut Vec<Vec<Encoded>>,
        rng: &mut rand_chacha::ChaCha8Rng,
    ) -> Vec<Encoded> {
        let mut attempt = 0;
        loop {
            // Documents that may already be in the stream wait while it cannot say.
            let (send, mut left) = self.without_held(cluster, pending).await;
            let mut retry_after = None;
            if !send.is_empty() {
                let result = self.bulk(cluster, &send).await;
                if let Settled::Retry {
                    docs,
                    retry_after: after,
                } = self.settle(send, result, queue)
                {
                    left.extend(docs);
                    retry_after = after;
                }
            }
            if left.is_empty() {
                return Vec::new();
            }
            pending = left;
            attempt += 1;
            if attempt >= self.pacing.attempts || self.shutdown.is_cancelled() {
                return pending;
            }
            let wait = backoff(&self.pacing, attempt, retry_after, rng);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.shutdown.cancelled() => {}
            }
        }
    }

    /// `pending` split into what to send now and what waits: the documents that may
    /// already be in the stream ([`Unsure`]) are looked up first, and those it holds
    /// are counted as already indexed and not sent; while it cannot say, they wait
    /// (the trouble told to [`SinkHealth`]), the others go on. After
    /// [`held::LOOKUP_TRIES`] failed look-ups in a row they are sent unchecked.
    async fn without_held(
        &mut self,
        cluster: &Cluster,
        pending: Vec<Encoded>,
    ) -> (Vec<Encoded>, Vec<Encoded>) {
        let (mut look, mut send) = self.unsure.split(pending);
        if look.is_empty() {
            return (send, Vec::new());
        }
        let refresh = self.unsure.refresh_due();
        let lookup = held::held(cluster, &look, refresh);
        // Bounded like a bulk request: the drain at shutdown does not wait on it.
        let answer = if self.shutdown.is_cancelled() {
            tokio::time::timeout(DRAIN_BULK_TIMEOUT, lookup)
                .await
                .unwrap_or_else(|_| {
                    Err((
                        Trouble::Unreachable,
                        "no answer while the gateway stops".into(),
                    ))
                })
        } else {
            tokio::select! {
                answer = lookup => answer,
                () = self.shutdown.cancelled() => Err((Trouble::Unreachable, "the gateway is stopping".into())),
            }
        };
        match answer {
            Ok(Lookup::NotSearchable(reason)) => {
                self.unsure.settled(&look);
                if self.unsure.not_searchable() {
                    tracing::warn!(
                        reason,
                        "The gateway cannot search the data stream (grant its user read on logs-llmgate.requests-*): documents sent before without an answer are sent again unchecked, and one indexed before a rollover may be stored twice."
                    );
                }
                send.append(&mut look);
            }
            Ok(Lookup::Held(found)) => {
                self.unsure.lookup_answered();
                self.unsure.settled(&look);
                let before = look.len();
                look.retain(|doc| !found.contains(&doc.id));
                let already = before - look.len();
                self.tally.taken += already as u64;
                if already > 0 {
                    tracing::info!(
                        already,
                        "Documents sent before without an answer were already in the data stream; not sent again."
                    );
                    self.metrics
                        .semlog_count(SemlogEvent::Duplicate, already as u64);
                }
                send.append(&mut look);
            }
            Err((trouble, reason)) if self.unsure.lookup_failed() => {
                tracing::warn!(
                    trouble = trouble.as_str(),
                    reason,
                    documents = look.len(),
                    "The data stream has not said which documents it holds, {} times in a row; they are sent unchecked (one indexed before a rollover may be stored twice).",
                    held::LOOKUP_TRIES
                );
                self.unsure.settled(&look);
                send.append(&mut look);
            }
            Err((trouble, reason)) => {
                if !self.shutdown.is_cancelled() {
                    self.health.trouble(trouble, &reason, look.len());
                }
                return (send, look);
            }
        }
        (send, Vec::new())
    }

    /// One `_bulk` of `docs`, timed; while the gateway stops, one bounded try.
    async fn bulk(&self, cluster: &Cluster, docs: &[Encoded]) -> BulkResult {
        let started = Instant::now();
        let result = if self.shutdown.is_cancelled() {
            // Draining at shutdown: one bounded try.
            tokio::time::timeout(DRAIN_BULK_TIMEOUT, cluster.bulk(docs))
                .await
                .unwrap_or_else(|_| BulkResult::RetryAll {
                    trouble: Trouble::Unreachable,
                    reason: "no answer while the gateway stops".into(),
                    retry_after: None,
                })
        } else {
            tokio::select! {
                r = cluster.bulk(docs) => r,
                () = self.shutdown.cancelled() => BulkResult::RetryAll {
                    trouble: Trouble::Unreachable,
                    reason: "the gateway is stopping".into(),
                    retry_after: None,
                },
            }
        };
        self.metrics.semlog_bulk_latency(started.elapsed());
        result
    }

    /// Acts on the cluster's answer to a `_bulk` of `pending`: counts what it took,
    /// dead-letters what it refused, splits a batch too large into `queue`, and says
    /// what is left to send again.
    fn settle(
        &mut self,
        mut pending: Vec<Encoded>,
        result: BulkResult,
        queue: &mut Vec<Vec<Encoded>>,
    ) -> Settled {
        match result {
            BulkResult::Items(items) => {
                self.unsure.write_answered();
                self.settle_items(pending, items)
            }
            BulkResult::RetryAll {
                trouble,
                reason,
                retry_after,
            } => {
                if !self.shutdown.is_cancelled() {
                    self.health.trouble(trouble, &reason, pending.len());
                }
                // No answer per document: the cluster may have taken some or all.
                self.unsure.unanswered(&pending);
                Settled::Retry {
                    docs: pending,
                    retry_after,
                }
            }
            BulkResult::Split if pending.len() > 1 => {
                let second = pending.split_off(pending.len() / 2);
                queue.push(second);
                queue.push(pending);
                Settled::Done
            }
            BulkResult::Split => {
                self.dead_letter(
                    &pending[0],
                    413,
                    "request_entity_too_large",
                    "a single document is over the cluster's request size limit",
                );
                Settled::Done
            }
            BulkResult::RejectAll { status, reason } => {
                for doc in &pending {
                    self.dead_letter(doc, status, "bulk_request_rejected", &reason);
                }
                Settled::Done
            }
        }
    }

    /// Acts on a `_bulk` answer item by item; what is worth retrying is left to send.
    fn settle_items(&mut self, pending: Vec<Encoded>, items: Vec<Item>) -> Settled {
        let mut retry = Vec::new();
        let mut why = None;
        for (doc, item) in pending.into_iter().zip(items) {
            match item {
                Item::Indexed => {
                    self.tally.taken += 1;
                    self.metrics.semlog_count(SemlogEvent::Indexed, 1);
                }
                Item::Duplicate => {
                    self.tally.taken += 1;
                    self.metrics.semlog_count(SemlogEvent::Duplicate, 1);
                }
                Item::Retry { trouble, reason } => {
                    why.get_or_insert((trouble, reason));
                    retry.push(doc);
                }
                Item::Rejected {
                    status,
                    error_type,
                    reason,
                } => self.dead_letter(&doc, status, &error_type, &reason),
            }
        }
        let Some((trouble, reason)) = why else {
            return Settled::Done;
        };
        self.health.trouble(trouble, &reason, retry.len());
        Settled::Retry {
            docs: retry,
            retry_after: None,
        }
    }

    /// Writes a refused document to the dead-letter file as the `_bulk` pair it was sent
    /// as (so `llmgate semlog replay`, or `curl --data-binary @file .../_bulk`, can send
    /// it again once the mapping is fixed) and the cluster's reason to the refusals file.
    fn dead_letter(&mut self, doc: &Encoded, status: u16, error_type: &str, reason: &str) {
        self.tally.refused += 1;
        self.health
            .dead_lettered(&doc.id, status, error_type, reason);
        self.metrics.semlog_count(SemlogEvent::DeadLettered, 1);
        if let Err(error) = self.dead_letter.write(&doc.lines) {
            tracing::error!(error = %error, "Could not write the dead-letter file.");
            self.metrics.semlog_dropped("dead_letter_error");
        }
        if let Err(error) = self
            .refusals
            .write(&refusal_line(doc, status, error_type, reason))
        {
            tracing::error!(error = %error, "Could not write the refusals file.");
        }
        self.metrics
            .semlog_files_deleted("dead_letter", self.dead_letter.take_deleted());
        self.refusals.take_deleted();
    }
}

/// How long one bulk request may take while the gateway stops.
pub(super) const DRAIN_BULK_TIMEOUT: Duration = Duration::from_secs(5);

/// Appends a batch to the NDJSON files; where a write fails, the rest is left undelivered.
fn write_files(files: &mut RotatingFile, metrics: &Metrics, mut docs: Vec<Encoded>) -> Delivery {
    for (i, doc) in docs.iter().enumerate() {
        if let Err(error) = files.write(&doc.lines) {
            tracing::error!(error = %error, "Could not write a semantic log file; the rest of the batch is spooled.");
            metrics.semlog_count(SemlogEvent::Indexed, i as u64);
            return Delivery::Unavailable(docs.split_off(i));
        }
    }
    metrics.semlog_count(SemlogEvent::Indexed, docs.len() as u64);
    metrics.semlog_files_deleted("requests", files.take_deleted());
    Delivery::Done
}

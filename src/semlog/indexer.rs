//! The indexer task: drains the queue in batches (by count, bytes and age), delivers
//! them, and keeps every document it cannot deliver now in the spool.
//!
//! - Elasticsearch: the policy and templates are set up first (retried until the
//!   cluster answers; no document is sent before, or the data stream would be created
//!   from the built-in `logs` template). Each batch is one `_bulk`; items answered 429
//!   or 5xx are retried alone with exponential backoff and full jitter (`Retry-After`
//!   honoured for whole-request answers), 409s are counted as already indexed, other
//!   4xx go to the dead-letter file, 413 splits the batch. A whole-request failure
//!   (connection refused, timeout, 429, 5xx) retries the batch a few times, then spools
//!   it; the spool is replayed, oldest first, before anything newer is sent.
//! - Files: batches are appended to rotating NDJSON files.
//!
//! On shutdown the queue is drained: delivered if the cluster answers at once, spooled
//! otherwise.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand_chacha::rand_core::{RngCore, SeedableRng};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::document::Encoded;
use super::elasticsearch::{BulkResult, Cluster, Item};
use super::files::{dead_letter_line, RotatingFile};
use super::spool::Spool;
use crate::telemetry::metrics::{Metrics, SemlogEvent};

/// Where batches go.
pub enum Destination {
    Elasticsearch(Arc<Cluster>),
    Files(RotatingFile),
}

/// Batch limits and retry pacing.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    pub batch_docs: usize,
    pub batch_bytes: usize,
    pub batch_age: Duration,
    /// First backoff; doubled per attempt up to `max_backoff`, then jittered.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    /// Attempts of a batch (whole-request failures) or of an item (429/5xx) before its
    /// documents are spooled and the cluster is treated as unavailable.
    pub attempts: u32,
}

pub struct Indexer {
    pub rx: mpsc::Receiver<Encoded>,
    pub destination: Destination,
    pub spool: Arc<Spool>,
    pub dead_letter: RotatingFile,
    pub pacing: Pacing,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    /// The Elasticsearch set-up succeeded (always true for files): until then nothing
    /// is sent, or the data stream would be created from the built-in template.
    pub ready: bool,
}

/// How a delivery attempt ended.
enum Delivery {
    Done,
    /// The cluster is unavailable: these documents were not delivered.
    Unavailable(Vec<Encoded>),
}

impl Indexer {
    pub async fn run(mut self) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64),
        );
        self.set_up(&mut rng).await;
        let mut failures = 0u32;
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            // The spool first: it holds the oldest documents.
            if !self.spool.is_empty() {
                match self
                    .spool
                    .peek(self.pacing.batch_docs, self.pacing.batch_bytes)
                {
                    Ok(batch) => {
                        let sent = batch.docs.len();
                        let delivery = if sent == 0 {
                            // Only a torn tail or a missing file: step over it.
                            Delivery::Done
                        } else {
                            self.deliver(batch.docs, &mut rng).await
                        };
                        match delivery {
                            Delivery::Done => {
                                failures = 0;
                                self.ack(batch.end);
                            }
                            Delivery::Unavailable(rest) if rest.len() < sent => {
                                // Part of the batch went through (indexed or dead-lettered):
                                // keep only the rest, behind the newer documents, so the
                                // delivered ones are not sent again.
                                if rest.iter().all(|doc| self.spool.append(doc).is_ok()) {
                                    self.ack(batch.end);
                                }
                                failures += 1;
                                self.wait_spooling(backoff(&self.pacing, failures, None, &mut rng))
                                    .await;
                            }
                            Delivery::Unavailable(_) => {
                                // Still in the spool; wait, moving new arrivals there too.
                                failures += 1;
                                self.wait_spooling(backoff(&self.pacing, failures, None, &mut rng))
                                    .await;
                            }
                        }
                        continue;
                    }
                    Err(error) => {
                        tracing::error!(error = %error, "Could not read the spool.");
                        self.wait_spooling(self.pacing.max_backoff).await;
                        continue;
                    }
                }
            }
            let Some(batch) = self.gather().await else {
                break;
            };
            if let Delivery::Unavailable(rest) = self.deliver(batch, &mut rng).await {
                self.spool_all(&rest);
                failures += 1;
                self.wait_spooling(backoff(&self.pacing, failures, None, &mut rng))
                    .await;
            } else {
                failures = 0;
            }
        }
        self.drain_on_shutdown(&mut rng).await;
    }

    fn ack(&self, end: super::spool::Position) {
        if let Err(error) = self.spool.ack(end) {
            tracing::error!(error = %error, "Could not advance the spool cursor.");
        }
    }

    /// Creates the Elasticsearch policy and templates, retrying until it works (or the
    /// gateway stops); meanwhile arriving documents go to the spool.
    async fn set_up(&mut self, rng: &mut rand_chacha::ChaCha8Rng) {
        let Destination::Elasticsearch(cluster) = &self.destination else {
            self.ready = true;
            self.metrics.semlog_ready(true);
            return;
        };
        let cluster = Arc::clone(cluster);
        let mut attempt = 0;
        loop {
            let result = tokio::select! {
                r = cluster.set_up() => r,
                () = self.shutdown.cancelled() => return,
            };
            match result {
                Ok(()) => {
                    tracing::info!("Elasticsearch is set up for the semantic log.");
                    self.ready = true;
                    self.metrics.semlog_ready(true);
                    return;
                }
                Err(error) => {
                    attempt += 1;
                    tracing::warn!(error = %error, attempt, "Could not set up Elasticsearch; documents wait in the spool.");
                    let wait = backoff(&self.pacing, attempt, None, rng);
                    if !self.wait_spooling(wait).await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits for a batch: up to `batch_docs` documents or `batch_bytes`, or whatever came
    /// within `batch_age` of the first. `None` when the gateway is stopping.
    async fn gather(&mut self) -> Option<Vec<Encoded>> {
        let first = tokio::select! {
            doc = self.rx.recv() => doc?,
            () = self.shutdown.cancelled() => return None,
        };
        let mut bytes = first.lines.len();
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + self.pacing.batch_age;
        while batch.len() < self.pacing.batch_docs && bytes < self.pacing.batch_bytes {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(doc)) => {
                    bytes += doc.lines.len();
                    batch.push(doc);
                }
                Ok(None) | Err(_) => break,
            }
        }
        Some(batch)
    }

    /// Delivers one batch, retrying what is worth retrying.
    async fn deliver(&mut self, docs: Vec<Encoded>, rng: &mut rand_chacha::ChaCha8Rng) -> Delivery {
        let cluster = match &mut self.destination {
            Destination::Files(files) => {
                let mut docs = docs;
                for (i, doc) in docs.iter().enumerate() {
                    if let Err(error) = files.write(&doc.lines) {
                        tracing::error!(error = %error, "Could not write a semantic log file; the rest of the batch is spooled.");
                        self.metrics.semlog_count(SemlogEvent::Indexed, i as u64);
                        return Delivery::Unavailable(docs.split_off(i));
                    }
                }
                self.metrics
                    .semlog_count(SemlogEvent::Indexed, docs.len() as u64);
                return Delivery::Done;
            }
            Destination::Elasticsearch(cluster) => Arc::clone(cluster),
        };
        // Batches still to send; a 413 splits one into two.
        let mut queue = vec![docs];
        let mut undelivered = Vec::new();
        while let Some(mut pending) = queue.pop() {
            if !undelivered.is_empty() {
                // The cluster is unavailable: the other pieces wait with the first.
                undelivered.extend(pending);
                continue;
            }
            let mut attempt = 0;
            loop {
                let started = Instant::now();
                let result = if self.shutdown.is_cancelled() {
                    // Draining at shutdown: one bounded try.
                    tokio::time::timeout(DRAIN_BULK_TIMEOUT, cluster.bulk(&pending))
                        .await
                        .unwrap_or_else(|_| BulkResult::RetryAll {
                            reason: "no answer while the gateway stops".into(),
                            retry_after: None,
                        })
                } else {
                    tokio::select! {
                        r = cluster.bulk(&pending) => r,
                        () = self.shutdown.cancelled() => BulkResult::RetryAll {
                            reason: "the gateway is stopping".into(),
                            retry_after: None,
                        },
                    }
                };
                self.metrics.semlog_bulk_latency(started.elapsed());
                let retry_after = match result {
                    BulkResult::Items(items) => {
                        let mut retry = Vec::new();
                        for (doc, item) in pending.into_iter().zip(items) {
                            match item {
                                Item::Indexed => self.metrics.semlog_count(SemlogEvent::Indexed, 1),
                                Item::Duplicate => {
                                    self.metrics.semlog_count(SemlogEvent::Duplicate, 1)
                                }
                                Item::Retry => retry.push(doc),
                                Item::Rejected {
                                    status,
                                    error_type,
                                    reason,
                                } => self.dead_letter(&doc, status, &error_type, &reason),
                            }
                        }
                        if retry.is_empty() {
                            break;
                        }
                        self.metrics
                            .semlog_count(SemlogEvent::Retried, retry.len() as u64);
                        pending = retry;
                        None
                    }
                    BulkResult::RetryAll {
                        reason,
                        retry_after,
                    } => {
                        tracing::warn!(reason = %reason, documents = pending.len(), attempt, "A bulk request failed as a whole.");
                        retry_after
                    }
                    BulkResult::Split if pending.len() > 1 => {
                        let second = pending.split_off(pending.len() / 2);
                        queue.push(second);
                        queue.push(pending);
                        break;
                    }
                    BulkResult::Split => {
                        let doc = &pending[0];
                        self.dead_letter(
                            doc,
                            413,
                            "request_entity_too_large",
                            "a single document is over the cluster's request size limit",
                        );
                        break;
                    }
                    BulkResult::RejectAll { status, reason } => {
                        for doc in &pending {
                            self.dead_letter(doc, status, "bulk_request_rejected", &reason);
                        }
                        break;
                    }
                };
                attempt += 1;
                if attempt >= self.pacing.attempts || self.shutdown.is_cancelled() {
                    undelivered.extend(pending);
                    break;
                }
                let wait = backoff(&self.pacing, attempt, retry_after, rng);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = self.shutdown.cancelled() => {}
                }
            }
        }
        if undelivered.is_empty() {
            Delivery::Done
        } else {
            Delivery::Unavailable(undelivered)
        }
    }

    fn dead_letter(&mut self, doc: &Encoded, status: u16, error_type: &str, reason: &str) {
        tracing::warn!(id = %doc.id, status, error_type, reason, "Elasticsearch refused a document; it goes to the dead-letter file.");
        self.metrics.semlog_count(SemlogEvent::DeadLettered, 1);
        if let Err(error) = self
            .dead_letter
            .write(&dead_letter_line(doc, status, error_type, reason))
        {
            tracing::error!(error = %error, "Could not write the dead-letter file.");
            self.metrics.semlog_dropped("dead_letter_error");
        }
    }

    fn spool_all(&self, docs: &[Encoded]) {
        for doc in docs {
            spool_one(&self.spool, &self.metrics, doc);
        }
    }

    /// Waits `wait` (or until shutdown), moving arriving documents into the spool so the
    /// queue keeps room for the request path. `false` if the gateway is stopping.
    async fn wait_spooling(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return true,
                () = self.shutdown.cancelled() => return false,
                doc = self.rx.recv() => match doc {
                    Some(doc) => spool_one(&self.spool, &self.metrics, &doc),
                    None => return false,
                },
            }
        }
    }

    /// Shutdown: what is still queued is delivered if the cluster takes it at once (one
    /// bounded try per batch), spooled otherwise. Before the set-up has succeeded, or with
    /// older documents in the spool, everything goes to the spool.
    async fn drain_on_shutdown(&mut self, rng: &mut rand_chacha::ChaCha8Rng) {
        self.rx.close();
        let mut rest = Vec::new();
        while let Ok(doc) = self.rx.try_recv() {
            rest.push(doc);
        }
        if !self.ready || !self.spool.is_empty() {
            self.spool_all(&rest);
        } else {
            while !rest.is_empty() {
                let tail = rest.split_off(rest.len().min(self.pacing.batch_docs));
                let batch = std::mem::replace(&mut rest, tail);
                if let Delivery::Unavailable(undelivered) = self.deliver(batch, rng).await {
                    self.spool_all(&undelivered);
                    self.spool_all(&rest);
                    rest.clear();
                }
            }
        }
        if let Err(error) = self.spool.sync() {
            tracing::error!(error = %error, "Could not flush the spool.");
        }
        if let Destination::Files(files) = &mut self.destination {
            let _ = files.sync();
        }
        let _ = self.dead_letter.sync();
    }
}

/// How long one bulk request may take while the gateway stops.
const DRAIN_BULK_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes one document to the spool, counting it or its drop.
pub fn spool_one(spool: &Spool, metrics: &Metrics, doc: &Encoded) {
    match spool.append(doc) {
        Ok(()) => metrics.semlog_count(SemlogEvent::Spooled, 1),
        Err(super::spool::SpoolError::Full(_)) => metrics.semlog_dropped("spool_full"),
        Err(error) => {
            tracing::error!(error = %error, "Could not write to the spool; the document is lost.");
            metrics.semlog_dropped("spool_error");
        }
    }
}

/// Exponential backoff with full jitter, at least `retry_after` when the cluster said so.
fn backoff(
    pacing: &Pacing,
    attempt: u32,
    retry_after: Option<Duration>,
    rng: &mut rand_chacha::ChaCha8Rng,
) -> Duration {
    let cap = pacing
        .base_backoff
        .saturating_mul(1u32 << attempt.min(16))
        .min(pacing.max_backoff);
    let jittered = cap.mul_f64((rng.next_u32() as f64) / (u32::MAX as f64));
    jittered.max(retry_after.unwrap_or_default().min(pacing.max_backoff))
}

/// The dead-letter file's directory inside the data directory.
pub fn dead_letter_dir(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("dead-letter")
}

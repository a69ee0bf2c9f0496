//! The indexer task: reads the spool in batches (sent when `batch_docs` documents or
//! `batch_bytes` are waiting, or at most `batch_age` after it began waiting for them),
//! delivers them, and acknowledges what the destination took. Documents reach the spool on the request path, so the
//! indexer never holds one that is not also on disk.
//!
//! - Elasticsearch: the policy and templates are set up first (retried until the
//!   cluster answers; no document is sent before, or the data stream would be created
//!   from the built-in `logs` template). Each batch is one `_bulk`; what
//!   [`elasticsearch::decide`](super::elasticsearch::decide) calls a passing state of the
//!   cluster (a block, a closed index, 429, 5xx, credentials) is retried alone with
//!   exponential backoff and full jitter (`Retry-After` honoured for whole-request
//!   answers), then goes back to the spool and is tried again, however long it takes;
//!   409s are counted as already indexed; documents refused for what they are (mapping,
//!   parsing) go to the dead-letter file as `_bulk` NDJSON (`llmgate semlog replay`
//!   sends them again) with the cluster's reason beside them; 413 splits the batch. A
//!   whole-request failure retries the batch a few times, then leaves it in the spool
//!   and backs off. Every trouble and recovery goes to [`SinkHealth`]. Documents that
//!   may already be in the stream are looked up first ([`super::held`]). One batch's
//!   delivery is [`delivery`]'s.
//! - Files: batches are appended to rotating NDJSON files. A crash between that write
//!   and the acknowledgement writes those documents again at the next start (at least
//!   once; a reader can drop repeats by `event.id`).
//! - Every `fsync` the spool is made durable (see [`Spool::flush`]).
//!
//! On shutdown the spool is flushed first, then delivered for as long as the caller
//! allows; the rest waits for the next start.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::document::Encoded;
use super::elasticsearch::Cluster;
use super::files::RotatingFile;
use super::health::{SinkHealth, Trouble};
use super::held::Unsure;
use super::setup;
use super::spool::Spool;
use super::target::IndexLifecycle;
use crate::telemetry::metrics::{Metrics, SemlogEvent};

mod delivery;
use delivery::Delivery;

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
    /// documents are left in the spool and the cluster is treated as unavailable.
    pub attempts: u32,
}

pub struct Indexer {
    pub spool: Arc<Spool>,
    /// Woken by every append to the spool.
    pub arrived: Arc<Notify>,
    pub destination: Destination,
    /// Refused documents as `_bulk` pairs, and why each was refused (by `_id`).
    pub dead_letter: RotatingFile,
    pub refusals: RotatingFile,
    pub pacing: Pacing,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    /// The Elasticsearch set-up succeeded (always true for files): until then nothing
    /// is sent, or the data stream would be created from the built-in template.
    pub ready: bool,
    /// The retention `semlog.lifecycle` asks for, and how long.
    pub lifecycle: IndexLifecycle,
    pub retention_days: u32,
    /// Where the set-up's report goes, for `/ready`.
    pub status: super::SemlogStatus,
    pub health: Arc<SinkHealth>,
    /// Documents that may already be in the stream: looked up before they are sent
    /// again (see [`held`]).
    pub unsure: Unsure,
    /// What became of the batch being delivered.
    pub tally: Tally,
    /// Documents refused in a row, in batches of which none was taken.
    pub refused_in_a_row: u64,
}

/// What became of one batch's documents: taken (indexed, or already in the stream) or
/// refused for good (dead-lettered). A batch all refused leaves the sink degraded.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    taken: u64,
    refused: u64,
}

/// How sending one batch from the spool ended.
#[derive(Debug, PartialEq)]
enum Sent {
    /// Delivered (or dead-lettered) and acknowledged.
    All,
    /// The destination is unavailable; what was not delivered is still in the spool.
    Deferred,
    /// The spool could not be read.
    ReadError,
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
        while !self.shutdown.is_cancelled() {
            if self.spool.is_empty() {
                tokio::select! {
                    () = self.arrived.notified() => {}
                    () = self.shutdown.cancelled() => break,
                }
                continue;
            }
            self.gather().await;
            let wait = match self.send_from_spool(&mut rng).await {
                Sent::All => {
                    failures = 0;
                    continue;
                }
                Sent::Deferred => {
                    failures += 1;
                    backoff(&self.pacing, failures, None, &mut rng)
                }
                Sent::ReadError => self.pacing.max_backoff,
            };
            if !self.pause(wait).await {
                break;
            }
        }
        self.drain_on_shutdown(&mut rng).await;
    }

    /// Reads the oldest batch from the spool, delivers it, and acknowledges what went
    /// through.
    async fn send_from_spool(&mut self, rng: &mut rand_chacha::ChaCha8Rng) -> Sent {
        let batch = match self
            .spool
            .peek(self.pacing.batch_docs, self.pacing.batch_bytes)
        {
            Ok(batch) => batch,
            Err(error) => {
                tracing::error!(error = %error, "Could not read the spool.");
                return Sent::ReadError;
            }
        };
        let read = batch.docs.len();
        self.note_oldest(&batch.docs);
        if read == 0 {
            // Only a torn tail or a missing file: step over it.
            self.ack(batch.end, 0);
            return Sent::All;
        }
        match self.deliver(batch.docs, rng).await {
            Delivery::Done => {
                self.ack(batch.end, read);
                // The batch is through (to the cluster or to files): any trouble is over,
                // unless the cluster refused every document of it.
                if self.tally.refused > 0 && self.tally.taken == 0 {
                    // Every document of the batch refused: degraded once that is more
                    // than one document alone (a poison document is a dead letter, not
                    // a sink that takes none).
                    self.refused_in_a_row += self.tally.refused;
                    if self.refused_in_a_row > 1 {
                        self.health.rejecting();
                    }
                } else {
                    self.refused_in_a_row = 0;
                    self.health.delivered();
                }
                Sent::All
            }
            Delivery::Unavailable(rest) => {
                self.metrics
                    .semlog_count(SemlogEvent::Deferred, rest.len() as u64);
                // Part of the batch went through (indexed or dead-lettered): keep only
                // the rest, behind the newer documents, so the delivered ones are not
                // sent again. Otherwise the batch stays where it is.
                if rest.len() < read && rest.iter().all(|doc| self.spool.append(doc).is_ok()) {
                    self.ack(batch.end, read);
                }
                Sent::Deferred
            }
        }
    }

    /// Tells [`SinkHealth`] when the first of `docs` (the oldest in the spool) was made.
    fn note_oldest(&self, docs: &[Encoded]) {
        self.health
            .oldest(docs.first().and_then(Encoded::created_ms));
    }

    fn ack(&mut self, end: super::spool::Position, docs: usize) {
        if let Err(error) = self.spool.ack(end, docs) {
            tracing::error!(error = %error, "Could not advance the spool cursor.");
        }
        self.unsure.acknowledged(docs as u64);
        if self.spool.is_empty() {
            self.health.oldest(None);
        }
    }

    /// Waits `wait`; `false` if the gateway started stopping meanwhile.
    async fn pause(&self, wait: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(wait) => true,
            () = self.shutdown.cancelled() => false,
        }
    }

    /// Sets the cluster up for the semantic log (see [`setup`]), trying again while it
    /// cannot be reached or asks to wait (or until the gateway stops); meanwhile documents
    /// wait in the spool. What no retry fixes is named once and counted, and documents
    /// then go anyway: a retention policy or a template is never the reason no log is
    /// indexed.
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
                r = setup::run(&cluster, self.lifecycle, self.retention_days) => r,
                () = self.shutdown.cancelled() => return,
            };
            match result {
                Ok(report) => {
                    tracing::info!(
                        product = report.target.product.as_str(),
                        version = %report.target.version,
                        serverless = report.target.serverless,
                        lifecycle = report.lifecycle.as_str(),
                        data_stream = report.data_stream,
                        "{}",
                        report.describe(cluster.data_stream(), self.retention_days)
                    );
                    for problem in &report.problems {
                        tracing::error!(
                            step = problem.step,
                            reason = %problem.reason,
                            fix = %problem.fix,
                            "The cluster refused a step of the semantic log's set-up; documents are indexed anyway."
                        );
                        self.metrics.semlog_setup_problem(problem.step);
                    }
                    if report.lifecycle == IndexLifecycle::None {
                        tracing::warn!(
                            "The semantic log has no retention policy on this cluster: nothing is ever deleted (semlog.lifecycle)."
                        );
                    }
                    self.metrics.semlog_target(
                        report.target.product.as_str(),
                        &report.target.version,
                        report.lifecycle.as_str(),
                        report.data_stream,
                    );
                    self.status.set(report);
                    self.ready = true;
                    self.metrics.semlog_ready(true);
                    self.health.delivered();
                    return;
                }
                Err(error) => {
                    attempt += 1;
                    // Nothing was sent: no document counts as retried.
                    self.health.trouble(Trouble::SetUp, &error.to_string(), 0);
                    if let Ok(oldest) = self.spool.peek(1, usize::MAX) {
                        self.note_oldest(&oldest.docs);
                    }
                    let wait = backoff(&self.pacing, attempt, None, rng);
                    if !self.pause(wait).await {
                        return;
                    }
                }
            }
        }
    }

    /// Lets a batch fill: waits until `batch_docs` documents or `batch_bytes` are in the
    /// spool, or `batch_age` has passed, or the gateway stops.
    async fn gather(&self) {
        let deadline = tokio::time::Instant::now() + self.pacing.batch_age;
        while self.spool.pending_docs() < self.pacing.batch_docs as u64
            && self.spool.pending_bytes() < self.pacing.batch_bytes as u64
        {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                () = self.arrived.notified() => {}
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Shutdown: the spool is made durable, then delivered, oldest first, for as long
    /// as the caller's timeout allows (one bounded try per batch). Before the set-up has
    /// succeeded, or when the cluster does not answer, the rest waits for the next start.
    async fn drain_on_shutdown(&mut self, rng: &mut rand_chacha::ChaCha8Rng) {
        if let Err(error) = self.spool.flush() {
            tracing::error!(error = %error, "Could not flush the spool.");
        }
        while self.ready && !self.spool.is_empty() {
            if self.send_from_spool(rng).await != Sent::All {
                break;
            }
        }
        if let Destination::Files(files) = &mut self.destination {
            let _ = files.sync();
        }
        let _ = self.dead_letter.sync();
        let _ = self.refusals.sync();
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

//! Semantic logs: one redacted document per request, searchable in Kibana, without
//! storing personal data or secrets, and without losing a record when Elasticsearch is
//! slow, down or refusing documents.
//!
//! ```text
//! RequestRecord --RedactedLog::build (redact)--> RedactedLog --encode--> bulk pair
//!   --append--> spool (NDJSON segments on disk; fsync every semlog.fsync_ms)
//!   --indexer: read oldest first, deliver, acknowledge--> Elasticsearch _bulk
//!                                                         (or NDJSON files)
//! ```
//!
//! The spool is written before a document is counted queued: a crash of the process
//! loses no document of a finished request, and one of the machine loses at most the
//! last `fsync_ms` of them. The indexer only ever reads what is on disk.
//!
//! - [`redact`]: what counts as personal data or a secret, and the `Redacted` text type.
//! - [`document`]: the ECS document and its byte-exact bulk encoding.
//! - [`target`]: what kind of cluster it is (Elasticsearch 8/9, Serverless, OpenSearch)
//!   and what it accepts; [`setup`]: the set-up that fits it (retention, mappings, the
//!   data stream); [`elasticsearch`]: the client, `_bulk`, and bulk answers as data.
//! - [`indexer`]: batching, retries, dead letters; [`health`]: the sink's state for
//!   `/ready`, the gauge and the log; [`replay`]: `llmgate semlog replay`; [`held`]:
//!   documents that may already be in the stream, looked up before they are sent again,
//!   so that none is stored twice across a rollover.
//! - [`spool`], [`files`]: the on-disk parts.
//! - [`config`]: the `[semlog]` settings.
//!
//! A document is dropped only when the spool is full (or the disk fails), and counted
//! (`llmgate_semlog_dropped_total{reason}`).

pub mod config;
pub mod document;
pub mod elasticsearch;
pub mod files;
pub mod health;
pub mod held;
pub mod indexer;
/// Redaction is the crate's (`crate::redact`): the gateway's other ways out use it too.
pub use crate::redact;
pub mod replay;
pub mod setup;
pub mod spool;
pub mod target;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::record::{Backlog, RequestObserver, RequestRecord};
use crate::telemetry::metrics::{Metrics, SemlogEvent};
use config::SemlogConfig;
use document::{DocumentSettings, RedactedLog};
use indexer::{Destination, Indexer, Pacing};
use redact::{Mode, Redactor};
use spool::Spool;

/// Where the semantic log goes and how it is doing, for `/ready`: files, or a cluster
/// and what its set-up found (once it has run); the sink's [`health::SinkHealth`] and the
/// spool's depth.
#[derive(Debug, Clone, Default)]
pub struct SemlogStatus {
    /// Documents go to a cluster (else to files).
    cluster: bool,
    /// Its set-up's report, once the set-up has run.
    report: Arc<Mutex<Option<setup::SetupSummary>>>,
    /// `None` without a semantic log (tests of other parts).
    sink: Option<(Arc<health::SinkHealth>, Arc<Spool>)>,
}

impl SemlogStatus {
    /// Files, or a cluster whose set-up is yet to run.
    fn new(cluster: bool, health: Arc<health::SinkHealth>, spool: Arc<Spool>) -> Self {
        Self {
            cluster,
            report: Arc::default(),
            sink: Some((health, spool)),
        }
    }

    pub(crate) fn set(&self, report: setup::SetupSummary) {
        if let Ok(mut slot) = self.report.lock() {
            *slot = Some(report);
        }
    }

    /// `{"sink": "files"}`, or the cluster's kind, retention and set-up problems (each
    /// step and what to change; the cluster's own words stay in the log); then the
    /// sink's state: `ok` or `degraded` with the `problem`, documents `queued`, the
    /// oldest one's age, and what was retried, dead-lettered and dropped since the start.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = self.where_to();
        if let (Some((health, spool)), Some(object)) = (&self.sink, value.as_object_mut()) {
            if let serde_json::Value::Object(state) = health.to_json(spool.pending_docs()) {
                object.extend(state);
            }
        }
        value
    }

    fn where_to(&self) -> serde_json::Value {
        if !self.cluster {
            return serde_json::json!({"sink": "files"});
        }
        let report = self.report.lock().ok().and_then(|r| r.clone());
        match report {
            None => serde_json::json!({"sink": "elasticsearch", "set_up": false}),
            Some(r) => serde_json::json!({
                "sink": r.target.product.as_str(),
                "set_up": true,
                "version": r.target.version,
                "serverless": r.target.serverless,
                "lifecycle": r.lifecycle.as_str(),
                "data_stream": r.data_stream,
                "problems": r.problems.iter().map(|p| serde_json::json!({"step": p.step, "fix": p.fix})).collect::<Vec<_>>(),
            }),
        }
    }
}

/// The semantic-log pipeline: the request path's end of it (an observer that never
/// blocks) and the indexer task behind it.
pub struct Semlog {
    spool: Arc<Spool>,
    /// Wakes the indexer after an append.
    arrived: Arc<Notify>,
    redactor: Redactor,
    settings: DocumentSettings,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
    status: SemlogStatus,
    health: Arc<health::SinkHealth>,
    /// The last [`RECENT_DOCUMENTS`] documents and their requests' API key ids, newest
    /// last, for the live view (serialised only when it asks).
    recent: Mutex<std::collections::VecDeque<(Option<String>, Arc<RedactedLog>)>>,
}

/// Documents held for the live view: enough that one key's last 20 are still there
/// when other keys have sent many more.
pub const RECENT_DOCUMENTS: usize = 500;

impl std::fmt::Debug for Semlog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semlog")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Retry pacing of the indexer; tests shorten it.
pub const DEFAULT_PACING: Pacing = Pacing {
    batch_docs: 500,
    batch_bytes: 5 << 20,
    batch_age: Duration::from_secs(1),
    base_backoff: Duration::from_millis(200),
    max_backoff: Duration::from_secs(30),
    attempts: 4,
};

impl Semlog {
    /// Opens the spool and the files, builds the Elasticsearch client (if configured)
    /// and spawns the indexer on the current Tokio runtime.
    pub fn start(
        config: &SemlogConfig,
        metrics: Arc<Metrics>,
        retry: Pacing,
    ) -> Result<Self, String> {
        metrics.semlog_zero_series(&redact::Kind::ALL.map(redact::Kind::as_str), &setup::STEPS);
        // First what can fail, then the tasks.
        let redactor = Redactor::new(match &config.redaction_key {
            Some(key) => Mode::KeyedHash(key.expose().as_bytes().to_vec()),
            None => Mode::Placeholder,
        })
        .with_hash_key(hash_key(config)?.expose().as_bytes());
        let spool = Arc::new(open_spool(config)?);
        let settings = DocumentSettings {
            namespace: config.namespace.clone(),
            excerpt_chars: config.excerpt_chars,
            stats_only: config.stats_only,
        };
        let destination = destination(config)?;
        let dead_letter = beside_dead_letters(config, "dead-letter")?;
        let refusals = beside_dead_letters(config, "refusals")?;
        let arrived = Arc::new(Notify::new());
        let shutdown = CancellationToken::new();
        let health = Arc::new(health::SinkHealth::new(Arc::clone(&metrics)));
        let status = SemlogStatus::new(
            config.elasticsearch.is_some(),
            Arc::clone(&health),
            Arc::clone(&spool),
        );
        let indexer = Indexer {
            spool: Arc::clone(&spool),
            arrived: Arc::clone(&arrived),
            destination,
            dead_letter,
            refusals,
            pacing: Pacing {
                batch_docs: config.batch_docs,
                batch_bytes: config.batch_bytes,
                batch_age: config.batch_age,
                ..retry
            },
            metrics: Arc::clone(&metrics),
            shutdown: shutdown.clone(),
            ready: false,
            lifecycle: config.lifecycle,
            retention_days: config
                .elasticsearch
                .as_ref()
                .map_or(30, |es| es.retention_days),
            status: status.clone(),
            health: Arc::clone(&health),
            unsure: held::Unsure::at_start(spool.pending_docs()),
            tally: indexer::Tally::default(),
            refused_in_a_row: 0,
        };
        let task = tokio::spawn(indexer.run());
        if !config.fsync.is_zero() {
            tokio::spawn(flush_every(
                Arc::clone(&spool),
                config.fsync,
                shutdown.clone(),
            ));
        }
        tokio::spawn(log_every(Arc::clone(&health), shutdown.clone()));
        Ok(Self {
            spool,
            arrived,
            redactor,
            settings,
            metrics,
            shutdown,
            task: Mutex::new(Some(task)),
            status,
            health,
            recent: Mutex::default(),
        })
    }

    /// The key the documents' hashes are made with, for the request's log line.
    pub fn hash_key(&self) -> Option<redact::HashKey> {
        self.redactor.hash_key()
    }

    /// Where documents go and what the set-up found, for `/ready`.
    pub fn status(&self) -> SemlogStatus {
        self.status.clone()
    }

    /// Stops the indexer after it has flushed the spool and delivered what it could
    /// (waiting up to `timeout`).
    pub async fn shutdown(&self, timeout: Duration) {
        self.shutdown.cancel();
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                tracing::error!(
                    "The semantic-log indexer did not stop in time; queued documents may be lost."
                );
            }
        }
    }
}

/// The key of the semantic log's hashes (`llm.input_hash`, `llm.output_hash`,
/// `user.hash`): the redaction key where one is set (so gateways that share it share
/// their hashes), else the gateway's own in `<data_dir>/hash-key` ([`files::own_hash_key`]).
/// Held as a secret: scrubbed from any text from outside.
pub fn hash_key(config: &SemlogConfig) -> Result<crate::secret::Secret, String> {
    if let Some(key) = &config.redaction_key {
        return Ok(key.clone());
    }
    files::own_hash_key(&config.data_dir)
        .map(crate::secret::Secret::new)
        .map_err(|e| {
            format!(
                "the semantic log's hash key ({}): {e}",
                files::hash_key_path(&config.data_dir).display()
            )
        })
}

/// The spool under `data_dir`, sized and synced as configured.
fn open_spool(config: &SemlogConfig) -> Result<Spool, String> {
    let dir = &config.data_dir;
    Spool::open(
        &dir.join("spool"),
        config.spool_max_bytes,
        config.spool_segment_bytes,
        config.fsync.is_zero(),
    )
    .map_err(|e| format!("could not open the spool in {}: {e}", dir.display()))
}

/// Where the indexer sends documents: the configured cluster (with its CA certificate
/// read), or else the rotating NDJSON files under `data_dir`.
fn destination(config: &SemlogConfig) -> Result<Destination, String> {
    let Some(es) = &config.elasticsearch else {
        return files::RotatingFile::open(
            &config.data_dir.join("semlog"),
            "requests",
            config.file_max_bytes,
            config.files_max_bytes,
        )
        .map(Destination::Files)
        .map_err(|e| format!("could not open the semantic-log files: {e}"));
    };
    let mut es = es.clone();
    if let Some(path) = &es.ca_cert {
        es.ca_cert_pem =
            Some(std::fs::read(path).map_err(|e| {
                format!("could not read the CA certificate {}: {e}", path.display())
            })?);
    }
    let cluster = elasticsearch::Cluster::new(&es, config.data_stream())?;
    Ok(Destination::Elasticsearch(Arc::new(cluster)))
}

/// The files named `prefix` in the dead-letter directory: the dead letters (`_bulk`
/// pairs) and, beside them, why each was refused.
fn beside_dead_letters(
    config: &SemlogConfig,
    prefix: &'static str,
) -> Result<files::RotatingFile, String> {
    files::RotatingFile::open(
        &indexer::dead_letter_dir(&config.data_dir),
        prefix,
        config.file_max_bytes,
        config.files_max_bytes,
    )
    .map_err(|e| format!("could not open the {prefix} files: {e}"))
}

impl RequestObserver for Semlog {
    fn observe(&self, record: &RequestRecord) {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let doc = RedactedLog::build(
            record,
            id,
            record.received_at,
            &self.redactor,
            &self.settings,
        );
        for (kind, n) in doc.redactions().iter() {
            self.metrics.semlog_redactions(kind.as_str(), n);
        }
        let encoded = match doc.encode() {
            Ok(encoded) => encoded,
            Err(error) => {
                tracing::error!(error = %error, "Could not encode a semantic log.");
                self.metrics.semlog_dropped("encode_error");
                return;
            }
        };
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() == RECENT_DOCUMENTS {
                recent.pop_front();
            }
            recent.push_back((record.api_key_id.clone(), Arc::new(doc)));
        }
        match self.spool.append(&encoded) {
            Ok(()) => {
                self.metrics.semlog_count(SemlogEvent::Queued, 1);
                self.arrived.notify_one();
            }
            Err(spool::SpoolError::Full(_)) => self.health.dropped("spool_full"),
            Err(error) => {
                tracing::error!(error = %error, "Could not write to the spool; the document is lost.");
                self.health.dropped("spool_error");
            }
        }
    }

    fn recent_documents(
        &self,
        keep: &dyn Fn(Option<&str>) -> bool,
        most: usize,
    ) -> Vec<serde_json::Value> {
        let chosen: Vec<Arc<RedactedLog>> = {
            let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent
                .iter()
                .rev()
                .filter(|(key_id, _)| keep(key_id.as_deref()))
                .take(most)
                .map(|(_, doc)| Arc::clone(doc))
                .collect()
        };
        chosen
            .iter()
            .filter_map(|doc| serde_json::to_value(doc.as_ref()).ok())
            .collect()
    }

    fn backlog(&self) -> Backlog {
        Backlog {
            queued: usize::try_from(self.spool.pending_docs()).unwrap_or(usize::MAX),
            spooled_bytes: self.spool.pending_bytes(),
        }
    }
}

/// Logs the sink's counts no line has said yet (dead letters, drops, retries) once a
/// line is due ([`health::LOG_EVERY`] after the last), whatever the indexer is doing
/// (waiting for documents, backing off, setting up): each is in the log within that
/// window and a second. Looking costs a lock, once a second.
async fn log_every(health: Arc<health::SinkHealth>, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => health.log_due(),
            () = shutdown.cancelled() => {
                health.log_due();
                return;
            }
        }
    }
}

/// Makes the spool durable every `every` until the gateway stops (the indexer's drain
/// flushes it a last time). The fsync runs on the blocking pool.
async fn flush_every(spool: Arc<Spool>, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let spool = Arc::clone(&spool);
        match tokio::task::spawn_blocking(move || spool.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(error = %error, "Could not fsync the spool."),
            Err(error) => tracing::error!(error = %error, "The spool fsync task failed."),
        }
    }
}

//! Settings of the semantic-log pipeline: the `[semlog]` table of the TOML file, its
//! flags and `LLMGATE_*` variables, validated without I/O (reading the CA file happens
//! when the pipeline starts).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// `[semlog]`: the semantic-log settings, each a file key and, unless `#[arg(skip)]`
/// (file only), a flag of `llmgate serve` with its environment variable.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Semantic logs")]
pub struct SemlogTable {
    /// Directory for the NDJSON files, the spool and the dead-letter file [default: data].
    #[arg(long, env = "LLMGATE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Elasticsearch URL; without it (and without a Cloud id) documents go to files.
    #[arg(long, env = "LLMGATE_ES_URL")]
    pub es_url: Option<String>,
    /// Elastic Cloud id (instead of a URL).
    #[arg(long, env = "LLMGATE_ES_CLOUD_ID")]
    pub es_cloud_id: Option<String>,
    /// User for basic authentication.
    #[arg(long, env = "LLMGATE_ES_USERNAME")]
    pub es_username: Option<String>,
    /// Password for basic authentication.
    #[arg(long, env = "LLMGATE_ES_PASSWORD", hide_env_values = true)]
    pub es_password: Option<String>,
    /// File holding the password instead (a mounted Secret; white space around it
    /// ignored).
    #[arg(long, env = "LLMGATE_ES_PASSWORD_FILE")]
    pub es_password_file: Option<PathBuf>,
    /// Encoded API key (the `encoded` value Elasticsearch returns).
    #[arg(long, env = "LLMGATE_ES_API_KEY", hide_env_values = true)]
    pub es_api_key: Option<String>,
    /// File holding the encoded API key instead.
    #[arg(long, env = "LLMGATE_ES_API_KEY_FILE")]
    pub es_api_key_file: Option<PathBuf>,
    /// PEM file of the CA that signed the cluster's certificate.
    #[arg(long, env = "LLMGATE_ES_CA_CERT")]
    pub es_ca_cert: Option<PathBuf>,
    /// Seconds before a request to Elasticsearch times out [default: 30].
    #[arg(skip)]
    pub es_timeout_secs: Option<u64>,
    /// Namespace of the data stream logs-llmgate.requests-<namespace> [default: default].
    #[arg(long = "semlog-namespace", env = "LLMGATE_SEMLOG_NAMESPACE")]
    pub namespace: Option<String>,
    /// Days the lifecycle policy keeps documents [default: 30].
    #[arg(skip)]
    pub retention_days: Option<u32>,
    /// How old documents are deleted: auto (what the cluster has: ILM on Elasticsearch,
    /// the data stream lifecycle on Serverless, ISM on OpenSearch), ilm, data_stream,
    /// ism or none [default: auto].
    #[arg(
        long = "semlog-lifecycle",
        env = "LLMGATE_SEMLOG_LIFECYCLE",
        value_enum
    )]
    pub lifecycle: Option<super::target::IndexLifecycle>,
    /// Key of the keyed-hash redaction mode (equal values get equal tokens); off if unset.
    #[arg(long, env = "LLMGATE_REDACTION_KEY", hide_env_values = true)]
    pub redaction_key: Option<String>,
    /// File holding the redaction key instead.
    #[arg(long, env = "LLMGATE_REDACTION_KEY_FILE")]
    pub redaction_key_file: Option<PathBuf>,
    /// Characters of prompt and response kept in a document [default: 512].
    #[arg(skip)]
    pub excerpt_chars: Option<usize>,
    /// Stats only: documents keep no excerpt of prompt or answer at all, only counts,
    /// hashes and scores [default: false].
    #[arg(long = "semlog-stats-only", env = "LLMGATE_SEMLOG_STATS_ONLY")]
    pub stats_only: Option<bool>,
    /// Milliseconds between the spool's fsyncs; 0 syncs every document [default: 200].
    #[arg(long = "semlog-fsync-ms", env = "LLMGATE_SEMLOG_FSYNC_MS")]
    pub fsync_ms: Option<u64>,
    /// Documents per bulk request at most [default: 500].
    #[arg(skip)]
    pub batch_docs: Option<usize>,
    /// Bytes per bulk request at most [default: 5 MiB].
    #[arg(skip)]
    pub batch_bytes: Option<usize>,
    /// Milliseconds a document waits for its batch at most [default: 1000].
    #[arg(skip)]
    pub batch_age_ms: Option<u64>,
    /// Bytes of disk spool at most [default: 1 GiB].
    #[arg(skip)]
    pub spool_max_bytes: Option<u64>,
    /// Bytes per spool segment [default: 16 MiB].
    #[arg(skip)]
    pub spool_segment_bytes: Option<u64>,
    /// Size at which the NDJSON files rotate [default: 64 MiB].
    #[arg(skip)]
    pub file_max_bytes: Option<u64>,
    /// Bytes of NDJSON files kept, for the request files and the dead letters each; the
    /// oldest files are deleted first [default: 1 GiB].
    #[arg(skip)]
    pub files_max_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SemlogConfig {
    pub data_dir: PathBuf,
    /// `None`: documents go to rotating NDJSON files under `data_dir`.
    pub elasticsearch: Option<EsConfig>,
    pub namespace: String,
    /// The retention asked for (`auto`: what the cluster offers).
    pub lifecycle: super::target::IndexLifecycle,
    /// Keyed-hash redaction when set.
    pub redaction_key: Option<Secret>,
    /// Characters of prompt and response kept in a document, after redaction.
    pub excerpt_chars: usize,
    /// No excerpts at all (the privacy mode): counts, hashes and scores only.
    pub stats_only: bool,
    /// How often the spool is made durable (fsync); zero: after every document. A
    /// document is written to the spool before it is counted queued, so a process crash
    /// loses nothing; this bounds what a machine crash can lose.
    pub fsync: Duration,
    /// A bulk request is sent at this many documents...
    pub batch_docs: usize,
    /// ...or this many bytes...
    pub batch_bytes: usize,
    /// ...or when its oldest document has waited this long.
    pub batch_age: Duration,
    /// The spool refuses documents beyond this; they are dropped and counted.
    pub spool_max_bytes: u64,
    pub spool_segment_bytes: u64,
    /// The NDJSON files rotate at this size.
    pub file_max_bytes: u64,
    /// The request files, and the dead letters, each keep at most this many bytes.
    pub files_max_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EsConfig {
    pub url: Option<String>,
    pub cloud_id: Option<String>,
    pub auth: EsAuth,
    pub ca_cert: Option<PathBuf>,
    /// The CA file's contents, read when the pipeline starts.
    pub ca_cert_pem: Option<Vec<u8>>,
    pub timeout: Duration,
    pub retention_days: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EsAuth {
    None,
    Basic {
        username: String,
        password: Secret,
    },
    /// The base64 `id:api_key` pair, as Elasticsearch's create-API-key answer encodes it.
    ApiKey(Secret),
}

impl EsAuth {
    /// The authentication the settings give: none, a user and password, or an API key.
    fn of(
        username: Option<String>,
        password: Option<String>,
        api_key: Option<String>,
    ) -> Result<Self, (&'static str, String)> {
        match (username, password, api_key) {
            (None, None, None) => Ok(EsAuth::None),
            (None, None, Some(key)) => Ok(EsAuth::ApiKey(Secret::new(key))),
            (Some(username), Some(password), None) => {
                // The Basic header made of them, should a proxy's error quote it.
                crate::secret::hold_credentials(&username, &password);
                Ok(EsAuth::Basic {
                    username,
                    password: Secret::new(password),
                })
            }
            (Some(_), None, _) | (None, Some(_), _) => Err((
                "semlog.es_username",
                "basic authentication needs both es_username and es_password".into(),
            )),
            (Some(_), Some(_), Some(_)) => Err((
                "semlog.es_api_key",
                "set either an API key or a user and password, not both".into(),
            )),
        }
    }
}

impl SemlogConfig {
    /// The data stream the documents go to: `logs-llmgate.requests-<namespace>`.
    pub fn data_stream(&self) -> String {
        format!("logs-{}-{}", super::document::DATASET, self.namespace)
    }

    /// The table (flags and variables already laid over the file) over defaults.
    /// Errors name the setting.
    pub fn resolve(table: SemlogTable) -> Result<Self, (&'static str, String)> {
        // Taken apart, so that a setting added to the table and not used here is an error.
        let SemlogTable {
            data_dir,
            es_url: url,
            es_cloud_id: cloud_id,
            es_username: username,
            es_password: password,
            es_password_file,
            es_api_key: api_key,
            es_api_key_file,
            es_ca_cert,
            es_timeout_secs,
            namespace,
            retention_days,
            lifecycle,
            redaction_key,
            redaction_key_file,
            excerpt_chars,
            stats_only,
            fsync_ms,
            batch_docs,
            batch_bytes,
            batch_age_ms,
            spool_max_bytes,
            spool_segment_bytes,
            file_max_bytes,
            files_max_bytes,
        } = table;
        let password = value_or_file(
            ("semlog.es_password", "semlog.es_password_file"),
            password,
            es_password_file,
        )?;
        let api_key = value_or_file(
            ("semlog.es_api_key", "semlog.es_api_key_file"),
            api_key,
            es_api_key_file,
        )?;
        let redaction_key = value_or_file(
            ("semlog.redaction_key", "semlog.redaction_key_file"),
            redaction_key,
            redaction_key_file,
        )?;
        let auth = EsAuth::of(username, password, api_key)?;
        let elasticsearch = (url.is_some() || cloud_id.is_some()).then(|| EsConfig {
            url,
            cloud_id,
            auth: auth.clone(),
            ca_cert: es_ca_cert,
            ca_cert_pem: None,
            timeout: Duration::from_secs(es_timeout_secs.unwrap_or(30)),
            retention_days: retention_days.unwrap_or(30),
        });
        if elasticsearch.is_none() && auth != EsAuth::None {
            return Err((
                "semlog.es_url",
                "credentials are set but no Elasticsearch URL or Cloud id".into(),
            ));
        }
        let config = Self {
            data_dir: data_dir.unwrap_or_else(|| PathBuf::from("data")),
            elasticsearch,
            namespace: namespace.unwrap_or_else(|| "default".to_owned()),
            lifecycle: lifecycle.unwrap_or_default(),
            redaction_key: redaction_key.map(Secret::new),
            excerpt_chars: excerpt_chars.unwrap_or(512),
            stats_only: stats_only.unwrap_or(false),
            fsync: Duration::from_millis(fsync_ms.unwrap_or(200)),
            batch_docs: batch_docs.unwrap_or(500),
            batch_bytes: batch_bytes.unwrap_or(5 << 20),
            batch_age: Duration::from_millis(batch_age_ms.unwrap_or(1000)),
            spool_max_bytes: spool_max_bytes.unwrap_or(1 << 30),
            spool_segment_bytes: spool_segment_bytes.unwrap_or(16 << 20),
            file_max_bytes: file_max_bytes.unwrap_or(64 << 20),
            files_max_bytes: files_max_bytes.unwrap_or(1 << 30),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges; does no I/O.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        // Elasticsearch data stream names: lowercase, no '-' in the namespace part.
        let ns_ok = !self.namespace.is_empty()
            && self.namespace.len() <= 100
            && self
                .namespace
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
        if !ns_ok {
            return Err((
                "semlog.namespace",
                "must be lowercase letters, digits, '_' or '.' (no '-'), at most 100".into(),
            ));
        }
        if self
            .redaction_key
            .as_ref()
            .is_some_and(|k| k.expose().len() < 16)
        {
            return Err((
                "semlog.redaction_key",
                "must be at least 16 characters".into(),
            ));
        }
        let positive = [
            ("semlog.batch_docs", self.batch_docs as u64),
            ("semlog.batch_bytes", self.batch_bytes as u64),
            ("semlog.spool_segment_bytes", self.spool_segment_bytes),
            ("semlog.file_max_bytes", self.file_max_bytes),
            ("semlog.excerpt_chars", self.excerpt_chars as u64),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err((name, "must be at least 1".into()));
        }
        if self.fsync > Duration::from_secs(60) {
            return Err((
                "semlog.fsync_ms",
                "must be at most 60000 (a minute of documents a machine crash could lose)".into(),
            ));
        }
        if self.files_max_bytes < self.file_max_bytes {
            return Err((
                "semlog.files_max_bytes",
                "must be at least file_max_bytes".into(),
            ));
        }
        if self.spool_max_bytes < self.spool_segment_bytes {
            return Err((
                "semlog.spool_max_bytes",
                "must be at least spool_segment_bytes".into(),
            ));
        }
        Ok(())
    }
}

/// A secret given as itself or as the file that holds it, not both; an error names the
/// setting that was set (`name`, or `file_name` for the file).
fn value_or_file(
    (name, file_name): (&'static str, &'static str),
    value: Option<String>,
    file: Option<PathBuf>,
) -> Result<Option<String>, (&'static str, String)> {
    match (value, file) {
        (Some(_), Some(_)) => Err((name, format!("set {name} or {file_name}, not both"))),
        (None, Some(path)) => crate::secret::read_file(&path)
            .map(Some)
            .map_err(|m| (file_name, m)),
        (value, None) => Ok(value),
    }
}

//! Where and how to reach an upstream server: one `[[models]]` entry with
//! `engine = "upstream"`, as `config` resolves it. Owned here, where it is read.

use std::path::PathBuf;
use std::time::Duration;

use super::fleet::FleetConfig;
use crate::secret::Secret;

/// Where and how to reach an upstream server.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// Base URLs without a trailing slash, one per replica (at least one):
    /// `<url>/chat/completions` is the chat route.
    pub urls: Vec<String>,
    pub model: String,
    pub api_key: Option<Secret>,
    pub tokenizer: Option<PathBuf>,
    pub logprobs: bool,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub probe_interval: Duration,
    pub context_length: u32,
    pub check_model: bool,
    /// `max_tokens` or `max_completion_tokens`.
    pub max_tokens_param: String,
    /// How requests are spread over the replicas and failing ones taken out.
    pub fleet: FleetConfig,
}

//! Settings of traces and logs, as `config` resolves them from the `[telemetry]` and
//! `[logging]` tables; owned here, where they are read.

use std::time::Duration;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Trace sampling. The exporter itself is configured by the standard `OTEL_*`
/// environment variables (see `telemetry::trace`).
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Share of ordinary requests whose trace is exported; failed, cancelled and slow
    /// requests always are.
    pub trace_sample_ratio: f64,
    /// A request with a TTFT above this is slow: its trace is always exported.
    pub trace_slow_ttft: Duration,
    /// A request with an e2e latency above this is slow: its trace is always exported.
    pub trace_slow_e2e: Duration,
    /// Spans held while their request runs; beyond this, child spans are dropped.
    pub trace_max_held_spans: usize,
    /// Spans waiting for the exporter; beyond this, whole traces are dropped.
    pub trace_export_queue: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoggingConfig {
    pub format: LogFormat,
    /// A `tracing` filter directive, such as `info` or `llmgate=debug,info`.
    pub filter: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines for a terminal.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

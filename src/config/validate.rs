//! The checks of ranges and relations between settings, once they are merged: no I/O,
//! each failure a [`ConfigError`] naming the setting.

use std::time::Duration;

use super::{Config, ConfigError, QualityConfig, ServerConfig};
use crate::engine::config::EngineConfig;
use crate::telemetry::config::TelemetryConfig;

impl Config {
    /// Checks ranges and relations between settings; does no I/O.
    pub fn validate(&self) -> Result<(), ConfigError> {
        telemetry(&self.telemetry)?;
        server(&self.server)?;
        server_timeouts(&self.server)?;
        engine(&self.engine)?;
        quality(&self.quality)?;
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.logging.filter) {
            return Err(ConfigError::invalid("logging.filter", error.to_string()));
        }
        Ok(())
    }
}

/// `Ok` where `holds`; else the error that `setting` `must` be otherwise.
fn require(holds: bool, setting: &'static str, must: impl Into<String>) -> Result<(), ConfigError> {
    if holds {
        Ok(())
    } else {
        Err(ConfigError::invalid(setting, must))
    }
}

/// The `[telemetry]` settings: the trace sample ratio, thresholds and bounds.
fn telemetry(t: &TelemetryConfig) -> Result<(), ConfigError> {
    require(
        (0.0..=1.0).contains(&t.trace_sample_ratio),
        "telemetry.trace_sample_ratio",
        "must be between 0 and 1",
    )?;
    require(
        !t.trace_slow_ttft.is_zero(),
        "telemetry.trace_slow_ttft_ms",
        "must be at least 1 ms",
    )?;
    require(
        !t.trace_slow_e2e.is_zero(),
        "telemetry.trace_slow_e2e_ms",
        "must be at least 1 ms",
    )?;
    // A request's trace is 4 spans; a smaller bound would drop every one of them.
    require(
        t.trace_max_held_spans >= 16,
        "telemetry.trace_max_held_spans",
        "must be at least 16",
    )?;
    require(
        t.trace_export_queue >= 16,
        "telemetry.trace_export_queue",
        "must be at least 16",
    )
}

/// The `[server]` settings but its timeouts: keys and limits, listeners, sizes.
fn server(s: &ServerConfig) -> Result<(), ConfigError> {
    if s.api_keys_file.is_none() && !s.rate_limits.is_unlimited() {
        return Err(ConfigError::invalid(
            if s.rate_limits.requests_per_minute.is_some() {
                "server.rate_limit_rpm"
            } else {
                "server.rate_limit_tpm"
            },
            "limits are per API key: set server.api_keys_file too",
        ));
    }
    require(
        s.api_keys_file.is_some() || s.quotas.is_none(),
        if s.quotas.tokens_per_day.is_some() {
            "server.quota_daily_tokens"
        } else {
            "server.quota_monthly_tokens"
        },
        "quotas are per API key: set server.api_keys_file too",
    )?;
    require(
        s.metrics_listen
            .is_none_or(|m| m != s.listen && !s.also_listen.contains(&m)),
        "server.metrics_listen",
        "must differ from server.listen (leave it unset to serve /metrics there)",
    )?;
    let mut addresses: Vec<_> = std::iter::once(s.listen)
        .chain(s.also_listen.iter().copied())
        .collect();
    addresses.sort_unstable();
    require(
        addresses.windows(2).all(|w| w[0] != w[1]),
        "server.listen",
        "lists an address twice",
    )?;
    require(
        s.max_body_bytes >= 1024,
        "server.max_body_bytes",
        "must be at least 1024 bytes",
    )?;
    require(
        s.send_buffer_bytes == 0 || (4096..=(64 << 20)).contains(&s.send_buffer_bytes),
        "server.send_buffer_bytes",
        "must be 0 (the OS's size) or between 4096 and 67108864",
    )?;
    require(
        s.max_in_flight != 0,
        "server.max_in_flight",
        "must be at least 1",
    )
}

/// The `[server]` timeouts, each from 1 s to its own upper bound.
fn server_timeouts(s: &ServerConfig) -> Result<(), ConfigError> {
    let timeouts = [
        ("server.keepalive_secs", s.keepalive, 3600),
        (
            "server.stream_write_timeout_secs",
            s.stream_write_timeout,
            3600,
        ),
        ("server.body_timeout_secs", s.body_timeout, 3600),
        ("server.queue_timeout_secs", s.queue_timeout, 3600),
        ("server.request_timeout_secs", s.request_timeout, 86_400),
        ("server.shutdown_timeout_secs", s.shutdown_timeout, 3600),
    ];
    for (name, value, most) in timeouts {
        require(
            !value.is_zero() && value <= Duration::from_secs(most),
            name,
            format!("must be between 1 and {most} seconds"),
        )?;
    }
    Ok(())
}

/// The `[engine]` settings shared by the in-process models.
fn engine(e: &EngineConfig) -> Result<(), ConfigError> {
    require(
        !e.model_id.trim().is_empty(),
        "engine.model_id",
        "must not be empty",
    )?;
    require(
        e.max_batch_size != Some(0),
        "engine.max_batch_size",
        "must be at least 1",
    )?;
    require(
        (1..=64).contains(&e.replicas),
        "engine.replicas",
        "must be between 1 and 64",
    )?;
    require(
        e.threads <= 1024,
        "engine.threads",
        "must be between 0 (one per core) and 1024",
    )?;
    require(
        e.max_tokens_cap != 0,
        "engine.max_tokens_cap",
        "must be at least 1",
    )?;
    require(
        !e.default_max_tokens
            .is_some_and(|n| n == 0 || n > e.max_tokens_cap),
        "engine.default_max_tokens",
        format!(
            "must be between 1 and max_tokens_cap ({})",
            e.max_tokens_cap
        ),
    )
}

/// The `[quality]` settings: repetition n and the degeneration guard.
fn quality(q: &QualityConfig) -> Result<(), ConfigError> {
    let q = &q.settings;
    require(
        (1..=16).contains(&q.repetition_n),
        "quality.repetition_n",
        "must be between 1 and 16",
    )?;
    require(
        q.guard.window >= 2 * q.repetition_n,
        "quality.guard_window",
        format!(
            "must be at least twice repetition_n ({})",
            2 * q.repetition_n
        ),
    )?;
    require(
        q.guard.threshold > 0.0 && q.guard.threshold < 1.0,
        "quality.guard_threshold",
        "must be between 0 and 1, exclusive",
    )
}

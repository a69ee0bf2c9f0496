//! The checks of ranges and relations between settings, once they are merged: no I/O,
//! each failure a [`ConfigError`] naming the setting.

use std::time::Duration;

use super::{Config, ConfigError};

impl Config {
    /// Checks ranges and relations between settings; does no I/O.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.telemetry;
        if !(0.0..=1.0).contains(&t.trace_sample_ratio) {
            return Err(ConfigError::invalid(
                "telemetry.trace_sample_ratio",
                "must be between 0 and 1",
            ));
        }
        if t.trace_slow_ttft.is_zero() || t.trace_slow_e2e.is_zero() {
            return Err(ConfigError::invalid(
                if t.trace_slow_ttft.is_zero() {
                    "telemetry.trace_slow_ttft_ms"
                } else {
                    "telemetry.trace_slow_e2e_ms"
                },
                "must be at least 1 ms",
            ));
        }
        // A request's trace is 4 spans; a smaller bound would drop every one of them.
        if t.trace_max_held_spans < 16 || t.trace_export_queue < 16 {
            return Err(ConfigError::invalid(
                if t.trace_max_held_spans < 16 {
                    "telemetry.trace_max_held_spans"
                } else {
                    "telemetry.trace_export_queue"
                },
                "must be at least 16",
            ));
        }
        let s = &self.server;
        let e = &self.engine;
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
        if s.metrics_listen == Some(s.listen) {
            return Err(ConfigError::invalid(
                "server.metrics_listen",
                "must differ from server.listen (leave it unset to serve /metrics there)",
            ));
        }
        if s.max_body_bytes < 1024 {
            return Err(ConfigError::invalid(
                "server.max_body_bytes",
                "must be at least 1024 bytes",
            ));
        }
        if s.send_buffer_bytes != 0 && !(4096..=(64 << 20)).contains(&s.send_buffer_bytes) {
            return Err(ConfigError::invalid(
                "server.send_buffer_bytes",
                "must be 0 (the OS's size) or between 4096 and 67108864",
            ));
        }
        if s.max_in_flight == 0 {
            return Err(ConfigError::invalid(
                "server.max_in_flight",
                "must be at least 1",
            ));
        }
        for (name, value, most) in [
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
        ] {
            if value.is_zero() || value > Duration::from_secs(most) {
                return Err(ConfigError::invalid(
                    name,
                    format!("must be between 1 and {most} seconds"),
                ));
            }
        }
        if e.model_id.trim().is_empty() {
            return Err(ConfigError::invalid("engine.model_id", "must not be empty"));
        }
        if e.max_batch_size == Some(0) {
            return Err(ConfigError::invalid(
                "engine.max_batch_size",
                "must be at least 1",
            ));
        }
        if !(1..=64).contains(&e.replicas) {
            return Err(ConfigError::invalid(
                "engine.replicas",
                "must be between 1 and 64",
            ));
        }
        if e.threads > 1024 {
            return Err(ConfigError::invalid(
                "engine.threads",
                "must be between 0 (one per core) and 1024",
            ));
        }
        if e.max_tokens_cap == 0 {
            return Err(ConfigError::invalid(
                "engine.max_tokens_cap",
                "must be at least 1",
            ));
        }
        if e.default_max_tokens
            .is_some_and(|n| n == 0 || n > e.max_tokens_cap)
        {
            return Err(ConfigError::invalid(
                "engine.default_max_tokens",
                format!(
                    "must be between 1 and max_tokens_cap ({})",
                    e.max_tokens_cap
                ),
            ));
        }
        let q = &self.quality.settings;
        if !(1..=16).contains(&q.repetition_n) {
            return Err(ConfigError::invalid(
                "quality.repetition_n",
                "must be between 1 and 16",
            ));
        }
        let guard = q.guard;
        if guard.window < 2 * q.repetition_n {
            return Err(ConfigError::invalid(
                "quality.guard_window",
                format!(
                    "must be at least twice repetition_n ({})",
                    2 * q.repetition_n
                ),
            ));
        }
        if !(guard.threshold > 0.0 && guard.threshold < 1.0) {
            return Err(ConfigError::invalid(
                "quality.guard_threshold",
                "must be between 0 and 1, exclusive",
            ));
        }
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.logging.filter) {
            return Err(ConfigError::invalid("logging.filter", error.to_string()));
        }
        Ok(())
    }
}

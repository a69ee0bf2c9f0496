//! Logging: human-readable lines for a terminal or one JSON object per line, written by
//! a background thread through a bounded queue, so a slow terminal or log shipper never
//! holds up a request. Lines that do not fit in the queue are dropped and counted
//! (`llmgate_log_lines_dropped_total`).
//!
//! Inside a request, every line carries the fields of the request's `request` span
//! (`request_id`, `trace_id`, `span_id`): at the top level of a JSON line, in the span
//! prefix of a text line.

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::telemetry::config::{LogFormat, LoggingConfig};

/// Lines the log queue holds before it drops new ones.
const LOG_QUEUE_LINES: usize = 64 * 1024;

/// Keeps the log writer thread alive; dropping it flushes the queue.
pub struct Logging {
    _guard: WorkerGuard,
    dropped: ErrorCounter,
}

impl Logging {
    /// Counts the lines dropped because the queue was full (for the metrics).
    pub fn drop_counter(&self) -> ErrorCounter {
        self.dropped.clone()
    }
}

/// Installs the global subscriber: `config.filter` selects, `config.format` formats,
/// and lines go to standard error through the bounded queue.
pub fn init(config: &LoggingConfig) -> Result<Logging, String> {
    let filter = EnvFilter::try_new(&config.filter).map_err(|e| {
        format!(
            "logging.filter '{}' is not a valid filter: {e}",
            config.filter
        )
    })?;
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("llmgate-log")
        .finish(std::io::stderr());
    let dropped = writer.error_counter();
    let registry = tracing_subscriber::registry().with(filter);
    let installed = match config.format {
        LogFormat::Json => registry.with(json_layer(writer)).try_init(),
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_writer(writer))
            .try_init(),
    };
    installed.map_err(|e| format!("could not install the logger: {e}"))?;
    Ok(Logging {
        _guard: guard,
        dropped,
    })
}

/// The JSON line format: `timestamp`, `level`, `target`, the event's fields (with
/// `message`) and the fields of every enclosing span, all at the top level.
pub fn json_layer<S, W>(writer: W) -> json_subscriber::JsonLayer<S, W>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    let mut layer = json_subscriber::JsonLayer::new(writer);
    layer
        .with_timer("timestamp", tracing_subscriber::fmt::time::SystemTime)
        .with_level("level")
        .with_target("target")
        .with_flattened_event()
        .with_top_level_flattened_span_list();
    layer
}

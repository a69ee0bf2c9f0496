//! The text formats `/metrics` speaks, and the encoding of the registry in each.

use super::Metrics;

/// The two text formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpositionFormat {
    OpenMetrics,
    Prometheus,
}

impl ExpositionFormat {
    /// OpenMetrics when the scraper asks for it (Prometheus does when exemplar storage
    /// is on), the classic format otherwise.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Self::OpenMetrics,
            _ => Self::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

impl Metrics {
    /// The exposition: OpenMetrics text (with exemplars) or the classic Prometheus text
    /// format 0.0.4, which has no exemplars.
    pub fn encode(&self, format: ExpositionFormat) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(16 * 1024);
        match format {
            ExpositionFormat::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
            }
            ExpositionFormat::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
            }
        }
        Ok(out)
    }
}

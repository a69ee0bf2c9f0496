//! `shadow = { model = "candidate", share = 0.05 }` on a `[[models]]` entry: a share of
//! the model's live requests also goes to another served model, whose answer the client
//! never sees, and the two are compared request by request (`crate::shadow`).

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The entry as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowTable {
    /// The candidate: another served model's id.
    pub model: Option<String>,
    /// The share of this model's requests also sent to the candidate, from 0 (none) to 1
    /// (all) [default: 0.05].
    pub share: Option<f64>,
    /// Shadow requests in flight at most; one more is dropped and counted [default: 4].
    pub max_in_flight: Option<usize>,
}

pub use crate::shadow::ShadowPolicy;

impl ShadowTable {
    /// Checked on its own; whether the candidate is served is checked with every model.
    pub(super) fn resolve(
        self,
        id: &str,
        invalid: impl Fn(&'static str, String) -> ConfigError,
    ) -> Result<ShadowPolicy, ConfigError> {
        let candidate = self.model.filter(|m| !m.trim().is_empty()).ok_or_else(|| {
            invalid(
                "shadow.model",
                "name the candidate: another served model's id".into(),
            )
        })?;
        if candidate == id {
            return Err(invalid(
                "shadow.model",
                format!("'{id}' cannot shadow itself; name another served model"),
            ));
        }
        let share = self.share.unwrap_or(0.05);
        if !(0.0..=1.0).contains(&share) {
            return Err(invalid(
                "shadow.share",
                format!("must be from 0 to 1 (a share of the requests), not {share}"),
            ));
        }
        let max_in_flight = self.max_in_flight.unwrap_or(4);
        if max_in_flight == 0 {
            return Err(invalid("shadow.max_in_flight", "must be at least 1".into()));
        }
        Ok(ShadowPolicy {
            candidate,
            share,
            max_in_flight,
        })
    }
}

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

pub use crate::shadow::split::{SplitPolicy, Sticky};
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
        if !(1..=4096).contains(&max_in_flight) {
            return Err(invalid(
                "shadow.max_in_flight",
                "must be from 1 to 4096".into(),
            ));
        }
        Ok(ShadowPolicy {
            candidate,
            share,
            max_in_flight,
        })
    }
}

/// `[[splits]]`: a model name clients send, answered by one of several served models.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitTable {
    /// The name clients send in `model`; not a served model's id.
    pub id: Option<String>,
    /// Whose requests stay on one variant: `api_key`, `user`, or `header:<name>`
    /// [default: api_key].
    pub sticky: Option<String>,
    /// The served models and their weights: `[{ model = "a", weight = 90 }, ...]`.
    pub variants: Option<Vec<VariantTable>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantTable {
    pub model: Option<String>,
    /// A share of the split's requests, against the other variants' weights [default: 1].
    pub weight: Option<u32>,
}

impl SplitTable {
    /// Checked against the served models' ids.
    pub(super) fn resolve(self, served: &[&str], index: usize) -> Result<SplitPolicy, ConfigError> {
        let invalid = |key: &'static str, message: String| {
            ConfigError::invalid(key, format!("[[splits]] entry {}: {message}", index + 1))
        };
        let id = self.id.filter(|id| !id.trim().is_empty()).ok_or_else(|| {
            invalid(
                "splits.id",
                "each split needs the model name clients send".into(),
            )
        })?;
        if served.contains(&id.as_str()) {
            return Err(invalid(
                "splits.id",
                format!("'{id}' is a served model's id; a split needs a name of its own"),
            ));
        }
        let sticky = match self.sticky.as_deref() {
            None => Sticky::ApiKey,
            Some(text) => Sticky::parse(text).ok_or_else(|| {
                invalid(
                    "splits.sticky",
                    format!("'{text}' is not api_key, user or header:<name>"),
                )
            })?,
        };
        let variants = self.variants.unwrap_or_default();
        if variants.is_empty() {
            return Err(invalid(
                "splits.variants",
                "name at least one variant".into(),
            ));
        }
        let variants = variants
            .into_iter()
            .map(|v| {
                let model = v.model.unwrap_or_default();
                if !served.contains(&model.as_str()) {
                    return Err(invalid(
                        "splits.variants",
                        format!("'{model}' is not a served model's id"),
                    ));
                }
                match v.weight.unwrap_or(1) {
                    0 => Err(invalid(
                        "splits.variants",
                        format!("'{model}': weight must be at least 1"),
                    )),
                    weight => Ok((model, weight)),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SplitPolicy {
            id,
            sticky,
            variants,
        })
    }
}

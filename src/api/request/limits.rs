//! What a request is checked against: the served models, each with its completion
//! budget and the defaults of what a request leaves out (docs/defaults.md).

use crate::engine::served::ModelPolicy;
use crate::error::ApiError;

/// Limits a request is validated against.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// The served models, the default (first) one first; any other `model` is a 404.
    pub models: Vec<ModelPolicy>,
    /// Refuse the non-OpenAI sampling extensions (`--strict-params`).
    pub strict_params: bool,
}

impl RequestLimits {
    /// The limits of one model, with the extensions allowed (tests, benchmarks).
    pub fn single(id: &str, max_tokens_cap: u32) -> Self {
        Self {
            models: vec![ModelPolicy::plain(id, max_tokens_cap)],
            strict_params: false,
        }
    }

    /// The served model `id` names; 404 `model_not_found` otherwise.
    pub fn model(&self, id: &str) -> Result<&ModelPolicy, ApiError> {
        self.models
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| ApiError::ModelNotFound(id.to_owned()))
    }
}

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
    /// The one model answers any name (`server.serve_any_model`).
    pub any_name: bool,
}

impl RequestLimits {
    /// The limits of one model, with the extensions allowed (tests, benchmarks).
    pub fn single(id: &str, max_tokens_cap: u32) -> Self {
        Self {
            models: vec![ModelPolicy::plain(id, max_tokens_cap)],
            strict_params: false,
            any_name: false,
        }
    }

    /// The one served model, when it answers any name (or none).
    pub fn any_model(&self) -> Option<&ModelPolicy> {
        match self.models.as_slice() {
            [only] if self.any_name => Some(only),
            _ => None,
        }
    }

    /// The one served model, whatever its names: a request that names none gets it, as
    /// vLLM and llama.cpp's server answer one.
    pub fn only_model(&self) -> Option<&ModelPolicy> {
        match self.models.as_slice() {
            [only] => Some(only),
            _ => None,
        }
    }

    /// The served model `name` names (its id or an alias; with `any_name`, the one model
    /// whatever the name); 404 `model_not_found` otherwise.
    pub fn model(&self, name: &str) -> Result<&ModelPolicy, ApiError> {
        self.models
            .iter()
            .find(|m| m.id == name)
            .or_else(|| self.models.iter().find(|m| m.is_named(name)))
            .or_else(|| self.any_model())
            .ok_or_else(|| ApiError::ModelNotFound(name.to_owned()))
    }
}

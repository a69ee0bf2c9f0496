//! What a request is checked against: the served models, each with its completion
//! budget and the defaults of what a request leaves out (docs/defaults.md).

use crate::error::ApiError;

/// Limits a request is validated against.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// The served models, the default (first) one first; any other `model` is a 404.
    pub models: Vec<ModelLimits>,
    /// Refuse the non-OpenAI sampling extensions (`--strict-params`).
    pub strict_params: bool,
}

/// One served model's id, completion budget and the defaults of what a request leaves
/// out.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLimits {
    pub id: String,
    pub max_tokens_cap: u32,
    /// Completion budget of a request that sets none; `None`: what the context leaves
    /// after the prompt (at most `max_tokens_cap`).
    pub default_max_tokens: Option<u32>,
    /// `temperature` and `top_p` of a request that sets none; `None`: the engine's.
    pub default_temperature: Option<f64>,
    pub default_top_p: Option<f64>,
    /// The degeneration guard watches this model's answers (not those of a request
    /// with `ignore_eos`, which asks for a fixed length).
    pub degeneration_guard: bool,
}

impl From<&crate::config::ModelConfig> for ModelLimits {
    fn from(model: &crate::config::ModelConfig) -> Self {
        Self {
            id: model.id.clone(),
            max_tokens_cap: model.max_tokens_cap,
            default_max_tokens: model.default_max_tokens,
            default_temperature: model.default_temperature,
            default_top_p: model.default_top_p,
            degeneration_guard: model.degeneration_guard,
        }
    }
}

impl ModelLimits {
    /// A model with no defaults of its own (tests, benchmarks).
    pub fn plain(id: &str, max_tokens_cap: u32) -> Self {
        Self {
            id: id.to_owned(),
            max_tokens_cap,
            default_max_tokens: None,
            default_temperature: None,
            default_top_p: None,
            degeneration_guard: false,
        }
    }
}

impl RequestLimits {
    /// The limits of one model, with the extensions allowed (tests, benchmarks).
    pub fn single(id: &str, max_tokens_cap: u32) -> Self {
        Self {
            models: vec![ModelLimits::plain(id, max_tokens_cap)],
            strict_params: false,
        }
    }

    /// The served model `id` names; 404 `model_not_found` otherwise.
    pub fn model(&self, id: &str) -> Result<&ModelLimits, ApiError> {
        self.models
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| ApiError::ModelNotFound(id.to_owned()))
    }
}

//! The models one gateway serves: each id clients send in `model`, the engine behind it
//! (mistral.rs in this process, or an upstream server) and its policy (budget,
//! defaults, guard).
//!
//! Built once at start-up from the config's `[[models]]` list (or the single model of
//! `[engine]`), held in application state, and looked up by id for every request. The
//! first model is the default for routes that take no `model` (`/tokenize` without one).

use std::sync::Arc;

use super::{EngineLoad, Front, ModelInfo, Readiness};

/// How a served model treats each request it gets: its id, the completion budget a
/// request may ask for, the defaults of what a request leaves out (docs/defaults.md),
/// and whether the degeneration guard watches its answers. Request validation reads it;
/// `/v1/models` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPolicy {
    pub id: String,
    pub max_tokens_cap: u32,
    /// Completion budget of a request that sets none; `None`: what the context leaves
    /// after the prompt (at most `max_tokens_cap`).
    pub default_max_tokens: Option<u32>,
    /// `temperature` and `top_p` of a request that sets none; `None`: the engine's.
    pub default_temperature: Option<f64>,
    pub default_top_p: Option<f64>,
    /// `seed` of a request that sets none; `None`: each such answer is random.
    pub default_seed: Option<u64>,
    /// The degeneration guard watches this model's answers (not those of a request
    /// with `ignore_eos`, which asks for a fixed length).
    pub degeneration_guard: bool,
    /// Other names clients may send for it (`aliases = [...]`); it answers under `id`.
    pub aliases: Vec<String>,
}

impl ModelPolicy {
    /// Whether a request's `model` names it.
    pub fn is_named(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name)
    }
}

impl ModelPolicy {
    /// A model with no defaults of its own (tests, benchmarks).
    pub fn plain(id: &str, max_tokens_cap: u32) -> Self {
        Self {
            id: id.to_owned(),
            max_tokens_cap,
            default_max_tokens: None,
            default_temperature: None,
            default_top_p: None,
            default_seed: None,
            degeneration_guard: false,
            aliases: Vec::new(),
        }
    }
}

/// One served model: its policy and the front of its engine.
#[derive(Clone)]
pub struct ServedModel {
    pub policy: ModelPolicy,
    pub engine: Front,
}

impl ServedModel {
    pub fn id(&self) -> &str {
        &self.policy.id
    }
}

/// Every served model, in the config's order; never empty.
#[derive(Clone)]
pub struct ServedModels(Vec<ServedModel>);

impl std::fmt::Debug for ServedModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(ServedModel::id))
            .finish()
    }
}

impl ServedModels {
    /// `None` for an empty list or a repeated id (the config refuses both first).
    pub fn new(models: Vec<ServedModel>) -> Option<Self> {
        let unique = models
            .iter()
            .enumerate()
            .all(|(i, m)| models[..i].iter().all(|o| o.id() != m.id()));
        (!models.is_empty() && unique).then_some(Self(models))
    }

    /// One model: the single-engine gateway and the tests.
    pub fn single(policy: ModelPolicy, engine: impl Into<Front>) -> Self {
        Self(vec![ServedModel {
            policy,
            engine: engine.into(),
        }])
    }

    /// The model `name` names: its id, or one of its aliases.
    pub fn get(&self, name: &str) -> Option<&ServedModel> {
        self.0
            .iter()
            .find(|m| m.id() == name)
            .or_else(|| self.0.iter().find(|m| m.policy.is_named(name)))
    }

    /// The first model: what a route that names none uses.
    pub fn default_model(&self) -> &ServedModel {
        &self.0[0]
    }

    pub fn iter(&self) -> impl Iterator<Item = &ServedModel> {
        self.0.iter()
    }

    pub fn policies(&self) -> Vec<ModelPolicy> {
        self.0.iter().map(|m| m.policy.clone()).collect()
    }

    /// The `model` label of a request that names no served model (refused before its
    /// body was read, or naming another model): the model itself when only one is
    /// served, so a single-model gateway counts all its traffic under its model.
    pub fn label_for_unknown(&self) -> &str {
        match self.0.as_slice() {
            [only] => only.id(),
            _ => crate::names::MODEL_NONE,
        }
    }

    /// Running and waiting over every engine.
    pub fn load(&self) -> EngineLoad {
        self.0.iter().fold(EngineLoad::default(), |sum, m| {
            let load = m.engine.load();
            EngineLoad {
                running: sum.running + load.running,
                waiting: sum.waiting + load.waiting,
            }
        })
    }

    /// The KV cache each model's engine reports, by model id.
    pub fn kv_caches(&self) -> Vec<(String, super::KvCacheUse)> {
        self.0
            .iter()
            .filter_map(|m| Some((m.id().to_owned(), m.engine.kv_cache()?)))
            .collect()
    }

    /// The facts of every model that is loaded.
    pub fn infos(&self) -> Vec<Arc<ModelInfo>> {
        self.0
            .iter()
            .filter_map(|m| m.engine.model_info())
            .collect()
    }

    /// Whether any model can take requests (the gateway is ready when one can).
    pub fn any_ready(&self) -> bool {
        self.0
            .iter()
            .any(|m| m.engine.readiness() == Readiness::Ready)
    }
}

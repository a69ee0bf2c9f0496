//! A model file as an in-process engine reads it before its weights: its facts, its
//! sha256 and the vocabulary structured output is built on; and the model's facts once
//! the engine knows its context and device. Both in-process engines load through here.

use std::path::Path;
use std::sync::Arc;

use super::GgufFacts;
use crate::engine::grammar::Vocabulary;
use crate::engine::{Decoding, LoadedModel, ModelInfo, Slots, Tokenized};
use crate::fingerprint::{self, Accelerator};

/// A GGUF file, read but not yet loaded.
pub struct ModelFile {
    pub facts: GgufFacts,
    /// sha256 of the whole file, hex: part of the system fingerprint.
    pub sha256: String,
    /// The tokens' bytes; `None` (with a warning) when the tokenizer is not one the
    /// grammar knows: no structured output and no log-probabilities then.
    pub vocabulary: Option<Arc<Vocabulary>>,
}

impl ModelFile {
    /// Reads the file's metadata and hashes it (seconds for a large file: call it off
    /// the async threads). Errors: the file cannot be read, or is not a GGUF.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let facts = GgufFacts::read(path).map_err(|e| {
            anyhow::anyhow!(
                "{} is not a GGUF file the gateway can read: {e}",
                path.display()
            )
        })?;
        let sha256 = fingerprint::file_sha256(path)?;
        let vocabulary = match facts.vocabulary() {
            Ok(vocabulary) => Some(Arc::new(vocabulary)),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "Structured output (response_format) and logprobs are not available for this model.");
                None
            }
        };
        Ok(Self {
            facts,
            sha256,
            vocabulary,
        })
    }

    /// The served model's facts: `engine` (name and version) running the file on
    /// `device` (`cpu/<weights>`, `cpu` or `cuda`) with `context_length` tokens.
    pub fn info(&self, id: &str, context_length: u32, engine: &str, device: String) -> ModelInfo {
        let accelerator = if device == "cuda" {
            crate::gpu::accelerator()
        } else {
            Accelerator::default()
        };
        ModelInfo {
            id: id.to_owned(),
            context_length,
            system_fingerprint: fingerprint::system_fingerprint(
                &self.sha256,
                engine,
                &device,
                &accelerator,
            ),
            sha256: self.sha256.clone(),
            quant: self.facts.quantization(),
            device,
            accelerator,
            upstream: None,
            loaded_at: crate::clock::unix_seconds(std::time::SystemTime::now()),
        }
    }
}

/// What an engine in this process (llama.cpp, mistral.rs) keeps of its loaded model for
/// the front: the facts it reports, the tokens' bytes and the tokens an answer ends on.
pub struct InProcessModel {
    /// The served model's facts (id, context, fingerprint, device), as `/v1/models`, the
    /// metrics and the semantic log report them.
    pub info: Arc<ModelInfo>,
    /// The tokens' bytes, for structured output, log-probabilities and `/tokenize`'s
    /// spellings; `None` when the file's tokenizer is not one the grammar knows.
    pub vocabulary: Option<Arc<Vocabulary>>,
    /// The tokens a sequence ends on, for `ignore_eos`, `min_tokens` and
    /// `stop_token_ids`.
    pub end_tokens: Arc<[u32]>,
}

impl InProcessModel {
    /// The model as the front sees it: the gateway picks its tokens among `vocab_size`,
    /// `sequences` run at once (each with its own KV cache one context long), and the
    /// gateway's stop screen cuts answers at `stop`.
    pub fn loaded(&self, vocab_size: u32, sequences: usize) -> LoadedModel {
        LoadedModel {
            info: Arc::clone(&self.info),
            decoding: Decoding::Picked {
                vocabulary: self.vocabulary.clone(),
                vocab_size,
                end_tokens: Arc::clone(&self.end_tokens),
            },
            slots: Slots::Sequences(sequences),
            applies_stops: false,
            passes_agents: false,
            // The engine that renders the template says what it does.
            template: crate::engine::TemplateTraits::default(),
            fleet: None,
        }
    }

    /// `ids` with their spellings and pieces, where the vocabulary knows them.
    pub fn tokenized(&self, ids: Vec<u32>) -> Tokenized {
        let spellings = self.vocabulary.as_ref().and_then(|v| v.spellings(&ids));
        let pieces = self
            .vocabulary
            .as_ref()
            .map(|v| ids.iter().map(|&id| v.token_text(id).bytes).collect());
        Tokenized {
            ids,
            spellings,
            pieces,
        }
    }
}

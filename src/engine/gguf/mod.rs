//! What the gateway reads from a GGUF file itself, before and beside mistral.rs: that
//! the file is sound and of an architecture mistral.rs can load (so a model that cannot
//! load stops start-up with the reason, before the engine sees it), the file type (its
//! quantization, for `llmgate_model_info`) and the tokenizer (for structured output,
//! `logprobs`, the end-of-sequence tokens, and an upstream model's token ids). Only the
//! header, the metadata and the tensor table are read ([`reader`]), never the data.

pub mod file;
pub mod reader;

use std::collections::HashMap;
use std::path::Path;

use super::grammar::Vocabulary;
pub use file::{InProcessModel, ModelFile};
pub use reader::{GgufError, MetaValue};

/// The architectures mistral.rs 0.8.1 loads from a GGUF file (`GGUFArchitecture` and the
/// match in mistralrs-core pipeline/gguf.rs that builds a model from it), as
/// `general.architecture` spells them.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "llama",
    "mistral3",
    "phi2",
    "phi3",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "starcoder2",
];

/// A GGUF's tokenizer, as llama.cpp stores it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerParts {
    /// `gpt2` (byte-level BPE), `llama` (SentencePiece)...
    pub model: String,
    /// The pre-tokenizer's name (`smollm`, `llama-bpe`...).
    pub pre: String,
    pub tokens: Vec<String>,
    /// llama.cpp's token types (3: control, a special token); empty when absent.
    pub types: Vec<i32>,
    /// BPE merges, `"a b"` each.
    pub merges: Vec<String>,
}

/// The metadata of one GGUF file.
#[derive(Debug, Clone)]
pub struct GgufFacts {
    metadata: HashMap<String, MetaValue>,
}

impl GgufFacts {
    /// Reads and checks the file's header, metadata and tensor table.
    pub fn read(path: &Path) -> Result<Self, GgufError> {
        let file = std::fs::File::open(path).map_err(|e| GgufError::Io(e.to_string()))?;
        let len = file
            .metadata()
            .map_err(|e| GgufError::Io(e.to_string()))?
            .len();
        Self::from_reader(std::io::BufReader::with_capacity(1 << 16, file), len)
    }

    /// The same, from `len` bytes of `input` (tests and fuzzing).
    pub fn from_reader(input: impl std::io::Read, len: u64) -> Result<Self, GgufError> {
        Ok(Self {
            metadata: reader::read_header(input, len)?.metadata,
        })
    }

    fn text(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).and_then(MetaValue::as_str)
    }

    fn number(&self, key: &str) -> Option<u64> {
        self.metadata.get(key).and_then(MetaValue::as_u64)
    }

    fn strings(&self, key: &str) -> Option<Vec<String>> {
        self.metadata.get(key)?.as_array().map(|items| {
            items
                .iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect()
        })
    }

    /// `general.architecture`, or `unknown`.
    pub fn architecture(&self) -> &str {
        self.text("general.architecture").unwrap_or("unknown")
    }

    /// That mistral.rs can load this architecture: an error naming it and the ones it
    /// can, before the engine is asked (mistral.rs 0.8.1 panics in its loader thread on
    /// an architecture it does not know).
    pub fn check_supported(&self) -> Result<(), String> {
        let architecture = self.architecture();
        if SUPPORTED_ARCHITECTURES.contains(&architecture.to_ascii_lowercase().as_str()) {
            return Ok(());
        }
        Err(format!(
            "the model's architecture is '{architecture}', which mistral.rs 0.8.1 cannot load from a GGUF file; it loads {}. Serve this model from a server that can (an upstream, docs/upstream.md), or convert another model",
            SUPPORTED_ARCHITECTURES.join(", ")
        ))
    }

    /// llama.cpp's name of `general.file_type` (`Q8_0`, `Q4_K_M`...); `unknown` without.
    pub fn quantization(&self) -> String {
        let Some(kind) = self.number("general.file_type") else {
            return "unknown".to_owned();
        };
        u32::try_from(kind)
            .ok()
            .and_then(file_type_name)
            .map_or_else(|| format!("file_type_{kind}"), str::to_owned)
    }

    /// The tokenizer's parts as llama.cpp stores them, for building a tokenizer outside
    /// mistral.rs.
    pub fn tokenizer_parts(&self) -> anyhow::Result<TokenizerParts> {
        let tokens = self.strings("tokenizer.ggml.tokens").unwrap_or_default();
        anyhow::ensure!(
            !tokens.is_empty(),
            "the GGUF file has no tokenizer.ggml.tokens"
        );
        let types = self.token_types().unwrap_or_default();
        Ok(TokenizerParts {
            model: self
                .text("tokenizer.ggml.model")
                .unwrap_or_default()
                .to_owned(),
            pre: self
                .text("tokenizer.ggml.pre")
                .unwrap_or_default()
                .to_owned(),
            tokens,
            types,
            merges: self.strings("tokenizer.ggml.merges").unwrap_or_default(),
        })
    }

    fn token_types(&self) -> Option<Vec<i32>> {
        self.metadata
            .get("tokenizer.ggml.token_type")?
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|v| match v {
                        MetaValue::Signed(n) => i32::try_from(*n).unwrap_or(0),
                        MetaValue::Unsigned(n) => i32::try_from(*n).unwrap_or(0),
                        _ => 0,
                    })
                    .collect()
            })
    }

    /// The tokenizer's vocabulary; an error where the grammar does not know it.
    pub fn vocabulary(&self) -> anyhow::Result<Vocabulary> {
        let model = self
            .text("tokenizer.ggml.model")
            .ok_or_else(|| anyhow::anyhow!("the GGUF file has no tokenizer.ggml.model"))?;
        let tokens = self
            .strings("tokenizer.ggml.tokens")
            .ok_or_else(|| anyhow::anyhow!("the GGUF file has no tokenizer.ggml.tokens"))?;
        let types = self.token_types().unwrap_or_else(|| vec![1; tokens.len()]);
        let eos = self
            .number("tokenizer.ggml.eos_token_id")
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| anyhow::anyhow!("the GGUF file has no tokenizer.ggml.eos_token_id"))?;
        Vocabulary::new(model, tokens, &types, eos)
    }
}

/// Tokens that end a turn in the chat templates mistral.rs knows (its
/// `SUPPORTED_ALTERNATE_EOS`, mistralrs-core pipeline/chat_template.rs): one of them ends a
/// sequence when the vocabulary has it and the template uses it.
const ALTERNATE_EOS: &[&str] = &[
    "<|im_end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<|end|>",
    "<|eot_id|>",
    "<|message|>",
    "<|start|>",
    "<|channel|>",
];

impl GgufFacts {
    /// The ids mistral.rs ends a sequence on (its `calculate_eos_tokens`, which this
    /// follows): the file's `eos_token_id`, and each of [`ALTERNATE_EOS`] the vocabulary
    /// has and the chat template names. Empty when the file names no EOS token.
    pub fn end_of_sequence_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .number("tokenizer.ggml.eos_token_id")
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect();
        let template = self.text("tokenizer.chat_template").unwrap_or_default();
        let tokens = self.strings("tokenizer.ggml.tokens").unwrap_or_default();
        for (id, token) in tokens.iter().enumerate() {
            if ALTERNATE_EOS.contains(&token.as_str()) && template.contains(token.as_str()) {
                if let Ok(id) = u32::try_from(id) {
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
        ids
    }
}

/// llama.cpp's `llama_ftype` names (`LLAMA_FTYPE_MOSTLY_*`).
fn file_type_name(kind: u32) -> Option<&'static str> {
    Some(match kind {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::reader::{string_value, write_header};
    use super::*;

    fn facts(architecture: &str) -> GgufFacts {
        let file = write_header(
            &[("general.architecture", 8, string_value(architecture))],
            &[],
        );
        GgufFacts::from_reader(file.as_slice(), file.len() as u64).expect("valid")
    }

    #[test]
    fn an_architecture_mistral_rs_cannot_load_is_named_with_the_ones_it_can() {
        assert!(facts("llama").check_supported().is_ok());
        assert!(facts("Qwen2").check_supported().is_ok());
        let error = facts("gemma3").check_supported().expect_err("gemma3");
        assert!(
            error.contains("'gemma3'") && error.contains("llama, mistral3"),
            "{error}"
        );
    }
}

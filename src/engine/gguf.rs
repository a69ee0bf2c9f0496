//! What the gateway reads from a GGUF file itself, beside mistral.rs: the file type (its
//! quantization, for `llmgate_model_info`) and the tokenizer's vocabulary (for structured
//! output and `logprobs`). Only the metadata is read, not the tensors.

use std::path::Path;

use candle_core::quantized::gguf_file;

use super::grammar::Vocabulary;

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
pub struct GgufFacts {
    content: gguf_file::Content,
}

impl GgufFacts {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let mut file = std::fs::File::open(path)?;
        Ok(Self {
            content: gguf_file::Content::read(&mut file)?,
        })
    }

    /// llama.cpp's name of `general.file_type` (`Q8_0`, `Q4_K_M`...); `unknown` without.
    pub fn quantization(&self) -> String {
        let Some(kind) = self
            .content
            .metadata
            .get("general.file_type")
            .and_then(|v| v.to_u32().ok())
        else {
            return "unknown".to_owned();
        };
        file_type_name(kind).map_or_else(|| format!("file_type_{kind}"), str::to_owned)
    }

    /// The tokenizer's parts as llama.cpp stores them, for building a tokenizer outside
    /// mistral.rs.
    pub fn tokenizer_parts(&self) -> anyhow::Result<TokenizerParts> {
        let metadata = &self.content.metadata;
        let text = |key: &str| {
            metadata
                .get(key)
                .and_then(|v| v.to_string().ok())
                .cloned()
                .unwrap_or_default()
        };
        let strings = |key: &str| -> anyhow::Result<Vec<String>> {
            match metadata.get(key) {
                Some(v) => Ok(v
                    .to_vec()?
                    .iter()
                    .map(|v| v.to_string().cloned())
                    .collect::<Result<_, _>>()?),
                None => Ok(Vec::new()),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        anyhow::ensure!(
            !tokens.is_empty(),
            "the GGUF file has no tokenizer.ggml.tokens"
        );
        let types = match metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| t.to_i32())
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok(TokenizerParts {
            model: text("tokenizer.ggml.model"),
            pre: text("tokenizer.ggml.pre"),
            tokens,
            types,
            merges: strings("tokenizer.ggml.merges")?,
        })
    }

    /// The tokenizer's vocabulary; an error where the grammar does not know it.
    pub fn vocabulary(&self) -> anyhow::Result<Vocabulary> {
        let metadata = &self.content.metadata;
        let meta = |key: &str| {
            metadata
                .get(key)
                .ok_or_else(|| anyhow::anyhow!("the GGUF file has no {key}"))
        };
        let model = meta("tokenizer.ggml.model")?.to_string()?.clone();
        let tokens: Vec<String> = meta("tokenizer.ggml.tokens")?
            .to_vec()?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<Result<_, _>>()?;
        let types: Vec<i32> = match metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| t.to_i32())
                .collect::<Result<_, _>>()?,
            None => vec![1; tokens.len()],
        };
        let eos = meta("tokenizer.ggml.eos_token_id")?.to_u32()?;
        Vocabulary::new(&model, tokens, &types, eos)
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
        let metadata = &self.content.metadata;
        let mut ids: Vec<u32> = metadata
            .get("tokenizer.ggml.eos_token_id")
            .and_then(|v| v.to_u32().ok())
            .into_iter()
            .collect();
        let template = metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        let tokens = metadata
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.to_vec().ok());
        for (id, token) in tokens.into_iter().flatten().enumerate() {
            let Ok(token) = token.to_string() else {
                continue;
            };
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

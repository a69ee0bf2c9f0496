//! What the gateway reads from a GGUF file itself, beside mistral.rs: the file type (its
//! quantization, for `llmgate_model_info`) and the tokenizer's vocabulary (for structured
//! output and `logprobs`). Only the metadata is read, not the tensors.

use std::path::Path;

use candle_core::quantized::gguf_file;

use super::grammar::Vocabulary;

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

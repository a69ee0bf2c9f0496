//! Sampling defaults for models whose card recommends them, applied when neither the
//! request nor the configuration sets a value (as vLLM reads a model's
//! `generation_config.json`; a GGUF carries none, so the file's name is what we know).
//!
//! Each entry is measured over `prompts/` with `scripts/sampling-report`; the table and
//! the command are in docs/defaults.md. A configuration entry
//! (`default_temperature`, `default_top_p`, `default_max_tokens`, `degeneration_guard`)
//! always wins over these.

use std::path::Path;

/// What a model's card recommends, and what measurement chose where it is silent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnownDefaults {
    pub temperature: f64,
    pub top_p: f64,
    /// A chat answer's budget: long enough for a full answer, short enough that a
    /// rambling one ends in seconds rather than minutes.
    pub max_tokens: u32,
    /// Stop answers whose recent tokens loop.
    pub degeneration_guard: bool,
}

/// File-name prefixes (of the GGUF) and their defaults.
const KNOWN: &[(&str, KnownDefaults)] = &[(
    // HuggingFaceTB/SmolLM2-135M-Instruct: the card's example samples at temperature
    // 0.2 and top_p 0.9. Over prompts/, 0.2 loops on the Q8_0 file where 0.7 ends more
    // answers by themselves; the guard cuts the loops that remain (docs/defaults.md).
    "SmolLM2-135M-Instruct",
    KnownDefaults {
        temperature: 0.7,
        top_p: 0.9,
        max_tokens: 512,
        degeneration_guard: true,
    },
)];

/// The defaults of the model in `path`, when its file name is a known one.
pub fn for_model_file(path: &Path) -> Option<KnownDefaults> {
    let name = path.file_name()?.to_str()?;
    KNOWN
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, defaults)| *defaults)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_files_are_matched_by_name_only() {
        let known = for_model_file(Path::new("models/SmolLM2-135M-Instruct.Q8_0.gguf"));
        assert_eq!(known.map(|d| d.temperature), Some(0.7));
        assert_eq!(
            for_model_file(Path::new("/data/SmolLM2-135M-Instruct.Q4_1.gguf")),
            known
        );
        assert_eq!(for_model_file(Path::new("models/Qwen2.5-0.5B.gguf")), None);
        assert_eq!(
            for_model_file(Path::new("SmolLM2-135M-Instruct/other.gguf")),
            None
        );
    }
}

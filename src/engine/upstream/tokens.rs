//! The token ids of an upstream's answer, for the repetition rate (seq-rep-n over token
//! ids), and the upstream model's tokenizer where the config names one.
//!
//! An upstream sends text, not ids. In order of preference the ids come from:
//! 1. the tokens it reports with their log-probabilities (asked for by default): each
//!    distinct token becomes one id, so seq-rep-n is exactly the one over the model's
//!    own tokens (only equality of ids matters to it);
//! 2. the model's tokenizer (`tokenizer.json`, or a GGUF's BPE vocabulary), applied to
//!    the text as it streams, a word at a time so that chunk boundaries do not split
//!    tokens that the whole text would not;
//! 3. whitespace-separated words, when neither is there.
//!
//! The basis used is recorded per request ([`RepetitionBasis`]), in the semantic log and
//! `llmgate_repetition_basis_total`: a repetition rate over words is not one over tokens.

use std::path::Path;
use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::engine::gguf::GgufFacts;
use crate::tokens::{RepetitionBasis, TokenLogprob};

/// The upstream model's tokenizer, loaded once at start-up.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    let is_gguf = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf {
        return GgufFacts::read(path)?.bpe_tokenizer();
    }
    Tokenizer::from_file(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Text without whitespace held back at most, waiting for the end of its word.
const MAX_PENDING_BYTES: usize = 64;

/// Turns one answer's chunks into ids; one per request.
#[derive(Debug)]
pub struct TokenReader {
    tokenizer: Option<Arc<Tokenizer>>,
    /// Text not yet turned into ids: the end of the answer that may still be the start
    /// of a longer word.
    pending: String,
}

impl TokenReader {
    pub fn new(tokenizer: Option<Arc<Tokenizer>>) -> Self {
        Self {
            tokenizer,
            pending: String::new(),
        }
    }

    /// The ids of a chunk's `text`, from its `logprobs` when it has them.
    pub fn ids(&mut self, text: &str, logprobs: &[TokenLogprob]) -> (Vec<u32>, RepetitionBasis) {
        if !logprobs.is_empty() {
            return (
                logprobs
                    .iter()
                    .map(|lp| spelling_id(&lp.token.bytes))
                    .collect(),
                RepetitionBasis::LogprobTokens,
            );
        }
        // What is pending has no whitespace: only the new text can end a word.
        let before = self.pending.len();
        self.pending.push_str(text);
        let split = self.pending[before..]
            .char_indices()
            .rev()
            .find(|(_, c)| c.is_whitespace())
            .map(|(i, _)| before + i);
        let split = match split {
            Some(split) => split,
            // A run without spaces (Chinese, a loop of "!!!") is taken in pieces, so its
            // ids arrive as it streams and no word costs more than a bounded encode.
            None if self.pending.len() >= MAX_PENDING_BYTES => self.pending.len(),
            None => 0,
        };
        let done: String = self.pending.drain(..split).collect();
        (self.encode(&done), self.basis())
    }

    /// The ids of what is still pending, when the answer ends.
    pub fn finish(&mut self) -> (Vec<u32>, RepetitionBasis) {
        let rest = std::mem::take(&mut self.pending);
        (self.encode(&rest), self.basis())
    }

    fn basis(&self) -> RepetitionBasis {
        if self.tokenizer.is_some() {
            RepetitionBasis::Tokenizer
        } else {
            RepetitionBasis::Words
        }
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        if text.is_empty() {
            return Vec::new();
        }
        match &self.tokenizer {
            Some(tokenizer) => tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default(),
            None => text
                .split_whitespace()
                .map(|w| spelling_id(w.as_bytes()))
                .collect(),
        }
    }
}

/// One id per distinct spelling (FNV-1a of the bytes): equal tokens, equal ids.
fn spelling_id(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Rough prompt tokens for the rate-limit charge, before the upstream counts them
/// itself: the tokenizer's count of each message plus a few for the chat template's
/// markers, or a byte count over four without a tokenizer.
pub fn estimate(tokenizer: Option<&Tokenizer>, texts: &[&str]) -> u32 {
    /// Tokens a chat template adds around a message (role, start and end markers).
    const PER_MESSAGE: u32 = 4;
    let count = |text: &str| match tokenizer {
        Some(t) => t
            .encode(text, false)
            .map(|e| u32::try_from(e.len()).unwrap_or(u32::MAX))
            .unwrap_or(0),
        None => u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX),
    };
    texts
        .iter()
        .map(|t| count(t).saturating_add(PER_MESSAGE))
        .fold(0u32, u32::saturating_add)
}

impl GgufFacts {
    /// A `tokenizers` tokenizer from a GGUF's GPT-2-style BPE vocabulary and merges (as
    /// llama.cpp's `gpt2` tokenizer model stores them): byte-level pre-tokenizing (digits
    /// one by one first, for the `smollm` pre-tokenizer), its control tokens special.
    pub fn bpe_tokenizer(&self) -> anyhow::Result<Tokenizer> {
        use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
        use tokenizers::models::bpe::BPE;
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::pre_tokenizers::digits::Digits;
        use tokenizers::pre_tokenizers::sequence::Sequence;
        use tokenizers::pre_tokenizers::PreTokenizerWrapper;
        use tokenizers::AddedToken;

        /// llama.cpp's token type of a control (special) token.
        const CONTROL: i32 = 3;
        let parts = self.tokenizer_parts()?;
        anyhow::ensure!(
            parts.model == "gpt2",
            "the GGUF's tokenizer is '{}'; only 'gpt2' (byte-level BPE) can be read here; give a tokenizer.json instead",
            parts.model
        );
        let special: Vec<AddedToken> = parts
            .tokens
            .iter()
            .zip(&parts.types)
            .filter(|(_, &t)| t == CONTROL)
            .map(|(token, _)| AddedToken::from(token.clone(), true))
            .collect();
        let vocab: tokenizers::models::bpe::Vocab = parts
            .tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        let merges = parts
            .merges
            .iter()
            .filter_map(|m| m.split_once(' '))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| anyhow::anyhow!("the GGUF's BPE vocabulary: {e}"))?;
        let mut tokenizer = Tokenizer::new(bpe);
        let byte_level = ByteLevel::default().add_prefix_space(false);
        if parts.pre == "smollm" {
            tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                PreTokenizerWrapper::ByteLevel(byte_level),
            ])));
        } else {
            tokenizer.with_pre_tokenizer(Some(byte_level));
        }
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        tokenizer.add_special_tokens(&special);
        Ok(tokenizer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::TokenText;

    #[test]
    fn logprob_tokens_are_ids_by_spelling() {
        let lp = |t: &str| TokenLogprob {
            sampled: None,
            token: TokenText::from_bytes(t.as_bytes().to_vec()),
            logprob: -0.1,
            top: Vec::new(),
        };
        let mut reader = TokenReader::new(None);
        let (a, basis) = reader.ids(" la France", &[lp(" la"), lp(" France")]);
        let (b, _) = reader.ids(" la", &[lp(" la")]);
        assert_eq!(basis, RepetitionBasis::LogprobTokens);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], b[0], "the same token, the same id");
        assert_ne!(a[0], a[1]);
    }

    #[test]
    fn words_wait_for_their_end_across_chunks() {
        let mut reader = TokenReader::new(None);
        let (first, basis) = reader.ids("la Fr", &[]);
        assert_eq!(basis, RepetitionBasis::Words);
        assert_eq!(first.len(), 1, "'Fr' may go on");
        let (second, _) = reader.ids("ance la", &[]);
        let (rest, _) = reader.finish();
        assert_eq!(second.len(), 1, "France, with 'la' pending");
        assert_eq!(rest.len(), 1);
        assert_eq!(first[0], rest[0], "la = la");
        assert_eq!(second[0], spelling_id(b"France"), "not 'Fr' + 'ance'");
    }

    #[test]
    fn text_without_spaces_is_taken_in_bounded_pieces() {
        let mut reader = TokenReader::new(None);
        let mut ids = 0;
        for _ in 0..100 {
            ids += reader.ids("巴黎", &[]).0.len();
        }
        assert!(ids >= 5, "ids as it streams, not all at the end: {ids}");
        assert!(reader.pending.len() < MAX_PENDING_BYTES);
    }

    #[test]
    fn an_estimate_counts_every_message() {
        assert_eq!(estimate(None, &["12345678"]), 2 + 4);
        assert_eq!(estimate(None, &["", "abc"]), 4 + 1 + 4);
    }
}

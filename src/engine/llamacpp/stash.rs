//! Prompt caches kept in host memory once their sequence is given to another prompt, as
//! llama.cpp's own server keeps them (`--cache-ram`): a slot holds one prompt's keys and
//! values, four slots hold four, and a gateway in front of many apps and chats sees many
//! more prompts than slots. When a slot's cache is about to be cut, its state is copied
//! here (llama.cpp's `llama_state_seq_get_data`); a later prompt that shares a longer
//! prefix with a stashed state than with any free slot has it copied back into its slot
//! and reads only the rest. A multi-turn chat sends its whole history again each turn,
//! a RAG app the same long instructions: their prefill becomes a memory copy.
//!
//! Bounded in bytes; the state used longest ago goes first. Only the loop's thread
//! touches it.

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;

/// A cut shorter than this many tokens is not worth a copy: reading it again is cheap.
pub(super) const WORTH_STASHING: usize = 8;

/// How many tokens of `prompt` a cache holding `held` can keep: their common prefix,
/// never all of the prompt (its last token is read again for its logits).
pub(super) fn shared_prefix(held: &[u32], prompt: &[u32]) -> usize {
    held.iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1))
}

/// Whether `common` tokens are a tenth of the prompt or more, as llama.cpp's server judges
/// a slot alike (`--slot-prompt-similarity` 0.1): a chat template's opening and default
/// system prompt before a short question are worth keeping, not before a long prompt.
pub(super) fn a_tenth_of(common: usize, prompt: &[u32]) -> bool {
    common * 10 >= prompt.len()
}

/// The stashed states and their bytes.
#[derive(Default)]
pub(super) struct Stash {
    entries: Vec<Stashed>,
    /// Bytes of all the entries' states.
    bytes: usize,
    /// At most this many bytes; 0 keeps nothing.
    limit: usize,
    /// Counts uses, for the order of eviction.
    uses: u64,
}

/// One sequence's state and the tokens it holds.
struct Stashed {
    tokens: Vec<u32>,
    state: SeqState,
    last_used: u64,
}

/// A stashed state that shares `common` tokens with a prompt.
pub(super) struct Found {
    index: usize,
    pub common: usize,
}

impl Stash {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Copies sequence `seq`'s state, holding `tokens`, into the stash, where it is
    /// worth it: the state of a longer prompt replaces those of its prefixes; old
    /// entries go until it fits. A state llama.cpp cannot copy is let go.
    pub(super) fn keep(&mut self, ctx: &LlamaContext<'_>, seq: i32, tokens: &[u32]) {
        if self.limit == 0 {
            return;
        }
        if self.entries.iter().any(|e| e.tokens.starts_with(tokens)) {
            // What it holds is here already (a restored state, or a longer one).
            return;
        }
        let state = match ctx.state_seq_get(seq, LlamaStateSeqFlags::empty()) {
            Ok(state) => state,
            Err(error) => {
                tracing::debug!(error = %error, "llama.cpp could not copy a sequence's state.");
                return;
            }
        };
        let size = state.byte_len();
        if size > self.limit {
            return;
        }
        self.entries.retain(|e| {
            let covered = tokens.starts_with(&e.tokens);
            if covered {
                self.bytes -= e.state.byte_len();
            }
            !covered
        });
        while self.bytes + size > self.limit {
            self.evict_oldest();
        }
        self.uses += 1;
        self.bytes += size;
        self.entries.push(Stashed {
            tokens: tokens.to_vec(),
            state,
            last_used: self.uses,
        });
    }

    /// The stashed state sharing the longest prefix with `prompt` (see
    /// [`shared_prefix`]), if it shares more than `beyond` tokens (what a free slot
    /// already holds) by at least [`WORTH_STASHING`], and [`a_tenth_of`] the prompt (a
    /// slot's rule: a chat template's opening alone is not worth a whole state's copy
    /// before a long prompt).
    pub(super) fn best_for(&self, prompt: &[u32], beyond: usize) -> Option<Found> {
        self.entries
            .iter()
            .enumerate()
            .map(|(index, e)| Found {
                index,
                common: shared_prefix(&e.tokens, prompt),
            })
            .filter(|f| f.common >= beyond + WORTH_STASHING && a_tenth_of(f.common, prompt))
            .max_by_key(|f| f.common)
    }

    /// Copies the state `found` names into sequence `seq` (whose cache is emptied
    /// first); the tokens it now holds, or `None` when llama.cpp refused it.
    pub(super) fn restore(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        seq: i32,
        found: &Found,
    ) -> Option<Vec<u32>> {
        let _ = ctx.clear_kv_cache_seq(u32::try_from(seq).ok(), None, None);
        let entry = &mut self.entries[found.index];
        if let Err(error) = ctx.state_seq_set(&entry.state, seq) {
            tracing::warn!(error = %error, "llama.cpp refused a stashed prompt state.");
            let _ = ctx.clear_kv_cache_seq(u32::try_from(seq).ok(), None, None);
            let gone = self.entries.swap_remove(found.index);
            self.bytes -= gone.state.byte_len();
            return None;
        }
        self.uses += 1;
        entry.last_used = self.uses;
        Some(entry.tokens.clone())
    }

    fn evict_oldest(&mut self) {
        let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
        else {
            return;
        };
        let gone = self.entries.swap_remove(oldest);
        self.bytes -= gone.state.byte_len();
    }

    /// States stashed, and their bytes (for the log).
    pub(super) fn size(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }
}

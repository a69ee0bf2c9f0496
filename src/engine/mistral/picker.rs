//! The logits processor through which the gateway, not mistral.rs, chooses each token.
//!
//! Where it runs: mistral.rs 0.8.1 copies each sequence's logits to host memory before
//! any processor sees them (`Sampler::sample`, mistralrs-core sampler.rs line 1033), on
//! CUDA as on CPU, and samples on the host after them. So the picker adds no transfer
//! between host and device; what it adds is host time per token, which
//! `cargo bench --bench picker` measures. Moving sampling onto the GPU would take
//! mistral.rs's unused on-device path (`sample_fast`, the same file) wired to a
//! per-request noise source: an upstream change, not one this gateway can make.

use std::sync::{Arc, Mutex};

use mistralrs::{CustomLogitsProcessor, DType, Tensor};

use crate::engine::grammar::Grammar;
use crate::engine::picking::TokenPicker;
pub use crate::engine::picking::{EndRules, Pick};
use crate::engine::Sampling;

/// The tokens the picker chose, drained by the forwarder as chunks arrive.
pub type PickedIds = Arc<Mutex<Vec<Pick>>>;

/// Picks the next token the gateway's way ([`TokenPicker`]: the grammar's and the
/// [`EndRules`]' masks, the seeded sampler keyed by seed and position), records it, and
/// masks every other token. It runs after mistral.rs has applied penalties.
pub struct Picker {
    core: TokenPicker,
    picked: PickedIds,
    /// Held, never read: mistral.rs owns the picker with the sequence, so what is parked
    /// here lives exactly as long as mistral.rs keeps the sequence (see
    /// [`super::ParkedReplicaSlot`]).
    _parked: Option<super::ParkedReplicaSlot>,
}

impl Picker {
    pub fn new(
        sampling: &Sampling,
        grammar: Option<Grammar>,
        top_logprobs: Option<u8>,
        ends: EndRules,
        picked: PickedIds,
    ) -> Self {
        Self {
            core: TokenPicker::new(sampling, grammar, top_logprobs, ends),
            picked,
            _parked: None,
        }
    }

    /// Keeps `parked` until mistral.rs drops the sequence.
    pub(super) fn parking(mut self, parked: super::ParkedReplicaSlot) -> Self {
        self._parked = Some(parked);
        self
    }

    fn record(&self, pick: Pick) {
        if let Ok(mut picks) = self.picked.lock() {
            picks.push(pick);
        }
    }
}

impl CustomLogitsProcessor for Picker {
    fn apply(&self, logits: &Tensor, context: &[u32]) -> mistralrs::Result<Tensor> {
        let mut values: Vec<f32> = logits.to_dtype(DType::F32)?.to_vec1()?;
        let pick = self
            .core
            .pick(&mut values, context.len())
            .map_err(grammar_failed)?;
        let (id, stops) = (pick.id, self.core.is_stop(pick.id));
        self.record(pick);
        // A stop token ends the sequence as EOS does: mistral.rs gets the EOS.
        let emitted = match (stops, self.core.ends.eos.first()) {
            (true, Some(&eos)) => eos,
            _ => id,
        };
        // Everything but the emitted token masked, in the buffer already copied. Greedy
        // steps too: mistral.rs may apply a model's own sampling defaults to a request
        // that sets none, so unmasked logits could be sampled rather than argmaxed.
        values.fill(f32::NEG_INFINITY);
        if let Some(slot) = values.get_mut(emitted as usize) {
            *slot = 0.0;
        }
        let n = values.len();
        Tensor::from_vec(values, n, logits.device())
    }
}

/// A grammar that cannot go on fails the sequence (an engine error for the client)
/// rather than let it produce JSON that breaks the schema.
fn grammar_failed(message: String) -> candle_core::Error {
    candle_core::Error::Msg(format!("structured output: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mistralrs::Device;

    fn apply(sampling: Sampling, logits: &[f32]) -> (u32, Vec<f32>) {
        apply_with(sampling, EndRules::default(), logits, &[1, 2, 3])
    }

    fn apply_with(
        sampling: Sampling,
        ends: EndRules,
        logits: &[f32],
        context: &[u32],
    ) -> (u32, Vec<f32>) {
        let picked = PickedIds::default();
        let picker = Picker::new(&sampling, None, None, ends, Arc::clone(&picked));
        let tensor = Tensor::from_slice(logits, logits.len(), &Device::Cpu).expect("tensor");
        let out = picker.apply(&tensor, context).expect("apply");
        let id = picked.lock().expect("ids")[0].id;
        (id, out.to_vec1().expect("values"))
    }

    fn only(id: u32, out: &[f32]) {
        for (i, v) in out.iter().enumerate() {
            let want = if i == id as usize {
                0.0
            } else {
                f32::NEG_INFINITY
            };
            assert_eq!(*v, want, "token {i}");
        }
    }

    #[test]
    fn greedy_picks_the_last_of_tied_maxima_and_masks_the_rest() {
        let (id, out) = apply(
            Sampling {
                temperature: Some(0.0),
                ..Sampling::default()
            },
            &[0.5, 2.0, -1.0, 2.0, 1.0],
        );
        assert_eq!(id, 3);
        only(id, &out);
    }

    #[test]
    fn a_sampled_pick_leaves_only_its_token_open() {
        let logits = [0.5, 2.0, -1.0, 2.0, 1.0];
        let (id, out) = apply(
            Sampling {
                temperature: Some(1.0),
                seed: Some(11),
                ..Sampling::default()
            },
            &logits,
        );
        only(id, &out);
    }

    #[test]
    fn end_rules_hold_back_eos_and_stop_tokens_as_vllm_does() {
        let greedy = Sampling {
            temperature: Some(0.0),
            ..Sampling::default()
        };
        // Token 0 is EOS and the likeliest; token 2 a stop token, next likeliest.
        let logits = [5.0, 1.0, 4.0, 2.0];
        let rules = |ignore_eos, min_tokens| EndRules {
            eos: Arc::from([0u32]),
            prompt_tokens: 3,
            ignore_eos,
            min_tokens,
            stop_token_ids: vec![2],
        };
        let pick = |ends, context: &[u32]| apply_with(greedy.clone(), ends, &logits, context).0;
        assert_eq!(pick(rules(false, 0), &[7, 7, 7]), 0, "EOS open by default");
        assert_eq!(
            pick(rules(true, 0), &[7, 7, 7]),
            2,
            "ignore_eos closes EOS only"
        );
        assert_eq!(
            pick(rules(false, 2), &[7, 7, 7, 9]),
            3,
            "one token in: EOS and the stop token wait for min_tokens"
        );
        assert_eq!(
            pick(rules(false, 2), &[7, 7, 7, 9, 9]),
            0,
            "two in: open again"
        );
        assert_eq!(
            pick(rules(true, 2), &[7, 7, 7, 9, 9]),
            2,
            "past min_tokens the stop token is open, EOS still ignored"
        );
        // Nothing but the closed tokens is open: the answer may end after all.
        let only_eos = [5.0, f32::NEG_INFINITY];
        let (id, _) = apply_with(greedy.clone(), rules(true, 0), &only_eos, &[7, 7, 7]);
        assert_eq!(id, 0);
        // A stop token is recorded as picked, and mistral.rs is handed the EOS instead.
        let (id, out) = apply_with(greedy, rules(true, 0), &logits, &[7, 7, 7]);
        assert_eq!(id, 2, "the stop token was the pick");
        assert_eq!(out[0], 0.0, "EOS is what the engine sees");
        assert_eq!(out[2], f32::NEG_INFINITY);
    }
}

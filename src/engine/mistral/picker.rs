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
use crate::engine::sampling::SeededSampler;
use crate::engine::Sampling;

/// Ids of the tokens the picker chose, drained by the forwarder as chunks arrive.
pub type PickedIds = Arc<Mutex<Vec<u32>>>;

/// Picks the next token with the request's [`SeededSampler`] (keyed by seed and
/// position, so concurrent neighbours cannot change it), records its id, and masks every
/// other token. It runs after mistral.rs has applied penalties. With a [`Grammar`] the
/// grammar's mask comes first, so only tokens that keep the JSON valid can be picked.
pub struct Picker {
    sampler: SeededSampler,
    grammar: Option<Grammar>,
    picked: PickedIds,
}

impl Picker {
    pub fn new(sampling: &Sampling, grammar: Option<Grammar>, picked: PickedIds) -> Self {
        let sampler = SeededSampler {
            // Without a seed the request is still sampled, from a fresh random stream.
            seed: sampling
                .seed
                .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0),
            // OpenAI's defaults: temperature 1, top_p 1.
            temperature: sampling.temperature.unwrap_or(1.0),
            top_p: sampling.top_p.unwrap_or(1.0),
            top_k: sampling.top_k,
            min_p: sampling.min_p,
        };
        Self {
            sampler,
            grammar,
            picked,
        }
    }

    fn record(&self, id: u32) {
        if let Ok(mut ids) = self.picked.lock() {
            ids.push(id);
        }
    }
}

impl CustomLogitsProcessor for Picker {
    fn apply(&self, logits: &Tensor, context: &[u32]) -> mistralrs::Result<Tensor> {
        let mut values: Vec<f32> = logits.to_dtype(DType::F32)?.to_vec1()?;
        if let Some(grammar) = &self.grammar {
            grammar.mask(&mut values).map_err(grammar_failed)?;
        }
        let id = self.sampler.pick(&values, context.len() as u64);
        if let Some(grammar) = &self.grammar {
            grammar.consume(id).map_err(grammar_failed)?;
        }
        self.record(id);
        // Everything but the picked token masked, in the buffer already copied. Greedy
        // steps too: mistral.rs may apply a model's own sampling defaults to a request
        // that sets none, so unmasked logits could be sampled rather than argmaxed.
        values.fill(f32::NEG_INFINITY);
        if let Some(slot) = values.get_mut(id as usize) {
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
        let picked = PickedIds::default();
        let picker = Picker::new(&sampling, None, Arc::clone(&picked));
        let tensor = Tensor::from_slice(logits, logits.len(), &Device::Cpu).expect("tensor");
        let out = picker.apply(&tensor, &[1, 2, 3]).expect("apply");
        let id = picked.lock().expect("ids")[0];
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
}

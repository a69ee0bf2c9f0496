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

/// A token the picker chose, with its log-probability and (when asked) the likeliest
/// alternatives, by id.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
    /// When it was picked: the token's production, on mistral.rs's engine thread, before
    /// the gateway's runtime gets to it (which a starved machine can delay by a whole
    /// answer).
    pub at: std::time::Instant,
}

/// The tokens the picker chose, drained by the forwarder as chunks arrive.
pub type PickedIds = Arc<Mutex<Vec<Pick>>>;

/// Picks the next token with the request's [`SeededSampler`] (keyed by seed and
/// position, so concurrent neighbours cannot change it), records its id, and masks every
/// other token. It runs after mistral.rs has applied penalties. With a [`Grammar`] the
/// grammar's mask comes first, so only tokens that keep the JSON valid can be picked.
/// The [`EndRules`] mask the tokens that would end the answer too early.
pub struct Picker {
    sampler: SeededSampler,
    grammar: Option<Grammar>,
    /// How many alternatives to report with each pick.
    top_logprobs: usize,
    ends: EndRules,
    picked: PickedIds,
}

/// When the answer may end, from vLLM's `ignore_eos`, `min_tokens` and `stop_token_ids`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndRules {
    /// The model's end-of-sequence tokens, as mistral.rs stops on them.
    pub eos: Arc<[u32]>,
    /// Tokens of the prompt: the picker sees the whole sequence, prompt first.
    pub prompt_tokens: usize,
    /// Never pick an end-of-sequence token.
    pub ignore_eos: bool,
    /// Pick neither an end-of-sequence nor a stop token before this many completion tokens.
    pub min_tokens: usize,
    /// Tokens that end the answer, their text left out: when the picker picks one, it
    /// records it and hands mistral.rs the end-of-sequence token in its place, so the
    /// sequence ends as at EOS. (mistral.rs's own `StopTokens::Ids` refuses any id that is
    /// a prefix of other tokens, which most word tokens are: `add_request.rs` line 329.)
    pub stop_token_ids: Vec<u32>,
}

impl EndRules {
    /// The tokens closed at this step, when `generated` completion tokens came before.
    fn closed(&self, generated: usize) -> impl Iterator<Item = u32> + '_ {
        let early = generated < self.min_tokens;
        let eos = (self.ignore_eos || early).then_some(self.eos.iter());
        let stops = early.then_some(self.stop_token_ids.iter());
        eos.into_iter()
            .flatten()
            .chain(stops.into_iter().flatten())
            .copied()
    }

    /// Masks the closed tokens in `values`, unless nothing else is left open (a grammar
    /// that can only end): an answer that cannot go on ends rather than fails.
    fn mask(&self, values: &mut [f32], generated: usize) {
        let closed: Vec<(usize, f32)> = self
            .closed(generated)
            .filter_map(|id| {
                let i = id as usize;
                values.get(i).map(|&v| (i, v))
            })
            .collect();
        if closed.is_empty() {
            return;
        }
        for &(i, _) in &closed {
            values[i] = f32::NEG_INFINITY;
        }
        if !values.iter().any(|v| v.is_finite()) {
            for (i, v) in closed {
                values[i] = v;
            }
        }
    }
}

impl Picker {
    pub fn new(
        sampling: &Sampling,
        grammar: Option<Grammar>,
        top_logprobs: Option<u8>,
        ends: EndRules,
        picked: PickedIds,
    ) -> Self {
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
            top_logprobs: usize::from(top_logprobs.unwrap_or(0)),
            ends,
            picked,
        }
    }

    fn record(&self, pick: Pick) {
        if let Ok(mut picks) = self.picked.lock() {
            picks.push(pick);
        }
    }
}

/// The picked token's log-probability under `logits` at temperature 1, and the `top`
/// likeliest tokens' (ties by lower id).
fn log_probabilities(logits: &[f32], id: u32, top: usize) -> Pick {
    let log_norm = log_sum_exp(logits);
    let lp = |l: f32| (f64::from(l) - log_norm) as f32;
    let mut best = Vec::new();
    if top > 0 {
        let mut ids: Vec<usize> = (0..logits.len())
            .filter(|&i| logits[i].is_finite())
            .collect();
        let order = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        if top < ids.len() {
            ids.select_nth_unstable_by(top, order);
            ids.truncate(top);
        }
        ids.sort_unstable_by(order);
        best = ids.into_iter().map(|i| (i as u32, lp(logits[i]))).collect();
    }
    Pick {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&l| lp(l)),
        top: best,
        at: std::time::Instant::now(),
    }
}

impl CustomLogitsProcessor for Picker {
    fn apply(&self, logits: &Tensor, context: &[u32]) -> mistralrs::Result<Tensor> {
        let mut values: Vec<f32> = logits.to_dtype(DType::F32)?.to_vec1()?;
        if let Some(grammar) = &self.grammar {
            grammar.mask(&mut values).map_err(grammar_failed)?;
        }
        let generated = context.len().saturating_sub(self.ends.prompt_tokens);
        self.ends.mask(&mut values, generated);
        let id = self.sampler.pick(&values, context.len() as u64);
        let stops = self.ends.stop_token_ids.contains(&id);
        if let (Some(grammar), false) = (&self.grammar, stops) {
            grammar.consume(id).map_err(grammar_failed)?;
        }
        self.record(log_probabilities(&values, id, self.top_logprobs));
        // A stop token ends the sequence as EOS does: mistral.rs gets the EOS.
        let emitted = match (stops, self.ends.eos.first()) {
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

/// ln(sum(exp(logits))), on every token's path: eight lanes at a time with `wide`'s
/// vectorised exp (libm's scalar exp made this 4x the cost of the whole greedy pick).
/// Terms more than 87 below the maximum (and masked tokens) count as 0; the sum is f32,
/// which leaves a relative error near 1e-6 on 49k terms, plenty for a log-probability.
fn log_sum_exp(logits: &[f32]) -> f64 {
    use wide::f32x8;
    let chunks = logits.chunks_exact(8);
    let rest = chunks.remainder();
    let lanes = |c: &[f32]| f32x8::from(<[f32; 8]>::try_from(c).unwrap_or([f32::NEG_INFINITY; 8]));
    let max = chunks
        .clone()
        .fold(f32x8::splat(f32::NEG_INFINITY), |m, c| m.max(lanes(c)))
        .to_array()
        .into_iter()
        .fold(f32::NEG_INFINITY, f32::max)
        .max(rest.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let shift = f32x8::splat(max);
    let sum = chunks
        .fold(f32x8::ZERO, |acc, c| acc + (lanes(c) - shift).exp())
        .reduce_add()
        + rest.iter().map(|&l| (l - max).exp()).sum::<f32>();
    f64::from(max) + f64::from(sum).ln()
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

    #[test]
    fn log_sum_exp_matches_the_plain_sum() {
        let logits: Vec<f32> = (0..49_157)
            .map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 10.0)
            .chain([f32::NEG_INFINITY, -200.0])
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let plain = f64::from(max)
            + logits
                .iter()
                .map(|&l| f64::from(l - max).exp())
                .sum::<f64>()
                .ln();
        assert!(
            (log_sum_exp(&logits) - plain).abs() < 1e-5,
            "{} {plain}",
            log_sum_exp(&logits)
        );
        assert!((log_sum_exp(&[0.0, 0.0, 0.0]) - 3f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn each_pick_carries_its_log_probability_and_the_top_alternatives() {
        // Probabilities 0.5, 0.25, 0.25 (and 0 for the masked one).
        let logits = [2f32.ln(), 0.0, 0.0, f32::NEG_INFINITY];
        let pick = log_probabilities(&logits, 1, 2);
        assert!((pick.logprob - 0.25f32.ln()).abs() < 1e-6, "{pick:?}");
        assert_eq!(pick.top.len(), 2);
        assert_eq!(pick.top[0].0, 0);
        assert!((pick.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(pick.top[1].0, 1, "ties by lower id");
        assert!(log_probabilities(&logits, 1, 0).top.is_empty());
        assert_eq!(
            log_probabilities(&logits, 3, 9).top.len(),
            3,
            "never a masked token"
        );
    }
}

//! Choosing each token the gateway's way, whatever engine computes the logits: the
//! structured-output mask, the end rules of `ignore_eos`, `min_tokens` and
//! `stop_token_ids`, the seeded sampler ([`super::sampling`]), and each pick's
//! log-probability with its likeliest alternatives. mistral.rs runs it as a logits
//! processor (`mistral::picker`); the llama.cpp engine calls it on each sequence's
//! logits. Penalties come before it ([`penalize`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::grammar::Grammar;
use super::sampling::SeededSampler;
use super::Sampling;

/// A token the picker chose, with its log-probability and (when asked) the likeliest
/// alternatives, by id.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub id: u32,
    /// Its log-probability under the model (temperature 1): the confidence figures'.
    pub logprob: f32,
    /// The alternatives, under the model; with `post_sampling_probs`, in the
    /// distribution the token was drawn from.
    pub top: Vec<(u32, f32)>,
    /// With `post_sampling_probs`: its log-probability in the distribution it was drawn
    /// from (after the temperature and top_k, top_p, min_p; 0 when greedy).
    pub sampled: Option<f32>,
    /// When it was picked: the token's production, on mistral.rs's engine thread, before
    /// the gateway's runtime gets to it (which a starved machine can delay by a whole
    /// answer).
    pub at: std::time::Instant,
    /// It ends the answer (an end-of-sequence or stop token): counted as generated, but
    /// no part of the content, so not in the answer's ids or log-probabilities.
    pub ends: bool,
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
    /// The rules a request's `sampling` sets, for a model ending on `eos`, after a
    /// prompt of `prompt_tokens`.
    pub fn of(sampling: &crate::engine::Sampling, eos: &Arc<[u32]>, prompt_tokens: usize) -> Self {
        Self {
            eos: Arc::clone(eos),
            prompt_tokens,
            ignore_eos: sampling.ignore_eos,
            min_tokens: sampling.min_tokens as usize,
            stop_token_ids: sampling.stop_token_ids.clone(),
        }
    }

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
    pub fn mask(&self, values: &mut [f32], generated: usize) {
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

/// The gateway's token choice for one sequence.
#[derive(Debug)]
pub struct TokenPicker {
    sampler: SeededSampler,
    /// `logit_bias`, added before everything else.
    bias: Vec<(u32, f32)>,
    grammar: Option<Grammar>,
    /// How many alternatives to report with each pick.
    top_logprobs: usize,
    /// llama.cpp's `post_sampling_probs`: report probabilities in the distribution each
    /// token is drawn from, not the model's.
    post_sampling: bool,
    pub ends: EndRules,
}

impl TokenPicker {
    pub fn new(
        sampling: &Sampling,
        grammar: Option<Grammar>,
        top_logprobs: Option<u8>,
        ends: EndRules,
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
            bias: sampling.logit_bias.clone(),
            grammar,
            top_logprobs: usize::from(top_logprobs.unwrap_or(0)),
            // Only shown with the log-probabilities: not computed for nothing.
            post_sampling: sampling.post_sampling_probs && top_logprobs.is_some(),
            ends,
        }
    }

    /// The next token of a sequence `length` tokens long (its prompt included), from
    /// the model's `values` after penalties: the grammar's and the end rules' masks
    /// first, then the seeded pick (keyed by seed and position, so neighbours in a batch
    /// cannot change it), which the grammar then consumes (a stop token ends the answer
    /// instead). `values` is left masked. Errors: a grammar that cannot go on.
    pub fn pick(&self, values: &mut [f32], length: usize) -> Result<Pick, String> {
        // An id past the vocabulary biases nothing, as in vLLM's processor.
        for &(id, bias) in &self.bias {
            if let Some(value) = values.get_mut(id as usize) {
                *value += bias;
            }
        }
        if let Some(grammar) = &self.grammar {
            grammar.mask(values)?;
        }
        let generated = length.saturating_sub(self.ends.prompt_tokens);
        self.ends.mask(values, generated);
        let id = self.sampler.pick(values, length as u64);
        if let (Some(grammar), false) = (&self.grammar, self.is_stop(id)) {
            grammar.consume(id)?;
        }
        // The alternatives come from one distribution: the model's, or the drawn one.
        let model_top = if self.post_sampling {
            0
        } else {
            self.top_logprobs
        };
        let mut pick = log_probabilities(values, id, model_top);
        pick.ends = self.is_stop(id) || self.ends.eos.contains(&id);
        if self.post_sampling {
            let (p, top) = self.sampler.probabilities(values, id, self.top_logprobs);
            pick.sampled = Some(p.ln() as f32);
            pick.top = top.into_iter().map(|(id, p)| (id, p.ln() as f32)).collect();
        }
        Ok(pick)
    }

    /// Whether `id` is one of the request's `stop_token_ids`.
    pub fn is_stop(&self, id: u32) -> bool {
        self.ends.stop_token_ids.contains(&id)
    }
}

/// The OpenAI penalties and the CTRL one, as vLLM applies them, on the logits of a
/// sequence whose answer so far is `answer` (and whose prompt is `prompt`, which only the
/// repetition penalty looks at): a token's logit loses `frequency_penalty` per time it
/// occurs in the answer and `presence_penalty` once if it does; a token in the prompt or
/// the answer has a positive logit divided, a negative one multiplied, by
/// `repetition_penalty`. mistral.rs applies these itself before its logits processor.
pub fn penalize(values: &mut [f32], prompt: &[u32], answer: &[u32], sampling: &Sampling) {
    let frequency = sampling.frequency_penalty.unwrap_or(0.0);
    let presence = sampling.presence_penalty.unwrap_or(0.0);
    if frequency != 0.0 || presence != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &id in answer {
            *counts.entry(id).or_default() += 1;
        }
        for (id, count) in counts {
            if let Some(v) = values.get_mut(id as usize) {
                *v -= frequency * count as f32 + presence;
            }
        }
    }
    if let Some(penalty) = sampling
        .repetition_penalty
        .filter(|p| *p != 1.0 && *p > 0.0)
    {
        let mut seen: Vec<u32> = prompt.iter().chain(answer).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for id in seen {
            if let Some(v) = values.get_mut(id as usize) {
                *v = if *v > 0.0 { *v / penalty } else { *v * penalty };
            }
        }
    }
}

/// The picked token's log-probability under `logits` at temperature 1, and the `top`
/// likeliest tokens' (ties by lower id).
pub fn log_probabilities(logits: &[f32], id: u32, top: usize) -> Pick {
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
        sampled: None,
        at: std::time::Instant::now(),
        ends: false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_as_vllm_applies_them() {
        let sampling = Sampling {
            frequency_penalty: Some(0.5),
            presence_penalty: Some(0.25),
            repetition_penalty: Some(2.0),
            ..Sampling::default()
        };
        let mut values = [1.0, 4.0, -1.0, 3.0];
        // Token 1 twice in the answer, token 2 in the prompt only.
        penalize(&mut values, &[2], &[1, 1], &sampling);
        assert_eq!(values[0], 1.0, "untouched");
        assert_eq!(values[1], (4.0 - 2.0 * 0.5 - 0.25) / 2.0);
        assert_eq!(values[2], -2.0, "a negative logit is multiplied");
        assert_eq!(values[3], 3.0);
        let mut plain = [1.0, 2.0];
        penalize(&mut plain, &[0], &[1], &Sampling::default());
        assert_eq!(plain, [1.0, 2.0], "no penalties: nothing moves");
    }

    #[test]
    fn logit_bias_moves_the_greedy_pick_and_can_ban_a_token() {
        let picker = |bias: Vec<(u32, f32)>| {
            let sampling = Sampling {
                temperature: Some(0.0),
                logit_bias: bias,
                ..Sampling::default()
            };
            TokenPicker::new(&sampling, None, None, EndRules::default())
        };
        let logits = [1.0, 3.0, 2.0];
        assert_eq!(
            picker(vec![])
                .pick(&mut logits.clone(), 0)
                .expect("pick")
                .id,
            1
        );
        assert_eq!(
            picker(vec![(0, 100.0)])
                .pick(&mut logits.clone(), 0)
                .expect("pick")
                .id,
            0
        );
        assert_eq!(
            picker(vec![(1, -100.0)])
                .pick(&mut logits.clone(), 0)
                .expect("pick")
                .id,
            2
        );
        // An id past the vocabulary biases nothing.
        assert_eq!(
            picker(vec![(9, 100.0)])
                .pick(&mut logits.clone(), 0)
                .expect("pick")
                .id,
            1
        );
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

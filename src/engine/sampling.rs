//! Reproducible per-request sampling.
//!
//! mistral.rs seeds one engine-wide RNG, so a request's `seed` alone cannot reproduce its
//! output once other requests share the engine. Instead the gateway picks each token
//! itself from the (already penalised) logits, with a ChaCha stream keyed by
//! `(seed, position)`: the draw for position p depends on nothing but the seed, p and the
//! logits, so the same request with the same seed on the same model gives the same text,
//! whatever runs beside it and in whatever order.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Temperatures at or below this are greedy, as in mistral.rs.
const GREEDY_BELOW: f64 = 1e-7;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeededSampler {
    pub seed: u64,
    pub temperature: f64,
    pub top_p: f64,
}

impl SeededSampler {
    /// Whether every pick is the argmax (temperature 0): no draw, no probabilities.
    fn is_greedy(&self) -> bool {
        self.temperature <= GREEDY_BELOW
    }

    /// The token to emit at `position` (prompt length + tokens generated so far).
    pub fn pick(&self, logits: &[f32], position: u64) -> u32 {
        if logits.is_empty() {
            return 0;
        }
        if self.is_greedy() {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / self.temperature;
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| (((l - max) as f64) * inv_t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let draw = self.uniform(position);
        if self.top_p >= 1.0 {
            return pick_from(weights.iter().copied().enumerate(), draw * total)
                .unwrap_or_else(|| argmax(logits));
        }
        let nucleus = self.nucleus(&weights, total);
        let mass: f64 = nucleus.iter().map(|&i| weights[i]).sum();
        pick_from(nucleus.iter().map(|&i| (i, weights[i])), draw * mass)
            .unwrap_or_else(|| argmax(logits))
    }

    /// Indices of the top-p nucleus, most probable first (ties by lower index). A token
    /// whose probability is under `(1 - top_p) / vocab` cannot be in the nucleus, so
    /// only the others are sorted.
    fn nucleus(&self, weights: &[f64], total: f64) -> Vec<usize> {
        let floor = (1.0 - self.top_p) / weights.len() as f64 * total;
        let mut candidates: Vec<usize> = (0..weights.len())
            .filter(|&i| weights[i] >= floor)
            .collect();
        candidates.sort_unstable_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        let mut acc = 0.0;
        let keep = candidates
            .iter()
            .position(|&i| {
                acc += weights[i];
                acc >= self.top_p * total
            })
            .map_or(candidates.len(), |p| p + 1);
        candidates.truncate(keep);
        candidates
    }

    /// A uniform draw in [0, 1) from the ChaCha stream of `position` under `seed`.
    fn uniform(&self, position: u64) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(position);
        (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The index where the running sum of weights first exceeds `target`.
fn pick_from(weights: impl Iterator<Item = (usize, f64)>, target: f64) -> Option<u32> {
    let mut acc = 0.0;
    let mut last = None;
    for (i, w) in weights {
        acc += w;
        last = Some(i as u32);
        if target < acc {
            return last;
        }
    }
    last
}

/// The index of the largest logit; on a tie the last one, as mistral.rs 0.8.1's own
/// greedy sampler decides (`argmax_f32`, mistralrs-core sampler.rs line 353).
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))
        .map_or(0, |(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(seed: u64, temperature: f64, top_p: f64) -> SeededSampler {
        SeededSampler {
            seed,
            temperature,
            top_p,
        }
    }

    #[test]
    fn greedy_is_argmax_and_ties_go_to_the_last_as_in_mistral_rs() {
        assert_eq!(sampler(1, 0.0, 1.0).pick(&[0.1, 3.0, 2.9], 5), 1);
        assert_eq!(argmax(&[3.0, 1.0, 3.0, 2.0]), 2);
    }

    #[test]
    fn same_seed_and_position_same_token_and_seeds_differ() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 101) as f32 / 25.0)
            .collect();
        let a: Vec<u32> = (0..50)
            .map(|p| sampler(42, 1.0, 1.0).pick(&logits, p))
            .collect();
        let b: Vec<u32> = (0..50)
            .map(|p| sampler(42, 1.0, 1.0).pick(&logits, p))
            .collect();
        let c: Vec<u32> = (0..50)
            .map(|p| sampler(43, 1.0, 1.0).pick(&logits, p))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn top_p_keeps_to_the_nucleus() {
        // Probabilities ~ 0.64, 0.24, 0.09, 0.03: top_p 0.5 leaves only token 0.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        for p in 0..200 {
            assert_eq!(sampler(7, 1.0, 0.5).pick(&logits, p), 0);
        }
        let picks: std::collections::HashSet<u32> = (0..400)
            .map(|p| sampler(7, 1.0, 0.8).pick(&logits, p))
            .collect();
        assert_eq!(picks, [0, 1].into_iter().collect());
    }

    #[test]
    fn frequencies_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 0.25 / 0.75
        let ones = (0..4000)
            .filter(|&p| sampler(9, 1.0, 1.0).pick(&logits, p) == 1)
            .count();
        assert!((2800..3200).contains(&ones), "{ones}");
    }
}

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
    /// Keep only the `top_k` most likely tokens.
    pub top_k: Option<u32>,
    /// Keep only tokens at least `min_p` times as likely as the most likely one.
    pub min_p: Option<f64>,
}

impl SeededSampler {
    /// Whether every pick is the argmax (temperature 0): no draw, no probabilities.
    fn is_greedy(&self) -> bool {
        self.temperature <= GREEDY_BELOW
    }

    /// Each token's weight at the temperature, relative to the likeliest (which has 1).
    fn weights(&self, logits: &[f32]) -> Vec<f64> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / self.temperature;
        logits
            .iter()
            .map(|&l| (((l - max) as f64) * inv_t).exp())
            .collect()
    }

    /// The token to emit at `position` (prompt length + tokens generated so far).
    pub fn pick(&self, logits: &[f32], position: u64) -> u32 {
        if logits.is_empty() {
            return 0;
        }
        if self.is_greedy() {
            return argmax(logits);
        }
        let weights = self.weights(logits);
        let draw = self.uniform(position);
        if self.top_k.is_some() || self.min_p.is_some() {
            let kept = self.filtered(&weights);
            return pick_from(
                kept.iter().map(|&i| (i, weights[i])),
                draw * mass(&kept, &weights),
            )
            .unwrap_or_else(|| argmax(logits));
        }
        let total: f64 = weights.iter().sum();
        if self.top_p >= 1.0 {
            return pick_from(weights.iter().copied().enumerate(), draw * total)
                .unwrap_or_else(|| argmax(logits));
        }
        let nucleus = self.nucleus(&weights, total);
        let mass: f64 = nucleus.iter().map(|&i| weights[i]).sum();
        pick_from(nucleus.iter().map(|&i| (i, weights[i])), draw * mass)
            .unwrap_or_else(|| argmax(logits))
    }

    /// The distribution a token is drawn from at these logits (after the temperature and
    /// min_p, top_k and top_p, as [`Self::pick`] draws): the probability of `picked` in
    /// it, and its `top` likeliest tokens' (ties by lower index), none at 0. Greedy: the
    /// argmax alone, at 1. llama.cpp's `post_sampling_probs`.
    pub fn probabilities(&self, logits: &[f32], picked: u32, top: usize) -> (f64, Vec<(u32, f64)>) {
        if logits.is_empty() || self.is_greedy() {
            let best = argmax(logits);
            let listed = if top > 0 {
                vec![(best, 1.0)]
            } else {
                Vec::new()
            };
            return (if picked == best { 1.0 } else { 0.0 }, listed);
        }
        let weights = self.weights(logits);
        // The tokens the draw takes from (`None`: all of them), most probable first.
        let drawn = if self.top_k.is_some() || self.min_p.is_some() {
            Some(self.filtered(&weights))
        } else if self.top_p < 1.0 {
            Some(self.nucleus(&weights, weights.iter().sum()))
        } else {
            None
        };
        let filtered = drawn.is_some();
        let (kept, total) = match drawn {
            Some(kept) => {
                let total = mass(&kept, &weights);
                (kept, total)
            }
            None => {
                // Every token may be drawn: only the top ones are sorted.
                let by_weight =
                    |a: &usize, b: &usize| weights[*b].total_cmp(&weights[*a]).then(a.cmp(b));
                let mut best: Vec<usize> =
                    (0..weights.len()).filter(|&i| weights[i] > 0.0).collect();
                if top < best.len() {
                    best.select_nth_unstable_by(top, by_weight);
                    best.truncate(top);
                }
                best.sort_unstable_by(by_weight);
                (best, weights.iter().sum())
            }
        };
        let picked = picked as usize;
        let p = if total > 0.0 && (!filtered || kept.contains(&picked)) {
            weights.get(picked).map_or(0.0, |w| w / total)
        } else {
            0.0
        };
        let listed = kept
            .iter()
            .take(top)
            .map(|&i| (i as u32, weights[i] / total))
            .filter(|&(_, p)| p > 0.0)
            .collect();
        (p, listed)
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
        candidates.truncate(nucleus_len(&candidates, weights, self.top_p * total));
        candidates
    }

    /// The tokens min_p, top_k and top_p leave, in that order (as vLLM applies them: each
    /// on what the one before left), most probable first, ties by lower index.
    fn filtered(&self, weights: &[f64]) -> Vec<usize> {
        // The most likely token has weight 1 (its logit is the maximum).
        let floor = self.min_p.unwrap_or(0.0);
        let mut kept: Vec<usize> = (0..weights.len())
            .filter(|&i| weights[i] > 0.0 && weights[i] >= floor)
            .collect();
        let by_weight = |a: &usize, b: &usize| weights[*b].total_cmp(&weights[*a]).then(a.cmp(b));
        if let Some(k) = self.top_k.map(|k| k as usize).filter(|&k| k < kept.len()) {
            kept.select_nth_unstable_by(k, by_weight);
            kept.truncate(k);
        }
        kept.sort_unstable_by(by_weight);
        if self.top_p < 1.0 {
            let total = mass(&kept, weights);
            kept.truncate(nucleus_len(&kept, weights, self.top_p * total));
        }
        kept
    }

    /// A uniform draw in [0, 1) from the ChaCha stream of `position` under `seed`.
    fn uniform(&self, position: u64) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(position);
        (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

fn mass(indices: &[usize], weights: &[f64]) -> f64 {
    indices.iter().map(|&i| weights[i]).sum()
}

/// How many of `sorted` (most probable first) it takes for their weights to reach
/// `target`: top-p's nucleus; all of them when they never do.
fn nucleus_len(sorted: &[usize], weights: &[f64], target: f64) -> usize {
    let mut acc = 0.0;
    sorted
        .iter()
        .position(|&i| {
            acc += weights[i];
            acc >= target
        })
        .map_or(sorted.len(), |p| p + 1)
}

/// The index where the running sum of weights first exceeds `target`.
fn pick_from(weights: impl Iterator<Item = (usize, f64)>, target: f64) -> Option<u32> {
    let mut acc = 0.0;
    let mut last = None;
    for (i, w) in weights {
        // A masked token (weight 0) is never picked, not even by rounding at the end.
        if w <= 0.0 {
            continue;
        }
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
            top_k: None,
            min_p: None,
        }
    }

    #[test]
    fn top_k_and_min_p_keep_only_the_likely_tokens() {
        // Probabilities ~ 0.47, 0.17, 0.17, 0.06, 0.02 ... at temperature 1.
        let logits = [3.0f32, 2.0, 2.0, 1.0, 0.0, -1.0];
        let picks = |s: SeededSampler| -> std::collections::BTreeSet<u32> {
            (0..400).map(|p| s.pick(&logits, p)).collect()
        };
        let top_2 = SeededSampler {
            top_k: Some(2),
            ..sampler(5, 1.0, 1.0)
        };
        assert_eq!(picks(top_2), [0, 1].into(), "ties go to the lower index");
        let min_p = SeededSampler {
            min_p: Some(0.3),
            ..sampler(5, 1.0, 1.0)
        };
        // 0.37 and 0.37 of the top token's probability pass, 0.14 does not.
        assert_eq!(picks(min_p), [0, 1, 2].into());
        let both = SeededSampler {
            top_k: Some(3),
            top_p: 0.7,
            ..sampler(5, 1.0, 1.0)
        };
        assert_eq!(picks(both), [0, 1].into(), "top_p on what top_k left");
        let a: Vec<u32> = (0..50).map(|p| top_2.pick(&logits, p)).collect();
        let b: Vec<u32> = (0..50).map(|p| top_2.pick(&logits, p)).collect();
        assert_eq!(a, b, "seeded");
    }

    #[test]
    fn post_sampling_probabilities_are_those_the_draw_uses() {
        let logits = [3.0f32, 2.0, 2.0, 1.0, f32::NEG_INFINITY];
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // Unfiltered at temperature 1: the softmax, none of the masked token.
        let (p, top) = sampler(1, 1.0, 1.0).probabilities(&logits, 1, 9);
        let e = |l: f64| l.exp();
        let total = e(3.0) + 2.0 * e(2.0) + e(1.0);
        assert!(close(p, e(2.0) / total), "{p}");
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(close(top.iter().map(|t| t.1).sum(), 1.0));
        // top_k 2: the two kept share everything; a token cut off has 0.
        let top_2 = SeededSampler {
            top_k: Some(2),
            ..sampler(1, 1.0, 1.0)
        };
        let (p, top) = top_2.probabilities(&logits, 0, 5);
        assert!(close(p, e(3.0) / (e(3.0) + e(2.0))), "{p}");
        assert_eq!(top.len(), 2);
        assert_eq!(top_2.probabilities(&logits, 3, 5).0, 0.0);
        // A cooler temperature sharpens it; greedy is the argmax at 1.
        let (cool, _) = sampler(1, 0.5, 1.0).probabilities(&logits, 0, 0);
        assert!(cool > e(3.0) / total);
        assert_eq!(
            sampler(1, 0.0, 1.0).probabilities(&logits, 0, 3),
            (1.0, vec![(0, 1.0)])
        );
        // top_p keeps the nucleus: 0.53 + 0.20 reach 0.6.
        let (p, top) = sampler(1, 1.0, 0.6).probabilities(&logits, 3, 5);
        assert_eq!((p, top.len()), (0.0, 2));
        // Every token the draw takes is among those it reports.
        for position in 0..200 {
            let picked = top_2.pick(&logits, position);
            assert!(top_2.probabilities(&logits, picked, 0).0 > 0.0);
        }
    }

    #[test]
    fn masked_tokens_are_never_picked() {
        let mut logits = vec![1.0f32; 8];
        for masked in [0, 3, 5] {
            logits[masked] = f32::NEG_INFINITY;
        }
        for s in [
            sampler(9, 1.0, 1.0),
            sampler(9, 0.7, 0.8),
            SeededSampler {
                top_k: Some(6),
                ..sampler(9, 1.0, 1.0)
            },
        ] {
            for p in 0..200 {
                let id = s.pick(&logits, p);
                assert!(![0, 3, 5].contains(&id), "{id} at {p}");
            }
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

//! Repetition rate: seq-rep-n of Welleck et al., "Neural Text Generation with Unlikelihood
//! Training" (ICLR 2020): `1 - unique n-grams / total n-grams` over the completion's token
//! ids, 0 when there are fewer than n tokens.
//!
//! [`RepetitionTracker`] updates it as each token arrives, in O(n) = O(1) work per token
//! for a fixed n (one hash of the newest n-gram), with no re-scan. It also keeps the same
//! figure over a sliding window of the last W tokens for the degeneration guard.

use std::collections::{HashMap, HashSet};

/// foldhash, not SipHash: an n-gram is hashed for every token of every answer, and
/// SipHash's resistance to chosen keys buys nothing a seeded foldhash does not here.
type Hasher = foldhash::fast::RandomState;

/// Incremental seq-rep-n over a growing token sequence.
#[derive(Debug, Clone)]
pub struct RepetitionTracker {
    n: usize,
    tokens: Vec<u32>,
    seen: HashSet<Box<[u32]>, Hasher>,
    window: Option<Window>,
}

/// N-gram counts of the n-grams that lie wholly within the last `size` tokens.
#[derive(Debug, Clone)]
struct Window {
    size: usize,
    counts: HashMap<Box<[u32]>, u32, Hasher>,
    total: usize,
}

impl RepetitionTracker {
    /// Tracks seq-rep-`n` over the whole sequence. `n` must be at least 1.
    pub fn new(n: usize) -> Self {
        Self {
            n: n.max(1),
            tokens: Vec::new(),
            seen: HashSet::default(),
            window: None,
        }
    }

    /// Also tracks seq-rep-n over the last `size` tokens.
    /// The same tracker with nothing seen yet: an answer started over.
    pub fn restarted(&self) -> Self {
        let fresh = Self::new(self.n);
        match &self.window {
            Some(window) => fresh.with_window(window.size),
            None => fresh,
        }
    }

    pub fn with_window(mut self, size: usize) -> Self {
        self.window = Some(Window {
            size: size.max(self.n),
            counts: HashMap::default(),
            total: 0,
        });
        self
    }

    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
        let len = self.tokens.len();
        if len < self.n {
            return;
        }
        let gram = &self.tokens[len - self.n..];
        if !self.seen.contains(gram) {
            self.seen.insert(gram.into());
        }
        if let Some(window) = &mut self.window {
            // The n-gram is copied only the first time the window holds it.
            match window.counts.get_mut(gram) {
                Some(count) => *count += 1,
                None => {
                    window.counts.insert(gram.into(), 1);
                }
            }
            window.total += 1;
            // The n-gram that starts just before the window leaves it.
            if len > window.size {
                let start = len - window.size - 1;
                let old = &self.tokens[start..start + self.n];
                if let Some(count) = window.counts.get_mut(old) {
                    *count -= 1;
                    if *count == 0 {
                        window.counts.remove(old);
                    }
                }
                window.total -= 1;
            }
        }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// seq-rep-n of everything pushed so far.
    pub fn rate(&self) -> f64 {
        let total = self.tokens.len().saturating_sub(self.n - 1);
        if self.tokens.len() < self.n {
            return 0.0;
        }
        1.0 - self.seen.len() as f64 / total as f64
    }

    /// seq-rep-n over the window, once the window is full; `None` before that or with
    /// no window configured.
    pub fn window_rate(&self) -> Option<f64> {
        let window = self.window.as_ref()?;
        if self.tokens.len() < window.size {
            return None;
        }
        Some(1.0 - window.counts.len() as f64 / window.total as f64)
    }
}

/// seq-rep-n computed in one pass over a whole sequence; the reference for the tracker.
pub fn seq_rep_n(tokens: &[u32], n: usize) -> f64 {
    if n == 0 || tokens.len() < n {
        return 0.0;
    }
    let grams: Vec<&[u32]> = tokens.windows(n).collect();
    let unique: HashSet<&[u32]> = grams.iter().copied().collect();
    1.0 - unique.len() as f64 / grams.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tracked(tokens: &[u32], n: usize) -> RepetitionTracker {
        let mut t = RepetitionTracker::new(n);
        tokens.iter().for_each(|&x| t.push(x));
        t
    }

    #[test]
    fn no_repeats_is_zero() {
        assert_eq!(tracked(&[1, 2, 3, 4, 5, 6, 7], 4).rate(), 0.0);
    }

    #[test]
    fn one_token_repeated_is_close_to_one() {
        let rate = tracked(&[9; 100], 4).rate();
        // 97 four-grams, one unique.
        assert!((rate - (1.0 - 1.0 / 97.0)).abs() < 1e-12, "{rate}");
    }

    #[test]
    fn fewer_tokens_than_n_is_zero() {
        assert_eq!(tracked(&[1, 1, 1], 4).rate(), 0.0);
        assert_eq!(tracked(&[], 4).rate(), 0.0);
    }

    #[test]
    fn hand_computed_mixed_case() {
        // 2-grams of a b a b c: ab ba ab bc -> 3 unique of 4.
        assert_eq!(tracked(&[1, 2, 1, 2, 3], 2).rate(), 0.25);
    }

    #[test]
    fn window_sees_only_recent_tokens() {
        let mut t = RepetitionTracker::new(2).with_window(4);
        for x in [1, 2, 3, 4, 5] {
            t.push(x);
        }
        assert_eq!(t.window_rate(), Some(0.0));
        for _ in 0..4 {
            t.push(7);
        }
        // Window = 7 7 7 7: 3 bigrams, 1 unique.
        assert!((t.window_rate().expect("full") - 2.0 / 3.0).abs() < 1e-12);
        assert!(t.rate() < t.window_rate().expect("full"));
    }

    proptest! {
        #[test]
        fn incremental_equals_batch(tokens in prop::collection::vec(0u32..6, 0..300), n in 1usize..6) {
            let t = tracked(&tokens, n);
            prop_assert!((t.rate() - seq_rep_n(&tokens, n)).abs() < 1e-12);
        }

        #[test]
        fn window_equals_batch_over_the_tail(tokens in prop::collection::vec(0u32..4, 0..200), n in 1usize..5, w in 5usize..40) {
            let mut t = RepetitionTracker::new(n).with_window(w);
            for (i, &x) in tokens.iter().enumerate() {
                t.push(x);
                let len = i + 1;
                match t.window_rate() {
                    Some(rate) => prop_assert!((rate - seq_rep_n(&tokens[len - w..len], n)).abs() < 1e-12),
                    None => prop_assert!(len < w),
                }
            }
        }
    }
}

//! Whether a candidate is better, worse or not distinguishable from the primary, figure
//! by figure, over paired differences (candidate minus primary, one per request both
//! answered): the median difference with a 95% percentile-bootstrap confidence interval
//! (2,000 resamples, a fixed seed so one window always gives one answer).
//!
//! A verdict also needs the difference to matter: an interval wholly above the figure's
//! margin says the candidate's figure is higher, wholly below minus the margin, lower;
//! anything else is not distinguishable. The margin ([`Margin`]) is 2% of the primary's
//! median with a floor of 0.25 ms for times, 0.01 for rates and log-probabilities, 1% of
//! the tokens (at least half a token): the gateway's own scheduling of a shadow's copy
//! moves its times by a few tens of microseconds (`scripts/shadow-bench`), which a
//! thousand pairs would otherwise call a difference.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

const RESAMPLES: usize = 2_000;
/// Fewer pairs than this give no verdict: an interval from a handful is noise.
pub const MIN_PAIRS: usize = 10;

/// Which way is better for a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Lower,
    Higher,
    /// Neither (the number of tokens): the verdict says only which way it moved.
    Neither,
}

/// How large a difference must be to matter, by kind of figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Margin {
    /// Milliseconds: 2% of the primary's median, at least 0.25 ms.
    Time,
    /// A rate, a share or a log-probability: 0.01.
    Rate,
    /// Tokens: 1% of the primary's median, at least half a token.
    Tokens,
}

impl Margin {
    /// The margin, given the primary's (or baseline's) values of the figure.
    pub fn of(self, primary: &[f64]) -> f64 {
        let mut sorted = primary.to_vec();
        sorted.sort_by(f64::total_cmp);
        let typical = if sorted.is_empty() {
            0.0
        } else {
            median(&sorted).abs()
        };
        match self {
            Margin::Time => (typical * 0.02).max(0.25),
            Margin::Rate => 0.01,
            Margin::Tokens => (typical * 0.01).max(0.5),
        }
    }
}

/// One figure's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FigureVerdict {
    pub figure: String,
    /// Pairs where both sides have the figure.
    pub pairs: usize,
    /// Median of candidate minus primary.
    pub median_difference: Option<f64>,
    /// 95% confidence interval of that median.
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    /// The smallest difference that counts ([`Margin`]).
    pub margin: f64,
    /// `better`, `worse`, `not_distinguishable`, `higher` or `lower` (a figure that is
    /// neither better nor worse either way), or `too_few_pairs`.
    pub verdict: String,
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// The verdict on `differences` (candidate minus primary) of a figure where `better`,
/// counting only a difference beyond `margin`.
pub fn verdict(
    figure: &'static str,
    differences: &[f64],
    better: Better,
    margin: f64,
) -> FigureVerdict {
    let pairs = differences.len();
    if pairs < MIN_PAIRS {
        let mut sorted = differences.to_vec();
        sorted.sort_by(f64::total_cmp);
        return FigureVerdict {
            figure: figure.to_owned(),
            pairs,
            median_difference: (!sorted.is_empty()).then(|| median(&sorted)),
            ci_low: None,
            ci_high: None,
            margin,
            verdict: "too_few_pairs".to_owned(),
        };
    }
    let mut sorted = differences.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5EED);
    let mut medians = Vec::with_capacity(RESAMPLES);
    let mut sample = vec![0.0; pairs];
    for _ in 0..RESAMPLES {
        for slot in sample.iter_mut() {
            *slot = differences[(rng.next_u64() % pairs as u64) as usize];
        }
        sample.sort_by(f64::total_cmp);
        medians.push(median(&sample));
    }
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((RESAMPLES as f64 - 1.0) * q).round() as usize];
    let (low, high) = (at(0.025), at(0.975));
    let direction = if high < -margin {
        Some(Better::Lower)
    } else if low > margin {
        Some(Better::Higher)
    } else {
        None
    };
    let verdict = match (direction, better) {
        (None, _) => "not_distinguishable",
        (Some(Better::Lower), Better::Neither) => "lower",
        (Some(_), Better::Neither) => "higher",
        (Some(d), b) if d == b => "better",
        (Some(_), _) => "worse",
    };
    FigureVerdict {
        figure: figure.to_owned(),
        pairs,
        median_difference: Some(median(&sorted)),
        ci_low: Some(low),
        ci_high: Some(high),
        margin,
        verdict: verdict.to_owned(),
    }
}

/// The verdicts as a table: one line per figure.
pub fn table(verdicts: &[FigureVerdict]) -> String {
    let num = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:+.3}"));
    let mut out = format!(
        "{:<18} {:>6} {:>12} {:>26} {:>8}  {}\n",
        "figure", "pairs", "median diff", "95% interval", "margin", "verdict"
    );
    for v in verdicts {
        let interval = match (v.ci_low, v.ci_high) {
            (Some(low), Some(high)) => format!("[{low:+.3}, {high:+.3}]"),
            _ => "-".to_owned(),
        };
        out.push_str(&format!(
            "{:<18} {:>6} {:>12} {:>26} {:>8.3}  {}\n",
            v.figure,
            v.pairs,
            num(v.median_difference),
            interval,
            v.margin,
            v.verdict.replace('_', " ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clear_shift_is_named_and_noise_is_not() {
        // The candidate 20 ms slower on every request, give or take 5.
        let slower: Vec<f64> = (0..200).map(|i| 20.0 + f64::from(i % 11) - 5.0).collect();
        let v = verdict("ttft_ms", &slower, Better::Lower, 0.25);
        assert_eq!(v.verdict, "worse");
        assert!(
            v.ci_low.unwrap() > 0.0 && v.ci_high.unwrap() < 30.0,
            "{v:?}"
        );
        // Symmetric noise around zero.
        let noise: Vec<f64> = (0..200).map(|i| f64::from(i % 21) - 10.0).collect();
        assert_eq!(
            verdict("ttft_ms", &noise, Better::Lower, 0.25).verdict,
            "not_distinguishable"
        );
        let higher_logprob: Vec<f64> = vec![0.3; 50];
        assert_eq!(
            verdict("mean_logprob", &higher_logprob, Better::Higher, 0.01).verdict,
            "better"
        );
        assert_eq!(
            verdict("completion_tokens", &[-4.0; 30], Better::Neither, 0.5).verdict,
            "lower"
        );
        assert_eq!(
            verdict("ttft_ms", &[1.0; 3], Better::Lower, 0.25).verdict,
            "too_few_pairs"
        );
    }

    #[test]
    fn a_steady_difference_smaller_than_the_margin_does_not_count() {
        // 0.05 ms faster on every request: certain, and too small to matter.
        let tiny: Vec<f64> = (0..1000)
            .map(|i| -0.05 + f64::from(i % 3) * 0.001)
            .collect();
        assert_eq!(
            verdict("ttft_ms", &tiny, Better::Lower, Margin::Time.of(&[0.7; 10])).verdict,
            "not_distinguishable"
        );
        assert_eq!(Margin::Time.of(&[100.0, 120.0, 140.0]), 2.4);
        assert_eq!(Margin::Tokens.of(&[8.0]), 0.5);
    }
}

//! Whether a candidate is better, worse or not distinguishable from the primary, figure
//! by figure, over paired differences (candidate minus primary, one per request both
//! answered): the median difference for times and tokens, the mean for rates (a refusal
//! is 0 or 1, and most answers repeat nothing: their median difference is 0 whatever
//! the share that changed), each with a 95% percentile-bootstrap confidence interval
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
    /// What the verdict is on: the mean difference for rates, the median otherwise.
    pub fn statistic(self) -> Statistic {
        match self {
            Margin::Rate => Statistic::Mean,
            Margin::Time | Margin::Tokens => Statistic::Median,
        }
    }

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

/// The centre of the paired differences a verdict is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    Median,
    Mean,
}

impl Statistic {
    /// Of `values`, which it may reorder.
    fn of(self, values: &mut [f64]) -> f64 {
        match self {
            Statistic::Mean => values.iter().sum::<f64>() / values.len() as f64,
            Statistic::Median => {
                let n = values.len();
                let (_, upper, _) = values.select_nth_unstable_by(n / 2, f64::total_cmp);
                let upper = *upper;
                if n % 2 == 1 {
                    upper
                } else {
                    let lower = values[..n / 2].iter().copied().fold(f64::MIN, f64::max);
                    (lower + upper) / 2.0
                }
            }
        }
    }
}

/// One figure's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FigureVerdict {
    pub figure: String,
    /// Pairs where both sides have the figure.
    pub pairs: usize,
    /// `median` or `mean` of candidate minus primary.
    pub statistic: Statistic,
    /// That statistic of the differences.
    pub difference: Option<f64>,
    /// Its 95% confidence interval.
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

/// A figure verdicts are given on: its name, which way is better, what margin counts, and
/// how to read it off one side (`S`) where that side has it.
pub type FigureOf<S> = (&'static str, Better, Margin, fn(&S) -> Option<f64>);

/// The verdict on a figure's paired values, `(primary, candidate)` for each request both
/// answered: on their differences, beyond `margin` as the primary's values size it.
pub fn verdict(
    figure: &'static str,
    pairs: &[(f64, f64)],
    better: Better,
    margin: Margin,
) -> FigureVerdict {
    let primary: Vec<f64> = pairs.iter().map(|&(p, _)| p).collect();
    let differences: Vec<f64> = pairs.iter().map(|&(p, c)| c - p).collect();
    on_differences(figure, &differences, better, (margin, margin.of(&primary)))
}

/// The verdict on `differences` (candidate minus primary) of a figure where `better`,
/// by `margin`'s statistic, counting only a difference beyond the margin's size.
fn on_differences(
    figure: &'static str,
    differences: &[f64],
    better: Better,
    (margin, size): (Margin, f64),
) -> FigureVerdict {
    let statistic = margin.statistic();
    let pairs = differences.len();
    let mut values = differences.to_vec();
    let difference = (!values.is_empty()).then(|| statistic.of(&mut values));
    let undecided = |verdict: &str| FigureVerdict {
        figure: figure.to_owned(),
        pairs,
        statistic,
        difference,
        ci_low: None,
        ci_high: None,
        margin: size,
        verdict: verdict.to_owned(),
    };
    if pairs < MIN_PAIRS {
        return undecided("too_few_pairs");
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5EED);
    let mut centres = Vec::with_capacity(RESAMPLES);
    let mut sample = vec![0.0; pairs];
    for _ in 0..RESAMPLES {
        for slot in sample.iter_mut() {
            *slot = differences[(rng.next_u64() % pairs as u64) as usize];
        }
        centres.push(statistic.of(&mut sample));
    }
    centres.sort_by(f64::total_cmp);
    let at = |q: f64| centres[((RESAMPLES as f64 - 1.0) * q).round() as usize];
    let (low, high) = (at(0.025), at(0.975));
    let direction = if high < -size {
        Some(Better::Lower)
    } else if low > size {
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
        ci_low: Some(low),
        ci_high: Some(high),
        ..undecided(verdict)
    }
}

/// The verdicts as a table: one line per figure.
pub fn table(verdicts: &[FigureVerdict]) -> String {
    let num = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:+.3}"));
    let mut out = format!(
        "{:<18} {:>6} {:>20} {:>26} {:>8}  {}\n",
        "figure", "pairs", "difference", "95% interval", "margin", "verdict"
    );
    for v in verdicts {
        let interval = match (v.ci_low, v.ci_high) {
            (Some(low), Some(high)) => format!("[{low:+.3}, {high:+.3}]"),
            _ => "-".to_owned(),
        };
        let difference = format!(
            "{} {}",
            num(v.difference),
            match v.statistic {
                Statistic::Median => "(median)",
                Statistic::Mean => "(mean)",
            }
        );
        out.push_str(&format!(
            "{:<18} {:>6} {:>20} {:>26} {:>8.3}  {}\n",
            v.figure,
            v.pairs,
            difference,
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
        let v = on_differences("ttft_ms", &slower, Better::Lower, (Margin::Time, 0.25));
        assert_eq!(v.verdict, "worse");
        assert!(
            v.ci_low.unwrap() > 0.0 && v.ci_high.unwrap() < 30.0,
            "{v:?}"
        );
        // Symmetric noise around zero.
        let noise: Vec<f64> = (0..200).map(|i| f64::from(i % 21) - 10.0).collect();
        assert_eq!(
            on_differences("ttft_ms", &noise, Better::Lower, (Margin::Time, 0.25)).verdict,
            "not_distinguishable"
        );
        let higher_logprob: Vec<f64> = vec![0.3; 50];
        assert_eq!(
            on_differences(
                "mean_logprob",
                &higher_logprob,
                Better::Higher,
                (Margin::Rate, 0.01)
            )
            .verdict,
            "better"
        );
        assert_eq!(
            on_differences(
                "completion_tokens",
                &[-4.0; 30],
                Better::Neither,
                (Margin::Tokens, 0.5)
            )
            .verdict,
            "lower"
        );
        assert_eq!(
            on_differences("ttft_ms", &[1.0; 3], Better::Lower, (Margin::Time, 0.25)).verdict,
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
            on_differences(
                "ttft_ms",
                &tiny,
                Better::Lower,
                (Margin::Time, Margin::Time.of(&[0.7; 10]))
            )
            .verdict,
            "not_distinguishable"
        );
        assert_eq!(Margin::Time.of(&[100.0, 120.0, 140.0]), 2.4);
        assert_eq!(Margin::Tokens.of(&[8.0]), 0.5);
    }

    #[test]
    fn a_rate_that_moves_in_a_third_of_the_pairs_is_seen() {
        // The candidate refuses a third of the requests the primary answers: the median
        // difference is 0, the mean 1/3.
        let refusals: Vec<f64> = (0..300).map(|i| f64::from(i % 3 == 0)).collect();
        let v = on_differences("refusal", &refusals, Better::Lower, (Margin::Rate, 0.01));
        assert_eq!(
            (v.statistic, v.verdict.as_str()),
            (Statistic::Mean, "worse")
        );
        assert!((v.difference.unwrap() - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn the_median_is_the_middle_or_the_mean_of_the_two() {
        assert_eq!(Statistic::Median.of(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(Statistic::Median.of(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}

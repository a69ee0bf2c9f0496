//! One shadowed request's two sides, side by side ([`Comparison`]): each side's figures as
//! its record has them, and how far the answers differ.

use serde::Serialize;

use crate::record::{RequestRecord, Status};

/// One side's figures, as its record has them.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SideFigures {
    pub model: String,
    pub request_id: String,
    /// `ok`, `error` or `cancelled`.
    pub status: &'static str,
    pub error: Option<&'static str>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub itl_p95_ms: Option<f64>,
    pub e2e_ms: f64,
    pub completion_tokens: u32,
    pub finish_reason: Option<&'static str>,
    pub repetition_rate: Option<f64>,
    pub refusal: Option<bool>,
    /// The answer's language, ISO 639-3.
    pub language: Option<&'static str>,
    pub mean_logprob: Option<f64>,
    pub system_fingerprint: Option<String>,
    #[serde(skip)]
    pub text: String,
}

impl SideFigures {
    pub fn of(record: &RequestRecord) -> Self {
        let t = &record.timings;
        let q = record.quality.as_ref();
        Self {
            model: record.model.clone(),
            request_id: record.request_id.clone(),
            status: record.status.as_str(),
            error: record.error_kind,
            ttft_ms: t.ttft_ms,
            tpot_ms: t.tpot_ms,
            itl_p95_ms: t.itl_ms.as_ref().map(|itl| itl.p95),
            e2e_ms: t.e2e_ms,
            completion_tokens: record.usage.completion_tokens,
            finish_reason: record.finish_reason.map(|f| f.as_str()),
            repetition_rate: q.map(|q| q.repetition_rate),
            refusal: q.map(|q| q.refusal),
            language: q.map(|q| q.answer_language),
            mean_logprob: q.and_then(|q| q.mean_logprob),
            system_fingerprint: record.served.as_ref().map(|s| s.system_fingerprint.clone()),
            text: record.response.clone().unwrap_or_default(),
        }
    }

    pub fn ok(&self) -> bool {
        self.status == Status::Ok.as_str()
    }
}

/// How far two answers differ.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Difference {
    pub identical: bool,
    /// Word-level edit distance over the longer answer's words (the first 1,000 of
    /// each): 0 identical, 1 nothing in common.
    pub edit_distance: f64,
    /// Words (by count) both answers have, over the longer answer's words.
    pub word_overlap: f64,
    /// The first word where they part (0-based), `None` when identical; 1,000 when
    /// they part after their first 1,000 words.
    pub first_difference_word: Option<usize>,
    /// Characters both answers start with.
    pub common_prefix_chars: usize,
}

/// Words of each answer the distance and overlap are taken over: the edit distance is
/// quadratic, and it runs as the second side's record is handed on.
pub const WORDS: usize = 1_000;

impl Difference {
    pub fn of(primary: &str, candidate: &str) -> Self {
        let a: Vec<&str> = primary.split_whitespace().take(WORDS).collect();
        let b: Vec<&str> = candidate.split_whitespace().take(WORDS).collect();
        let longer = a.len().max(b.len());
        let edit_distance = if longer == 0 {
            0.0
        } else {
            strsim::generic_levenshtein(&a, &b) as f64 / longer as f64
        };
        let mut counts = std::collections::HashMap::<&str, i64>::new();
        for w in &a {
            *counts.entry(w).or_default() += 1;
        }
        let mut shared = 0usize;
        for w in &b {
            if let Some(n) = counts.get_mut(w).filter(|n| **n > 0) {
                *n -= 1;
                shared += 1;
            }
        }
        let identical = primary == candidate;
        Self {
            identical,
            edit_distance,
            word_overlap: if longer == 0 {
                1.0
            } else {
                shared as f64 / longer as f64
            },
            first_difference_word: (!identical)
                .then(|| a.iter().zip(&b).take_while(|(x, y)| x == y).count()),
            common_prefix_chars: primary
                .chars()
                .zip(candidate.chars())
                .take_while(|(x, y)| x == y)
                .count(),
        }
    }
}

/// A shadowed request: the client's answer (the primary) and the candidate's.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Comparison {
    /// The client's request id.
    pub pair_id: String,
    pub primary: SideFigures,
    pub candidate: SideFigures,
    /// Only when both answered.
    pub difference: Option<Difference>,
}

impl Comparison {
    pub fn of(pair_id: String, primary: SideFigures, candidate: SideFigures) -> Self {
        let difference = (primary.ok() && candidate.ok())
            .then(|| Difference::of(&primary.text, &candidate.text));
        Self {
            pair_id,
            primary,
            candidate,
            difference,
        }
    }

    /// Candidate minus primary, for a figure both sides have.
    pub fn delta(&self, figure: impl Fn(&SideFigures) -> Option<f64>) -> Option<f64> {
        Some(figure(&self.candidate)? - figure(&self.primary)?)
    }

    /// `identical`, `different` or `failed` (one side did not answer).
    pub fn outcome(&self) -> &'static str {
        match &self.difference {
            Some(d) if d.identical => "identical",
            Some(_) => "different",
            None => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_measured_apart_by_words() {
        let same = Difference::of("the cat sat", "the cat sat");
        assert!(same.identical);
        assert_eq!(
            (
                same.edit_distance,
                same.word_overlap,
                same.first_difference_word
            ),
            (0.0, 1.0, None)
        );
        let apart = Difference::of("the cat sat on the mat", "the cat lay on a mat");
        assert!(!apart.identical);
        assert_eq!(apart.first_difference_word, Some(2));
        assert!((apart.edit_distance - 2.0 / 6.0).abs() < 1e-9);
        assert!((apart.word_overlap - 4.0 / 6.0).abs() < 1e-9);
        assert_eq!(apart.common_prefix_chars, 8);
        let empty = Difference::of("", "");
        assert_eq!((empty.edit_distance, empty.word_overlap), (0.0, 1.0));
    }
}

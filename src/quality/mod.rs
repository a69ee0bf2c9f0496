//! Answer-quality signals, computed cheaply per request and reported with the timings:
//!
//! - [`repetition`]: seq-rep-n, incrementally per token, and the sliding window that
//!   drives the degeneration guard;
//! - [`refusal`]: does the answer decline the request (phrase list, several languages);
//! - [`intent`]: what kind of request it is (regex rules from `prompts/intents.toml`);
//! - confidence: how likely the model found the tokens it gave (mean and minimum
//!   log-probability, share of unlikely tokens), from the picker's log-probabilities.

pub mod intent;
pub mod language;
pub mod refusal;
pub mod repetition;

use serde::Serialize;

/// The quality figures of one finished request.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = QualitySignals)]
pub struct Quality {
    /// seq-rep-n over the answer's tokens: the share of n-grams seen before.
    pub repetition_rate: f64,
    /// The degeneration guard stopped the answer early.
    pub degenerated: bool,
    /// The answer reads as a refusal.
    pub refusal: bool,
    /// The prompt's intent, by the configured rules.
    pub intent: String,
    /// The prompt's language, ISO 639-3 (`und`: could not tell).
    pub language: &'static str,
    /// The answer's language, the same way: an answer in another language than its
    /// prompt's is a defect a user notices at once.
    pub answer_language: &'static str,
    /// Mean natural-log probability of the answer's tokens; `None` without tokens or
    /// when the engine reports no log-probabilities.
    pub mean_logprob: Option<f64>,
    /// The least likely token's log-probability.
    pub min_logprob: Option<f64>,
    /// Share of tokens less likely than `quality.low_confidence_prob`.
    pub low_confidence_share: Option<f64>,
    /// What the repetition rate's token ids are: the engine's own, or for an upstream
    /// what stood in for them.
    /// Left out for the engine's own token ids.
    #[serde(skip_serializing_if = "RepetitionBasis::is_token_ids")]
    #[schema(required = false)]
    pub repetition_basis: RepetitionBasis,
}

/// Settings of the degeneration guard; whether it watches an answer is the served
/// model's setting (`ModelConfig::degeneration_guard`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardConfig {
    /// Tokens in the sliding window.
    pub window: usize,
    /// Stop when the window's seq-rep-n is above this.
    pub threshold: f64,
}

use std::sync::Arc;

use crate::tokens::{RepetitionBasis, TokenLogprob};
use intent::IntentClassifier;
use refusal::RefusalDetector;
use repetition::RepetitionTracker;

/// Quality settings shared by all requests.
#[derive(Debug, Clone)]
pub struct QualitySettings {
    /// n of seq-rep-n.
    pub repetition_n: usize,
    pub guard: GuardConfig,
    pub refusal: Arc<RefusalDetector>,
    pub intents: Arc<IntentClassifier>,
    /// A token less likely than this counts as a low-confidence one.
    pub low_confidence_prob: f64,
}

/// Tokens less likely than this are low-confidence ones unless configured otherwise.
pub const DEFAULT_LOW_CONFIDENCE_PROB: f64 = 0.1;

impl Default for QualitySettings {
    fn default() -> Self {
        Self {
            repetition_n: 4,
            guard: GuardConfig {
                window: 64,
                threshold: 0.6,
            },
            refusal: Arc::new(RefusalDetector::with_defaults()),
            intents: Arc::new(IntentClassifier::with_defaults()),
            low_confidence_prob: DEFAULT_LOW_CONFIDENCE_PROB,
        }
    }
}

/// Running totals of the answer's log-probabilities.
#[derive(Debug, Clone, Copy)]
struct Confidence {
    /// ln of `low_confidence_prob`.
    low_below: f64,
    tokens: u64,
    sum: f64,
    min: f64,
    low: u64,
}

impl Confidence {
    fn new(low_confidence_prob: f64) -> Self {
        Self {
            low_below: low_confidence_prob.ln(),
            tokens: 0,
            sum: 0.0,
            min: f64::INFINITY,
            low: 0,
        }
    }

    fn push(&mut self, logprob: f32) {
        let lp = f64::from(logprob);
        self.tokens += 1;
        self.sum += lp;
        self.min = self.min.min(lp);
        self.low += u64::from(lp < self.low_below);
    }

    /// Mean, minimum and low share, rounded to 4 places; `None`s without tokens.
    fn figures(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        if self.tokens == 0 {
            return (None, None, None);
        }
        let round = |x: f64| (x * 10_000.0).round() / 10_000.0;
        let n = self.tokens as f64;
        (
            Some(round(self.sum / n)),
            Some(round(self.min)),
            Some(round(self.low as f64 / n)),
        )
    }
}

/// Follows one answer as it is generated.
#[derive(Debug)]
pub struct QualityTracker {
    repetition: RepetitionTracker,
    guard: Option<GuardConfig>,
    refusal: Arc<RefusalDetector>,
    intent: String,
    /// What the prompt's language is told from, told when the answer ends: off the way
    /// to the first token (whatlang takes tens of microseconds).
    prompt_sample: String,
    /// The languages once told (a response's body and its record both ask): the prompt's,
    /// and the answer's with the length of the text it was told from.
    prompt_language: Option<&'static str>,
    answer_language: Option<(usize, &'static str)>,
    text: String,
    degenerated: bool,
    confidence: Confidence,
}

impl QualityTracker {
    /// Starts tracking an answer to a request whose intent is classified from `prompt`;
    /// `guarded`: the degeneration guard watches it.
    pub fn new(settings: &QualitySettings, prompt: &str, guarded: bool) -> Self {
        let mut repetition = RepetitionTracker::new(settings.repetition_n);
        let guard = guarded.then_some(settings.guard);
        if let Some(guard) = guard {
            repetition = repetition.with_window(guard.window);
        }
        Self {
            repetition,
            guard,
            refusal: Arc::clone(&settings.refusal),
            intent: settings.intents.classify(prompt).to_owned(),
            prompt_sample: language::sample(prompt).to_owned(),
            prompt_language: None,
            answer_language: None,
            text: String::new(),
            degenerated: false,
            confidence: Confidence::new(settings.low_confidence_prob),
        }
    }

    /// Forgets the answer so far: it starts over (an upstream replica failed midway
    /// through an answer the client had not received, and another answers it).
    pub fn restart(&mut self) {
        self.repetition = self.repetition.restarted();
        self.answer_language = None;
        self.text.clear();
        self.degenerated = false;
        self.confidence = Confidence::new(self.confidence.low_below.exp());
    }

    /// Adds newly generated text, token ids and their log-probabilities (may be empty).
    /// Returns `true` when the degeneration guard trips: the generation should stop here.
    pub fn push(&mut self, text: &str, ids: &[u32], logprobs: &[TokenLogprob]) -> bool {
        self.text.push_str(text);
        for &id in ids {
            self.repetition.push(id);
        }
        for lp in logprobs {
            self.confidence.push(lp.logprob);
        }
        if let (Some(guard), Some(rate)) = (self.guard, self.repetition.window_rate()) {
            if rate > guard.threshold {
                self.degenerated = true;
            }
        }
        self.degenerated
    }

    /// The answer so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn token_ids(&self) -> &[u32] {
        self.repetition.tokens()
    }

    /// The answer's language, told again only if the answer grew since.
    fn answer_language(&mut self) -> &'static str {
        match self.answer_language {
            Some((len, code)) if len == self.text.len() => code,
            _ => {
                let code = language::language_of(&self.text);
                self.answer_language = Some((self.text.len(), code));
                code
            }
        }
    }

    pub fn finish(&mut self) -> Quality {
        let (mean_logprob, min_logprob, low_confidence_share) = self.confidence.figures();
        Quality {
            repetition_rate: (self.repetition.rate() * 10_000.0).round() / 10_000.0,
            degenerated: self.degenerated,
            refusal: self.refusal.is_refusal(&self.text),
            intent: self.intent.clone(),
            language: self
                .prompt_language
                .get_or_insert_with(|| language::language_of(&self.prompt_sample)),
            answer_language: self.answer_language(),
            mean_logprob,
            min_logprob,
            low_confidence_share,
            repetition_basis: RepetitionBasis::TokenIds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_and_the_answer_each_get_their_language() {
        let settings = QualitySettings::default();
        let mut tracker = QualityTracker::new(
            &settings,
            "Quelle est la capitale de la France et pourquoi est-elle célèbre ?",
            false,
        );
        tracker.push(
            "The capital of France is Paris, famous for its museums ",
            &[],
            &[],
        );
        tracker.push("and for the tower that stands by the river.", &[], &[]);
        let quality = tracker.finish();
        assert_eq!((quality.language, quality.answer_language), ("fra", "eng"));
        // No answer yet: undetermined, not the prompt's.
        let mut empty = QualityTracker::new(&settings, "What is the capital of France?", false);
        assert_eq!(empty.finish().answer_language, language::UNDETERMINED);
    }

    #[test]
    fn guard_trips_on_a_loop_and_not_on_varied_text() {
        let settings = QualitySettings {
            guard: GuardConfig {
                window: 16,
                threshold: 0.5,
            },
            ..QualitySettings::default()
        };
        let mut varied = QualityTracker::new(&settings, "hello", true);
        assert!((0..64).all(|i| !varied.push("x", &[i], &[])));
        let mut unguarded = QualityTracker::new(&settings, "hello", false);
        assert!((0..64u32).all(|i| !unguarded.push("ab ", &[i % 3], &[])));

        let mut looping = QualityTracker::new(&settings, "hello", true);
        let tripped_at = (0..64u32).position(|i| looping.push("ab ", &[i % 3], &[]));
        assert_eq!(
            tripped_at,
            Some(15),
            "trips once the 16-token window is full"
        );
        let quality = looping.finish();
        assert!(quality.degenerated && quality.repetition_rate > 0.5);
        assert_eq!(quality.intent, "greeting");
    }

    #[test]
    fn finish_reports_refusal_and_intent() {
        let mut t = QualityTracker::new(
            &QualitySettings::default(),
            "Write a Python function",
            false,
        );
        t.push("I'm sorry, but I can't help with that.", &[1, 2, 3], &[]);
        let q = t.finish();
        assert!(q.refusal && !q.degenerated);
        assert_eq!(q.intent, "coding");
        assert_eq!(q.repetition_rate, 0.0);
        assert_eq!(q.mean_logprob, None, "no log-probabilities reported");
    }

    #[test]
    fn confidence_is_the_mean_minimum_and_low_share_of_token_logprobs() {
        let lp = |p: f32| TokenLogprob {
            sampled: None,
            token: crate::tokens::TokenText::from_bytes(b"x".to_vec()),
            logprob: p.ln(),
            top: Vec::new(),
        };
        let mut t = QualityTracker::new(&QualitySettings::default(), "hi", false);
        t.push("a", &[1], &[lp(0.9)]);
        t.push("bc", &[2, 3], &[lp(0.5), lp(0.05)]);
        t.push("", &[4], &[lp(1.0)]);
        let q = t.finish();
        let mean = (0.9f64.ln() + 0.5f64.ln() + 0.05f64.ln() + 0.0) / 4.0;
        assert!((q.mean_logprob.expect("mean") - mean).abs() < 1e-4);
        assert!((q.min_logprob.expect("min") - 0.05f64.ln()).abs() < 1e-4);
        assert_eq!(q.low_confidence_share, Some(0.25), "one of four under 0.1");
    }
}

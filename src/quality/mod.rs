//! Answer-quality signals, computed cheaply per request and reported with the timings:
//!
//! - [`repetition`]: seq-rep-n, incrementally per token, and the sliding window that
//!   drives the degeneration guard;
//! - [`refusal`]: does the answer decline the request (phrase list, several languages);
//! - [`intent`]: what kind of request it is (regex rules from `prompts/intents.toml`).

pub mod intent;
pub mod refusal;
pub mod repetition;

use serde::Serialize;

/// The quality figures of one finished request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Quality {
    pub repetition_rate: f64,
    /// The degeneration guard stopped the answer early.
    pub degenerated: bool,
    pub refusal: bool,
    pub intent: String,
}

/// Settings of the degeneration guard; off unless configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardConfig {
    /// Tokens in the sliding window.
    pub window: usize,
    /// Stop when the window's seq-rep-n is above this.
    pub threshold: f64,
}

use std::sync::Arc;

use intent::IntentClassifier;
use refusal::RefusalDetector;
use repetition::RepetitionTracker;

/// Quality settings shared by all requests.
#[derive(Debug, Clone)]
pub struct QualitySettings {
    /// n of seq-rep-n.
    pub repetition_n: usize,
    pub guard: Option<GuardConfig>,
    pub refusal: Arc<RefusalDetector>,
    pub intents: Arc<IntentClassifier>,
}

impl Default for QualitySettings {
    fn default() -> Self {
        Self {
            repetition_n: 4,
            guard: None,
            refusal: Arc::new(RefusalDetector::with_defaults()),
            intents: Arc::new(IntentClassifier::with_defaults()),
        }
    }
}

/// Follows one answer as it is generated.
#[derive(Debug)]
pub struct QualityTracker {
    repetition: RepetitionTracker,
    guard: Option<GuardConfig>,
    refusal: Arc<RefusalDetector>,
    intent: String,
    text: String,
    degenerated: bool,
}

impl QualityTracker {
    /// Starts tracking an answer to a request whose intent is classified from `prompt`.
    pub fn new(settings: &QualitySettings, prompt: &str) -> Self {
        let mut repetition = RepetitionTracker::new(settings.repetition_n);
        if let Some(guard) = settings.guard {
            repetition = repetition.with_window(guard.window);
        }
        Self {
            repetition,
            guard: settings.guard,
            refusal: Arc::clone(&settings.refusal),
            intent: settings.intents.classify(prompt).to_owned(),
            text: String::new(),
            degenerated: false,
        }
    }

    /// Adds newly generated text and token ids. Returns `true` when the degeneration guard
    /// trips: the generation should stop here.
    pub fn push(&mut self, text: &str, ids: &[u32]) -> bool {
        self.text.push_str(text);
        for &id in ids {
            self.repetition.push(id);
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

    pub fn finish(&self) -> Quality {
        Quality {
            repetition_rate: (self.repetition.rate() * 10_000.0).round() / 10_000.0,
            degenerated: self.degenerated,
            refusal: self.refusal.is_refusal(&self.text),
            intent: self.intent.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_trips_on_a_loop_and_not_on_varied_text() {
        let settings = QualitySettings {
            guard: Some(GuardConfig {
                window: 16,
                threshold: 0.5,
            }),
            ..QualitySettings::default()
        };
        let mut varied = QualityTracker::new(&settings, "hello");
        assert!((0..64).all(|i| !varied.push("x", &[i])));

        let mut looping = QualityTracker::new(&settings, "hello");
        let tripped_at = (0..64u32).position(|i| looping.push("ab ", &[i % 3]));
        assert_eq!(
            tripped_at,
            Some(15),
            "trips once the 16-token window is full"
        );
        let quality = looping.finish();
        assert!(quality.degenerated && quality.repetition_rate > 0.5);
        assert_eq!(quality.intent, "general");
    }

    #[test]
    fn finish_reports_refusal_and_intent() {
        let mut t = QualityTracker::new(&QualitySettings::default(), "Write a Python function");
        t.push("I'm sorry, but I can't help with that.", &[1, 2, 3]);
        let q = t.finish();
        assert!(q.refusal && !q.degenerated);
        assert_eq!(q.intent, "coding");
        assert_eq!(q.repetition_rate, 0.0);
    }
}

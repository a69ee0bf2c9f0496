//! The drift canary: on a schedule, the same few prompts (greedy, seeded) go to every
//! replica of a fleet, out of band; a replica whose answer to a prompt differs from the
//! majority's is drifting (another model build, quantization, driver, or a fault), and
//! `/ready`, `/stats`, `llmgate_endpoint_drifting` and the alert rule say so, with the
//! differing text. Replicas of one model serving one seeded greedy request should agree.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::engine::backend::{CanaryView, DifferingAnswer};

/// Prompts sent when the operator sets none: short, with one plain answer each.
pub const DEFAULT_PROMPTS: [&str; 3] = [
    "What is the capital of France? Answer in one word.",
    "Count from one to five, separated by commas.",
    "Translate 'good morning' into Spanish.",
];

/// The seed every canary request carries.
pub const SEED: u64 = 20_261_205;

/// A fleet's canary as the config sets it.
#[derive(Debug, Clone, PartialEq)]
pub struct CanaryConfig {
    pub every: Duration,
    pub prompts: Vec<String>,
    pub max_tokens: u32,
}

/// One replica's answers in a round, by prompt: `None` where it gave none.
pub type Answers = Vec<Option<Answer>>;

#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub text: String,
    pub system_fingerprint: Option<String>,
}

/// The last round's findings, by endpoint label.
#[derive(Debug, Default)]
pub struct Canaries(Mutex<HashMap<String, CanaryView>>);

impl Canaries {
    /// The last round's view of `label`, if it was in the round.
    pub fn of(&self, label: &str) -> Option<CanaryView> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(label)
            .cloned()
    }

    /// A round's findings replace the last round's.
    pub fn set(&self, views: Vec<(String, CanaryView)>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = views.into_iter().collect();
    }
}

/// The round's verdict per replica: for each prompt, the answer most replicas gave, when
/// more than half of those that answered gave it; a replica that answered otherwise is
/// drifting. Without a majority (two replicas that disagree) nobody is flagged. A
/// prompt a replica did not answer this round keeps what the `last` round found of it,
/// so a drifting replica that misses a round is not cleared by its silence.
pub fn judge(
    prompts: &[String],
    round: &[(String, Answers)],
    checked_at: u64,
    last: &Canaries,
) -> Vec<(String, CanaryView)> {
    let majorities: Vec<Option<&str>> = (0..prompts.len())
        .map(|p| {
            let texts: Vec<&str> = round
                .iter()
                .filter_map(|(_, answers)| answers.get(p)?.as_ref().map(|a| a.text.as_str()))
                .collect();
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for text in &texts {
                *counts.entry(text).or_default() += 1;
            }
            counts
                .into_iter()
                .find(|(_, n)| *n * 2 > texts.len())
                .map(|(text, _)| text)
        })
        .collect();
    round
        .iter()
        .map(|(label, answers)| {
            let mut hash = Sha256::new();
            let mut differing = Vec::new();
            let last = last.of(label);
            for (p, answer) in answers.iter().enumerate() {
                let Some(answer) = answer else {
                    let kept = last
                        .iter()
                        .flat_map(|view| &view.differing)
                        .find(|d| d.prompt == prompts[p]);
                    differing.extend(kept.cloned());
                    continue;
                };
                hash.update(answer.text.as_bytes());
                hash.update([0]);
                if let Some(majority) = majorities[p].filter(|m| *m != answer.text) {
                    differing.push(DifferingAnswer {
                        prompt: prompts[p].clone(),
                        answer: answer.text.clone(),
                        majority: majority.to_owned(),
                    });
                }
            }
            let view = CanaryView {
                checked_at,
                drifting: !differing.is_empty(),
                output_hash: hex::encode(hash.finalize()),
                system_fingerprint: answers
                    .iter()
                    .flatten()
                    .find_map(|a| a.system_fingerprint.clone()),
                differing,
                unanswered: answers.iter().filter(|a| a.is_none()).count(),
            };
            (label.clone(), view)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(text: &str) -> Option<Answer> {
        Some(Answer {
            text: text.into(),
            system_fingerprint: Some("fp".into()),
        })
    }

    #[test]
    fn the_one_that_differs_from_the_majority_is_flagged_with_its_text() {
        let prompts = vec!["p1".to_owned(), "p2".to_owned()];
        let round = vec![
            ("a".to_owned(), vec![said("Paris"), said("1, 2")]),
            ("b".to_owned(), vec![said("Paris"), said("1, 2")]),
            ("c".to_owned(), vec![said("Lyon"), None]),
        ];
        let last = Canaries::default();
        let views = judge(&prompts, &round, 7, &last);
        let c = &views[2].1;
        assert!(c.drifting && !views[0].1.drifting && !views[1].1.drifting);
        assert_eq!(c.differing[0].answer, "Lyon");
        assert_eq!(c.differing[0].majority, "Paris");
        assert_eq!(c.unanswered, 1);
        assert_eq!(views[0].1.output_hash, views[1].1.output_hash);
        // A round it misses keeps it flagged; one it answers alike clears it.
        last.set(views);
        let silent = vec![
            ("a".to_owned(), vec![said("Paris"), said("1, 2")]),
            ("b".to_owned(), vec![said("Paris"), said("1, 2")]),
            ("c".to_owned(), vec![None, None]),
        ];
        let views = judge(&prompts, &silent, 8, &last);
        assert!(views[2].1.drifting, "silence clears nothing");
        assert_eq!(views[2].1.differing[0].answer, "Lyon");
        last.set(views);
        let agrees = vec![
            ("c".to_owned(), vec![said("Paris"), said("1, 2")]),
            silent[0].clone(),
            silent[1].clone(),
        ];
        assert!(judge(&prompts, &agrees, 9, &last)
            .iter()
            .all(|(_, v)| !v.drifting));
        // Two that disagree: no majority, nobody flagged.
        let two = vec![
            ("a".to_owned(), vec![said("x")]),
            ("b".to_owned(), vec![said("y")]),
        ];
        assert!(judge(&prompts[..1], &two, 0, &Canaries::default())
            .iter()
            .all(|(_, v)| !v.drifting));
    }
}

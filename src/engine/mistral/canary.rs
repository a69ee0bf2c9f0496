//! Does batched decoding give the answers single sequences get? Two greedy prompts of the
//! same token count are answered one at a time, then both at once on one model instance.
//! mistral.rs's scheduler batches sequences of equal length, so the pair is prefilled
//! and decoded together; any difference is a batching defect like mistral.rs 0.8.1's on
//! CPU (docs/engine.md, "Known engine defect: batching on CPU"), where the first row drifts into the last row's
//! answer after one token.
//!
//! The gateway runs it at start-up on CUDA before it batches there (a few hundred
//! milliseconds on a GPU), and `examples/batching_defect` prints it on any device.

use crate::engine::{EngineError, EngineEvent, Generation, GenerationRequest, Prompt, Sampling};

/// Prompts that differ in one word, most often one token in any tokenizer; the first two
/// with equal token counts are used.
const CANDIDATES: [&str; 6] = [
    "What is the capital of France?",
    "What is the capital of Spain?",
    "What is the capital of Italy?",
    "What is the capital of Japan?",
    "What is the capital of Peru?",
    "What is the capital of Chile?",
];

/// Short, so that numerical differences between batch shapes (which a GPU may have
/// without any defect) have little room to change a greedy answer; the defect shows
/// from the second token.
const MAX_TOKENS: u32 = 16;

/// One prompt's answer alone and in the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub prompt: &'static str,
    pub alone: String,
    pub together: String,
}

/// What the canary saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Token count of both prompts.
    pub prompt_tokens: u32,
    pub pairs: [Pair; 2],
}

impl Findings {
    pub fn batched_equals_single(&self) -> bool {
        self.pairs.iter().all(|p| p.alone == p.together)
    }

    /// One line per prompt, for logs and the reproduction.
    pub fn describe(&self) -> String {
        self.pairs
            .iter()
            .map(|p| {
                format!(
                    "{}\n  alone:    {:?}\n  together: {:?}",
                    p.prompt, p.alone, p.together
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// What the canary runs on: prompts are counted first, so that the pair can be sent to
/// the engine back to back (counting goes through mistral.rs's engine loop, and would
/// let the first sequence run ahead of the second).
pub(crate) trait Subject {
    /// The prompt's token count.
    async fn count(&self, request: &GenerationRequest) -> Result<u32, EngineError>;
    /// Starts a counted request; both of the pair must land on one model instance.
    async fn start(
        &self,
        request: GenerationRequest,
        prompt_tokens: u32,
    ) -> Result<Generation, EngineError>;
}

/// Answers the first two candidates of equal token count alone, then together.
pub(crate) async fn run(subject: &impl Subject) -> anyhow::Result<Findings> {
    let (first, second, tokens) = equal_length_pair(subject).await?;
    let alone_first = answer(subject.start(request(first), tokens).await?).await?;
    let alone_second = answer(subject.start(request(second), tokens).await?).await?;
    let together_first = subject.start(request(first), tokens).await?;
    let together_second = subject.start(request(second), tokens).await?;
    let (together_first, together_second) =
        tokio::join!(answer(together_first), answer(together_second));
    Ok(Findings {
        prompt_tokens: tokens,
        pairs: [
            Pair {
                prompt: first,
                alone: alone_first,
                together: together_first?,
            },
            Pair {
                prompt: second,
                alone: alone_second,
                together: together_second?,
            },
        ],
    })
}

/// The first two candidates with equal token counts, and that count.
async fn equal_length_pair(
    subject: &impl Subject,
) -> anyhow::Result<(&'static str, &'static str, u32)> {
    let mut seen: Vec<(&'static str, u32)> = Vec::new();
    for prompt in CANDIDATES {
        let tokens = subject.count(&request(prompt)).await?;
        if let Some(&(other, _)) = seen.iter().find(|s| s.1 == tokens) {
            return Ok((other, prompt, tokens));
        }
        seen.push((prompt, tokens));
    }
    anyhow::bail!("no two of the canary's prompts have the same token count")
}

fn request(prompt: &str) -> GenerationRequest {
    GenerationRequest {
        request_id: format!("canary: {prompt}"),
        prompt: Prompt::user(prompt),
        budget: crate::engine::Budget::Asked(MAX_TOKENS),
        sampling: Sampling {
            temperature: Some(0.0),
            ..Sampling::default()
        },
        ..GenerationRequest::default()
    }
}

/// The whole answer.
async fn answer(mut generation: Generation) -> anyhow::Result<String> {
    let mut text = String::new();
    while let Some(event) = generation.events.recv().await {
        match event {
            EngineEvent::Token { text: piece, .. } => text.push_str(&piece),
            EngineEvent::Finished { .. } => return Ok(text),
            EngineEvent::Failed(error) => return Err(error.into()),
            EngineEvent::Restarted => text.clear(),
            // The canary asks for text: it offers no tools, and reasoning is not the answer.
            EngineEvent::Progress { .. }
            | EngineEvent::Reasoning { .. }
            | EngineEvent::ToolCall { .. } => {}
        }
    }
    anyhow::bail!("the engine closed the stream without finishing")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::engine::scripted::{Script, ScriptedEngine};
    use crate::engine::{Front, ModelInfo};

    fn engine(answer: &[&str]) -> Front {
        let info = ModelInfo {
            id: "m".into(),
            context_length: 512,
            system_fingerprint: "fp_test".into(),
            ..ModelInfo::default()
        };
        let engine: Arc<dyn crate::engine::Backend> = Arc::new(ScriptedEngine::new(
            info,
            Script::tokens(answer, Duration::ZERO),
        ));
        Front::from(engine)
    }

    /// `single` answers the first two requests (the single ones), `batched` the rest;
    /// prompts count one token per word.
    struct Scripted {
        single: Front,
        batched: Front,
        started: AtomicUsize,
    }

    impl Subject for Scripted {
        async fn count(&self, request: &GenerationRequest) -> Result<u32, EngineError> {
            Ok(request.prompt.last_user_text().split_whitespace().count() as u32)
        }

        async fn start(
            &self,
            request: GenerationRequest,
            _prompt_tokens: u32,
        ) -> Result<Generation, EngineError> {
            if self.started.fetch_add(1, Ordering::SeqCst) < 2 {
                self.single.run(request).await
            } else {
                self.batched.run(request).await
            }
        }
    }

    async fn canary(single: Front, batched: Front) -> Findings {
        run(&Scripted {
            single,
            batched,
            started: AtomicUsize::new(0),
        })
        .await
        .expect("canary")
    }

    #[tokio::test]
    async fn equal_answers_pass_and_the_first_equal_length_pair_is_used() {
        let outcome = canary(engine(&["Paris", "."]), engine(&["Paris", "."])).await;
        assert!(outcome.batched_equals_single(), "{}", outcome.describe());
        assert_eq!(outcome.pairs[0].prompt, CANDIDATES[0]);
        assert_eq!(outcome.pairs[1].prompt, CANDIDATES[1]);
        assert_eq!(outcome.pairs[0].alone, "Paris.");
    }

    #[tokio::test]
    async fn a_batched_answer_that_drifts_fails() {
        let outcome = canary(engine(&["Paris", "."]), engine(&["Paris", " Madrid"])).await;
        assert!(!outcome.batched_equals_single());
        assert!(outcome.describe().contains("together: \"Paris Madrid\""));
    }
}

//! mistral.rs responses to [`EngineEvent`]s: the forwarder task of one request, and the
//! translation of each response, including the finishes mistral.rs leaves out.

use std::time::Duration;

use mistralrs::Response;
use tokio::sync::mpsc;

use super::{PickedIds, Slot};
use crate::engine::{EngineError, EngineEvent, FinishReason, Usage};

/// Translates mistral.rs responses into engine events until the request ends or the
/// gateway drops its stream (which drops `engine_rx` and so cancels the sequence). The
/// running slot is freed when this returns.
pub(super) async fn forward(
    mut engine_rx: mpsc::Receiver<Response>,
    picked: PickedIds,
    prompt_tokens: u32,
    max_tokens: u32,
    tx: mpsc::Sender<EngineEvent>,
    _slot: Slot,
) {
    // Counted here as well, for a finish that arrives without usage.
    let mut tokens = Usage {
        prompt_tokens,
        completion_tokens: 0,
    };
    loop {
        let response = tokio::select! {
            r = engine_rx.recv() => r,
            () = tx.closed() => return,
        };
        let ids = picked
            .lock()
            .map(|mut ids| std::mem::take(&mut *ids))
            .unwrap_or_default();
        let Some(response) = response else {
            // mistral.rs 0.8.1 sends no final chunk when the last token completes no
            // character (an accented letter split across tokens, say): the sequence
            // ends and the channel closes. Finish it from our own count.
            tokens.completion_tokens += to_u32(ids.len());
            for event in closed_without_finish(ids, tokens, max_tokens) {
                let _ = tx.send(event).await;
            }
            return;
        };
        tokens.completion_tokens += to_u32(ids.len());
        for event in translate(response, ids, tokens) {
            let last = !matches!(event, EngineEvent::Token { .. });
            if tx.send(event).await.is_err() || last {
                return;
            }
        }
    }
}

/// What to report when mistral.rs closes a stream without a finish chunk: a finish with
/// our own count when tokens were generated, an error otherwise.
fn closed_without_finish(ids: Vec<u32>, counted: Usage, max_tokens: u32) -> Vec<EngineEvent> {
    if counted.completion_tokens == 0 {
        return vec![EngineEvent::Failed(EngineError::Internal(
            "the engine closed the stream without finishing".into(),
        ))];
    }
    tracing::warn!(
        completion_tokens = counted.completion_tokens,
        "The engine ended a sequence without a final chunk; finishing it from the gateway's count."
    );
    let reason = if counted.completion_tokens >= max_tokens {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let mut events = Vec::with_capacity(2);
    if !ids.is_empty() {
        events.push(EngineEvent::Token {
            text: String::new(),
            ids,
        });
    }
    events.push(EngineEvent::Finished {
        reason,
        usage: counted,
        prefill: None,
    });
    events
}

/// Events for one mistral.rs response; `ids` are the tokens picked since the last one and
/// `counted` the usage the forwarder counted itself, used when mistral.rs sends none.
fn translate(response: Response, ids: Vec<u32>, counted: Usage) -> Vec<EngineEvent> {
    match response {
        Response::Chunk(chunk) => {
            let mut events = Vec::with_capacity(2);
            let Some(choice) = chunk.choices.into_iter().next() else {
                return events;
            };
            let text = choice.delta.content.unwrap_or_default();
            if !text.is_empty() || !ids.is_empty() {
                events.push(EngineEvent::Token { text, ids });
            }
            if let Some(reason) = choice.finish_reason {
                let reason = match reason.as_str() {
                    "length" => FinishReason::Length,
                    "stop" => FinishReason::Stop,
                    // "canceled", "tool_calls"...: nothing this gateway asked for.
                    other => {
                        events.push(EngineEvent::Failed(EngineError::Internal(format!(
                            "the engine ended the sequence with '{other}'"
                        ))));
                        return events;
                    }
                };
                let (usage, prefill) = usage_of(chunk.usage);
                events.push(EngineEvent::Finished {
                    reason,
                    usage: usage.unwrap_or(counted),
                    prefill,
                });
            }
            events
        }
        Response::ValidationError(e) => {
            vec![EngineEvent::Failed(EngineError::Rejected(e.to_string()))]
        }
        Response::InternalError(e) => {
            vec![EngineEvent::Failed(EngineError::Internal(e.to_string()))]
        }
        Response::ModelError(message, _) => {
            vec![EngineEvent::Failed(EngineError::Internal(message))]
        }
        other => vec![EngineEvent::Failed(EngineError::Internal(format!(
            "unexpected engine response: {}",
            response_kind(&other)
        )))],
    }
}

fn response_kind(response: &Response) -> &'static str {
    match response {
        Response::Done(_) => "done",
        Response::CompletionChunk(_)
        | Response::CompletionDone(_)
        | Response::CompletionModelError(..) => "completion",
        _ => "other",
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Token counts and prefill time from the usage mistral.rs attaches to the last chunk.
fn usage_of(usage: Option<mistralrs::Usage>) -> (Option<Usage>, Option<Duration>) {
    let Some(u) = usage else {
        return (None, None);
    };
    let counts = Usage {
        prompt_tokens: to_u32(u.prompt_tokens),
        completion_tokens: to_u32(u.completion_tokens),
    };
    (
        Some(counts),
        Duration::try_from_secs_f32(u.total_prompt_time_sec).ok(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_close_after_tokens_is_a_finish_from_our_count() {
        let counted = Usage {
            prompt_tokens: 51,
            completion_tokens: 128,
        };
        let events = closed_without_finish(vec![7], counted, 128);
        assert_eq!(
            events,
            vec![
                EngineEvent::Token {
                    text: String::new(),
                    ids: vec![7]
                },
                EngineEvent::Finished {
                    reason: FinishReason::Length,
                    usage: counted,
                    prefill: None
                }
            ]
        );
        let early = closed_without_finish(
            vec![],
            Usage {
                completion_tokens: 5,
                ..counted
            },
            128,
        );
        assert!(matches!(
            early[0],
            EngineEvent::Finished {
                reason: FinishReason::Stop,
                ..
            }
        ));
        let nothing = closed_without_finish(
            vec![],
            Usage {
                completion_tokens: 0,
                ..counted
            },
            128,
        );
        assert!(matches!(nothing[0], EngineEvent::Failed(_)));
    }
}

//! mistral.rs responses to [`EngineEvent`]s: the forwarder task of one request, and the
//! translation of each response, including the finishes mistral.rs leaves out.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use mistralrs::Response;
use tokio::sync::mpsc;

use super::picker::Pick;
use super::{ParkedReplicaSlot, PickedIds, ReplicaSlot};
use crate::engine::grammar::Vocabulary;
use crate::engine::{EngineError, EngineEvent};
use crate::tokens::{FinishReason, TokenLogprob, TokenText, Usage};

/// Translates mistral.rs responses into engine events until the request ends or the
/// gateway drops its stream (which drops `engine_rx` and so cancels the sequence at its
/// next step; the slot waits in `parked` until mistral.rs has let the sequence go).
///
/// mistral.rs's engine loop awaits its send into `engine_rx`, for every sequence it runs.
/// So this task drains `engine_rx` whether or not the gateway is taking events: those the
/// gateway has no room for wait here (at most the request's `max_tokens`), and a client
/// that reads slowly cannot stall the engine for everyone else. The running slot is freed
/// as soon as mistral.rs is done with the sequence, not when the client has read it all.
pub(super) async fn forward(
    mut engine_rx: mpsc::Receiver<Response>,
    picked: PickedIds,
    vocabulary: Option<Arc<Vocabulary>>,
    prompt_tokens: u32,
    max_tokens: u32,
    tx: mpsc::Sender<EngineEvent>,
    (slot, parked): (ReplicaSlot, ParkedReplicaSlot),
) {
    // Some while mistral.rs runs the sequence; given back as soon as it has ended.
    let mut running = Some(slot);
    // Counted here as well, for a finish that arrives without usage.
    let mut tokens = Usage {
        prompt_tokens,
        completion_tokens: 0,
        cached_tokens: None,
        reasoning_tokens: None,
    };
    let mut pending: VecDeque<EngineEvent> = VecDeque::new();
    // mistral.rs has not sent its first piece of text yet (see `restore_leading_space`).
    let mut first_piece = true;
    // When each token not yet handed on was picked, oldest first (see `production`).
    let mut picked_at: VecDeque<Instant> = VecDeque::new();
    loop {
        tokio::select! {
            response = engine_rx.recv(), if running.is_some() => {
                // What the gateway's runtime got to now; the pieces are stamped with
                // when their tokens were produced, below.
                let at = Instant::now();
                let picks = picked
                    .lock()
                    .map(|mut picks| std::mem::take(&mut *picks))
                    .unwrap_or_default();
                picked_at.extend(picks.iter().map(|p| p.at));
                tokens.completion_tokens += to_u32(picks.len());
                if let Some(slot) = running.as_mut() {
                    slot.grow_by(picks.len());
                }
                let picked = Picked::new(picks, vocabulary.as_deref());
                let mut events = match response {
                    Some(response) => {
                        let mut events = translate(response, picked, tokens, at);
                        if let Some(EngineEvent::Token { text, logprobs, .. }) = events.first_mut() {
                            if std::mem::take(&mut first_piece) {
                                restore_leading_space(text, logprobs);
                            }
                        }
                        events
                    }
                    // mistral.rs 0.8.1 sends no final chunk when the last token completes
                    // no character (an accented letter split across tokens, say): the
                    // sequence ends and the channel closes. Finish it from our own count.
                    None => closed_without_finish(picked, tokens, max_tokens, at),
                };
                production(&mut events, &mut picked_at);
                for event in events {
                    let last = !matches!(event, EngineEvent::Token { .. });
                    pending.push_back(event);
                    if last {
                        // The sequence is over: the slot goes to the next request now.
                        drop(running.take());
                        break;
                    }
                }
            }
            room = tx.reserve(), if !pending.is_empty() => {
                let Ok(room) = room else { return park(running, &parked) };
                if let Some(event) = pending.pop_front() {
                    room.send(event);
                }
            }
            () = tx.closed() => return park(running, &parked),
        }
        if running.is_none() && pending.is_empty() {
            return;
        }
    }
}

/// The client has gone: a slot still running waits in the sequence's picker until
/// mistral.rs drops the sequence ([`ParkedReplicaSlot`]).
fn park(running: Option<ReplicaSlot>, parked: &ParkedReplicaSlot) {
    if let Ok(mut cell) = parked.lock() {
        *cell = running;
    }
}

/// Stamps one response's pieces with when their tokens were produced, not when the
/// gateway's runtime got to them: mistral.rs sends one response per engine step, so a
/// piece takes the oldest pick not yet used (the engine may have run ahead of this
/// task, and picked the next tokens too); the sequence's last piece takes its last pick,
/// so that TPOT's span ends where the answer did. A step mistral.rs sends nothing for
/// (a character split across tokens) moves the pieces after it one token early, never
/// past the last. Without picks (none recorded) the runtime's stamp stands.
fn production(events: &mut [EngineEvent], picked_at: &mut VecDeque<Instant>) {
    let ends = events
        .iter()
        .any(|e| !matches!(e, EngineEvent::Token { .. }));
    let produced = if ends {
        let last = picked_at.back().copied();
        picked_at.clear();
        last
    } else {
        picked_at.pop_front()
    };
    let Some(produced) = produced else {
        return;
    };
    for event in events {
        if let EngineEvent::Token { at, .. } = event {
            *at = produced.min(*at);
        }
    }
}

/// mistral.rs 0.8.1 trims the start of a sequence's first piece of text
/// (`Sequence::peek_delta`, sequence.rs line 1029: "the first token usually starts with a
/// space"), so a completion of "The capital of France is" reads "Paris." where the model
/// said " Paris.", and an answer that opens with a newline loses it. The picker knows the
/// tokens' bytes and puts the whitespace back. Without a vocabulary (no bytes) the text
/// stays as mistral.rs sent it.
///
/// The picks drained with the first piece may already include the next token (the
/// engine runs ahead of this forwarder), so the whitespace is read from the start of the
/// picks, never from their end: a text that follows it is kept behind exactly that
/// whitespace; an empty first piece (a token of whitespace alone, trimmed to nothing) is
/// the first token's text.
fn restore_leading_space(text: &mut String, tokens: &[TokenLogprob]) {
    if text.is_empty() {
        if let Some(first) = tokens.first() {
            let spelled = std::str::from_utf8(&first.token.bytes).unwrap_or_default();
            if !spelled.is_empty() && spelled.chars().all(char::is_whitespace) {
                spelled.clone_into(text);
            }
        }
        return;
    }
    let bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|t| t.token.bytes.iter().copied())
        .collect();
    let Ok(decoded) = std::str::from_utf8(&bytes) else {
        return;
    };
    let rest = decoded.trim_start();
    let whitespace = &decoded[..decoded.len() - rest.len()];
    if !whitespace.is_empty() && rest.starts_with(text.as_str()) {
        text.insert_str(0, whitespace);
    }
}

/// The tokens picked since the last response: their ids and log-probabilities. The
/// token that ends the answer is counted (the forwarder's usage), not listed: it is no
/// part of the content (docs/api.md, "The end token").
#[derive(Debug, Default)]
struct Picked {
    ids: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    /// Tokens picked, the end token included: a step that picked only the end still
    /// gives an event, which marks when it was picked (where TPOT's span ends).
    count: usize,
}

impl Picked {
    fn new(picks: Vec<Pick>, vocabulary: Option<&Vocabulary>) -> Self {
        let text = |id: u32| {
            vocabulary
                .map_or_else(|| TokenText::from_bytes(Vec::new()), |v| v.token_text(id))
                .with_id(id)
        };
        let count = picks.len();
        let content = || picks.iter().filter(|p| !p.ends);
        let ids = content().map(|p| p.id).collect();
        let logprobs = content()
            .map(|p| TokenLogprob {
                sampled: p.sampled,
                token: text(p.id),
                logprob: p.logprob,
                top: p.top.iter().map(|&(id, lp)| (text(id), lp)).collect(),
            })
            .collect();
        Self {
            ids,
            logprobs,
            count,
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// What to report when mistral.rs closes a stream without a finish chunk: a finish with
/// our own count when tokens were generated, an error otherwise.
fn closed_without_finish(
    picked: Picked,
    counted: Usage,
    max_tokens: u32,
    at: Instant,
) -> Vec<EngineEvent> {
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
    if !picked.is_empty() {
        events.push(EngineEvent::Token {
            text: String::new(),
            ids: picked.ids,
            logprobs: picked.logprobs,
            at,
        });
    }
    events.push(EngineEvent::Finished {
        reason,
        usage: counted,
    });
    events
}

/// Events for one mistral.rs response, handed over `at`; `picked` are the tokens picked
/// since the last one and `counted` the usage the forwarder counted itself, used when
/// mistral.rs sends none.
fn translate(response: Response, picked: Picked, counted: Usage, at: Instant) -> Vec<EngineEvent> {
    match response {
        Response::Chunk(chunk) => {
            let usage = usage_of(chunk.usage).unwrap_or(counted);
            match chunk.choices.into_iter().next() {
                Some(choice) => piece(
                    choice.delta.content.unwrap_or_default(),
                    choice.finish_reason,
                    picked,
                    usage,
                    at,
                ),
                None => Vec::new(),
            }
        }
        // Legacy completions stream the same way, with text instead of a delta and no
        // usage (our own count stands).
        Response::CompletionChunk(chunk) => match chunk.choices.into_iter().next() {
            Some(choice) => piece(choice.text, choice.finish_reason, picked, counted, at),
            None => Vec::new(),
        },
        Response::CompletionModelError(message, _) => {
            vec![EngineEvent::Failed(EngineError::Internal(message))]
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

/// The events of one streamed piece of text and, on the last, how the sequence ended.
fn piece(
    text: String,
    finish_reason: Option<String>,
    picked: Picked,
    usage: Usage,
    at: Instant,
) -> Vec<EngineEvent> {
    let mut events = Vec::with_capacity(2);
    if !text.is_empty() || !picked.is_empty() {
        events.push(EngineEvent::Token {
            text,
            ids: picked.ids,
            logprobs: picked.logprobs,
            at,
        });
    }
    if let Some(reason) = finish_reason {
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
        events.push(EngineEvent::Finished { reason, usage });
    }
    events
}

fn response_kind(response: &Response) -> &'static str {
    match response {
        Response::Done(_) => "done",
        Response::CompletionDone(_) => "completion done",
        _ => "other",
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Token counts from the usage mistral.rs attaches to the last chunk.
fn usage_of(usage: Option<mistralrs::Usage>) -> Option<Usage> {
    usage.map(|u| Usage {
        prompt_tokens: to_u32(u.prompt_tokens),
        completion_tokens: to_u32(u.completion_tokens),
        cached_tokens: None,
        reasoning_tokens: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_pieces_trimmed_whitespace_is_restored_from_the_tokens() {
        let tokens = |texts: &[&str]| -> Vec<TokenLogprob> {
            texts
                .iter()
                .map(|t| TokenLogprob {
                    sampled: None,
                    token: TokenText::from_bytes(t.as_bytes().to_vec()),
                    logprob: -0.1,
                    top: Vec::new(),
                })
                .collect()
        };
        let restored = |text: &str, texts: &[&str]| {
            let mut text = text.to_owned();
            restore_leading_space(&mut text, &tokens(texts));
            text
        };
        assert_eq!(restored("Paris", &[" Par", "is"]), " Paris");
        assert_eq!(
            restored("Par", &[" Par", "is"]),
            " Par",
            "the next pick came along"
        );
        assert_eq!(
            restored("", &["\n", "\n"]),
            "\n",
            "the next pick is its own piece"
        );
        assert_eq!(
            restored("", &["\n\n"]),
            "\n\n",
            "a whitespace-only first token"
        );
        assert_eq!(restored("Paris", &["Paris"]), "Paris");
        assert_eq!(
            restored("", &["<|im_end|>"]),
            "",
            "not whitespace: left alone"
        );
        assert_eq!(
            restored("x", &[" y"]),
            "x",
            "not the tokens' text: left alone"
        );
        assert_eq!(restored("Paris", &[]), "Paris", "no vocabulary, no bytes");
    }

    #[test]
    fn the_end_token_is_counted_and_timed_but_not_listed() {
        let at = Instant::now();
        let pick = |id: u32, ends: bool| Pick {
            sampled: None,
            id,
            logprob: -0.5,
            top: Vec::new(),
            at,
            ends,
        };
        let usage = Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: None,
            reasoning_tokens: None,
        };
        // The last step picked ".", then the end token: "." is listed, the end is not.
        let last = piece(
            ".".into(),
            Some("stop".into()),
            Picked::new(vec![pick(13, false), pick(2, true)], None),
            usage,
            at,
        );
        assert!(
            matches!(&last[0], EngineEvent::Token { ids, logprobs, .. } if *ids == [13] && logprobs.len() == 1),
            "{last:?}"
        );
        assert_eq!(
            last[1],
            EngineEvent::Finished {
                reason: FinishReason::Stop,
                usage
            }
        );
        // A step that picked only the end still marks when (TPOT's span ends there).
        let alone = piece(
            String::new(),
            Some("stop".into()),
            Picked::new(vec![pick(2, true)], None),
            usage,
            at,
        );
        assert_eq!(
            alone[0],
            EngineEvent::Token {
                text: String::new(),
                ids: Vec::new(),
                logprobs: Vec::new(),
                at
            }
        );
    }

    #[test]
    fn pieces_are_stamped_when_their_tokens_were_picked() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + std::time::Duration::from_millis(n);
        let token = |text: &str| EngineEvent::Token {
            text: text.into(),
            ids: Vec::new(),
            logprobs: Vec::new(),
            at: ms(100),
        };
        // The runtime got to three steps at once, at 100 ms; they were picked at 10, 20
        // and 30 ms, and the third one ended the answer at 40 (its last pick).
        let mut picked_at: VecDeque<Instant> = [ms(10), ms(20), ms(30), ms(40)].into();
        let stamped = |events: &[EngineEvent]| match &events[0] {
            EngineEvent::Token { at, .. } => *at,
            _ => unreachable!(),
        };
        let mut first = vec![token("a")];
        production(&mut first, &mut picked_at);
        assert_eq!(stamped(&first), ms(10));
        let mut second = vec![token("b")];
        production(&mut second, &mut picked_at);
        assert_eq!(stamped(&second), ms(20));
        let finished = EngineEvent::Finished {
            reason: FinishReason::Stop,
            usage: Usage::default(),
        };
        let mut last = vec![token("c"), finished];
        production(&mut last, &mut picked_at);
        assert_eq!(stamped(&last), ms(40), "the answer's end is its last pick");
        assert!(picked_at.is_empty());
        // Nothing picked: the runtime's stamp stands.
        let mut unpicked = vec![token("d")];
        production(&mut unpicked, &mut picked_at);
        assert_eq!(stamped(&unpicked), ms(100));
    }

    #[test]
    fn a_silent_close_after_tokens_is_a_finish_from_our_count() {
        let counted = Usage {
            prompt_tokens: 51,
            completion_tokens: 128,
            cached_tokens: None,
            reasoning_tokens: None,
        };
        let at = Instant::now();
        let picked = Picked::new(
            vec![Pick {
                sampled: None,
                id: 7,
                logprob: -0.5,
                top: Vec::new(),
                at,
                ends: false,
            }],
            None,
        );
        let events = closed_without_finish(picked, counted, 128, at);
        assert_eq!(
            events,
            vec![
                EngineEvent::Token {
                    text: String::new(),
                    ids: vec![7],
                    logprobs: vec![TokenLogprob {
                        sampled: None,
                        token: TokenText::from_bytes(Vec::new()).with_id(7),
                        logprob: -0.5,
                        top: Vec::new(),
                    }],
                    at
                },
                EngineEvent::Finished {
                    reason: FinishReason::Length,
                    usage: counted,
                }
            ]
        );
        let early = closed_without_finish(
            Picked::default(),
            Usage {
                completion_tokens: 5,
                ..counted
            },
            128,
            at,
        );
        assert!(matches!(
            early[0],
            EngineEvent::Finished {
                reason: FinishReason::Stop,
                ..
            }
        ));
        let nothing = closed_without_finish(
            Picked::default(),
            Usage {
                completion_tokens: 0,
                ..counted
            },
            128,
            at,
        );
        assert!(matches!(nothing[0], EngineEvent::Failed(_)));
    }
}

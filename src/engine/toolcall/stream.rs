//! Reads an answer in the generic tool format back into OpenAI's shape as it streams:
//! once `{"tool_call":{"name":"<name>","arguments":` is complete, the call's first
//! delta (its id and name) goes out, then each piece of the arguments as the engine
//! writes it, less the two closing braces that end the call and the answer; a
//! `{"response": "..."}` answer is content, sent once it is whole (its JSON string is
//! read then). The grammar writes the JSON compact, so the prefix is exact.

use std::time::Instant;

use serde_json::Value;

use super::ToolPlan;
use crate::engine::{EngineError, EngineEvent, ToolCallDelta};
use crate::tokens::FinishReason;

const CALL_HEAD: &str = "{\"tool_call\":{\"name\":\"";
const ARGUMENTS_HEAD: &str = "\",\"arguments\":";
/// What closes the arguments' object's parents: the call and the answer.
const CLOSING: &str = "}}";

/// Where the answer's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Before the call's name is known (or the answer is seen to be a response).
    Head,
    /// In the arguments: this many bytes of the text have gone out.
    Arguments { sent: usize },
}

/// One answer in the generic format, read as its tokens come.
#[derive(Debug)]
pub struct Reading {
    plan: ToolPlan,
    text: String,
    part: Part,
    /// Token ids not yet accounted for by an event that went out, and all of them.
    pending: u32,
    ids: Vec<u32>,
    last_at: Option<Instant>,
}

impl Reading {
    pub fn new(plan: ToolPlan) -> Self {
        Self {
            plan,
            text: String::new(),
            part: Part::Head,
            pending: 0,
            ids: Vec::new(),
            last_at: None,
        }
    }

    /// The events the client's side gets for one of the engine's.
    pub fn on_event(&mut self, event: EngineEvent) -> Vec<EngineEvent> {
        match event {
            EngineEvent::Token { text, ids, at, .. } => {
                self.text.push_str(&text);
                self.pending += u32::try_from(ids.len()).unwrap_or(u32::MAX);
                self.ids.extend(ids);
                self.last_at = Some(at);
                self.advance(at)
            }
            EngineEvent::Finished { reason, usage } => self.finish(reason, usage),
            EngineEvent::Restarted => {
                *self = Self::new(self.plan.clone());
                vec![EngineEvent::Restarted]
            }
            other => vec![other],
        }
    }

    /// What the text so far lets out.
    fn advance(&mut self, at: Instant) -> Vec<EngineEvent> {
        let mut out = Vec::new();
        if self.part == Part::Head {
            let Some(name) = self.name() else {
                return out;
            };
            let sent = CALL_HEAD.len() + name.len() + ARGUMENTS_HEAD.len();
            out.push(self.call_piece(Some(name), String::new(), at));
            self.part = Part::Arguments { sent };
        }
        if let Part::Arguments { sent } = self.part {
            // The closing braces are held back: they are not the arguments'.
            let mut end = self.text.len().saturating_sub(CLOSING.len()).max(sent);
            while !self.text.is_char_boundary(end) {
                end -= 1;
            }
            if end > sent {
                let piece = self.text[sent..end].to_owned();
                out.push(self.call_piece(None, piece, at));
                self.part = Part::Arguments { sent: end };
            }
        }
        out
    }

    /// The call's name, once the text has it whole.
    fn name(&self) -> Option<String> {
        let rest = self.text.strip_prefix(CALL_HEAD)?;
        let (name, _) = rest.split_once(ARGUMENTS_HEAD)?;
        Some(name.to_owned())
    }

    /// A piece of the call, standing for the tokens not yet accounted for.
    fn call_piece(&mut self, name: Option<String>, arguments: String, at: Instant) -> EngineEvent {
        let tokens = std::mem::take(&mut self.pending);
        EngineEvent::ToolCall {
            delta: ToolCallDelta {
                index: 0,
                id: name.as_ref().map(|_| self.plan.id(0)),
                name,
                arguments,
            },
            tokens,
            at,
        }
    }

    /// The engine's end: the call's last piece and a `tool_calls` finish, the response
    /// as content, or an error the client can read when the JSON is not whole.
    fn finish(&mut self, reason: FinishReason, usage: crate::tokens::Usage) -> Vec<EngineEvent> {
        let at = self.last_at.unwrap_or_else(Instant::now);
        let parsed: Option<Value> = serde_json::from_str(&self.text).ok();
        let Some(parsed) = parsed else {
            return vec![EngineEvent::Failed(self.unfinished(reason, usage))];
        };
        // The end token is counted in the usage but comes with no event: it is the
        // call's last.
        let seen = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
        self.pending += usage.completion_tokens.saturating_sub(seen);
        let mut out = Vec::new();
        match self.part {
            Part::Arguments { sent } => {
                let rest = self.text[sent..].strip_suffix(CLOSING).unwrap_or("");
                if !rest.is_empty() || self.pending > 0 {
                    out.push(self.call_piece(None, rest.to_owned(), at));
                }
            }
            Part::Head => {
                if let Some(content) = parsed.get("response").and_then(Value::as_str) {
                    out.push(EngineEvent::Token {
                        text: content.to_owned(),
                        ids: std::mem::take(&mut self.ids),
                        logprobs: Vec::new(),
                        at,
                    });
                    out.push(EngineEvent::Finished { reason, usage });
                    return out;
                }
                // A call written other than compact: read whole, sent in two pieces.
                let call = parsed.get("tool_call");
                let name = call.and_then(|c| c.get("name")).and_then(Value::as_str);
                let (Some(name), Some(arguments)) = (name, call.and_then(|c| c.get("arguments")))
                else {
                    return vec![EngineEvent::Failed(self.unfinished(reason, usage))];
                };
                out.push(self.call_piece(Some(name.to_owned()), String::new(), at));
                out.push(self.call_piece(None, arguments.to_string(), at));
            }
        }
        let reason = match reason {
            FinishReason::Stop => FinishReason::ToolCalls,
            other => other,
        };
        out.push(EngineEvent::Finished { reason, usage });
        out
    }

    fn unfinished(&self, reason: FinishReason, usage: crate::tokens::Usage) -> EngineError {
        match reason {
            FinishReason::Length => EngineError::InvalidParameter {
                param: "max_tokens".into(),
                message: format!(
                    "the model's tool call was cut at {} tokens, before its arguments were whole; ask for more",
                    usage.completion_tokens
                ),
            },
            _ => EngineError::Internal(format!(
                "the engine's tool-call answer is not the JSON its grammar holds: {}",
                self.text.chars().take(120).collect::<String>()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Usage;

    fn plan() -> ToolPlan {
        ToolPlan {
            call_id: "call_x".into(),
            format: super::super::ToolFormat::Generic,
            tools: Vec::new(),
        }
    }

    fn token(text: &str) -> EngineEvent {
        EngineEvent::Token {
            text: text.into(),
            ids: vec![1],
            logprobs: Vec::new(),
            at: Instant::now(),
        }
    }

    fn finished(reason: FinishReason, tokens: u32) -> EngineEvent {
        EngineEvent::Finished {
            reason,
            usage: Usage {
                completion_tokens: tokens,
                ..Usage::default()
            },
        }
    }

    fn feed(reading: &mut Reading, pieces: &[&str]) -> Vec<EngineEvent> {
        pieces
            .iter()
            .flat_map(|p| reading.on_event(token(p)))
            .collect()
    }

    #[test]
    fn a_call_streams_its_name_then_its_arguments_without_the_closing_braces() {
        let mut reading = Reading::new(plan());
        let pieces = [
            "{\"tool_call\":{\"",
            "name\":\"get_",
            "weather\",\"arguments\":{\"ci",
            "ty\":\"Pa",
            "ris\"}",
            "}}",
        ];
        let mut out = feed(&mut reading, &pieces);
        out.extend(reading.on_event(finished(FinishReason::Stop, 6)));
        let mut calls = crate::engine::ToolCalls::default();
        let mut tokens = 0;
        for event in &out[..out.len() - 1] {
            let EngineEvent::ToolCall {
                delta, tokens: n, ..
            } = event
            else {
                panic!("{event:?}")
            };
            calls.push(delta);
            tokens += n;
        }
        assert_eq!(calls.0[0].name, "get_weather");
        assert_eq!(calls.0[0].id, "call_x");
        assert_eq!(calls.0[0].arguments, "{\"city\":\"Paris\"}");
        assert_eq!(tokens, 6, "every token in some piece");
        let EngineEvent::ToolCall { delta: first, .. } = &out[0] else {
            panic!()
        };
        assert_eq!(
            (first.name.as_deref(), first.arguments.as_str()),
            (Some("get_weather"), "")
        );
        assert!(matches!(
            out.last(),
            Some(EngineEvent::Finished {
                reason: FinishReason::ToolCalls,
                ..
            })
        ));
    }

    #[test]
    fn a_response_is_content_once_whole() {
        let mut reading = Reading::new(plan());
        let out = feed(
            &mut reading,
            &["{\"response\":\"Bon", "jour \\\"à\\\" tous\"}"],
        );
        assert!(out.is_empty(), "held until whole: {out:?}");
        let out = reading.on_event(finished(FinishReason::Stop, 2));
        assert!(
            matches!(&out[0], EngineEvent::Token { text, ids, .. } if text == "Bonjour \"à\" tous" && ids.len() == 2)
        );
        assert!(matches!(
            out[1],
            EngineEvent::Finished {
                reason: FinishReason::Stop,
                ..
            }
        ));
    }

    #[test]
    fn a_call_cut_by_the_budget_is_an_error_naming_max_tokens() {
        let mut reading = Reading::new(plan());
        feed(
            &mut reading,
            &["{\"tool_call\":{\"name\":\"f\",\"arguments\":{\"city\":\"Par"],
        );
        let out = reading.on_event(finished(FinishReason::Length, 9));
        assert!(matches!(
            &out[0],
            EngineEvent::Failed(EngineError::InvalidParameter { param, .. }) if param == "max_tokens"
        ));
    }
}

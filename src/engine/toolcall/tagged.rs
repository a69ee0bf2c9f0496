//! An answer in a template's own tool-call format ([`super::syntax`]: Hermes, Llama 3,
//! Mistral, DeepSeek R1), read as its tokens come. The template lists the tools and
//! renders earlier calls and results itself; under `required` or a named function a
//! grammar holds the answer to one call. Under `auto` the model writes freely: text is
//! content until a call opens, the calls of a section go out once it closes (at its
//! closing marker, or at the end of the answer for a format that has none), and a call
//! that is not readable, or names a tool the request did not offer, is an error the
//! client can read, never text.

use std::time::Instant;

use super::syntax::{RawCall, Syntax, Unread};
use super::ToolPlan;
use crate::engine::reasoning::tag_start_at_end;
use crate::engine::{EngineError, EngineEvent, ToolCallDelta};
use crate::tokens::{FinishReason, Usage};

/// Where the reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Text,
    /// In a section of calls: the text before `scanned` holds no closing marker. `bare`:
    /// opened by the answer's own start (Llama 3's JSON), which may yet read as text.
    Call {
        scanned: usize,
        bare: bool,
    },
}

/// One answer in a template's tool-call format, read as its tokens come.
#[derive(Debug)]
pub struct Reading {
    plan: ToolPlan,
    syntax: &'static Syntax,
    /// Text not yet handed on: a marker's start, white space, or a section not yet closed.
    held: String,
    part: Part,
    /// Content handed on (a bare call can then no longer open).
    wrote_text: bool,
    /// Calls handed on.
    calls: usize,
    /// Token ids behind `held` (and behind white space dropped before a call).
    ids: Vec<u32>,
    /// Tokens the events handed on stand for, for the end token's share.
    accounted: u32,
    last_at: Option<Instant>,
}

impl Reading {
    /// An answer to `plan`, in its format's `syntax` ([`ToolFormat::syntax`](super::ToolFormat::syntax)).
    pub fn new(plan: ToolPlan, syntax: &'static Syntax) -> Self {
        Self {
            plan,
            syntax,
            held: String::new(),
            part: Part::Text,
            wrote_text: false,
            calls: 0,
            ids: Vec::new(),
            accounted: 0,
            last_at: None,
        }
    }

    /// The events the client's side gets for one of the engine's.
    pub fn on_event(&mut self, event: EngineEvent) -> Vec<EngineEvent> {
        match event {
            EngineEvent::Token { text, ids, at, .. } => {
                self.held.push_str(&text);
                self.ids.extend(ids);
                self.last_at = Some(at);
                self.advance(at)
                    .unwrap_or_else(|e| vec![EngineEvent::Failed(e)])
            }
            EngineEvent::Finished { reason, usage } => self.finish(reason, usage),
            EngineEvent::Restarted => {
                *self = Self::new(self.plan.clone(), self.syntax);
                vec![EngineEvent::Restarted]
            }
            other => vec![other],
        }
    }

    /// What the text so far lets out.
    fn advance(&mut self, at: Instant) -> Result<Vec<EngineEvent>, EngineError> {
        let mut out = Vec::new();
        loop {
            match self.part {
                Part::Text => {
                    if let Some(bare) = self.syntax.bare.filter(|_| self.may_open_bare()) {
                        let start = self.held.trim_start();
                        if start.is_empty() {
                            return Ok(out);
                        }
                        if start.starts_with(bare) {
                            self.held = start.to_owned();
                            self.part = Part::Call {
                                scanned: 0,
                                bare: true,
                            };
                            continue;
                        }
                    }
                    if let Some((i, marker)) = self.first_opening() {
                        let section = self.held.split_off(i);
                        // Line breaks before a call are not content: their tokens are
                        // the call's.
                        if self.held.trim().is_empty() {
                            self.held.clear();
                        } else {
                            out.extend(self.text(at));
                        }
                        self.held = section[marker.len()..].to_owned();
                        self.part = Part::Call {
                            scanned: 0,
                            bare: false,
                        };
                        continue;
                    }
                    // All but what may be the start of a marker, once there is more than
                    // white space (the model's line breaks around calls are not content).
                    let keep = self
                        .syntax
                        .opens
                        .iter()
                        .map(|marker| tag_start_at_end(&self.held, marker))
                        .max()
                        .unwrap_or(0);
                    if self.held[..self.held.len() - keep].trim().is_empty() {
                        return Ok(out);
                    }
                    let kept = self.held.split_off(self.held.len() - keep);
                    out.extend(self.text(at));
                    self.held = kept;
                    return Ok(out);
                }
                Part::Call { scanned, bare } => {
                    // A section without a closing marker runs to the answer's end.
                    let Some(close) = self.syntax.close else {
                        return Ok(out);
                    };
                    // Only the new text, and a marker's start before it, can hold it.
                    let Some(i) = self.held[scanned..].find(close).map(|i| scanned + i) else {
                        let mut scanned = self.held.len().saturating_sub(close.len() - 1);
                        while !self.held.is_char_boundary(scanned) {
                            scanned -= 1;
                        }
                        self.part = Part::Call { scanned, bare };
                        return Ok(out);
                    };
                    let rest = self.held.split_off(i);
                    out.extend(self.section(at, bare)?);
                    self.held = rest[close.len()..].to_owned();
                    self.part = Part::Text;
                }
            }
        }
    }

    fn may_open_bare(&self) -> bool {
        self.calls == 0 && !self.wrote_text
    }

    /// The first marker in `held` that opens a section, and where.
    fn first_opening(&self) -> Option<(usize, &'static str)> {
        self.syntax
            .opens
            .iter()
            .filter_map(|marker| self.held.find(marker).map(|i| (i, *marker)))
            .min_by_key(|(i, _)| *i)
    }

    /// `held` as content, with the tokens behind it; none for white space after a call
    /// (its tokens are then the call's).
    fn text(&mut self, at: Instant) -> Option<EngineEvent> {
        if self.held.trim().is_empty() && self.calls > 0 {
            self.held.clear();
            return None;
        }
        let text = std::mem::take(&mut self.held);
        let ids = std::mem::take(&mut self.ids);
        self.accounted = self
            .accounted
            .saturating_add(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        self.wrote_text |= !text.is_empty();
        (!text.is_empty() || !ids.is_empty()).then(|| EngineEvent::Token {
            text,
            ids,
            logprobs: Vec::new(),
            at,
        })
    }

    /// `held` as a section of calls: for each its first delta (id and name), then its
    /// arguments; the section's tokens go with its last piece. A bare section that
    /// reads as no call is content.
    fn section(&mut self, at: Instant, bare: bool) -> Result<Vec<EngineEvent>, EngineError> {
        let calls = match (self.syntax.parse)(&self.held) {
            Ok(calls) => calls,
            Err(Unread::NotACall) if bare => return Ok(self.text(at).into_iter().collect()),
            Err(Unread::NotACall) => return Err(self.unreadable("is not a call")),
            Err(Unread::Bad(why)) => return Err(self.unreadable(why)),
        };
        for call in &calls {
            let why = self.against_schema(call);
            if let Some(why) = why {
                return Err(self.unreadable(&why));
            }
        }
        self.held.clear();
        let mut out = Vec::with_capacity(calls.len() * 2);
        for RawCall { name, arguments } in calls {
            let index = u32::try_from(self.calls).unwrap_or(u32::MAX);
            let piece = |id: Option<String>, name: Option<String>, arguments: String| {
                EngineEvent::ToolCall {
                    delta: ToolCallDelta {
                        index,
                        id,
                        name,
                        arguments,
                    },
                    tokens: 0,
                    at,
                }
            };
            out.push(piece(
                Some(self.plan.id(self.calls)),
                Some(name),
                String::new(),
            ));
            out.push(piece(None, None, arguments.to_string()));
            self.calls += 1;
        }
        let tokens = u32::try_from(std::mem::take(&mut self.ids).len()).unwrap_or(u32::MAX);
        self.accounted = self.accounted.saturating_add(tokens);
        if let Some(EngineEvent::ToolCall { tokens: t, .. }) = out.last_mut() {
            *t = tokens;
        }
        Ok(out)
    }

    /// What is wrong with `call` for the request's tools: a tool it did not offer, or
    /// arguments its schema does not take (under `auto` no grammar held them; a schema
    /// that cannot be compiled here is not held against the call).
    fn against_schema(&self, call: &RawCall) -> Option<String> {
        let Some(tool) = self.plan.tools.iter().find(|f| f.name == call.name) else {
            return Some(format!(
                "names a tool the request did not offer ({})",
                call.name
            ));
        };
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        compiler
            .add_resource("tool.json", tool.parameters.clone())
            .ok()?;
        let schema = compiler.compile("tool.json", &mut schemas).ok()?;
        let error = schemas.validate(&call.arguments, schema).err()?;
        // The first mistake the schema found, where it is.
        let mut first = &error;
        while let Some(cause) = first.causes.first() {
            first = cause;
        }
        Some(format!(
            "has arguments {}'s schema does not take (at '{}': {})",
            call.name, first.instance_location, first.kind
        ))
    }

    fn unreadable(&self, why: &str) -> EngineError {
        EngineError::Internal(format!(
            "the model's tool call {why}: {}",
            self.held.trim().chars().take(160).collect::<String>()
        ))
    }

    /// The engine's end: the last text, a section the end closed, and a `tool_calls`
    /// finish where there were calls.
    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<EngineEvent> {
        let at = self.last_at.unwrap_or_else(Instant::now);
        let mut out = Vec::new();
        match self.part {
            Part::Text => out.extend(self.text(at)),
            // A section the end closes: one without a closing marker, or one the end
            // token closed in place of it (seen of Qwen).
            Part::Call { bare, .. } => match self.section(at, bare) {
                Ok(events) => out.extend(events),
                Err(_) if reason == FinishReason::Length => {
                    return vec![EngineEvent::Failed(EngineError::InvalidParameter {
                        param: "max_tokens".into(),
                        message: format!(
                            "the model's tool call was cut at {} tokens, before it was whole; \
                             ask for more",
                            usage.completion_tokens
                        ),
                    })]
                }
                Err(error) => return vec![EngineEvent::Failed(error)],
            },
        }
        if self.calls == 0 {
            out.push(EngineEvent::Finished { reason, usage });
            return out;
        }
        // The end token is counted in the usage but comes with no event, and white
        // space after the last call comes with none either: the last call's.
        let rest = usage.completion_tokens.saturating_sub(self.accounted);
        if rest > 0 {
            match out.last_mut() {
                Some(EngineEvent::ToolCall { tokens, .. }) => *tokens += rest,
                // The call went out before the end: an empty piece of it carries them.
                _ => out.push(EngineEvent::ToolCall {
                    delta: ToolCallDelta {
                        index: u32::try_from(self.calls - 1).unwrap_or(u32::MAX),
                        ..ToolCallDelta::default()
                    },
                    tokens: rest,
                    at,
                }),
            }
        }
        let reason = match reason {
            FinishReason::Stop => FinishReason::ToolCalls,
            other => other,
        };
        out.push(EngineEvent::Finished { reason, usage });
        out
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::toolcall::ToolFormat;
    use crate::engine::Function;
    use serde_json::json;

    fn plan_in(format: ToolFormat) -> ToolPlan {
        ToolPlan {
            call_id: "call_x".into(),
            format,
            tools: ["get_weather", "get_time"]
                .map(|name| Function {
                    name: name.into(),
                    description: None,
                    parameters: json!({"type": "object", "properties": {
                        "city": {"type": "string"}, "zone": {"type": "string"}}}),
                    strict: None,
                })
                .into_iter()
                .collect(),
        }
    }

    fn reading(format: ToolFormat) -> Reading {
        Reading::new(
            plan_in(format),
            format.syntax().expect("a format of its own"),
        )
    }

    fn feed(reading: &mut Reading, pieces: &[&str], reason: FinishReason) -> Vec<EngineEvent> {
        let mut out = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            out.extend(reading.on_event(EngineEvent::Token {
                text: (*piece).into(),
                ids: vec![i as u32],
                logprobs: Vec::new(),
                at: Instant::now(),
            }));
        }
        let usage = Usage {
            completion_tokens: pieces.len() as u32 + 1,
            ..Usage::default()
        };
        out.extend(reading.on_event(EngineEvent::Finished { reason, usage }));
        out
    }

    /// (content, [(index, id, name, arguments)], finish reason or error text).
    type Read = (String, Vec<(u32, Option<String>, String)>, String);

    fn read(out: &[EngineEvent]) -> Read {
        let (mut content, mut calls, mut end) = (String::new(), Vec::new(), String::new());
        for event in out {
            match event {
                EngineEvent::Token { text, .. } => content.push_str(text),
                EngineEvent::ToolCall { delta, .. } => match &delta.name {
                    Some(name) => calls.push((delta.index, delta.id.clone(), name.clone())),
                    // An empty piece carries tokens only.
                    None if delta.arguments.is_empty() => {}
                    None => {
                        let last: &mut (u32, Option<String>, String) =
                            calls.last_mut().expect("a call");
                        last.2.push_str(&format!("({})", delta.arguments));
                    }
                },
                EngineEvent::Finished { reason, .. } => end = format!("{reason:?}"),
                EngineEvent::Failed(e) => end = e.to_string(),
                other => panic!("{other:?}"),
            }
        }
        (content, calls, end)
    }

    #[test]
    fn calls_after_text_are_read_as_they_close() {
        let mut reading = reading(ToolFormat::Hermes);
        let out = feed(
            &mut reading,
            &[
                "Let me check.\n<tool",
                "_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
                "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", ",
                "\"arguments\": {\"zone\": \"CET\"}}\n</tool_call>",
            ],
            FinishReason::Stop,
        );
        let (content, calls, end) = read(&out);
        assert_eq!(content, "Let me check.\n");
        assert_eq!(
            calls,
            vec![
                (
                    0,
                    Some("call_x".into()),
                    "get_weather({\"city\":\"Paris\"})".into()
                ),
                (
                    1,
                    Some("call_x_1".into()),
                    "get_time({\"zone\":\"CET\"})".into()
                ),
            ]
        );
        assert_eq!(end, "ToolCalls");
        // Every token is accounted for, the end token with the last call.
        let tokens: u32 = out
            .iter()
            .map(|e| match e {
                EngineEvent::Token { ids, .. } => ids.len() as u32,
                EngineEvent::ToolCall { tokens, .. } => *tokens,
                _ => 0,
            })
            .sum();
        assert_eq!(tokens, 5);
    }

    #[test]
    fn a_closing_tag_cut_between_tokens_is_found() {
        let (_, calls, end) = read(&feed(
            &mut reading(ToolFormat::Hermes),
            &[
                "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</to",
                "ol_ca",
                "ll>",
            ],
            FinishReason::Stop,
        ));
        assert_eq!(calls[0].2, "get_time({\"zone\":\"CET\"})");
        assert_eq!(end, "ToolCalls");
    }

    #[test]
    fn text_alone_is_content_and_a_closing_end_token_closes_a_call() {
        let (content, calls, end) = read(&feed(
            &mut reading(ToolFormat::Hermes),
            &["It is <b>sunny</b> ", "in Paris <tool"],
            FinishReason::Stop,
        ));
        assert_eq!(
            (content.as_str(), calls.len()),
            ("It is <b>sunny</b> in Paris <tool", 0)
        );
        assert_eq!(end, "Stop");
        let (content, calls, end) = read(&feed(
            &mut reading(ToolFormat::Hermes),
            &["\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"UTC\\\"}\"}"],
            FinishReason::Stop,
        ));
        assert_eq!(content, "", "line breaks before a call are not content");
        assert_eq!(calls[0].2, "get_time({\"zone\":\"UTC\"})");
        assert_eq!(end, "ToolCalls");
    }

    #[test]
    fn a_call_that_is_not_json_or_not_offered_is_an_error_and_a_cut_one_names_max_tokens() {
        for body in [
            "{\"name\": \"get_weather\", \"arguments\": {",
            "{\"name\": \"rm_rf\"}",
            // Arguments the tool's schema does not take.
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": 75001}}",
        ] {
            let (_, _, end) = read(&feed(
                &mut reading(ToolFormat::Hermes),
                &["<tool_call>\n", body, "\n</tool_call>"],
                FinishReason::Stop,
            ));
            assert!(end.contains("the model's tool call"), "{end}");
        }
        let out = feed(
            &mut reading(ToolFormat::Hermes),
            &["<tool_call>\n{\"name\": \"get_weather\", \"argu"],
            FinishReason::Length,
        );
        assert!(
            matches!(&out[..], [EngineEvent::Failed(EngineError::InvalidParameter { param, .. })] if param == "max_tokens"),
            "{out:?}"
        );
    }

    #[test]
    fn llama_3_json_is_a_call_when_it_is_the_answer_and_text_otherwise() {
        let (content, calls, end) = read(&feed(
            &mut reading(ToolFormat::Llama3),
            &[
                "\n{\"name\": \"get_weather\", ",
                "\"parameters\": {\"city\": \"Paris\"}}",
            ],
            FinishReason::Stop,
        ));
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![(
                0,
                Some("call_x".into()),
                "get_weather({\"city\":\"Paris\"})".into()
            )]
        );
        assert_eq!(end, "ToolCalls");
        let (content, calls, end) = read(&feed(
            &mut reading(ToolFormat::Llama3),
            &["{\"answer\": ", "42}"],
            FinishReason::Stop,
        ));
        assert_eq!((content.as_str(), calls.len()), ("{\"answer\": 42}", 0));
        assert_eq!(end, "Stop");
        let (content, calls, _) = read(&feed(
            &mut reading(ToolFormat::Llama3),
            &["Hello! {\"name\": \"get_time\"}"],
            FinishReason::Stop,
        ));
        assert_eq!(
            (content.as_str(), calls.len()),
            ("Hello! {\"name\": \"get_time\"}", 0),
            "JSON after text is text"
        );
        let (_, calls, _) = read(&feed(
            &mut reading(ToolFormat::Llama3),
            &["<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}"],
            FinishReason::Stop,
        ));
        assert_eq!(calls[0].2, "get_time({})");
    }

    #[test]
    fn mistral_calls_run_to_the_end_and_take_nine_character_ids() {
        let (content, calls, end) = read(&feed(
            &mut reading(ToolFormat::MistralNemo),
            &[
                "[TOOL_",
                "CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, ",
                "{\"name\": \"get_time\", \"arguments\": {}}]",
            ],
            FinishReason::Stop,
        ));
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![
                (
                    0,
                    Some("x00000000".into()),
                    "get_weather({\"city\":\"Paris\"})".into()
                ),
                (1, Some("x00000001".into()), "get_time({})".into()),
            ]
        );
        assert_eq!(end, "ToolCalls");
        let (_, calls, _) = read(&feed(
            &mut reading(ToolFormat::MistralArgs),
            &["[TOOL_CALLS]get_time[ARGS]{\"zone\": \"CET\"}"],
            FinishReason::Stop,
        ));
        assert_eq!(calls[0].2, "get_time({\"zone\":\"CET\"})");
    }

    #[test]
    fn deepseek_calls_go_out_when_their_block_closes() {
        let out = feed(
            &mut reading(ToolFormat::DeepSeekR1),
            &[
                "I will look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n",
                "```json\n{\"zone\": \"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁",
                "end｜>",
            ],
            FinishReason::Stop,
        );
        let (content, calls, end) = read(&out);
        assert_eq!(content, "I will look.");
        assert_eq!(calls[0].2, "get_time({\"zone\":\"CET\"})");
        assert_eq!(end, "ToolCalls");
    }
}

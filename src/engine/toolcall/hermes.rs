//! The Hermes tool-call format, which Qwen 2.5 and 3, Hermes 2 and 3 and the templates
//! written after them speak: the template lists the tools and renders earlier calls and
//! results itself, and the model writes each call as
//! `<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>`, after any text.
//!
//! Under `required` or a named function a grammar holds the answer to one such call, its
//! arguments to the tool's schema (written with the template's own spacing). Under `auto`
//! the model writes freely and the answer is read as it streams: text is content until a
//! `<tool_call>` opens, each call goes out once its `</tool_call>` closes it, and a call
//! that is not JSON naming an offered tool is an error the client can read, never text.

use std::time::Instant;

use serde_json::{json, Value};

use super::{call_schemas, ToolPlan};
use crate::engine::reasoning::tag_start_at_end;
use crate::engine::{EngineError, EngineEvent, ToolCallDelta, Tools};
use crate::tokens::{FinishReason, Usage};

/// The tag that opens a call.
pub const OPEN: &str = "<tool_call>";
/// The tag that closes it.
pub const CLOSE: &str = "</tool_call>";

/// Whether a chat template speaks this format: it lists `tools` and writes calls in
/// `<tool_call>` tags.
pub fn template_speaks(source: &str) -> bool {
    source.contains(OPEN) && source.contains("tools")
}

/// The Lark grammar (llguidance's) that holds an answer to one call of a tool the choice
/// allows, spaced as the template writes calls.
pub fn grammar(tools: &Tools) -> String {
    let calls: Vec<Value> = call_schemas(tools).collect();
    let schema = json!({
        "anyOf": calls,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
    });
    format!("start: \"{OPEN}\\n\" call \"\\n{CLOSE}\"\ncall: %json {schema}\n")
}

/// Where the reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Text,
    /// In a call: the text before `scanned` holds no closing tag.
    Call {
        scanned: usize,
    },
}

/// One answer in the Hermes format, read as its tokens come.
#[derive(Debug)]
pub struct Reading {
    plan: ToolPlan,
    /// Text not yet handed on: a tag's start, white space, or a call not yet closed.
    held: String,
    part: Part,
    /// Calls handed on.
    calls: usize,
    /// Token ids behind `held` (and behind white space dropped before a call).
    ids: Vec<u32>,
    /// Tokens the events handed on stand for, for the end token's share.
    accounted: u32,
    last_at: Option<Instant>,
}

impl Reading {
    pub fn new(plan: ToolPlan) -> Self {
        Self {
            plan,
            held: String::new(),
            part: Part::Text,
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
                *self = Self::new(self.plan.clone());
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
                    if let Some(i) = self.held.find(OPEN) {
                        let call = self.held.split_off(i);
                        // Line breaks before a call are not content: its tokens are
                        // the call's.
                        if self.held.trim().is_empty() {
                            self.held.clear();
                        } else {
                            out.extend(self.text(at));
                        }
                        self.held = call[OPEN.len()..].to_owned();
                        self.part = Part::Call { scanned: 0 };
                        continue;
                    }
                    // All but what may be the start of a tag, once there is more than
                    // white space (the model's line breaks around calls are not content).
                    let keep = tag_start_at_end(&self.held, OPEN);
                    if self.held[..self.held.len() - keep].trim().is_empty() {
                        return Ok(out);
                    }
                    let kept = self.held.split_off(self.held.len() - keep);
                    out.extend(self.text(at));
                    self.held = kept;
                    return Ok(out);
                }
                Part::Call { scanned } => {
                    // Only the new text, and a tag's start before it, can hold the tag.
                    let Some(i) = self.held[scanned..].find(CLOSE).map(|i| scanned + i) else {
                        let mut scanned = self.held.len().saturating_sub(CLOSE.len() - 1);
                        while !self.held.is_char_boundary(scanned) {
                            scanned -= 1;
                        }
                        self.part = Part::Call { scanned };
                        return Ok(out);
                    };
                    let rest = self.held.split_off(i);
                    out.extend(self.call(at)?);
                    self.held = rest[CLOSE.len()..].to_owned();
                    self.part = Part::Text;
                }
            }
        }
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
        (!text.is_empty() || !ids.is_empty()).then(|| EngineEvent::Token {
            text,
            ids,
            logprobs: Vec::new(),
            at,
        })
    }

    /// `held` as one call: its first delta (id and name), then its arguments.
    fn call(&mut self, at: Instant) -> Result<[EngineEvent; 2], EngineError> {
        let body = std::mem::take(&mut self.held);
        let (name, arguments) = self.parse(body.trim())?;
        let index = u32::try_from(self.calls).unwrap_or(u32::MAX);
        let id = match self.calls {
            0 => self.plan.call_id.clone(),
            n => format!("{}_{n}", self.plan.call_id),
        };
        self.calls += 1;
        let tokens = u32::try_from(std::mem::take(&mut self.ids).len()).unwrap_or(u32::MAX);
        self.accounted = self.accounted.saturating_add(tokens);
        let piece = |id: Option<String>, name: Option<String>, arguments: String, tokens| {
            EngineEvent::ToolCall {
                delta: ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                },
                tokens,
                at,
            }
        };
        Ok([
            piece(Some(id), Some(name), String::new(), 0),
            piece(None, None, arguments, tokens),
        ])
    }

    /// A call's JSON: the name of an offered tool, and its arguments as compact JSON.
    fn parse(&self, body: &str) -> Result<(String, String), EngineError> {
        let unreadable = |why: &str| {
            EngineError::Internal(format!(
                "the model's tool call {why}: {}",
                body.chars().take(160).collect::<String>()
            ))
        };
        let call: Value = serde_json::from_str(body).map_err(|_| unreadable("is not JSON"))?;
        let name = call
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| unreadable("has no name"))?;
        if !self.plan.tools.iter().any(|t| t == name) {
            return Err(unreadable("names a tool the request did not offer"));
        }
        let arguments = match call.get("arguments") {
            Some(Value::Object(arguments)) => Value::Object(arguments.clone()).to_string(),
            // Some models write the arguments as a JSON string.
            Some(Value::String(text))
                if serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()) =>
            {
                text.clone()
            }
            None => "{}".to_owned(),
            Some(_) => return Err(unreadable("has arguments that are not a JSON object")),
        };
        Ok((name.to_owned(), arguments))
    }

    /// The engine's end: the last text, a call the end token closed, and a `tool_calls`
    /// finish where there were calls.
    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<EngineEvent> {
        let at = self.last_at.unwrap_or_else(Instant::now);
        let mut out = Vec::new();
        match self.part {
            Part::Text => out.extend(self.text(at)),
            // A call the end token closed in place of `</tool_call>` (seen of Qwen).
            Part::Call { .. } => match self.call(at) {
                Ok(call) => out.extend(call),
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
    use crate::engine::ToolChoice;

    fn plan() -> ToolPlan {
        ToolPlan {
            call_id: "call_x".into(),
            format: ToolFormat::Hermes,
            tools: vec!["get_weather".into(), "get_time".into()],
        }
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
        let mut reading = Reading::new(plan());
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
            &mut Reading::new(plan()),
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
            &mut Reading::new(plan()),
            &["It is <b>sunny</b> ", "in Paris <tool"],
            FinishReason::Stop,
        ));
        assert_eq!(
            (content.as_str(), calls.len()),
            ("It is <b>sunny</b> in Paris <tool", 0)
        );
        assert_eq!(end, "Stop");
        let (content, calls, end) = read(&feed(
            &mut Reading::new(plan()),
            &["\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"UTC\\\"}\"}"],
            FinishReason::Stop,
        ));
        assert_eq!(content, "", "line breaks before a call are not content");
        assert_eq!(calls[0].2, "get_time({\"zone\": \"UTC\"})");
        assert_eq!(end, "ToolCalls");
    }

    #[test]
    fn a_call_that_is_not_json_or_not_offered_is_an_error_and_a_cut_one_names_max_tokens() {
        for body in [
            "{\"name\": \"get_weather\", \"arguments\": {",
            "{\"name\": \"rm_rf\"}",
        ] {
            let (_, _, end) = read(&feed(
                &mut Reading::new(plan()),
                &["<tool_call>\n", body, "\n</tool_call>"],
                FinishReason::Stop,
            ));
            assert!(end.contains("the model's tool call"), "{end}");
        }
        let out = feed(
            &mut Reading::new(plan()),
            &["<tool_call>\n{\"name\": \"get_weather\", \"argu"],
            FinishReason::Length,
        );
        assert!(
            matches!(&out[..], [EngineEvent::Failed(EngineError::InvalidParameter { param, .. })] if param == "max_tokens"),
            "{out:?}"
        );
    }

    #[test]
    fn the_grammar_holds_one_call_spaced_as_the_template_writes_it() {
        let tools = Tools {
            functions: vec![crate::engine::Function {
                name: "get_time".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"zone": {"type": "string"}}}),
                strict: None,
            }],
            choice: ToolChoice::Required,
            parallel: None,
            legacy: false,
        };
        let lark = grammar(&tools);
        assert!(
            lark.starts_with("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {"),
            "{lark}"
        );
        assert!(
            lark.contains("\"const\":\"get_time\"") && lark.contains("\"key_separator\":\": \""),
            "{lark}"
        );
        assert!(template_speaks("{% if tools %}<tool_call>{% endif %}"));
        assert!(!template_speaks("<|im_start|>{{ m.content }}"));
    }
}

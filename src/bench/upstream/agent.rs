//! What the scripted upstream adds to play vLLM serving an agentic, reasoning model:
//! reasoning chunks before the answer, and tool calls instead of content when the
//! request offers tools, so tests can drive an agent loop through the gateway.
//!
//! The choice of tools, their arguments and their frames are plain functions over the
//! request's JSON (tested here without a server); [`Streamed`]'s phases below send them
//! at the script's pace. Both apply to chat answers only; tool calls, to those without
//! a fault, since a fault scripts the content.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{envelope, frame, object, Pace, ScriptedFault, State, Streamed, Tx};
use crate::stream::chunks::Shape;

/// Characters per streamed fragment of a call's arguments, as engines send a few
/// tokens' worth at a time.
const FRAGMENT_CHARS: usize = 8;

/// One tool call the answer makes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ToolCall {
    /// `call_<n>`, unique within the server's life, so a client that keys results by
    /// id never mixes two turns.
    pub id: String,
    pub name: String,
    /// The arguments, serialized compactly, as the fragments will spell them.
    pub arguments: String,
}

/// The names of the tools the answer calls, in order; empty: answer with text.
///
/// A named `tool_choice` wins; else the first offered tool not yet called in the
/// conversation (every not-yet-called one when `parallel`, the script's
/// `parallel_calls`, and the request allows parallel calls). Once all were called, `required` calls the first again and `auto`
/// answers text, which ends an agent's loop.
pub(super) fn tools_to_call(body: &Value, parallel: bool) -> Vec<String> {
    let Some(tools) = body["tools"].as_array().filter(|tools| !tools.is_empty()) else {
        return Vec::new();
    };
    let choice = &body["tool_choice"];
    if *choice == "none" {
        return Vec::new();
    }
    if let Some(name) = choice["function"]["name"].as_str() {
        return vec![name.to_owned()];
    }
    let called = called_tools(body);
    let offered: Vec<&str> = tools
        .iter()
        .filter_map(|tool| tool["function"]["name"].as_str())
        .collect();
    let uncalled: Vec<String> = offered
        .iter()
        .filter(|name| !called.contains(name))
        .map(|name| (*name).to_owned())
        .collect();
    match uncalled.first() {
        None if *choice == "required" => offered.iter().take(1).map(|n| (*n).to_owned()).collect(),
        None => Vec::new(),
        Some(_) if parallel && body["parallel_tool_calls"] != false => uncalled,
        Some(first) => vec![first.clone()],
    }
}

/// Every tool an assistant message of the conversation has called.
fn called_tools(body: &Value) -> Vec<&str> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|message| message["role"] == "assistant")
        .filter_map(|message| message["tool_calls"].as_array())
        .flatten()
        .filter_map(|call| call["function"]["name"].as_str())
        .collect()
}

/// The `parameters` schema of the offered tool `name` (null when it is not offered).
pub(super) fn parameters_of<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|tool| tool["function"]["name"] == name)
        .map_or(&Value::Null, |tool| &tool["function"]["parameters"])
}

/// Arguments that satisfy `parameters` (a JSON Schema object): each `required`
/// property (every property when none is), valued by [`example`].
pub(super) fn arguments_for(parameters: &Value) -> Value {
    let Some(properties) = parameters["properties"].as_object() else {
        return json!({});
    };
    let names: Vec<&str> = match parameters["required"].as_array() {
        Some(required) => required.iter().filter_map(Value::as_str).collect(),
        None => properties.keys().map(String::as_str).collect(),
    };
    let arguments: Map<String, Value> = names
        .into_iter()
        .map(|name| {
            let value = properties.get(name).map_or(Value::Null, example);
            (name.to_owned(), value)
        })
        .collect();
    Value::Object(arguments)
}

/// A value of `schema`: its first `enum` value, else one of its type (the first type
/// named, for `["string", "null"]`); null when the schema says neither.
fn example(schema: &Value) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|values| values.first()) {
        return first.clone();
    }
    let kind = schema["type"]
        .as_str()
        .or_else(|| schema["type"][0].as_str());
    match kind {
        Some("string") => json!("Paris"),
        Some("integer") => json!(1),
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => json!({}),
        _ => Value::Null,
    }
}

/// `arguments` in fragments of at most [`FRAGMENT_CHARS`] characters.
fn fragments(arguments: &str) -> Vec<String> {
    let chars: Vec<char> = arguments.chars().collect();
    chars
        .chunks(FRAGMENT_CHARS)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

/// The chunks of `calls` as vLLM and OpenAI stream them: per call, a header naming it
/// with empty arguments, then its arguments' fragments; last, the `tool_calls` finish.
pub(super) fn tool_call_chunks(model: &str, calls: &[ToolCall]) -> Vec<Value> {
    let mut chunks = Vec::new();
    for (index, call) in calls.iter().enumerate() {
        let header = json!({"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": ""}});
        chunks.push(delta_chunk(model, json!({"tool_calls": [header]}), None));
        for fragment in fragments(&call.arguments) {
            let delta = json!({"index": index, "function": {"arguments": fragment}});
            chunks.push(delta_chunk(model, json!({"tool_calls": [delta]}), None));
        }
    }
    chunks.push(delta_chunk(model, json!({}), Some("tool_calls")));
    chunks
}

/// The tokens `calls` cost: one per header and one per fragment, as their chunks.
pub(super) fn tool_call_tokens(calls: &[ToolCall]) -> u32 {
    let chunks: usize = calls
        .iter()
        .map(|call| 1 + fragments(&call.arguments).len())
        .sum();
    u32::try_from(chunks).unwrap_or(u32::MAX)
}

/// Reasoning chunk `i` (`think0`, ` think1`, ...) under `field`, vLLM's
/// `reasoning_content` or its newer `reasoning`.
pub(super) fn reasoning_chunk(model: &str, field: &str, i: u32) -> Value {
    let text = if i == 0 {
        "think0".to_owned()
    } else {
        format!(" think{i}")
    };
    delta_chunk(model, json!({ field: text }), None)
}

/// A chat chunk whose one choice carries `delta`, without log-probabilities.
fn delta_chunk(model: &str, delta: Value, finish: Option<&str>) -> Value {
    let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
    envelope(Shape::Chat, model, choice)
}

/// The usage chunk: `completion` tokens, of which `reasoning` were reasoning (a detail
/// sent only when there was some, so answers without keep their usage as before).
pub(super) fn usage_chunk(shape: Shape, model: &str, completion: u32, reasoning: u32) -> Value {
    let prompt_tokens = 5;
    let mut usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion});
    if reasoning > 0 {
        usage["completion_tokens_details"] = json!({"reasoning_tokens": reasoning});
    }
    json!({"id": "scripted-1", "object": object(shape), "created": 0, "model": model,
        "choices": [], "usage": usage})
}

/// A chunk every `interval` (zero: no pace); the first at once.
pub(super) fn pace(interval: Duration) -> Pace {
    (!interval.is_zero()).then(|| {
        let mut pace = tokio::time::interval(interval);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        pace
    })
}

/// Waits for the pace's next tick, when the script sets one.
pub(super) async fn tick(pace: &mut Pace) {
    if let Some(pace) = pace.as_mut() {
        pace.tick().await;
    }
}

impl State {
    /// The tool calls a request gets instead of content (none: content), with their
    /// arguments and fresh ids. Chat only; a fault scripts the content, so it is
    /// answered with content as before.
    pub(super) fn tool_calls(
        &self,
        body: &Value,
        shape: Shape,
        fault: Option<ScriptedFault>,
    ) -> Vec<ToolCall> {
        if shape != Shape::Chat || fault.is_some() {
            return Vec::new();
        }
        let names = tools_to_call(body, self.script.parallel_calls);
        names
            .into_iter()
            .map(|name| ToolCall {
                id: format!("call_{}", self.calls.fetch_add(1, Ordering::SeqCst)),
                arguments: arguments_for(parameters_of(body, &name)).to_string(),
                name,
            })
            .collect()
    }
}

impl Streamed {
    /// Reasoning chunks the answer opens with: the script's, in chat only.
    pub(super) fn reasoning_tokens(&self) -> u32 {
        match self.shape {
            Shape::Chat => self.script.reasoning,
            Shape::Text => 0,
        }
    }

    /// The usage chunk: the reasoning and the content's or the calls' tokens.
    pub(super) fn usage(&self) -> Value {
        let reasoning = self.reasoning_tokens();
        let answer = if self.calls.is_empty() {
            self.tokens
        } else {
            tool_call_tokens(&self.calls)
        };
        usage_chunk(self.shape, &self.model, reasoning + answer, reasoning)
    }

    /// The reasoning chunks, at the script's pace; whether the reader is still there.
    pub(super) async fn reasoning(&self, tx: &Tx, pace: &mut Pace) -> bool {
        for i in 0..self.reasoning_tokens() {
            tick(pace).await;
            let chunk = reasoning_chunk(&self.model, &self.script.reasoning_field, i);
            if !self.sent(tx, frame(chunk)).await {
                return false;
            }
        }
        true
    }

    /// The tool calls' chunks, at the script's pace, with their finish; whether the
    /// reader is still there for the usage.
    pub(super) async fn tool_calls(&self, tx: &Tx, pace: &mut Pace) -> bool {
        for chunk in tool_call_chunks(&self.model, &self.calls) {
            // The finish follows the last fragment at once, as the content's does.
            if chunk["choices"][0]["finish_reason"].is_null() {
                tick(pace).await;
            }
            if !self.sent(tx, frame(chunk)).await {
                return false;
            }
        }
        true
    }

    /// Sends `bytes`; whether the reader took them (counted as abandoned if not).
    pub(super) async fn sent(&self, tx: &Tx, bytes: Bytes) -> bool {
        let sent = tx.send(bytes).await.is_ok();
        if !sent {
            self.abandoned.fetch_add(1, Ordering::SeqCst);
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, parameters: Value) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": parameters}})
    }

    fn two_tools() -> Vec<Value> {
        let city = json!({"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]});
        let zone = json!({"type": "object", "properties": {"zone": {"type": "string"}}});
        vec![tool("get_weather", city), tool("get_time", zone)]
    }

    /// A conversation in which the assistant has called `called`, one turn each.
    fn body(called: &[&str], tool_choice: Value) -> Value {
        let mut messages = vec![json!({"role": "user", "content": "Weather and time?"})];
        for (i, name) in called.iter().enumerate() {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("call_{i}"), "type": "function",
                 "function": {"name": name, "arguments": "{}"}}]}));
            messages.push(
                json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": "ok"}),
            );
        }
        json!({"messages": messages, "tools": two_tools(), "tool_choice": tool_choice})
    }

    #[test]
    fn an_agent_loop_calls_each_tool_then_answers_text() {
        assert_eq!(
            tools_to_call(&body(&[], Value::Null), false),
            ["get_weather"]
        );
        assert_eq!(
            tools_to_call(&body(&["get_weather"], json!("auto")), false),
            ["get_time"]
        );
        let done = body(&["get_weather", "get_time"], json!("auto"));
        assert!(tools_to_call(&done, false).is_empty());
    }

    #[test]
    fn required_calls_the_first_tool_again_once_all_were_called() {
        let done = body(&["get_weather", "get_time"], json!("required"));
        assert_eq!(tools_to_call(&done, false), ["get_weather"]);
    }

    #[test]
    fn a_named_tool_choice_wins_and_none_answers_text() {
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        assert_eq!(tools_to_call(&body(&[], named), false), ["get_time"]);
        assert!(tools_to_call(&body(&[], json!("none")), false).is_empty());
        let no_tools = json!({"messages": [{"role": "user", "content": "hi"}], "tools": []});
        assert!(tools_to_call(&no_tools, true).is_empty());
    }

    #[test]
    fn parallel_calls_take_every_uncalled_tool_unless_the_request_forbids_it() {
        let mut request = body(&[], Value::Null);
        assert_eq!(tools_to_call(&request, true), ["get_weather", "get_time"]);
        request["parallel_tool_calls"] = json!(false);
        assert_eq!(tools_to_call(&request, true), ["get_weather"]);
    }

    #[test]
    fn arguments_follow_the_schema() {
        let schema = json!({"type": "object", "properties": {
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "city": {"type": "string"}, "days": {"type": "integer"},
            "ratio": {"type": "number"}, "exact": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "extra": {"type": "object"}, "maybe": {"type": ["string", "null"]},
            "optional": {"type": "string"}},
            "required": ["unit", "city", "days", "ratio", "exact", "tags", "extra", "maybe"]});
        assert_eq!(
            arguments_for(&schema),
            json!({"unit": "celsius", "city": "Paris", "days": 1, "ratio": 1.5,
                   "exact": true, "tags": [], "extra": {}, "maybe": "Paris"})
        );
        let unrequired = json!({"properties": {"zone": {"type": "string"}}});
        assert_eq!(arguments_for(&unrequired), json!({"zone": "Paris"}));
        assert_eq!(arguments_for(&Value::Null), json!({}));
        let request = body(&[], Value::Null);
        assert_eq!(
            arguments_for(parameters_of(&request, "get_weather")),
            json!({"city": "Paris"})
        );
    }

    #[test]
    fn calls_stream_as_a_header_then_fragments_then_the_finish() {
        let arguments = r#"{"city":"Paris","note":"é€"}"#.to_owned();
        let calls = [
            ToolCall {
                id: "call_7".into(),
                name: "get_weather".into(),
                arguments: arguments.clone(),
            },
            ToolCall {
                id: "call_8".into(),
                name: "get_time".into(),
                arguments: "{}".into(),
            },
        ];
        let chunks = tool_call_chunks("m", &calls);
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        assert_eq!(
            *deltas[0],
            json!({"tool_calls": [{"index": 0, "id": "call_7", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}]})
        );
        let first: Vec<&Value> = deltas[1..]
            .iter()
            .take_while(|d| d["tool_calls"][0]["index"] == 0)
            .copied()
            .collect();
        let joined: String = first
            .iter()
            .map(|d| {
                d["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .unwrap_or("?")
            })
            .inspect(|fragment| assert!(fragment.chars().count() <= FRAGMENT_CHARS))
            .collect();
        assert_eq!(joined, arguments);
        assert!(first.iter().all(|d| d["tool_calls"][0].get("id").is_none()));
        let second = &deltas[1 + first.len()]["tool_calls"][0];
        assert_eq!(
            (second["index"].clone(), second["id"].clone()),
            (json!(1), json!("call_8"))
        );
        let finish = &chunks[chunks.len() - 1]["choices"][0];
        assert_eq!(finish["delta"], json!({}));
        assert_eq!(finish["finish_reason"], "tool_calls");
        assert_eq!(chunks.len() - 1, tool_call_tokens(&calls) as usize);
        assert!(chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null()));
    }

    #[test]
    fn reasoning_and_usage_chunks_are_framed_as_vllm_does() {
        let first = reasoning_chunk("m", "reasoning_content", 0);
        assert_eq!(
            first["choices"][0],
            json!({"index": 0, "delta": {"reasoning_content": "think0"},
                   "logprobs": null, "finish_reason": null})
        );
        assert_eq!(
            reasoning_chunk("m", "reasoning", 2)["choices"][0]["delta"],
            json!({"reasoning": " think2"})
        );
        let usage = usage_chunk(Shape::Chat, "m", 7, 3);
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                   "completion_tokens_details": {"reasoning_tokens": 3}})
        );
        assert_eq!(usage["choices"], json!([]));
        assert!(usage_chunk(Shape::Text, "m", 4, 0)["usage"]
            .get("completion_tokens_details")
            .is_none());
    }
}

//! Tool calls on an engine in this process, in the generic format llama.cpp's server uses
//! for a chat template that knows no tools: the tools are described in a system message,
//! the answer is JSON held by a grammar to `{"tool_call": {"name", "arguments"}}` (or,
//! under `tool_choice: "auto"`, `{"response": "..."}` as well), and the gateway turns it
//! back into OpenAI's `tool_calls` as it streams ([`stream`]). Because the grammar holds
//! the arguments to each tool's schema, `required` and a named function always give a
//! valid call, even on the default 135M model.
//!
//! The conversation's earlier calls and results are written in the same format (an
//! assistant's `tool_calls` as its `tool_call` JSON, a `tool` message as a user turn with
//! `{"tool_response": ...}`), so a template that knows only system, user and assistant
//! renders them. One call per answer: `parallel_tool_calls` asks for at most one here.
//!
//! A template that knows tools in a format of its own (Hermes and Qwen, Llama 3,
//! Mistral, DeepSeek R1: [`syntax`]) renders them and the history itself, and the answer
//! is read in that format ([`tagged`]).

pub mod stream;
pub mod syntax;
pub mod tagged;

use serde_json::{json, Value};

use super::{ChatMessage, EngineError, GenerationRequest, Prompt, ResponseFormat, Role};
use super::{ToolChoice, Tools};

/// How a model in this process is asked for tool calls, and how they are read back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolFormat {
    /// llama.cpp's generic JSON, described in a system message and held by a grammar:
    /// for a template that knows no tools.
    #[default]
    Generic,
    /// `<tool_call>` tags: Qwen 2.5 and 3, Hermes 2 and 3.
    Hermes,
    /// JSON `{"name", "parameters"}` as the answer: Llama 3.1 to 3.3.
    Llama3,
    /// `[TOOL_CALLS]` and a JSON list: Mistral Nemo.
    MistralNemo,
    /// `[TOOL_CALLS]name[ARGS]{...}`: Mistral Small 3.2, Devstral, Magistral.
    MistralArgs,
    /// `<｜tool▁calls▁begin｜>` blocks: DeepSeek R1 (and V3.1's spelling).
    DeepSeekR1,
}

/// What a request with tools became: how to read its answer back.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// The first call's id, made from the request's id so a replay gets the same
    /// ([`ToolPlan::id`] gives each call's).
    pub call_id: String,
    pub format: ToolFormat,
    /// The tools the model may call: their names, and their arguments' schemas.
    pub tools: Vec<super::Function>,
}

impl ToolPlan {
    /// The id of the answer's `n`th call (from 0): `call_id`, then `call_id_1`...; nine
    /// letters and digits where the format's template takes no other (Mistral's).
    pub fn id(&self, n: usize) -> String {
        if self.format.nine_character_ids() {
            let stem: String = self
                .call_id
                .strip_prefix("call_")
                .unwrap_or(&self.call_id)
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(7)
                .collect();
            return format!("{stem:0<7}{}{}", base36(n / 36), base36(n));
        }
        match n {
            0 => self.call_id.clone(),
            n => format!("{}_{n}", self.call_id),
        }
    }
}

/// A call id as Mistral's templates take one (nine letters and digits, else they refuse
/// the conversation): itself where it is one (the ids [`ToolPlan::id`] gives), else nine
/// characters of its hash, the same for a call and for its result.
pub fn nine_character_id(id: &str) -> String {
    if id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return id.to_owned();
    }
    use sha2::Digest;
    sha2::Sha256::digest(id.as_bytes())
        .iter()
        .take(9)
        .map(|byte| base36(usize::from(*byte)))
        .collect()
}

/// The base-36 digit of `n` modulo 36.
fn base36(n: usize) -> char {
    char::from(b"0123456789abcdefghijklmnopqrstuvwxyz"[n % 36])
}

/// Makes a request with tools ready for an engine in this process whose template speaks
/// `format`. Generic: the tools in a system message, earlier calls and results as text,
/// the answer held to the generic format. A template's own format: the template renders
/// the tools and the history; a grammar holds the answer to a call under `required` or a
/// named function.
/// `None` for a request without tools, or whose `tool_choice` is `none` (the tools are
/// then left out of the prompt, as the model may not call them).
pub fn plan(
    request: &mut GenerationRequest,
    format: ToolFormat,
) -> Result<Option<ToolPlan>, EngineError> {
    let Prompt::Chat(messages) = &mut request.prompt else {
        return Ok(None);
    };
    if format == ToolFormat::Generic {
        for message in messages.iter_mut() {
            written_as_text(message);
        }
    }
    let Some(tools) = request.tools.take() else {
        return Ok(None);
    };
    if tools.choice == ToolChoice::None {
        return Ok(None);
    }
    if request.top_logprobs.is_some() {
        return Err(EngineError::Unsupported {
            param: "logprobs".into(),
            reason: "a tool call's tokens here are JSON the gateway reads back into the \
                     call; ask for the call without logprobs"
                .into(),
        });
    }
    if request.response_format != ResponseFormat::Text {
        return Err(EngineError::Unsupported {
            param: "response_format".into(),
            reason: "an engine in this process holds a tool call's answer to its own JSON \
                     format; send tools or response_format, not both"
                .into(),
        });
    }
    let may_answer = tools.choice == ToolChoice::Auto;
    if format == ToolFormat::Generic {
        messages.insert(
            0,
            ChatMessage::new(Role::System, instructions(&tools, may_answer)),
        );
        merge_system_messages(messages);
        request.response_format = ResponseFormat::JsonSchema(answer_schema(&tools, may_answer));
    } else if !may_answer {
        if let Some(grammar) = format.grammar(&tools) {
            request.response_format = ResponseFormat::Lark(grammar);
        }
    }
    let id: String = request
        .request_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(24)
        .collect();
    let functions = if format == ToolFormat::Generic {
        tools.functions
    } else {
        // The template lists them.
        let functions = tools.functions.clone();
        request.tools = Some(tools);
        functions
    };
    Ok(Some(ToolPlan {
        call_id: format!("call_{id}"),
        format,
        tools: functions,
    }))
}

/// An earlier call or result, in the generic format and roles any template renders.
fn written_as_text(message: &mut ChatMessage) {
    if !message.tool_calls.is_empty() {
        let calls: Vec<String> = std::mem::take(&mut message.tool_calls)
            .into_iter()
            .map(|call| {
                let arguments: Value =
                    serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments));
                json!({"tool_call": {"name": call.name, "arguments": arguments}}).to_string()
            })
            .collect();
        let before = std::mem::take(&mut message.content);
        message.content = std::iter::once(before)
            .filter(|c| !c.is_empty())
            .chain(calls)
            .collect::<Vec<_>>()
            .join("\n");
    }
    if message.role == Role::Tool {
        message.role = Role::User;
        let response = json!({"tool_response": {
            "tool_call_id": message.tool_call_id.take(),
            "name": message.name.take(),
            "content": message.content,
        }});
        message.content = response.to_string();
    }
}

/// The system message that offers the tools and says how to answer.
fn instructions(tools: &Tools, may_answer: bool) -> String {
    let listed: Vec<String> = tools
        .functions
        .iter()
        .map(|f| {
            json!({"name": f.name, "description": f.description, "parameters": f.parameters})
                .to_string()
        })
        .collect();
    let choice = match (&tools.choice, may_answer) {
        (ToolChoice::Named(name), _) => format!("Call the tool {name}."),
        (_, true) => "Call a tool when one helps, or answer directly.".to_owned(),
        _ => "Call one of the tools.".to_owned(),
    };
    let formats = if may_answer {
        "To call a tool, answer with {\"tool_call\": {\"name\": <tool name>, \"arguments\": \
         <arguments>}}; to answer directly, with {\"response\": <your answer>}."
    } else {
        "Answer with {\"tool_call\": {\"name\": <tool name>, \"arguments\": <arguments>}}."
    };
    format!(
        "You can call these tools:\n{}\n{choice} {formats} Answer in JSON only.",
        listed.join("\n")
    )
}

/// A template may take one system message, first: the tools go at the head of the
/// client's own.
fn merge_system_messages(messages: &mut Vec<ChatMessage>) {
    if messages.len() > 1 && messages[1].role == Role::System {
        let client = messages.remove(1);
        messages[0].content = format!("{}\n\n{}", client.content, messages[0].content);
    }
}

/// The JSON Schema the answer is held to: a call of one of the tools the choice allows,
/// its arguments held to that tool's schema, or (`may_answer`) a text response.
pub fn answer_schema(tools: &Tools, may_answer: bool) -> Value {
    let calls: Vec<Value> = allowed(tools)
        .map(|f| call_schema(f, "arguments"))
        .map(|call| {
            json!({"type": "object", "properties": {"tool_call": call},
                "required": ["tool_call"], "additionalProperties": false})
        })
        .collect();
    let mut answers = calls;
    if may_answer {
        answers.push(
            json!({"type": "object", "properties": {"response": {"type": "string"}},
            "required": ["response"], "additionalProperties": false}),
        );
    }
    if answers.len() == 1 {
        return answers.remove(0);
    }
    json!({"anyOf": answers})
}

/// The tools the choice allows: all, or the one named.
fn allowed(tools: &Tools) -> impl Iterator<Item = &super::Function> + '_ {
    tools.functions.iter().filter(|f| match &tools.choice {
        ToolChoice::Named(name) => &f.name == name,
        _ => true,
    })
}

/// One call of `function`: its name and its arguments (under `arguments_key`), held to
/// its schema.
fn call_schema(function: &super::Function, arguments_key: &str) -> Value {
    json!({"type": "object", "properties": {
        "name": {"const": function.name},
        arguments_key: arguments_schema(function),
    }, "required": ["name", arguments_key], "additionalProperties": false})
}

/// The schema `function`'s arguments are held to: its own, [`closed`].
fn arguments_schema(function: &super::Function) -> Value {
    let mut arguments = function.parameters.clone();
    if arguments.as_object().is_some_and(serde_json::Map::is_empty) {
        arguments = json!({"type": "object"});
    }
    closed(&mut arguments);
    arguments
}

/// An object schema takes only the properties it lists unless it says otherwise: a
/// small model fills an open object with keys of its own (`"maxLength": 20` beside
/// `"city"` was seen on the default model, and a tool without parameters got arguments
/// until its budget ran out), which a strict tool rejects.
fn closed(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let is_object = object.get("type").and_then(Value::as_str) == Some("object")
                || object.contains_key("properties");
            let open = ["additionalProperties", "patternProperties"]
                .iter()
                .any(|k| object.contains_key(*k));
            if is_object && !open {
                object.insert("additionalProperties".into(), Value::Bool(false));
            }
            object.values_mut().for_each(closed);
        }
        Value::Array(items) => items.iter_mut().for_each(closed),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Function, ToolCall};

    fn tools(choice: ToolChoice) -> Tools {
        let function = |name: &str| Function {
            name: name.into(),
            description: Some(format!("{name} of a city")),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}),
            strict: None,
        };
        Tools {
            functions: vec![function("get_weather"), function("get_time")],
            choice,
            parallel: None,
            legacy: false,
        }
    }

    fn request(messages: Vec<ChatMessage>, choice: ToolChoice) -> GenerationRequest {
        GenerationRequest {
            request_id: "6f1c4a52-8a1e-4a8b".into(),
            prompt: Prompt::Chat(messages),
            tools: Some(tools(choice)),
            ..GenerationRequest::default()
        }
    }

    #[test]
    fn the_tools_go_in_one_system_message_and_the_answer_is_held_to_a_call() {
        let mut r = request(
            vec![
                ChatMessage::new(Role::System, "Be brief."),
                ChatMessage::new(Role::User, "Weather in Paris?"),
            ],
            ToolChoice::Required,
        );
        let plan = plan(&mut r, ToolFormat::Generic)
            .expect("ok")
            .expect("a plan");
        assert_eq!(plan.call_id, "call_6f1c4a528a1e4a8b");
        let Prompt::Chat(messages) = &r.prompt else {
            panic!()
        };
        assert_eq!(messages.len(), 2);
        assert!(messages[0]
            .content
            .starts_with("Be brief.\n\nYou can call these tools:"));
        assert!(messages[0].content.contains("\"name\":\"get_time\""));
        let ResponseFormat::JsonSchema(schema) = &r.response_format else {
            panic!()
        };
        assert_eq!(
            schema["anyOf"].as_array().map(Vec::len),
            Some(2),
            "one per tool"
        );
        assert!(r.tools.is_none());
    }

    #[test]
    fn a_named_choice_allows_that_tool_and_auto_allows_an_answer() {
        let named = answer_schema(&tools(ToolChoice::Named("get_time".into())), false);
        assert_eq!(
            named["properties"]["tool_call"]["properties"]["name"]["const"],
            "get_time"
        );
        let auto = answer_schema(&tools(ToolChoice::Auto), true);
        let answers = auto["anyOf"].as_array().expect("anyOf");
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[2]["required"], json!(["response"]));
    }

    #[test]
    fn earlier_calls_and_results_are_written_in_the_format() {
        let mut assistant = ChatMessage::new(Role::Assistant, "");
        assistant.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"Paris\"}".into(),
        }];
        let mut result = ChatMessage::new(Role::Tool, "18 C");
        result.tool_call_id = Some("call_1".into());
        let mut r = request(
            vec![ChatMessage::new(Role::User, "Weather?"), assistant, result],
            ToolChoice::None,
        );
        assert_eq!(
            plan(&mut r, ToolFormat::Generic).expect("ok"),
            None,
            "none: no call to read back"
        );
        let Prompt::Chat(messages) = &r.prompt else {
            panic!()
        };
        assert_eq!(
            messages[1].content,
            r#"{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}"#
        );
        assert!(messages[1].tool_calls.is_empty());
        assert_eq!(messages[2].role, Role::User);
        assert_eq!(
            messages[2].content,
            r#"{"tool_response":{"tool_call_id":"call_1","name":null,"content":"18 C"}}"#
        );
    }

    #[test]
    fn tools_with_a_response_format_are_refused() {
        let mut r = request(vec![ChatMessage::new(Role::User, "hi")], ToolChoice::Auto);
        r.response_format = ResponseFormat::JsonObject;
        assert!(matches!(
            plan(&mut r, ToolFormat::Generic),
            Err(EngineError::Unsupported { param, .. }) if param == "response_format"
        ));
    }
}

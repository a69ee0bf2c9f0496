//! `tools`, `tool_choice`, `parallel_tool_calls` and the legacy `functions` and
//! `function_call`, read into [`Tools`], and the tool calls of an assistant message in
//! the history. Every refusal names the parameter, down to the element
//! (`tools[1].function.name`), as OpenAI's do.

use serde_json::{json, Map, Value};

use crate::engine::{
    ChatMessage, ContentPart, Function, GenerationRequest, Prompt, ToolCall, ToolChoice, Tools,
};
use crate::error::ApiError;

/// The most tools one request may offer, as in OpenAI's API.
pub const MAX_TOOLS: usize = 128;

/// The tools the request offers; `None` when it offers none (absent, `null` or `[]`).
pub(super) fn tools_of(object: &Map<String, Value>) -> Result<Option<Tools>, ApiError> {
    let get = |key: &str| object.get(key).filter(|v| !v.is_null());
    let listed = |key: &str| get(key).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()));
    let (legacy, functions) = match (listed("tools"), listed("functions")) {
        (true, true) => {
            return Err(ApiError::invalid(
                "functions",
                "send tools or the legacy functions, not both",
            ))
        }
        (true, false) => (false, read_tools(get("tools"))?),
        (false, true) => (true, read_functions(get("functions"))?),
        (false, false) => (false, Vec::new()),
    };
    let (choice_key, choice) = if legacy {
        ("function_call", get("function_call"))
    } else {
        ("tool_choice", get("tool_choice"))
    };
    if legacy && get("tool_choice").is_some() {
        return Err(ApiError::invalid(
            "tool_choice",
            "goes with tools; with the legacy functions, send function_call",
        ));
    }
    let choice = match choice {
        Some(choice) => read_choice(choice_key, choice, &functions)?,
        None => ToolChoice::Auto,
    };
    let parallel = match get("parallel_tool_calls") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "must be a boolean",
            ))
        }
    };
    if functions.is_empty() {
        // Without tools, only the neutral choices are meaningful (SDKs send them).
        if !matches!(choice, ToolChoice::Auto | ToolChoice::None) {
            return Err(ApiError::invalid(
                choice_key,
                format!("'{choice_key}' is only allowed when tools are given"),
            ));
        }
        return Ok(None);
    }
    Ok(Some(Tools {
        functions,
        choice,
        parallel,
        legacy,
    }))
}

fn read_tools(tools: Option<&Value>) -> Result<Vec<Function>, ApiError> {
    let Some(Value::Array(tools)) = tools else {
        return Err(ApiError::invalid("tools", "must be an array of tools"));
    };
    let mut functions = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Some(tool) = tool.as_object() else {
            return Err(ApiError::invalid(at, "must be an object"));
        };
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!("'{other}' tools are not served; only 'function'"),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    "must be 'function'",
                ))
            }
        }
        functions.push(read_function(
            &format!("{at}.function"),
            tool.get("function"),
        )?);
    }
    checked(functions, "tools")
}

fn read_functions(functions: Option<&Value>) -> Result<Vec<Function>, ApiError> {
    let Some(Value::Array(list)) = functions else {
        return Err(ApiError::invalid(
            "functions",
            "must be an array of functions",
        ));
    };
    let functions = list
        .iter()
        .enumerate()
        .map(|(i, f)| read_function(&format!("functions[{i}]"), Some(f)))
        .collect::<Result<Vec<_>, _>>()?;
    checked(functions, "functions")
}

/// Refuses more than [`MAX_TOOLS`] and a name given twice.
fn checked(functions: Vec<Function>, param: &str) -> Result<Vec<Function>, ApiError> {
    if functions.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            param,
            format!(
                "{} tools are more than the {MAX_TOOLS} one request may offer",
                functions.len()
            ),
        ));
    }
    for (i, f) in functions.iter().enumerate() {
        if functions[..i].iter().any(|g| g.name == f.name) {
            return Err(ApiError::invalid(
                format!("{param}[{i}]"),
                format!("the name '{}' is given twice", f.name),
            ));
        }
    }
    Ok(functions)
}

fn read_function(at: &str, function: Option<&Value>) -> Result<Function, ApiError> {
    let Some(function) = function.and_then(Value::as_object) else {
        return Err(ApiError::invalid(at, "must be an object with a name"));
    };
    let name = function_name(&format!("{at}.name"), function.get("name"))?;
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.description"),
                "must be a string",
            ))
        }
    };
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.parameters"),
                "must be a JSON Schema object",
            ))
        }
    };
    let strict = match function.get("strict") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.strict"),
                "must be a boolean",
            ))
        }
    };
    Ok(Function {
        name,
        description,
        parameters,
        strict,
    })
}

/// A function's name as OpenAI allows it: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn function_name(at: &str, name: Option<&Value>) -> Result<String, ApiError> {
    let Some(name) = name.and_then(Value::as_str) else {
        return Err(ApiError::invalid(
            at,
            "this parameter is required (a string)",
        ));
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > 64 || !name.chars().all(allowed) {
        return Err(ApiError::invalid(
            at,
            format!("'{name}' is not 1 to 64 letters, digits, underscores or dashes"),
        ));
    }
    Ok(name.to_owned())
}

/// `tool_choice` or `function_call`: a word, or the function to call.
fn read_choice(key: &str, choice: &Value, functions: &[Function]) -> Result<ToolChoice, ApiError> {
    let named = |name: &str| {
        if functions.iter().any(|f| f.name == name) {
            Ok(ToolChoice::Named(name.to_owned()))
        } else {
            Err(ApiError::invalid(
                key,
                format!("names '{name}', which is not among the tools given"),
            ))
        }
    };
    match choice {
        Value::String(word) => match word.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" if key == "tool_choice" => Ok(ToolChoice::Required),
            other => Err(ApiError::invalid(
                key,
                format!("'{other}' is not one of auto, none, required, or a function to call"),
            )),
        },
        // `{"type": "function", "function": {"name": ...}}`, or legacy `{"name": ...}`.
        Value::Object(object) => {
            let name = object
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| object.get("name"))
                .and_then(Value::as_str);
            match name {
                Some(name) => named(name),
                None => Err(ApiError::invalid(
                    key,
                    "an object must name the function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )),
            }
        }
        _ => Err(ApiError::invalid(key, "must be a string or an object")),
    }
}

/// An assistant message's `tool_calls`, each `{"id", "type": "function", "function":
/// {"name", "arguments"}}`; `at` is the message's path (`messages[2]`).
pub(super) fn history_calls(at: &str, calls: &Value) -> Result<Vec<ToolCall>, ApiError> {
    let Some(calls) = calls.as_array() else {
        return Err(ApiError::invalid(
            format!("{at}.tool_calls"),
            "must be an array",
        ));
    };
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let at = format!("{at}.tool_calls[{i}]");
            let id = call.get("id").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(format!("{at}.id"), "this parameter is required (a string)")
            })?;
            let function = call.get("function");
            let name = function_name(
                &format!("{at}.function.name"),
                function.and_then(|f| f.get("name")),
            )?;
            Ok(ToolCall {
                id: id.to_owned(),
                name,
                arguments: arguments(&at, function)?,
            })
        })
        .collect()
}

/// A legacy `function_call` of an assistant message in the history, as a tool call
/// whose id its `function` answer will carry.
pub(super) fn history_function_call(
    at: &str,
    call: &Value,
    id: String,
) -> Result<ToolCall, ApiError> {
    let at = format!("{at}.function_call");
    let name = function_name(&format!("{at}.name"), call.get("name"))?;
    Ok(ToolCall {
        id,
        name,
        arguments: arguments(&at, Some(call))?,
    })
}

/// The arguments as a string of JSON, as OpenAI sends them (an object is taken too, as
/// some clients send one, and written out).
fn arguments(at: &str, function: Option<&Value>) -> Result<String, ApiError> {
    match function.and_then(|f| f.get("arguments")) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(object @ Value::Object(_)) => Ok(object.to_string()),
        Some(_) => Err(ApiError::invalid(
            format!("{at}.function.arguments"),
            "must be a string of JSON",
        )),
    }
}

/// What the input hash adds for tools, tool calls, names and media, in a fixed layout;
/// `None` for a request with none of them.
pub(super) fn canonical(generation: &GenerationRequest) -> Option<Value> {
    let plain = |m: &ChatMessage| {
        m.tool_calls.is_empty()
            && m.tool_call_id.is_none()
            && m.name.is_none()
            && m.parts.is_empty()
    };
    let all_plain = match &generation.prompt {
        Prompt::Chat(messages) => messages.iter().all(plain),
        Prompt::Text(_) | Prompt::Tokens(_) => true,
    };
    // Most requests: nothing to add, and no JSON built to find that out.
    let thinking = generation.reasoning_effort.is_some()
        || generation.reasoning_format.is_some()
        || generation.template_kwargs.is_some();
    if generation.tools.is_none() && !thinking && all_plain {
        return None;
    }
    let messages: Vec<Value> = match &generation.prompt {
        Prompt::Chat(messages) => messages
            .iter()
            .map(|m| {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| json!([c.id, c.name, c.arguments]))
                    .collect();
                let media: Vec<Value> = m
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        ContentPart::Media(media) => {
                            Some(json!([media.kind.as_str(), media.value]))
                        }
                        ContentPart::Text(_) => None,
                    })
                    .collect();
                json!([calls, m.tool_call_id, m.name, media])
            })
            .collect(),
        Prompt::Text(_) | Prompt::Tokens(_) => Vec::new(),
    };
    let tools = generation.tools.as_ref().map(|t| {
        let functions: Vec<Value> = t
            .functions
            .iter()
            .map(|f| json!([f.name, f.description, f.parameters, f.strict]))
            .collect();
        let choice = match &t.choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(name) => json!({ "name": name }),
        };
        json!([functions, choice, t.parallel, t.legacy])
    });
    Some(json!({
        "tools": tools,
        "messages": messages,
        "reasoning_effort": generation.reasoning_effort,
        "reasoning_format": generation.reasoning_format.map(|f| f.as_str()),
        "chat_template_kwargs": generation.template_kwargs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(body: Value) -> Result<Option<Tools>, ApiError> {
        tools_of(body.as_object().expect("object"))
    }

    fn param(error: ApiError) -> String {
        match error {
            ApiError::InvalidParameter { param, .. }
            | ApiError::UnsupportedParameter { param, .. } => param,
            other => panic!("{other:?}"),
        }
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters":
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn tools_and_choices_are_read() {
        let t = tools(
            json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false}),
        )
        .expect("ok")
        .expect("tools");
        assert_eq!(t.names(), vec!["get_weather"]);
        assert_eq!(t.choice, ToolChoice::Required);
        assert_eq!(t.parallel, Some(false));
        assert!(!t.legacy);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let t = tools(json!({"tools": [weather()], "tool_choice": named}))
            .expect("ok")
            .expect("tools");
        assert_eq!(t.choice, ToolChoice::Named("get_weather".into()));
        let legacy = tools(json!({"functions": [{"name": "f"}], "function_call": {"name": "f"}}))
            .expect("ok")
            .expect("tools");
        assert!(legacy.legacy);
        assert_eq!(legacy.choice, ToolChoice::Named("f".into()));
        assert_eq!(legacy.functions[0].parameters, json!({}));
    }

    #[test]
    fn neutral_values_are_no_tools() {
        assert_eq!(
            tools(json!({"tools": [], "tool_choice": "none"})).expect("ok"),
            None
        );
        assert_eq!(
            tools(json!({"tools": null, "tool_choice": "auto"})).expect("ok"),
            None
        );
        assert_eq!(tools(json!({})).expect("ok"), None);
    }

    #[test]
    fn each_mistake_names_its_parameter() {
        let cases = [
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "tool_choice": "always"}),
                "tool_choice",
            ),
            (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
            (
                json!({"tools": [weather(), {"type": "function", "function": {"name": "a b"}}]}),
                "tools[1].function.name",
            ),
            (json!({"tools": [weather(), weather()]}), "tools[1]"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [weather()], "functions": [{"name": "f"}]}),
                "functions",
            ),
            (json!({"tools": "get_weather"}), "tools"),
            (
                json!({"tools": [weather()], "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
            ),
            (
                json!({"functions": [{"name": "f"}], "function_call": "required"}),
                "function_call",
            ),
        ];
        for (body, expected) in cases {
            let got = tools(body.clone()).expect_err(&body.to_string());
            assert_eq!(param(got), expected, "{body}");
        }
    }

    #[test]
    fn history_calls_are_read_with_their_arguments() {
        let calls = history_calls(
            "messages[1]",
            &json!([{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]),
        )
        .expect("ok");
        assert_eq!(calls[0].arguments, "{\"city\":\"Paris\"}");
        let missing =
            history_calls("messages[1]", &json!([{"function": {"name": "f"}}])).expect_err("no id");
        assert_eq!(param(missing), "messages[1].tool_calls[0].id");
    }
}

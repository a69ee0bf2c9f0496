//! How the tool-call formats of the templates users run write a call, so that one reader
//! ([`super::tagged`]) takes them all, and the grammar that holds an answer to a call in
//! each under `tool_choice: "required"` or a named function:
//!
//! | format | a call as the model writes it |
//! |---|---|
//! | Hermes (Qwen 2.5 and 3, Hermes 2 and 3) | `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>` |
//! | Llama 3.1, 3.2, 3.3 | `{"name": "f", "parameters": {...}}` as the whole answer, or after `<\|python_tag\|>` |
//! | Mistral Nemo | `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` |
//! | Mistral Small 3.2, Devstral, Magistral | `[TOOL_CALLS]f[CALL_ID]id[ARGS]{...}`, one per call |
//! | DeepSeek R1 | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>` |
//!
//! Each is told from the chat template's source at load (it writes the format's marker
//! and lists `tools`), as llama.cpp's server tells them.

use serde_json::{json, Value};

use super::{allowed, arguments_schema, call_schema, ToolFormat};
use crate::engine::Tools;

/// How one format marks and writes its calls.
#[derive(Debug)]
pub struct Syntax {
    /// Markers that open a call, or a block of calls; text before one is content.
    pub opens: &'static [&'static str],
    /// An answer that begins (after white space) with this is a call from its first
    /// character on (Llama 3's bare JSON); one that then reads as no call is content.
    pub bare: Option<&'static str>,
    /// The marker that closes what an opening marker opened; `None`: it runs to the end
    /// of the answer.
    pub close: Option<&'static str>,
    /// The calls an opened section holds.
    pub parse: fn(&str) -> Result<Vec<RawCall>, Unread>,
}

/// One call as the model wrote it: a name and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct RawCall {
    pub name: String,
    pub arguments: Value,
}

/// Why an opened section gave no calls.
#[derive(Debug, Clone, PartialEq)]
pub enum Unread {
    /// It is not a call at all (JSON without a name, or not JSON): content, where the
    /// section was opened by a bare start.
    NotACall,
    /// It is a call, written wrong.
    Bad(&'static str),
}

static HERMES: Syntax = Syntax {
    opens: &["<tool_call>"],
    bare: None,
    close: Some("</tool_call>"),
    parse: json_calls,
};

static LLAMA3: Syntax = Syntax {
    opens: &["<|python_tag|>"],
    bare: Some("{"),
    close: None,
    parse: json_calls,
};

static MISTRAL: Syntax = Syntax {
    opens: &[MISTRAL_CALLS],
    bare: None,
    close: None,
    parse: mistral_calls,
};

static DEEPSEEK_R1: Syntax = Syntax {
    opens: &[DEEPSEEK_CALLS_BEGIN],
    bare: None,
    close: Some(DEEPSEEK_CALLS_END),
    parse: deepseek_calls,
};

const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const DEEPSEEK_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DEEPSEEK_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DEEPSEEK_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DEEPSEEK_CALL_END: &str = "<｜tool▁call▁end｜>";
const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";

impl ToolFormat {
    /// The format a chat template writes calls in, from its source; `Generic` for one
    /// that renders no tools.
    pub fn of_template(source: &str) -> Self {
        if !source.contains("tools") {
            return ToolFormat::Generic;
        }
        if source.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if source.contains(DEEPSEEK_CALLS_BEGIN) {
            ToolFormat::DeepSeekR1
        } else if source.contains(MISTRAL_CALLS) && source.contains(MISTRAL_ARGS) {
            ToolFormat::MistralArgs
        } else if source.contains(MISTRAL_CALLS) {
            ToolFormat::MistralNemo
        } else if source.contains("<|start_header_id|>") && source.contains("ipython") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// How this format writes calls; `None` for the generic format (read by
    /// [`super::stream`]).
    pub fn syntax(self) -> Option<&'static Syntax> {
        match self {
            ToolFormat::Generic => None,
            ToolFormat::Hermes => Some(&HERMES),
            ToolFormat::Llama3 => Some(&LLAMA3),
            ToolFormat::MistralNemo | ToolFormat::MistralArgs => Some(&MISTRAL),
            ToolFormat::DeepSeekR1 => Some(&DEEPSEEK_R1),
        }
    }

    /// Whether a call's id must be nine letters and digits (Mistral's templates refuse
    /// any other).
    pub fn nine_character_ids(self) -> bool {
        matches!(self, ToolFormat::MistralNemo | ToolFormat::MistralArgs)
    }

    /// The Lark grammar (llguidance's) that holds an answer to one call of a tool the
    /// choice allows, written as the format writes it; `None` for the generic format
    /// (held by a JSON schema).
    pub fn grammar(self, tools: &Tools) -> Option<String> {
        let call = |arguments_key: &str| {
            let calls: Vec<Value> = allowed(tools)
                .map(|f| call_schema(f, arguments_key))
                .collect();
            json_rule(json!({"anyOf": calls}))
        };
        // One alternative per tool: its name as text, then its arguments.
        let named = |before: &str, after: &str| {
            let rules: Vec<String> = allowed(tools)
                .enumerate()
                .map(|(i, f)| {
                    let head = lark_string(&format!("{}{before}", f.name));
                    let tail = if after.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", lark_string(after))
                    };
                    format!("call_{i}: {head} {}{tail}", json_rule(arguments_schema(f)))
                })
                .collect();
            let names: Vec<String> = (0..rules.len()).map(|i| format!("call_{i}")).collect();
            format!("call: {}\n{}\n", names.join(" | "), rules.join("\n"))
        };
        let grammar = match self {
            ToolFormat::Generic => return None,
            ToolFormat::Hermes => format!(
                "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: {}\n",
                call("arguments")
            ),
            ToolFormat::Llama3 => format!("start: call\ncall: {}\n", call("parameters")),
            ToolFormat::MistralNemo => format!(
                "start: {} call \"]\"\ncall: {}\n",
                lark_string("[TOOL_CALLS]["),
                call("arguments")
            ),
            ToolFormat::MistralArgs => format!(
                "start: {} call\n{}",
                lark_string(MISTRAL_CALLS),
                named(MISTRAL_ARGS, "")
            ),
            ToolFormat::DeepSeekR1 => format!(
                "start: {} call {}\n{}",
                lark_string(&format!(
                    "{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}function{DEEPSEEK_SEP}"
                )),
                lark_string(&format!("{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}")),
                named("\n```json\n", "\n```")
            ),
        };
        Some(grammar)
    }
}

/// A Lark rule that holds JSON to `schema`, spaced as templates write calls
/// (`{"a": 1, "b": 2}`).
fn json_rule(mut schema: Value) -> String {
    schema["x-guidance"] =
        json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    format!("%json {schema}")
}

/// `text` as a Lark string literal (JSON's escapes are Lark's).
fn lark_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// One or more JSON calls, apart by white space or `;` (Hermes writes one per tag,
/// Llama 3 one or several as its answer).
fn json_calls(body: &str) -> Result<Vec<RawCall>, Unread> {
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = match values.next() {
            Some(Ok(value)) => value,
            _ if calls.is_empty() => return Err(Unread::NotACall),
            _ => return Err(Unread::Bad("is not JSON")),
        };
        calls.push(call_of(&value)?);
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    if calls.is_empty() {
        return Err(Unread::NotACall);
    }
    Ok(calls)
}

/// A call written as a JSON object: its `name`, and its `arguments` (or Llama's
/// `parameters`) as an object or as JSON text of one.
fn call_of(value: &Value) -> Result<RawCall, Unread> {
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .ok_or(Unread::NotACall)?;
    let arguments = value.get("arguments").or_else(|| value.get("parameters"));
    Ok(RawCall {
        name: name.to_owned(),
        arguments: arguments_of(arguments)?,
    })
}

/// A call's arguments: an object, or JSON text of one (some models write them so);
/// none is `{}`.
fn arguments_of(arguments: Option<&Value>) -> Result<Value, Unread> {
    let not_an_object = Unread::Bad("has arguments that are not a JSON object");
    match arguments {
        None => Ok(json!({})),
        Some(Value::Object(_)) => Ok(arguments.cloned().unwrap_or_default()),
        Some(Value::String(text)) => serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
            .ok_or(not_an_object),
        Some(_) => Err(not_an_object),
    }
}

/// Mistral's calls after `[TOOL_CALLS]`, in either of its spellings: Nemo's JSON list,
/// or one `name[ARGS]{...}` (with `[CALL_ID]id` before `[ARGS]` in Mistral Small 3.2)
/// after each `[TOOL_CALLS]`.
fn mistral_calls(body: &str) -> Result<Vec<RawCall>, Unread> {
    let mut calls = Vec::new();
    for piece in body.split(MISTRAL_CALLS).map(str::trim) {
        if piece.is_empty() {
            continue;
        }
        if piece.starts_with('[') {
            let list: Value =
                serde_json::from_str(piece).map_err(|_| Unread::Bad("is not JSON"))?;
            let list = list
                .as_array()
                .ok_or(Unread::Bad("is not a list of calls"))?;
            for value in list {
                calls.push(call_of(value).map_err(|_| Unread::Bad("has no name"))?);
            }
            continue;
        }
        let (head, arguments) = piece
            .split_once(MISTRAL_ARGS)
            .ok_or(Unread::Bad("has no [ARGS]"))?;
        let name = head.split(MISTRAL_CALL_ID).next().unwrap_or(head).trim();
        let arguments: Value =
            serde_json::from_str(arguments.trim()).map_err(|_| Unread::Bad("is not JSON"))?;
        calls.push(RawCall {
            name: name.to_owned(),
            arguments: arguments_of(Some(&arguments))?,
        });
    }
    if calls.is_empty() {
        return Err(Unread::Bad("is empty"));
    }
    Ok(calls)
}

/// DeepSeek's calls between its block markers: each `function<｜tool▁sep｜>name` and
/// fenced JSON (R1), or `name<｜tool▁sep｜>{...}` (V3.1).
fn deepseek_calls(body: &str) -> Result<Vec<RawCall>, Unread> {
    let mut calls = Vec::new();
    for piece in body.split(DEEPSEEK_CALL_BEGIN).skip(1) {
        let piece = piece.split(DEEPSEEK_CALL_END).next().unwrap_or(piece);
        let (kind, rest) = piece
            .split_once(DEEPSEEK_SEP)
            .ok_or(Unread::Bad("has no name"))?;
        let (name, arguments) = if kind.trim() == "function" {
            let (name, fenced) = rest.split_once('\n').unwrap_or((rest, ""));
            let fenced = fenced.trim();
            let inner = fenced.strip_prefix("```json").unwrap_or(fenced);
            (name, inner.strip_suffix("```").unwrap_or(inner))
        } else {
            (kind, rest)
        };
        let arguments: Value =
            serde_json::from_str(arguments.trim()).map_err(|_| Unread::Bad("is not JSON"))?;
        calls.push(RawCall {
            name: name.trim().to_owned(),
            arguments: arguments_of(Some(&arguments))?,
        });
    }
    if calls.is_empty() {
        return Err(Unread::Bad("is empty"));
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Function, ToolChoice};

    fn call(name: &str, arguments: Value) -> RawCall {
        RawCall {
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn each_template_is_told_by_its_marker() {
        let cases = [
            (
                "{% for t in tools %}<tool_call>{% endfor %}",
                ToolFormat::Hermes,
            ),
            (
                "{% if tools %}<|start_header_id|>ipython<|end_header_id|>{% endif %}",
                ToolFormat::Llama3,
            ),
            (
                "{% if tools %}[TOOL_CALLS][{% endif %}",
                ToolFormat::MistralNemo,
            ),
            (
                "{{ tools }}[TOOL_CALLS]{{ n }}[ARGS]",
                ToolFormat::MistralArgs,
            ),
            ("{{ tools }}<｜tool▁calls▁begin｜>", ToolFormat::DeepSeekR1),
            ("<|im_start|>{{ m.content }}", ToolFormat::Generic),
            ("<tool_call> without the list", ToolFormat::Generic),
        ];
        for (source, format) in cases {
            assert_eq!(ToolFormat::of_template(source), format, "{source}");
        }
    }

    #[test]
    fn json_calls_take_one_or_several_and_tell_text_from_a_bad_call() {
        assert_eq!(
            json_calls(
                r#"{"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": "{\"b\": 2}"}"#
            ),
            Ok(vec![call("f", json!({"a": 1})), call("g", json!({"b": 2}))])
        );
        assert_eq!(json_calls(r#"{"answer": 42}"#), Err(Unread::NotACall));
        assert_eq!(json_calls("Paris is sunny."), Err(Unread::NotACall));
        assert_eq!(
            json_calls(r#"{"name": "f", "parameters": [1]}"#),
            Err(Unread::Bad("has arguments that are not a JSON object"))
        );
        assert_eq!(
            json_calls(r#"{"name": "f"} and then"#),
            Err(Unread::Bad("is not JSON"))
        );
    }

    #[test]
    fn mistral_calls_are_read_in_both_spellings() {
        assert_eq!(
            mistral_calls(
                r#"[{"name": "f", "arguments": {"a": 1}, "id": "abcdefghi"}, {"name": "g", "arguments": {}}]"#
            ),
            Ok(vec![call("f", json!({"a": 1})), call("g", json!({}))])
        );
        assert_eq!(
            mistral_calls(r#"f[CALL_ID]abcdefghi[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}"#),
            Ok(vec![call("f", json!({"a": 1})), call("g", json!({}))])
        );
        assert_eq!(mistral_calls("f(a=1)"), Err(Unread::Bad("has no [ARGS]")));
    }

    #[test]
    fn deepseek_calls_are_read_in_r1_and_v3_spellings() {
        let r1 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜>";
        assert_eq!(
            deepseek_calls(r1),
            Ok(vec![call("f", json!({"a": 1})), call("g", json!({}))])
        );
        let v3 = "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜>";
        assert_eq!(deepseek_calls(v3), Ok(vec![call("f", json!({"a": 1}))]));
    }

    #[test]
    fn each_grammar_writes_a_call_as_its_format_does() {
        let tools = Tools {
            functions: vec![Function {
                name: "get_time".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"zone": {"type": "string"}}}),
                strict: None,
            }],
            choice: ToolChoice::Required,
            parallel: None,
            legacy: false,
        };
        let hermes = ToolFormat::Hermes.grammar(&tools).expect("a grammar");
        assert!(
            hermes.starts_with("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {"),
            "{hermes}"
        );
        assert!(
            hermes.contains("\"const\":\"get_time\"")
                && hermes.contains("\"key_separator\":\": \""),
            "{hermes}"
        );
        let llama = ToolFormat::Llama3.grammar(&tools).expect("a grammar");
        assert!(llama.contains("\"parameters\":{"), "{llama}");
        let mistral = ToolFormat::MistralArgs.grammar(&tools).expect("a grammar");
        assert!(
            mistral.starts_with(
                "start: \"[TOOL_CALLS]\" call\ncall: call_0\ncall_0: \"get_time[ARGS]\" %json {"
            ),
            "{mistral}"
        );
        let deepseek = ToolFormat::DeepSeekR1.grammar(&tools).expect("a grammar");
        assert!(
            deepseek.contains("call_0: \"get_time\\n```json\\n\" %json {"),
            "{deepseek}"
        );
        assert_eq!(ToolFormat::Generic.grammar(&tools), None);
    }
}

//! What agents and multimodal clients add to a conversation: the tools a request offers
//! (`tools`, `tool_choice`, `parallel_tool_calls`, or legacy `functions`), the calls an
//! assistant made of them, and the parts of a message that are not text. Parsed once by
//! `api::request::tools`; an upstream gets them as they were sent
//! (`upstream::wire`), an engine in this process refuses what it cannot serve
//! ([`Front::prepare`](super::Front::prepare)).

use serde_json::Value;

/// The tools a request offers the model, and how it may use them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// The functions, in the order the client listed them.
    pub functions: Vec<Function>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` as sent; `None`: the engine's default (OpenAI's: true).
    pub parallel: Option<bool>,
    /// The client used the legacy `functions` and `function_call`: the answer carries
    /// `function_call`, not `tool_calls`.
    pub legacy: bool,
}

impl Tools {
    /// The functions' names, for the record.
    pub fn names(&self) -> Vec<String> {
        self.functions.iter().map(|f| f.name.clone()).collect()
    }
}

/// One function a model may call: its name and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON Schema (`{}` when the function takes none).
    pub parameters: Value,
    /// OpenAI's `strict`: the arguments must follow the schema exactly.
    pub strict: Option<bool>,
}

/// `tool_choice` (or legacy `function_call`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No call: the tools are context only.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
}

/// A call of a tool, whole: in an assistant message of the history, or an answer's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them (JSON text).
    pub arguments: String,
}

/// A piece of a tool call as it streams, framed as OpenAI frames it: the first piece
/// of a call carries its id and name, the later ones fragments of its arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// Which call of the answer (0, 1, ...).
    pub index: u32,
    pub id: Option<String>,
    pub name: Option<String>,
    /// A fragment of the arguments (empty in a call's first piece).
    pub arguments: String,
}

/// The tool calls of one answer, put together from their pieces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCalls(pub Vec<ToolCall>);

impl ToolCalls {
    /// Adds a piece to the call it belongs to (by index, in the order calls began).
    pub fn push(&mut self, delta: &ToolCallDelta) {
        let index = delta.index as usize;
        while self.0.len() <= index {
            self.0.push(ToolCall::default());
        }
        let call = &mut self.0[index];
        if let Some(id) = &delta.id {
            call.id.clone_from(id);
        }
        if let Some(name) = &delta.name {
            call.name.push_str(name);
        }
        call.arguments.push_str(&delta.arguments);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A part of a message's content that is not text, passed on as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaPart {
    pub kind: MediaKind,
    /// The part's own object (`{"url": ..., "detail": ...}` for an image), unread: its
    /// bytes and URL go to the upstream and nowhere else (never a log or a document).
    pub value: Value,
}

/// What a message's content part holds.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentPart {
    Text(String),
    Media(MediaPart),
}

/// The kinds of content part OpenAI's chat API takes besides text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    ImageUrl,
    InputAudio,
    File,
}

impl MediaKind {
    /// The part's `type`, which is also the key of its object.
    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::ImageUrl => "image_url",
            MediaKind::InputAudio => "input_audio",
            MediaKind::File => "file",
        }
    }

    pub fn of(kind: &str) -> Option<Self> {
        Some(match kind {
            "image_url" => MediaKind::ImageUrl,
            "input_audio" => MediaKind::InputAudio,
            "file" => MediaKind::File,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_make_the_calls_they_belong_to() {
        let mut calls = ToolCalls::default();
        let piece = |index, id: Option<&str>, name: Option<&str>, arguments: &str| ToolCallDelta {
            index,
            id: id.map(str::to_owned),
            name: name.map(str::to_owned),
            arguments: arguments.to_owned(),
        };
        calls.push(&piece(0, Some("call_1"), Some("get_weather"), ""));
        calls.push(&piece(1, Some("call_2"), Some("get_time"), ""));
        calls.push(&piece(0, None, None, "{\"city\":"));
        calls.push(&piece(1, None, None, "{}"));
        calls.push(&piece(0, None, None, "\"Paris\"}"));
        assert_eq!(
            calls.0,
            vec![
                ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                },
                ToolCall {
                    id: "call_2".into(),
                    name: "get_time".into(),
                    arguments: "{}".into()
                },
            ]
        );
    }
}

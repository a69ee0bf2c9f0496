//! A conversation rendered into the prompt the model reads.
//!
//! The model file's chat template (`tokenizer.chat_template`) is Jinja, and it is
//! rendered as Jinja with minijinja, as llama-server renders it (`--jinja`, its default)
//! and as transformers does. llama.cpp's own `llama_chat_apply_template` only recognises
//! a template's family and writes that family's turns, which drops what a template adds
//! itself: SmolLM2's template opens every conversation without a system turn with its
//! default system prompt, and llama-server's answers differ from ours without it. A
//! template minijinja cannot render (tried at load) is left to llama.cpp's reading, with a
//! warning; so is a template chosen by name (`engine.chat_template`), which names one of
//! llama.cpp's built-in formats.

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use minijinja::{context, Environment, Error, ErrorKind};

use serde_json::{Map, Value as Json};

use crate::engine::backend::TemplateTraits;
use crate::engine::reasoning::OPEN;
use crate::engine::toolcall::{self, ToolFormat};
use crate::engine::{ChatMessage, EngineError, GenerationRequest, TemplateInputs};

/// How a loaded model renders conversations.
pub(super) enum ChatTemplate {
    /// The file's Jinja template, with the model's BOS and EOS texts.
    Jinja(Box<Jinja>),
    /// llama.cpp's built-in format: one named, or the file's family as llama.cpp reads it.
    Llama(LlamaChatTemplate),
}

pub(super) struct Jinja {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// The tokenizer adds a BOS token itself: a rendered one is dropped, not doubled.
    adds_bos: bool,
    traits: TemplateTraits,
    /// `enable_thinking` where the request sets none (`engine.reasoning`).
    thinking: bool,
}

impl Jinja {
    /// `source` with `model`'s BOS and EOS texts.
    fn for_model(model: &LlamaModel, source: String) -> Result<Self, Error> {
        let vocab = model.vocab();
        let text =
            |token| String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned();
        Self::new(
            source,
            text(vocab.bos()),
            text(vocab.eos()),
            vocab.should_add_bos(),
        )
    }

    /// The template `source`, checked by rendering a one-turn conversation.
    pub(super) fn new(
        source: String,
        bos: String,
        eos: String,
        adds_bos: bool,
    ) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| {
            chrono::Utc::now().format(&format).to_string()
        });
        let traits = TemplateTraits {
            takes_kwargs: true,
            thinking_switch: ["enable_thinking", "reasoning_effort"]
                .iter()
                .any(|switch| source.contains(switch)),
            thinks: source.contains(OPEN),
            tool_format: ToolFormat::of_template(&source),
        };
        env.add_template_owned("chat", source)?;
        let jinja = Self {
            env,
            bos,
            eos,
            adds_bos,
            traits,
            thinking: true,
        };
        let hi = ChatMessage::new(crate::engine::Role::User, "Hi");
        jinja.render(std::slice::from_ref(&hi), true, &Map::new())?;
        Ok(jinja)
    }

    /// `variables`: the request's own for the template ([`variables`]); the messages
    /// and the tokens win over any of the same name, and they win over what llama.cpp's
    /// server gives every template: `enable_thinking` (on unless `engine.reasoning` is
    /// off), and today's date as Llama 3's `date_string` and FireFunction's `datetime`.
    fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        variables: &Map<String, Json>,
    ) -> Result<String, Error> {
        let ids = self.traits.tool_format.nine_character_ids();
        let messages: Vec<_> = messages.iter().map(|m| message(m, ids)).collect();
        let now = chrono::Utc::now();
        // Earlier ones win.
        let given = context! {
            ..minijinja::Value::from_serialize(variables),
            ..context! {
                enable_thinking => self.thinking,
                date_string => now.format("%d %b %Y").to_string(),
                datetime => now.format("%b %d %Y %H:%M:%S GMT").to_string(),
            }
        };
        let rendered = self.env.get_template("chat")?.render(context! {
            messages,
            add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
            ..given
        })?;
        Ok(match rendered.strip_prefix(self.bos.as_str()) {
            Some(rest) if self.adds_bos && !self.bos.is_empty() => rest.to_owned(),
            _ => rendered,
        })
    }
}

/// A message as templates read it (transformers' shape): `role` and `content`, and where
/// they are set an assistant's `tool_calls` (each `{id, type, function: {name,
/// arguments}}`, the arguments as a JSON object), a result's `tool_call_id`, a `name`.
/// A key that is not set is absent, not none: templates ask `'tool_calls' in message`.
/// `nine_character_ids`: call ids as Mistral's templates take them
/// ([`toolcall::nine_character_id`]).
fn message(m: &ChatMessage, nine_character_ids: bool) -> minijinja::Value {
    let id = |id: &str| match nine_character_ids {
        true => toolcall::nine_character_id(id),
        false => id.to_owned(),
    };
    let calls: Vec<Json> = m
        .tool_calls
        .iter()
        .map(|call| {
            let arguments: Json = serde_json::from_str(&call.arguments)
                .unwrap_or_else(|_| Json::String(call.arguments.clone()));
            serde_json::json!({"id": id(&call.id), "type": "function",
                "function": {"name": call.name, "arguments": arguments}})
        })
        .collect();
    let mut shaped = Map::new();
    shaped.insert("role".into(), Json::from(m.role.as_str()));
    shaped.insert("content".into(), Json::from(m.content.as_str()));
    if !calls.is_empty() {
        shaped.insert("tool_calls".into(), Json::Array(calls));
    }
    if let Some(call_id) = &m.tool_call_id {
        shaped.insert("tool_call_id".into(), Json::String(id(call_id)));
    }
    if let Some(name) = &m.name {
        shaped.insert("name".into(), Json::from(name.as_str()));
    }
    minijinja::Value::from_serialize(&shaped)
}

/// The template variables a request sets: its `chat_template_kwargs`, its
/// `reasoning_effort` as a variable of that name (an effort of `none` also turns
/// `enable_thinking` off unless the request set it), and the `tools` a template that
/// renders them is given (transformers' shape: `{type: "function", function: {name,
/// description, parameters}}`).
pub(super) fn variables(request: &GenerationRequest) -> Map<String, Json> {
    variables_of(
        request.tools.as_ref(),
        request.template_kwargs.as_ref(),
        request.reasoning_effort.as_deref(),
    )
}

/// The template variables of `/apply-template`'s inputs, as a generation's.
pub(super) fn inputs_variables(inputs: &TemplateInputs) -> Map<String, Json> {
    variables_of(
        inputs.tools.as_ref(),
        inputs.kwargs.as_ref(),
        inputs.reasoning_effort.as_deref(),
    )
}

fn variables_of(
    tools: Option<&crate::engine::Tools>,
    kwargs: Option<&Map<String, Json>>,
    reasoning_effort: Option<&str>,
) -> Map<String, Json> {
    let mut variables = kwargs.cloned().unwrap_or_default();
    if let Some(tools) = tools {
        let listed: Vec<Json> = tools
            .functions
            .iter()
            .map(|f| {
                let mut function = serde_json::json!({"name": f.name});
                if let Some(description) = &f.description {
                    function["description"] = Json::String(description.clone());
                }
                function["parameters"] = f.parameters.clone();
                serde_json::json!({"type": "function", "function": function})
            })
            .collect();
        variables.insert("tools".into(), Json::Array(listed));
    }
    if let Some(effort) = reasoning_effort {
        variables.insert("reasoning_effort".into(), Json::String(effort.to_owned()));
        if effort == "none" {
            variables
                .entry("enable_thinking")
                .or_insert(Json::Bool(false));
        }
    }
    variables
}

impl ChatTemplate {
    /// What the template does beyond writing the messages (nothing for llama.cpp's own
    /// reading, which takes no variables).
    pub(super) fn traits(&self) -> TemplateTraits {
        match self {
            ChatTemplate::Jinja(jinja) => jinja.traits,
            ChatTemplate::Llama(_) => TemplateTraits::default(),
        }
    }

    /// `enable_thinking` where a request sets none: `engine.reasoning` off turns it off
    /// (llama.cpp's own reading takes no variables).
    pub(super) fn think_by_default(&mut self, on: bool) {
        if let ChatTemplate::Jinja(jinja) = self {
            jinja.thinking = on;
        }
    }

    /// The file's template: as Jinja, else (minijinja cannot render it) as llama.cpp reads
    /// it; `None` when the file has none. A template chosen by name
    /// (`engine.chat_template`) is made where it is chosen, at load.
    pub(super) fn of(model: &LlamaModel, path: &std::path::Path) -> Option<Self> {
        let file = model.chat_template(None).ok()?;
        let source = file.to_string().ok()?;
        match Jinja::for_model(model, source) {
            Ok(jinja) => Some(ChatTemplate::Jinja(Box::new(jinja))),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "The model's chat template is not Jinja minijinja renders: llama.cpp's reading of it renders conversations.");
                Some(ChatTemplate::Llama(file))
            }
        }
    }

    /// The Jinja template in `file` (`engine.chat_template_file`): one that cannot be
    /// read or rendered is a start-up error.
    pub(super) fn from_file(model: &LlamaModel, file: &std::path::Path) -> anyhow::Result<Self> {
        let source = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("engine.chat_template_file {}: {e}", file.display()))?;
        let jinja = Jinja::for_model(model, source).map_err(|e| {
            anyhow::anyhow!(
                "engine.chat_template_file {} is not a template minijinja renders: {e}",
                file.display()
            )
        })?;
        Ok(ChatTemplate::Jinja(Box::new(jinja)))
    }

    /// `messages` as the model reads them, with the assistant's turn opened when
    /// `add_generation_prompt`.
    pub(super) fn render(
        &self,
        model: &LlamaModel,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        variables: &Map<String, Json>,
    ) -> Result<String, EngineError> {
        match self {
            ChatTemplate::Jinja(jinja) => {
                jinja
                    .render(messages, add_generation_prompt, variables)
                    .map_err(|e| {
                        // A template's own raise_exception: what it refuses in this conversation.
                        EngineError::InvalidParameter {
                            param: "messages".into(),
                            message: format!("the model's chat template refuses them: {e}"),
                        }
                    })
            }
            ChatTemplate::Llama(template) => {
                let chat = messages
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        LlamaChatMessage::new(m.role.as_str().to_owned(), m.content.clone())
                            .map_err(|_| EngineError::InvalidParameter {
                                param: format!("messages[{i}].content"),
                                message: "contains a NUL character".into(),
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                model
                    .apply_chat_template(template, &chat, add_generation_prompt)
                    .map_err(|e| {
                        EngineError::Internal(format!(
                            "llama.cpp could not apply the chat template: {e}"
                        ))
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Role;

    fn turn(role: Role, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    #[test]
    fn hugging_face_templates_render_with_their_python_habits() {
        let source = "{{ bos_token }}{% for m in messages %}\
            {% if loop.first and m.role == 'assistant' %}{{ raise_exception('start with a user turn') }}{% endif %}\
            [{{ m.role }}]{{ m.content.strip() }}{% if m.content.startswith(' ') %}~{% endif %}{{ eos_token }}\
            {% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";
        let jinja = Jinja::new(source.into(), "<s>".into(), "</s>".into(), false).expect("renders");
        let rendered = jinja
            .render(
                &[turn(Role::User, " hi "), turn(Role::Assistant, "yo")],
                true,
                &Map::new(),
            )
            .expect("a conversation");
        assert_eq!(rendered, "<s>[user]hi~</s>[assistant]yo</s>[assistant]");
        let error = jinja
            .render(&[turn(Role::Assistant, "yo")], false, &Map::new())
            .expect_err("the template's own refusal");
        assert!(
            error.to_string().contains("start with a user turn"),
            "{error}"
        );
        // A tokenizer that adds BOS itself gets none from the template too.
        let adds = Jinja::new(source.into(), "<s>".into(), "</s>".into(), true).expect("renders");
        let once = adds
            .render(&[turn(Role::User, "hi")], false, &Map::new())
            .expect("renders");
        assert_eq!(once, "[user]hi</s>");
        assert!(Jinja::new("{% for %}".into(), String::new(), String::new(), false).is_err());
    }

    /// A template with Qwen3's thinking switch: it opens the section unless told not to.
    const SWITCHED: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}\
        {% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}\
        <think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

    #[test]
    fn the_requests_variables_reach_the_template_and_its_traits_are_read() {
        let jinja = Jinja::new(SWITCHED.into(), String::new(), String::new(), false).expect("ok");
        assert_eq!(
            jinja.traits,
            TemplateTraits {
                takes_kwargs: true,
                thinking_switch: true,
                thinks: true,
                tool_format: ToolFormat::Generic,
            }
        );
        let hi = [turn(Role::User, "hi")];
        let render = |request: &GenerationRequest| {
            jinja
                .render(&hi, true, &variables(request))
                .expect("renders")
        };
        let mut request = GenerationRequest::default();
        let open = render(&request);
        assert!(crate::engine::reasoning::opens_thinking(&open), "{open}");
        // An effort of none turns thinking off; the request's own switch wins over it.
        request.reasoning_effort = Some("none".into());
        assert!(render(&request).ends_with("</think>\n\n"));
        request.template_kwargs = serde_json::json!({"enable_thinking": true, "messages": []})
            .as_object()
            .cloned();
        assert_eq!(
            render(&request),
            open,
            "and no variable replaces the messages"
        );

        let plain = Jinja::new(
            "{{ messages[0].content }}".into(),
            String::new(),
            String::new(),
            false,
        )
        .expect("ok");
        assert_eq!(
            plain.traits,
            TemplateTraits {
                takes_kwargs: true,
                ..TemplateTraits::default()
            }
        );
    }

    #[test]
    fn tools_and_the_historys_calls_reach_a_template_that_renders_them() {
        let source = "{% for t in tools %}{{ t.function.name }}{{ t.function.parameters | tojson }};\
            {% endfor %}{% for m in messages %}[{{ m.role }}]{% for c in m.tool_calls or [] %}\
            <tool_call>{{ c.function.name }}{{ c.function.arguments | tojson }}</tool_call>{% endfor %}\
            {% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}{{ m.content }}{% endfor %}";
        let jinja = Jinja::new(source.into(), String::new(), String::new(), false).expect("ok");
        assert_eq!(jinja.traits.tool_format, ToolFormat::Hermes);
        let mut call = turn(Role::Assistant, "");
        call.tool_calls = vec![crate::engine::ToolCall {
            id: "call_a".into(),
            name: "get_time".into(),
            arguments: "{\"zone\":\"CET\"}".into(),
        }];
        let mut result = turn(Role::Tool, "12:00");
        result.tool_call_id = Some("call_a".into());
        let request = GenerationRequest {
            tools: Some(crate::engine::Tools {
                functions: vec![crate::engine::Function {
                    name: "get_time".into(),
                    description: None,
                    parameters: serde_json::json!({"type": "object"}),
                    strict: None,
                }],
                choice: crate::engine::ToolChoice::Auto,
                parallel: None,
                legacy: false,
            }),
            ..GenerationRequest::default()
        };
        let rendered = jinja
            .render(&[call, result], false, &variables(&request))
            .expect("renders");
        assert_eq!(
            rendered,
            "get_time{\"type\":\"object\"};[assistant]<tool_call>get_time{\"zone\":\"CET\"}</tool_call>[tool](call_a)12:00"
        );
    }

    #[test]
    fn every_template_gets_the_thinking_switch_and_the_date_and_mistrals_get_their_ids() {
        let source = "{{ enable_thinking }}|{{ date_string }}|{% for m in messages %}\
            {{ m.tool_call_id }};{% endfor %}{% if tools %}[TOOL_CALLS]{% endif %}";
        let mut jinja =
            Jinja::new(source.into(), String::new(), String::new(), false).expect("renders");
        assert_eq!(jinja.traits.tool_format, ToolFormat::MistralNemo);
        let mut result = turn(Role::Tool, "12:00");
        result.tool_call_id = Some("call_a".into());
        let mut ours = turn(Role::Tool, "13:00");
        ours.tool_call_id = Some("x00000001".into());
        let today = chrono::Utc::now().format("%d %b %Y").to_string();
        let rendered = jinja
            .render(&[result.clone(), ours], false, &Map::new())
            .expect("renders");
        let [switch, date, ids] = rendered.split('|').collect::<Vec<_>>()[..] else {
            panic!("{rendered}")
        };
        assert_eq!((switch, date), ("True", today.as_str()));
        let ids: Vec<&str> = ids.split(';').collect();
        assert!(
            ids[0].len() == 9 && ids[0].chars().all(|c| c.is_ascii_alphanumeric()),
            "{ids:?}"
        );
        assert_eq!(
            ids[0],
            toolcall::nine_character_id("call_a"),
            "the same for call and result"
        );
        assert_eq!(ids[1], "x00000001", "an id Mistral takes is kept");
        // engine.reasoning off, and the request's own switch over it.
        jinja.thinking = false;
        let off = jinja
            .render(std::slice::from_ref(&result), false, &Map::new())
            .expect("renders");
        assert!(off.starts_with("False|"), "{off}");
        let kwargs = serde_json::json!({"enable_thinking": true});
        let on = jinja
            .render(
                std::slice::from_ref(&result),
                false,
                kwargs.as_object().expect("an object"),
            )
            .expect("renders");
        assert!(on.starts_with("True|"), "{on}");
    }
}

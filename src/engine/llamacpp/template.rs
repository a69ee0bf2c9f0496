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

use crate::engine::{ChatMessage, EngineError};

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
}

impl Jinja {
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
        env.add_template_owned("chat", source)?;
        let jinja = Self {
            env,
            bos,
            eos,
            adds_bos,
        };
        let hi = ChatMessage::new(crate::engine::Role::User, "Hi");
        jinja.render(std::slice::from_ref(&hi), true)?;
        Ok(jinja)
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let messages: Vec<_> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        let rendered = self.env.get_template("chat")?.render(context! {
            messages,
            add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        })?;
        Ok(match rendered.strip_prefix(self.bos.as_str()) {
            Some(rest) if self.adds_bos && !self.bos.is_empty() => rest.to_owned(),
            _ => rendered,
        })
    }
}

impl ChatTemplate {
    /// The file's template: as Jinja, else (minijinja cannot render it) as llama.cpp reads
    /// it; `None` when the file has none. A template chosen by name
    /// (`engine.chat_template`) is made where it is chosen, at load.
    pub(super) fn of(model: &LlamaModel, path: &std::path::Path) -> Option<Self> {
        let file = model.chat_template(None).ok()?;
        let source = file.to_string().ok()?;
        let vocab = model.vocab();
        let text =
            |token| String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned();
        match Jinja::new(
            source,
            text(vocab.bos()),
            text(vocab.eos()),
            vocab.should_add_bos(),
        ) {
            Ok(jinja) => Some(ChatTemplate::Jinja(Box::new(jinja))),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "The model's chat template is not Jinja minijinja renders: llama.cpp's reading of it renders conversations.");
                Some(ChatTemplate::Llama(file))
            }
        }
    }

    /// `messages` as the model reads them, with the assistant's turn opened when
    /// `add_generation_prompt`.
    pub(super) fn render(
        &self,
        model: &LlamaModel,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        match self {
            ChatTemplate::Jinja(jinja) => {
                jinja.render(messages, add_generation_prompt).map_err(|e| {
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
            )
            .expect("a conversation");
        assert_eq!(rendered, "<s>[user]hi~</s>[assistant]yo</s>[assistant]");
        let error = jinja
            .render(&[turn(Role::Assistant, "yo")], false)
            .expect_err("the template's own refusal");
        assert!(
            error.to_string().contains("start with a user turn"),
            "{error}"
        );
        // A tokenizer that adds BOS itself gets none from the template too.
        let adds = Jinja::new(source.into(), "<s>".into(), "</s>".into(), true).expect("renders");
        let once = adds
            .render(&[turn(Role::User, "hi")], false)
            .expect("renders");
        assert_eq!(once, "[user]hi</s>");
        assert!(Jinja::new("{% for %}".into(), String::new(), String::new(), false).is_err());
    }
}

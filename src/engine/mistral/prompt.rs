//! The prompt's way into mistral.rs: rendered by its chat template and counted on an
//! instance's engine loop, with every answer waited out by a task of its own
//! ([`detached`]).

use std::sync::Arc;

use either::Either;
use mistralrs::{Model, TextMessageRole, TextMessages};

use crate::engine::{ChatMessage, EngineError, Prompt, Role, TokenizeRequest};

/// Renders and tokenizes a prompt on `model`: mistral.rs answers between two steps of
/// that instance's engine loop, so the caller picks an idle instance (see
/// [`MistralEngine::idlest`]).
pub(super) async fn tokenize(
    model: &Arc<Model>,
    request: &TokenizeRequest,
) -> Result<Vec<u32>, EngineError> {
    let input = match &request.prompt {
        Prompt::Chat(messages) => Either::Left(text_messages(messages)),
        Prompt::Text(text) => Either::Right(text.clone()),
        Prompt::Tokens(ids) => return Ok(ids.clone()),
    };
    let (special, generation) = (request.add_special_tokens, request.add_generation_prompt);
    detached(model, move |model| async move {
        model.tokenize(input, None, special, generation, None).await
    })
    .await
}

/// Runs `call` on `model` in a task of its own and waits for it. A request that leaves
/// (its client gone, its deadline passed) drops this future, not the task: the task
/// holds mistral.rs's answer channel until the answer comes. mistral.rs 0.8.1's engine
/// thread panics when a tokenize or detokenize answer finds its receiver gone
/// (`engine/add_request.rs:774`, `expect("Sender disconnected unexpectedly!")`), so a
/// client that gave up while its prompt waited to be counted took the engine down.
pub(super) async fn detached<T, F, Fut>(model: &Arc<Model>, call: F) -> Result<T, EngineError>
where
    T: Send + 'static,
    F: FnOnce(Arc<Model>) -> Fut,
    Fut: std::future::Future<Output = mistralrs::error::Result<T>> + Send + 'static,
{
    tokio::spawn(call(Arc::clone(model)))
        .await
        .map_err(|e| EngineError::Internal(format!("mistral.rs's answer was lost: {e}")))?
        .map_err(|e| EngineError::Internal(e.to_string()))
}

/// Counts the prompt as the engine will see it before committing to a stream, so a
/// prompt that cannot fit is a clean 400 instead of a mid-stream failure.
pub(super) async fn count_prompt(model: &Arc<Model>, prompt: &Prompt) -> Result<u32, EngineError> {
    let ids = tokenize(model, &TokenizeRequest::as_generated(prompt.clone())).await?;
    Ok(u32::try_from(ids.len()).unwrap_or(u32::MAX))
}

pub(super) fn text_messages(messages: &[ChatMessage]) -> TextMessages {
    messages.iter().fold(TextMessages::new(), |acc, m| {
        let role = match m.role {
            Role::System => TextMessageRole::System,
            Role::User => TextMessageRole::User,
            Role::Assistant => TextMessageRole::Assistant,
            // Refused before a prompt is rendered (`Front::prepare`): no tools here.
            Role::Tool => TextMessageRole::Tool,
        };
        acc.add_message(role, &m.content)
    })
}

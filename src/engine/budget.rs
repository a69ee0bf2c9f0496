//! A request's completion budget as one type: how many tokens the answer may have, and
//! where that number came from, which decides what happens when it does not fit beside
//! the prompt and whether an upstream is sent it.

use super::EngineError;

/// How many completion tokens a request may have, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// The client's `max_tokens` (or `max_completion_tokens`), within the model's cap:
    /// refused when it does not fit beside the prompt; sent to an upstream.
    Asked(u32),
    /// The served model's `default_max_tokens`, for a request that sets none: shrinks to
    /// what the context leaves; sent to an upstream.
    ModelDefault(u32),
    /// Nothing set: the model's cap, shrunk to what the context leaves; an upstream
    /// applies its own default.
    Cap(u32),
}

impl Default for Budget {
    /// No cap: whatever the context leaves.
    fn default() -> Self {
        Budget::Cap(u32::MAX)
    }
}

impl Budget {
    /// The budget of a request that asked for `asked` (or nothing) from a model with
    /// `default` and `cap`. Errors: `asked` is over the cap (the cap is the error).
    pub fn choose(asked: Option<u32>, default: Option<u32>, cap: u32) -> Result<Self, u32> {
        match (asked, default) {
            (Some(n), _) if n > cap => Err(cap),
            (Some(n), _) => Ok(Budget::Asked(n)),
            (None, Some(n)) => Ok(Budget::ModelDefault(n)),
            (None, None) => Ok(Budget::Cap(cap)),
        }
    }

    /// The most completion tokens the answer may have.
    pub fn tokens(self) -> u32 {
        match self {
            Budget::Asked(n) | Budget::ModelDefault(n) | Budget::Cap(n) => n,
        }
    }

    /// What the client asked for, if it asked.
    pub fn asked(self) -> Option<u32> {
        match self {
            Budget::Asked(n) => Some(n),
            _ => None,
        }
    }

    /// The budget an upstream is sent: the client's or the model's default; `None`
    /// leaves the upstream's own default.
    pub fn sent(self) -> Option<u32> {
        match self {
            Budget::Asked(n) | Budget::ModelDefault(n) => Some(n),
            Budget::Cap(_) => None,
        }
    }

    /// The budget within `context_length` after a prompt of `prompt_tokens`, as OpenAI
    /// fits it: a prompt that fills the context, or an asked budget that does not fit
    /// beside it, is refused; any other budget shrinks to what is left.
    pub fn fit(
        self,
        prompt_tokens: u32,
        context_length: u32,
        prompt_param: &'static str,
    ) -> Result<Self, EngineError> {
        let left = context_length.saturating_sub(prompt_tokens);
        if left == 0 || self.asked().is_some_and(|asked| asked > left) {
            return Err(EngineError::ContextLengthExceeded {
                prompt_tokens,
                max_tokens: self.asked(),
                context_length,
                prompt_param,
            });
        }
        Ok(match self {
            Budget::Asked(n) => Budget::Asked(n),
            Budget::ModelDefault(n) => Budget::ModelDefault(n.min(left)),
            Budget::Cap(n) => Budget::Cap(n.min(left)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chooses_the_asked_then_the_default_then_the_cap() {
        assert_eq!(Budget::choose(Some(5), Some(9), 10), Ok(Budget::Asked(5)));
        assert_eq!(Budget::choose(Some(11), None, 10), Err(10));
        assert_eq!(
            Budget::choose(None, Some(9), 10),
            Ok(Budget::ModelDefault(9))
        );
        assert_eq!(Budget::choose(None, None, 10), Ok(Budget::Cap(10)));
        assert_eq!(Budget::Cap(10).sent(), None);
        assert_eq!(Budget::ModelDefault(9).sent(), Some(9));
    }

    #[test]
    fn an_asked_budget_that_does_not_fit_is_refused_others_shrink() {
        let refused = Budget::Asked(8).fit(95, 100, "messages").unwrap_err();
        assert!(matches!(
            refused,
            EngineError::ContextLengthExceeded {
                max_tokens: Some(8),
                ..
            }
        ));
        assert_eq!(
            Budget::Asked(5).fit(95, 100, "messages"),
            Ok(Budget::Asked(5))
        );
        assert_eq!(Budget::Cap(50).fit(95, 100, "prompt"), Ok(Budget::Cap(5)));
        assert_eq!(
            Budget::ModelDefault(50).fit(95, 100, "prompt"),
            Ok(Budget::ModelDefault(5))
        );
        assert!(Budget::Cap(50).fit(100, 100, "prompt").is_err());
    }
}

//! The redacted excerpts of a request's document: its prompt, its answer and its tool
//! calls' arguments, each cut to the configured length after redaction, and what
//! redaction found in them.

use super::{agent, DocumentSettings};
use crate::record::RequestRecord;
use crate::redact::{Redacted, RedactionCounts, Redactor};

/// The prompt and response excerpts of a request, redacted, and what redaction found in
/// them.
pub(super) struct Excerpts {
    pub(super) prompt: Option<Redacted>,
    pub(super) response: Option<Redacted>,
    /// The answer's tool calls, `name(arguments)` per line.
    pub(super) tool_calls: Option<Redacted>,
    pub(super) counts: RedactionCounts,
}

impl Excerpts {
    /// The excerpts of `r` (none where `settings` keep only stats, though the redactions
    /// are still counted).
    pub(super) fn redacted(
        r: &RequestRecord,
        redactor: &Redactor,
        settings: &DocumentSettings,
    ) -> Self {
        let mut counts = RedactionCounts::default();
        // Only the start of a long prompt is redacted: the excerpt comes from it, and a
        // megabyte prompt must not cost the request path a megabyte of regex work. The
        // window is wide enough that a value cut by it lies wholly beyond the excerpt.
        let window = settings.excerpt_chars.saturating_mul(4).max(4096);
        // Any secret the gateway holds (an upstream's key, a URL's password, the Basic
        // header made of it) is taken out first: an upstream may quote one back in its
        // answer, in a form no pattern of the redactor knows (an opaque token).
        fn head(t: &str, window: usize) -> String {
            crate::secret::scrub_held(t.char_indices().nth(window).map_or(t, |(i, _)| &t[..i]))
        }
        // What the prompt gave away is kept out of both excerpts wherever it recurs: a
        // name its cue marked once, then repeated (or echoed by the answer) without it.
        let (prompt, known) = match r.prompt.as_deref() {
            Some(t) => {
                let (excerpt, known) =
                    redactor.prompt_excerpt(&head(t, window), settings.excerpt_chars, &mut counts);
                (Some(excerpt), known)
            }
            None => (None, Vec::new()),
        };
        let response = r.response.as_deref().map(|t| {
            redactor.excerpt_knowing(
                &head(t, window),
                &known,
                settings.excerpt_chars,
                &mut counts,
            )
        });
        let tool_calls = agent::calls_text(r).map(|t| {
            redactor.excerpt_knowing(
                &head(&t, window),
                &known,
                settings.excerpt_chars,
                &mut counts,
            )
        });
        let keep = !settings.stats_only;
        Self {
            prompt: prompt.filter(|_| keep),
            response: response.filter(|_| keep),
            tool_calls: tool_calls.filter(|_| keep),
            counts,
        }
    }
}

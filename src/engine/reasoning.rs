//! A reasoning model's thinking, split out of the text an engine in this process writes,
//! as llama-server's `reasoning_format` does: `<think>…</think>` at the head of the
//! answer becomes `reasoning_content` ([`EngineEvent::Reasoning`]), the rest the answer.
//! A template that opens the section itself (DeepSeek R1's, Qwen3's) leaves the model
//! inside it: the answer then starts as reasoning, with no `<think>` of its own.
//!
//! The split is read as the tokens stream: a tag cut between tokens is held until it is
//! whole, and nothing else waits.

use std::time::Instant;

use super::EngineEvent;

/// The tag that opens a thinking section.
pub const OPEN: &str = "<think>";
/// The tag that closes it.
pub const CLOSE: &str = "</think>";

/// How an engine in this process hands over a model's thinking (llama-server's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Left in the answer's content as the model wrote it.
    None,
    /// Split into `reasoning_content`.
    Deepseek,
    /// Split where the model's template writes thinking sections; the default.
    Auto,
}

impl ReasoningFormat {
    pub const NAMES: [&'static str; 3] = ["none", "deepseek", "auto"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Self::None),
            "deepseek" => Some(Self::Deepseek),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Deepseek => "deepseek",
            Self::Auto => "auto",
        }
    }

    /// Whether answers are split, for a model whose template writes thinking sections
    /// (`template_thinks`) and a prompt that leaves the model inside one (`opened`).
    pub fn splits(self, template_thinks: bool, opened: bool) -> bool {
        match self {
            Self::None => false,
            Self::Deepseek => true,
            Self::Auto => template_thinks || opened,
        }
    }
}

/// Whether a rendered prompt ends inside a thinking section its template opened.
pub fn opens_thinking(rendered: &str) -> bool {
    rendered.trim_end().ends_with(OPEN)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Nothing but white space yet: a `<think>` may still open.
    Head,
    Thinking,
    /// The section has closed; white space before the answer is dropped.
    Closed,
    Answer,
}

/// Reads an engine's events into reasoning and answer, in order.
#[derive(Debug)]
pub struct Splitter {
    part: Part,
    /// Text not yet handed on: the start of a tag, or white space at the head.
    held: String,
    /// Tokens behind `held`, and their ids while they may still be the answer's.
    held_ids: Vec<u32>,
    /// Reasoning tokens handed on, for the usage where the engine gives none.
    reasoning_tokens: u32,
}

impl Splitter {
    /// `opened`: the template left the model inside a thinking section.
    pub fn new(opened: bool) -> Self {
        Self {
            part: if opened { Part::Thinking } else { Part::Head },
            held: String::new(),
            held_ids: Vec::new(),
            reasoning_tokens: 0,
        }
    }

    /// What `event` becomes: reasoning, answer text, or itself.
    pub fn on_event(&mut self, event: EngineEvent) -> Vec<EngineEvent> {
        match event {
            EngineEvent::Token { .. } if self.part == Part::Answer => vec![event],
            EngineEvent::Token { text, ids, at, .. } => {
                self.held.push_str(&text);
                self.held_ids.extend(ids);
                self.split(at, false)
            }
            EngineEvent::Finished { reason, mut usage } => {
                let mut out = self.split(Instant::now(), true);
                if self.reasoning_tokens > 0 {
                    usage.reasoning_tokens.get_or_insert(self.reasoning_tokens);
                }
                out.push(EngineEvent::Finished { reason, usage });
                out
            }
            EngineEvent::Restarted => {
                *self = Self::new(false);
                vec![event]
            }
            other => vec![other],
        }
    }

    /// Hands on what `held` is known to be; `end`: nothing more comes.
    fn split(&mut self, at: Instant, end: bool) -> Vec<EngineEvent> {
        let mut out = Vec::new();
        if self.part == Part::Head {
            let head = self.held.trim_start();
            if let Some(rest) = head.strip_prefix(OPEN) {
                self.held = rest.trim_start().to_owned();
                self.part = Part::Thinking;
            } else if OPEN.starts_with(head) && !end {
                return out;
            } else {
                self.part = Part::Answer;
                let held = std::mem::take(&mut self.held);
                out.extend(self.answer(held, at));
                return out;
            }
        }
        if self.part == Part::Thinking {
            if let Some(i) = self.held.find(CLOSE) {
                let after = self.held.split_off(i);
                out.extend(self.reasoning(at, true));
                self.part = Part::Closed;
                self.held = after[CLOSE.len()..].to_owned();
            } else {
                // The longest end of the text that may be the start of the closing tag.
                let keep = if end {
                    0
                } else {
                    tag_start_at_end(&self.held, CLOSE)
                };
                let kept = self.held.split_off(self.held.len() - keep);
                out.extend(self.reasoning(at, end));
                self.held = kept;
            }
        }
        if self.part == Part::Closed {
            let answer = self.held.trim_start();
            if !answer.is_empty() {
                let answer = answer.to_owned();
                self.held.clear();
                self.part = Part::Answer;
                out.extend(self.answer(answer, at));
            } else if end {
                out.extend(self.answer(String::new(), at));
            }
        }
        out
    }

    /// `held` as reasoning, with every held token. Text-less tokens (a tag's) wait for
    /// the next text, or at the section's end (`closing`) are counted with no event.
    fn reasoning(&mut self, at: Instant, closing: bool) -> Option<EngineEvent> {
        let tokens = u32::try_from(self.held_ids.len()).unwrap_or(u32::MAX);
        if self.held.is_empty() && !closing {
            return None;
        }
        self.held_ids.clear();
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(tokens);
        let text = std::mem::take(&mut self.held);
        (!text.is_empty()).then_some(EngineEvent::Reasoning { text, tokens, at })
    }

    /// `text` as the answer, with the held tokens' ids (none left where the thinking
    /// took them).
    fn answer(&mut self, text: String, at: Instant) -> Option<EngineEvent> {
        let ids = std::mem::take(&mut self.held_ids);
        (!text.is_empty() || !ids.is_empty()).then(|| EngineEvent::Token {
            text,
            ids,
            logprobs: Vec::new(),
            at,
        })
    }
}

/// How many bytes at the end of `text` are a proper start of `tag`: what
/// a reader of tags in streamed text holds back until the next piece.
pub(crate) fn tag_start_at_end(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .filter(|&k| tag.is_char_boundary(k))
        .find(|&k| text.ends_with(&tag[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{FinishReason, Usage};

    fn token(text: &str, id: u32) -> EngineEvent {
        EngineEvent::Token {
            text: text.into(),
            ids: vec![id],
            logprobs: Vec::new(),
            at: Instant::now(),
        }
    }

    /// Feeds `pieces` and the end; gives (reasoning, answer, reasoning tokens of the
    /// events, usage's reasoning tokens), with each handed-on piece's kind in order.
    fn split(opened: bool, pieces: &[&str]) -> (String, String, u32, Option<u32>, Vec<char>) {
        let mut splitter = Splitter::new(opened);
        let mut events = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            events.extend(splitter.on_event(token(piece, i as u32)));
        }
        events.extend(splitter.on_event(EngineEvent::Finished {
            reason: FinishReason::Stop,
            usage: Usage::default(),
        }));
        let (mut reasoning, mut answer, mut tokens, mut usage) =
            (String::new(), String::new(), 0, None);
        let mut kinds = Vec::new();
        for event in events {
            match event {
                EngineEvent::Reasoning {
                    text, tokens: n, ..
                } => {
                    reasoning.push_str(&text);
                    tokens += n;
                    kinds.push('r');
                }
                EngineEvent::Token { text, .. } => {
                    answer.push_str(&text);
                    kinds.push('a');
                }
                EngineEvent::Finished { usage: u, .. } => usage = u.reasoning_tokens,
                other => panic!("{other:?}"),
            }
        }
        (reasoning, answer, tokens, usage, kinds)
    }

    #[test]
    fn a_think_section_at_the_head_is_reasoning_and_the_rest_the_answer() {
        let (reasoning, answer, tokens, usage, kinds) = split(
            false,
            &[
                "\n<th",
                "ink>",
                "Paris is ",
                "in France.</",
                "think>",
                "\n\nIt is ",
                "sunny.",
            ],
        );
        assert_eq!(reasoning, "Paris is in France.");
        assert_eq!(answer, "It is sunny.");
        // The tags' tokens are the thinking's: the opening one's go with its first text,
        // the closing one's into the usage only.
        assert_eq!((tokens, usage), (4, Some(5)));
        // Each piece as soon as its kind is known: no waiting for the end.
        assert_eq!(kinds, ['r', 'r', 'a', 'a']);
    }

    #[test]
    fn a_template_that_opened_the_section_leaves_the_answer_in_it() {
        let (reasoning, answer, ..) = split(true, &["Hmm, ", "sun.</think>", "Sunny."]);
        assert_eq!(
            (reasoning.as_str(), answer.as_str()),
            ("Hmm, sun.", "Sunny.")
        );
        // Cut by the budget before it closed: all of it was thinking.
        let (reasoning, answer, ..) = split(true, &["Hmm, ", "still </thi"]);
        assert_eq!(
            (reasoning.as_str(), answer.as_str()),
            ("Hmm, still </thi", "")
        );
    }

    #[test]
    fn an_answer_that_does_not_open_with_think_is_left_whole() {
        let (reasoning, answer, tokens, usage, _) =
            split(false, &[" <", "b>Bold</b> and <think>x</think>"]);
        assert_eq!(reasoning, "");
        assert_eq!(answer, " <b>Bold</b> and <think>x</think>");
        assert_eq!((tokens, usage), (0, None));
        // A lone start of the tag at the end is the answer's too.
        let (_, answer, ..) = split(false, &["<thi"]);
        assert_eq!(answer, "<thi");
    }

    #[test]
    fn the_answer_keeps_its_token_ids() {
        let mut splitter = Splitter::new(false);
        assert!(
            splitter.on_event(token("  ", 7)).is_empty(),
            "may open still"
        );
        let out = splitter.on_event(token("Hi", 8));
        let [EngineEvent::Token { text, ids, .. }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!((text.as_str(), ids.as_slice()), ("  Hi", &[7, 8][..]));
        assert!(
            matches!(&splitter.on_event(token("!", 9))[..], [EngineEvent::Token { ids, .. }] if ids == &[9])
        );
    }

    #[test]
    fn formats_are_read_by_name_and_auto_follows_the_template() {
        for name in ReasoningFormat::NAMES {
            assert_eq!(
                ReasoningFormat::parse(name).map(ReasoningFormat::as_str),
                Some(name)
            );
        }
        assert_eq!(ReasoningFormat::parse("DeepSeek"), None);
        assert!(!ReasoningFormat::Auto.splits(false, false));
        assert!(ReasoningFormat::Auto.splits(true, false));
        assert!(ReasoningFormat::Auto.splits(false, true));
        assert!(!ReasoningFormat::None.splits(true, true));
        assert!(ReasoningFormat::Deepseek.splits(false, false));
        assert!(opens_thinking("<|Assistant|><think>\n"));
        assert!(!opens_thinking("<think>\n\n</think>\n\n"));
    }
}

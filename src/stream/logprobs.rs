//! Token log-probabilities in the two shapes OpenAI gives them:
//!
//! ```text
//! chat:   "logprobs": {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72,105],
//!                       "top_logprobs": [{"token", "logprob", "bytes"}...]}], "refusal": null}
//! legacy: "logprobs": {"tokens": ["Hi"], "token_logprobs": [-0.5],
//!                      "top_logprobs": [{"Hi": -0.5, "Yo": -1.25}], "text_offset": [0]}
//! ```
//!
//! Both serialise straight from the engine's [`TokenLogprob`]s, with nothing copied.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::engine::TokenLogprob;

/// OpenAI's chat `logprobs` object over the tokens of one chunk or answer.
#[derive(Debug, Clone, Copy)]
pub struct ChatLogprobs<'a>(pub &'a [TokenLogprob]);

impl Serialize for ChatLogprobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Top<'a> {
            token: &'a str,
            logprob: f32,
            bytes: &'a [u8],
        }
        #[derive(Serialize)]
        struct Entry<'a> {
            token: &'a str,
            logprob: f32,
            bytes: &'a [u8],
            top_logprobs: Vec<Top<'a>>,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            content: Vec<Entry<'a>>,
            refusal: Option<()>,
        }
        let content = self
            .0
            .iter()
            .map(|t| Entry {
                token: &t.token.text,
                logprob: t.logprob,
                bytes: &t.token.bytes,
                top_logprobs: t
                    .top
                    .iter()
                    .map(|(token, logprob)| Top {
                        token: &token.text,
                        logprob: *logprob,
                        bytes: &token.bytes,
                    })
                    .collect(),
            })
            .collect();
        Body {
            content,
            refusal: None,
        }
        .serialize(serializer)
    }
}

/// The legacy completions' `logprobs` object over the tokens of one chunk or answer.
/// `start`: the character offset of the first token's text in the whole response text
/// (the echoed prompt counts), so `text_offset` runs on across the chunks of a stream.
#[derive(Debug, Clone, Copy)]
pub struct TextLogprobs<'a> {
    pub tokens: &'a [TokenLogprob],
    pub start: usize,
}

impl Serialize for TextLogprobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            tokens: Vec<&'a str>,
            token_logprobs: Vec<f32>,
            top_logprobs: Vec<TopMap<'a>>,
            text_offset: Vec<usize>,
        }
        let mut offset = self.start;
        let text_offset = self
            .tokens
            .iter()
            .map(|t| {
                let at = offset;
                offset += t.token.text.chars().count();
                at
            })
            .collect();
        Body {
            tokens: self.tokens.iter().map(|t| t.token.text.as_str()).collect(),
            token_logprobs: self.tokens.iter().map(|t| t.logprob).collect(),
            top_logprobs: self.tokens.iter().map(TopMap).collect(),
            text_offset,
        }
        .serialize(serializer)
    }
}

/// One token's `{text: logprob}` map: the most likely alternatives, then the picked
/// token if it is not among them (OpenAI's "up to logprobs + 1 entries").
struct TopMap<'a>(&'a TokenLogprob);

impl Serialize for TopMap<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let picked_listed = t.top.iter().any(|(token, _)| token.bytes == t.token.bytes);
        let mut map = serializer.serialize_map(Some(t.top.len() + usize::from(!picked_listed)))?;
        for (token, logprob) in &t.top {
            map.serialize_entry(&token.text, logprob)?;
        }
        if !picked_listed {
            map.serialize_entry(&t.token.text, &t.logprob)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TokenText;

    fn token(text: &str, logprob: f32, top: &[(&str, f32)]) -> TokenLogprob {
        TokenLogprob {
            token: TokenText::from_bytes(text.as_bytes().to_vec()),
            logprob,
            top: top
                .iter()
                .map(|(t, lp)| (TokenText::from_bytes(t.as_bytes().to_vec()), *lp))
                .collect(),
        }
    }

    #[test]
    fn legacy_logprobs_are_parallel_lists_with_running_offsets() {
        let tokens = [
            token("Hi", -0.5, &[("Hi", -0.5), ("Yo", -1.25)]),
            token(" é", -2.0, &[(" a", -0.25)]),
            token("!", -0.125, &[]),
        ];
        let body = serde_json::to_string(&TextLogprobs {
            tokens: &tokens,
            start: 7,
        })
        .expect("json");
        assert_eq!(
            body,
            "{\"tokens\":[\"Hi\",\" é\",\"!\"],\"token_logprobs\":[-0.5,-2.0,-0.125],\
             \"top_logprobs\":[{\"Hi\":-0.5,\"Yo\":-1.25},{\" a\":-0.25,\" é\":-2.0},{\"!\":-0.125}],\
             \"text_offset\":[7,9,11]}"
        );
    }
}

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

use std::borrow::Cow;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::tokens::{TokenLogprob, TokenText};

/// `$shape`'s schema is that of `$body`, the struct it serialises through: the
/// document of `/openapi.json` describes what is written.
macro_rules! schema_of_body {
    ($shape:ty => $body:ident) => {
        impl PartialSchema for $shape {
            fn schema() -> RefOr<Schema> {
                $body::schema()
            }
        }

        impl ToSchema for $shape {
            fn name() -> Cow<'static, str> {
                $body::name()
            }

            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                $body::schemas(schemas);
            }
        }
    };
}

/// OpenAI's chat `logprobs` object over the tokens of one chunk or answer.
#[derive(Debug, Clone, Copy)]
pub struct ChatLogprobs<'a>(pub &'a [TokenLogprob]);

impl Serialize for ChatLogprobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let content = self
            .0
            .iter()
            .map(|t| ChatEntry {
                token: &t.token.text,
                logprob: t.shown(),
                bytes: &t.token.bytes,
                top_logprobs: t
                    .top
                    .iter()
                    .map(|(token, logprob)| ChatTop {
                        token: &token.text,
                        logprob: *logprob,
                        bytes: &token.bytes,
                    })
                    .collect(),
            })
            .collect();
        ChatBody {
            content,
            refusal: None,
        }
        .serialize(serializer)
    }
}

/// What [`ChatLogprobs`] writes; its schema is the one `/openapi.json` gives.
#[derive(Serialize, ToSchema)]
#[schema(as = ChatLogprobs)]
struct ChatBody<'a> {
    content: Vec<ChatEntry<'a>>,
    #[schema(value_type = Option<String>)]
    refusal: Option<()>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = ChatTokenLogprob)]
struct ChatEntry<'a> {
    token: &'a str,
    /// Natural log of the token's probability.
    logprob: f32,
    /// The token's UTF-8 bytes (a token may be part of a character).
    bytes: &'a [u8],
    top_logprobs: Vec<ChatTop<'a>>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = ChatTopLogprob)]
struct ChatTop<'a> {
    token: &'a str,
    logprob: f32,
    bytes: &'a [u8],
}

schema_of_body!(ChatLogprobs<'_> => ChatBody);

/// The legacy completions' `logprobs` object over the tokens of one chunk or answer.
/// `start`: where the first token's `text_offset` counts from, in characters of the whole
/// response text (the echoed prompt counts); see [`TextLogprobs::end`].
#[derive(Debug, Clone, Copy)]
pub struct TextLogprobs<'a> {
    pub tokens: &'a [TokenLogprob],
    pub start: usize,
}

impl TextLogprobs<'_> {
    /// Where the next chunk's tokens count from: `start` plus the characters these
    /// tokens begin. Counted from the tokens' bytes, not from the text sent, so a stream
    /// reports the same offsets as the whole answer whatever its chunks held.
    pub fn end(&self) -> usize {
        self.start + self.tokens.iter().map(chars_begun).sum::<usize>()
    }

    /// Each token's character offset: that of the character its first byte begins, or,
    /// for a token that starts inside a character (one split across tokens), of that
    /// character.
    fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        let mut begun = self.start;
        self.tokens.iter().map(move |t| {
            let continues = t.token.bytes.first().is_some_and(|b| is_continuation(*b));
            let at = if continues {
                begun.saturating_sub(1)
            } else {
                begun
            };
            begun += chars_begun(t);
            at
        })
    }

    /// How many of the first tokens end by character `end`: their text is all there.
    pub fn ended_by(&self, end: usize) -> usize {
        self.offsets()
            .zip(self.tokens)
            .take_while(|(at, t)| at + chars_begun(t) <= end)
            .count()
    }

    /// How many of the tokens begin before character `end` (where a stop sequence cut
    /// the text): the rest spelled the stop and are not the answer's.
    pub fn begun_before(&self, end: usize) -> usize {
        self.offsets().take_while(|&at| at < end).count()
    }
}

fn is_continuation(byte: u8) -> bool {
    byte & 0xC0 == 0x80
}

/// Characters a token's bytes begin (UTF-8 lead bytes); its text's when it has no bytes.
fn chars_begun(t: &TokenLogprob) -> usize {
    if t.token.bytes.is_empty() {
        return t.token.text.chars().count();
    }
    t.token
        .bytes
        .iter()
        .filter(|b| !is_continuation(**b))
        .count()
}

/// A token as the legacy shape spells it: its text, or `bytes:\xe4\xb8` when its bytes
/// are not UTF-8 on their own (part of a character), as OpenAI writes them.
fn legacy_spelling(token: &TokenText) -> Cow<'_, str> {
    if token.bytes.is_empty() {
        return Cow::Borrowed(token.text.as_str());
    }
    match std::str::from_utf8(&token.bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => {
            use std::fmt::Write;
            let mut spelled = String::from("bytes:");
            for b in &token.bytes {
                let _ = write!(spelled, "\\x{b:02x}");
            }
            Cow::Owned(spelled)
        }
    }
}

impl Serialize for TextLogprobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        TextBody {
            tokens: self
                .tokens
                .iter()
                .map(|t| legacy_spelling(&t.token))
                .collect(),
            token_logprobs: self.tokens.iter().map(TokenLogprob::shown).collect(),
            top_logprobs: self.tokens.iter().map(TopMap).collect(),
            text_offset: self.offsets().collect(),
        }
        .serialize(serializer)
    }
}

/// What [`TextLogprobs`] writes; its schema is the one `/openapi.json` gives.
#[derive(Serialize, ToSchema)]
#[schema(as = TextLogprobs)]
struct TextBody<'a> {
    tokens: Vec<Cow<'a, str>>,
    token_logprobs: Vec<f32>,
    /// Per token, `{text: logprob}` of the likeliest alternatives and the picked token.
    #[schema(value_type = Vec<std::collections::HashMap<String, f32>>)]
    top_logprobs: Vec<TopMap<'a>>,
    /// Where each token starts, in characters of the response text.
    text_offset: Vec<usize>,
}

schema_of_body!(TextLogprobs<'_> => TextBody);

/// One token's `{text: logprob}` map: the most likely alternatives, then the picked
/// token if it is not among them (OpenAI's "up to logprobs + 1 entries").
struct TopMap<'a>(&'a TokenLogprob);

impl Serialize for TopMap<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let picked = (&t.token, t.shown());
        let listed = t.top.iter().map(|(token, logprob)| (token, *logprob));
        // A map has one value per key: two tokens that spell alike (a byte-fallback
        // `<0x41>` and `A`) keep the likelier, which comes first.
        let mut seen: Vec<Cow<'_, str>> = Vec::with_capacity(t.top.len() + 1);
        let mut map = serializer.serialize_map(None)?;
        for (token, logprob) in listed.chain(std::iter::once(picked)) {
            let spelled = legacy_spelling(token);
            if !seen.contains(&spelled) {
                map.serialize_entry(&spelled, &logprob)?;
                seen.push(spelled);
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str, logprob: f32, top: &[(&str, f32)]) -> TokenLogprob {
        TokenLogprob {
            sampled: None,
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

    #[test]
    fn a_character_split_across_tokens_is_spelled_in_bytes_and_offset_once() {
        let byte_token = |bytes: &[u8]| TokenLogprob {
            sampled: None,
            token: TokenText::from_bytes(bytes.to_vec()),
            logprob: -1.0,
            top: Vec::new(),
        };
        // "中" is e4 b8 ad: one token holds its first byte, the next the other two.
        let tokens = [
            byte_token("a".as_bytes()),
            byte_token(&[0xe4]),
            byte_token(&[0xb8, 0xad]),
            byte_token("b".as_bytes()),
        ];
        let lp = TextLogprobs {
            tokens: &tokens,
            start: 0,
        };
        let body = serde_json::to_value(lp).expect("json");
        assert_eq!(
            body["tokens"],
            serde_json::json!(["a", "bytes:\\xe4", "bytes:\\xb8\\xad", "b"])
        );
        assert_eq!(
            body["text_offset"],
            serde_json::json!([0, 1, 1, 2]),
            "'a中b'"
        );
        assert_eq!(lp.end(), 3);
        let streamed = TextLogprobs {
            tokens: &tokens[2..],
            start: TextLogprobs {
                tokens: &tokens[..2],
                start: 0,
            }
            .end(),
        };
        assert_eq!(
            serde_json::to_value(streamed).expect("json")["text_offset"],
            serde_json::json!([1, 2]),
            "split across chunks, the same offsets"
        );
    }

    #[test]
    fn tokens_that_spell_alike_keep_one_key_the_likelier() {
        let tokens = [token("A", -0.5, &[("A", -0.25), ("A", -0.5), ("B", -2.0)])];
        let body = serde_json::to_string(&TextLogprobs {
            tokens: &tokens,
            start: 0,
        })
        .expect("json");
        assert!(
            body.contains("\"top_logprobs\":[{\"A\":-0.25,\"B\":-2.0}]"),
            "{body}"
        );
    }
}

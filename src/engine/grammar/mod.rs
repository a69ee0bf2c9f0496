//! Structured output: JSON held to a schema, or text to a GBNF grammar ([`gbnf`]), while
//! it is decoded.
//!
//! The gateway, not mistral.rs, applies the constraint. mistral.rs 0.8.1 samples first and
//! masks only when the sampled token breaks the grammar, then samples again
//! (`sample_sequence`, mistralrs-core pipeline/sampling.rs); with the gateway's own picker
//! that is two picks per such token, and a picked id recorded for a token that is then
//! thrown away. So each step here computes the grammar's mask first, the seeded picker
//! chooses among the tokens it allows, and the grammar consumes the choice: the picked
//! text is valid by construction, and seeded answers stay reproducible.
//!
//! The grammar needs each token's bytes. [`Vocabulary::new`] takes them from the GGUF
//! file's tokenizer metadata (`engine::gguf`) (byte-level BPE as in GPT-2, or SentencePiece with byte
//! fallback), builds llguidance's token trie, and a parser factory from it. A schema is
//! compiled by [`Vocabulary::compile`] before the request waits for the engine, so a
//! schema that cannot be compiled is a 400 naming the field, never a failed stream.

pub mod gbnf;

use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenId};

use super::{EngineError, ResponseFormat};
use crate::tokens::TokenText;

/// Where a schema problem is reported, as the client spelt it.
pub const SCHEMA_PARAM: &str = "response_format.json_schema.schema";
/// llama.cpp's parameter for a GBNF grammar.
pub const GRAMMAR_PARAM: &str = "grammar";
/// The stack a grammar is compiled on (reserved, not committed, until used).
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// The model's tokens as bytes, and the grammar compiler built on them.
pub struct Vocabulary {
    factory: ParserFactory,
    /// Each token as the vocabulary spells it (`Ġthe`), for `/tokenize`'s `token_strs`.
    spellings: Vec<String>,
    /// Each token's bytes as it appears in text (a special token as its name), for
    /// `logprobs`.
    bytes: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("tokens", &self.spellings.len())
            .finish_non_exhaustive()
    }
}

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp defines them.
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_BYTE: i32 = 6;

impl Vocabulary {
    /// The vocabulary of a tokenizer `model` ("gpt2" or "llama"): token spellings, their
    /// GGUF types, and the end-of-sequence token.
    pub fn new(
        model: &str,
        spellings: Vec<String>,
        types: &[i32],
        eos: u32,
    ) -> anyhow::Result<Self> {
        let byte_level = match model {
            "gpt2" => true,
            "llama" => false,
            other => anyhow::bail!("structured output does not know the '{other}' tokenizer"),
        };
        let words: Vec<Vec<u8>> = spellings
            .iter()
            .zip(types.iter().copied().chain(std::iter::repeat(1)))
            .map(|(spelling, kind)| token_bytes(spelling, kind, byte_level))
            .collect();
        let vocab_size = u32::try_from(words.len())?;
        anyhow::ensure!(
            eos < vocab_size,
            "the end-of-sequence token {eos} is not in the vocabulary"
        );
        let trie = TokTrie::from(&TokRxInfo::new(vocab_size, eos), &words);
        let env: toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)?;
        // Errors go to the client through our own message; llguidance prints nothing.
        factory.quiet();
        let bytes = words
            .into_iter()
            .map(|mut word| {
                if word.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
                    word.remove(0);
                }
                word
            })
            .collect();
        Ok(Self {
            factory,
            spellings,
            bytes,
        })
    }

    /// Tokens in the vocabulary: its ids are `0..len`.
    pub fn len(&self) -> usize {
        self.spellings.len()
    }

    /// Whether the vocabulary has no tokens (never, for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.spellings.is_empty()
    }

    /// A token as text (empty for an id the vocabulary does not have).
    pub fn token_text(&self, id: u32) -> TokenText {
        TokenText::from_bytes(self.bytes.get(id as usize).cloned().unwrap_or_default())
    }

    /// The grammar for `format`, ready for one request; `None` for free text. An error
    /// names the parameter and says what the compiler found.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<Grammar>, EngineError> {
        let (grammar, param, what) = match format {
            ResponseFormat::Text => return Ok(None),
            ResponseFormat::JsonObject => (
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
                "response_format",
                "schema",
            ),
            ResponseFormat::JsonSchema(schema) => (
                TopLevelGrammar::from_json_schema(compact(schema.clone())),
                SCHEMA_PARAM,
                "schema",
            ),
            ResponseFormat::Grammar(text) => {
                let lark = gbnf::to_lark(text).map_err(|e| EngineError::InvalidParameter {
                    param: GRAMMAR_PARAM.to_owned(),
                    message: format!("is not a GBNF grammar: {e}"),
                })?;
                (TopLevelGrammar::from_lark(lark), GRAMMAR_PARAM, "grammar")
            }
            ResponseFormat::Lark(lark) => (
                TopLevelGrammar::from_lark(lark.clone()),
                "tools",
                "tools' schemas",
            ),
        };
        // llguidance's compiler recurses along a GBNF grammar's chains of rules and
        // parentheses: bounded (`gbnf`'s limits), yet deeper than a thread's usual 2 MiB
        // holds in a debug build, so it runs on a thread with room.
        let parser = match format {
            ResponseFormat::Grammar(_) => std::thread::scope(|scope| {
                std::thread::Builder::new()
                    .name("grammar".into())
                    .stack_size(COMPILE_STACK_BYTES)
                    .spawn_scoped(scope, || self.factory.create_parser(grammar))
                    .map_err(|e| EngineError::Internal(e.to_string()))?
                    .join()
                    .map_err(|_| EngineError::Internal("the grammar compiler panicked".into()))
            })?,
            _ => self.factory.create_parser(grammar),
        }
        .map_err(|e| EngineError::InvalidParameter {
            param: param.to_owned(),
            message: format!("the {what} cannot be used for constrained decoding: {e}"),
        })?;
        Ok(Some(Grammar(Arc::new(Mutex::new(Matcher::new(Ok(
            parser,
        )))))))
    }

    /// How the vocabulary spells `ids`; `None` for an id it does not have.
    pub fn spellings(&self, ids: &[u32]) -> Option<Vec<String>> {
        ids.iter()
            .map(|&id| self.spellings.get(id as usize).cloned())
            .collect()
    }
}

/// Small models wander in free whitespace: unless the schema says otherwise, JSON is
/// decoded compact (`{"a":1}`), which is still any JSON parser's JSON.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// One request's grammar state: which tokens may come next, advanced by each pick.
#[derive(Clone)]
pub struct Grammar(Arc<Mutex<Matcher>>);

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Grammar {
    /// Sets every logit the grammar does not allow next to minus infinity (only the end
    /// of sequence once the JSON is complete).
    pub fn mask(&self, logits: &mut [f32]) -> Result<(), String> {
        let mut matcher = self.0.lock().map_err(|_| "the grammar lock is poisoned")?;
        let allowed = matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        let known = allowed.len();
        for (id, logit) in logits.iter_mut().enumerate() {
            // The model's logits may run past the vocabulary (padding): never allowed.
            if id >= known || !allowed.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances the grammar past the picked token.
    pub fn consume(&self, id: u32) -> Result<(), String> {
        let mut matcher = self.0.lock().map_err(|_| "the grammar lock is poisoned")?;
        if matcher.is_stopped() {
            return Ok(());
        }
        matcher.consume_token(id).map_err(|e| e.to_string())
    }
}

/// A token's bytes. Control and user-defined tokens are special (llguidance's marker
/// byte first), so no grammar produces them by spelling them out.
fn token_bytes(spelling: &str, kind: i32, byte_level: bool) -> Vec<u8> {
    if kind == TOKEN_CONTROL || kind == TOKEN_USER_DEFINED {
        let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        bytes.extend_from_slice(spelling.as_bytes());
        return bytes;
    }
    if byte_level {
        return spelling.chars().filter_map(byte_of_char).collect();
    }
    if kind == TOKEN_BYTE {
        // SentencePiece byte fallback: "<0x0A>".
        if let Some(byte) = spelling
            .strip_prefix("<0x")
            .and_then(|s| s.strip_suffix('>'))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            return vec![byte];
        }
    }
    spelling.replace('\u{2581}', " ").into_bytes()
}

/// GPT-2's byte-level alphabet, read backwards: printable Latin-1 bytes stand for
/// themselves and the other 68 bytes were moved to U+0100 onwards, in order.
fn byte_of_char(c: char) -> Option<u8> {
    let code = c as u32;
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(code) {
        return u8::try_from(code).ok();
    }
    let index = code.checked_sub(0x100)?;
    (0u32..=255)
        .filter(|&b| !printable(b))
        .nth(index as usize)
        .and_then(|b| u8::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_spellings_decode_to_their_bytes() {
        assert_eq!(token_bytes("Ġthe", 1, true), b" the");
        assert_eq!(token_bytes("Ċ", 1, true), b"\n");
        assert_eq!(token_bytes("{\"", 1, true), b"{\"");
        // "é" is two bytes, each spelled by its own character.
        assert_eq!(token_bytes("Ã©", 1, true), "é".as_bytes());
        assert_eq!(
            token_bytes("<|im_end|>", TOKEN_CONTROL, true)[0],
            TokTrie::SPECIAL_TOKEN_MARKER
        );
        for byte in 0u8..=255 {
            let spelled = (0u32..)
                .filter_map(char::from_u32)
                .find(|&c| byte_of_char(c) == Some(byte));
            assert!(spelled.is_some(), "byte {byte} has a character");
        }
    }

    #[test]
    fn sentencepiece_spellings_decode_to_their_bytes() {
        assert_eq!(token_bytes("\u{2581}the", 1, false), b" the");
        assert_eq!(token_bytes("<0x0A>", TOKEN_BYTE, false), b"\n");
    }

    /// A toy vocabulary: single characters of JSON and a few words.
    fn vocabulary() -> Vocabulary {
        let mut spellings: Vec<String> = [
            "<eos>", "{", "}", "\"", ":", ",", "a", "b", "1", "2", "Ġ", "name", "x",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        spellings.push("\"name\"".to_owned());
        let mut types = vec![1; spellings.len()];
        types[0] = TOKEN_CONTROL;
        Vocabulary::new("gpt2", spellings, &types, 0).expect("vocabulary")
    }

    fn allowed(grammar: &Grammar, vocab: usize) -> Vec<usize> {
        let mut logits = vec![0.0; vocab];
        grammar.mask(&mut logits).expect("mask");
        (0..vocab).filter(|&i| logits[i] == 0.0).collect()
    }

    #[test]
    fn a_schema_masks_what_would_break_it_and_ends_with_eos() {
        let vocab = vocabulary();
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": ["a", "b"]}},
            "required": ["name"],
            "additionalProperties": false
        });
        let grammar = vocab
            .compile(&ResponseFormat::JsonSchema(schema))
            .expect("compiles")
            .expect("a grammar");
        assert_eq!(allowed(&grammar, 14), vec![1], "only '{{' may start");
        for id in [1, 13, 4, 3, 6, 3, 2] {
            // {"name":"a"}
            assert!(allowed(&grammar, 14).contains(&(id as usize)), "token {id}");
            grammar.consume(id).expect("consume");
        }
        assert_eq!(allowed(&grammar, 14), vec![0], "complete: only the end");
        assert_eq!(vocab.token_text(13).text, "\"name\"");
        assert_eq!(
            vocab.token_text(0).text,
            "<eos>",
            "special tokens read as their name"
        );
        assert_eq!(vocab.token_text(10).bytes, b" ");
    }

    /// Picks `ids` in turn, each allowed when picked; then only the end may follow.
    fn walk(grammar: &Grammar, ids: &[u32]) {
        for &id in ids {
            assert!(allowed(grammar, 14).contains(&(id as usize)), "token {id}");
            grammar.consume(id).expect("consume");
        }
        assert_eq!(allowed(grammar, 14), vec![0], "complete: only the end");
    }

    fn gbnf(text: &str) -> Grammar {
        vocabulary()
            .compile(&ResponseFormat::Grammar(text.to_owned()))
            .expect("compiles")
            .expect("a grammar")
    }

    #[test]
    fn a_gbnf_grammar_holds_the_answer_to_it() {
        // llama.cpp's server test: exactly five a's.
        let grammar = gbnf(r#"root ::= "a"{5,5}"#);
        assert_eq!(allowed(&grammar, 14), vec![6], "only 'a'");
        walk(&grammar, &[6, 6, 6, 6, 6]);
        // Rules, a class, alternatives and an optional part; a token spanning two
        // literals ("name" after a quote is one token) is allowed where its text fits.
        let grammar = gbnf("root ::= \"{\" pair (\",\" pair)? \"}\"\npair ::= key \":\" [0-9]+\nkey ::= \"\\\"name\\\"\" | \"x\"");
        assert_eq!(allowed(&grammar, 14), vec![1]);
        walk(&grammar, &[1, 13, 4, 8, 9, 5, 12, 4, 8, 2]);
        let grammar = gbnf("root ::= [ab]* \"x\"");
        assert_eq!(allowed(&grammar, 14), vec![6, 7, 12]);
        walk(&grammar, &[7, 6, 12]);
    }

    #[test]
    fn a_literal_is_lexed_a_character_at_a_time() {
        // Greedy lexing of a whole "ab" would never let [ab]+ end in it: "abab" is one
        // such answer, and more may follow.
        let grammar = gbnf(r#"root ::= [ab]+ "ab""#);
        for id in [6, 7, 6, 7] {
            grammar.consume(id).expect("consume");
        }
        assert_eq!(allowed(&grammar, 14), vec![0, 6, 7], "the end, or more");
        // A repeated literal of several characters repeats whole: "ab" "ab", never "abb".
        let grammar = gbnf(r#"root ::= "ab"{2}"#);
        walk(&grammar, &[6, 7, 6, 7]);
    }

    #[test]
    fn what_the_translator_writes_compiles() {
        let vocabulary = vocabulary();
        for text in [
            "root ::= Item-2 item-2\nItem-2 ::= \"A\"\nitem-2 ::= \"a\"",
            r#"root ::= [\]^/\[-] [^"\n] . "\x7f" "" ("a" | )"#,
            r#"root ::= "g"*? "h"{0} "i"{2,} ("j" "k"){1,3} "l"+?*"#,
            "root ::= \"x\"\r\n",
        ] {
            assert!(
                vocabulary
                    .compile(&ResponseFormat::Grammar(text.to_owned()))
                    .is_ok_and(|g| g.is_some()),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_deepest_grammar_allowed_compiles() {
        // A chain of rules as deep as allowed, each with parentheses as deep as allowed:
        // parsing and llguidance's compiler both recurse along it.
        let depth = gbnf::MAX_RULE_DEPTH;
        let nested = |i: usize| {
            let (open, close) = ("(".repeat(gbnf::MAX_NESTING), ")".repeat(gbnf::MAX_NESTING));
            format!("r{i} ::= {open}\"a\" r{} | \"b\"{close}\n", i + 1)
        };
        let mut text = String::from("root ::= r1\n");
        // root, then r1 to r(depth - 1): `depth` rules in a chain.
        for i in 1..depth - 1 {
            text.push_str(&nested(i));
        }
        text.push_str(&format!("r{} ::= \"c\"\n", depth - 1));
        let compiled = vocabulary().compile(&ResponseFormat::Grammar(text.clone()));
        assert!(
            compiled.as_ref().is_ok_and(Option::is_some),
            "{:?}",
            compiled.err()
        );
        // One rule deeper is refused, before the compiler.
        let deeper = text.replace("root ::= r1", "root ::= r0\nr0 ::= r1");
        let refused = vocabulary()
            .compile(&ResponseFormat::Grammar(deeper))
            .expect_err("too deep");
        assert!(refused.to_string().contains("deep"), "{refused}");
    }

    #[test]
    fn a_grammar_that_is_not_gbnf_names_the_parameter() {
        let error = vocabulary()
            .compile(&ResponseFormat::Grammar("root ::= (".into()))
            .expect_err("refused");
        let EngineError::InvalidParameter { param, message } = error else {
            panic!("{error:?}");
        };
        assert_eq!(param, GRAMMAR_PARAM);
        assert!(message.contains("line 1, column 11"), "{message}");
    }

    #[test]
    fn a_schema_that_cannot_compile_names_the_field() {
        let vocab = vocabulary();
        let error = vocab
            .compile(&ResponseFormat::JsonSchema(
                serde_json::json!({"type": "no-such-type"}),
            ))
            .expect_err("refused");
        let EngineError::InvalidParameter { param, message } = error else {
            panic!("{error:?}");
        };
        assert_eq!(param, SCHEMA_PARAM);
        assert!(message.contains("cannot be used"), "{message}");
        assert!(vocab
            .compile(&ResponseFormat::Text)
            .expect("text")
            .is_none());
        assert!(vocab
            .compile(&ResponseFormat::JsonObject)
            .expect("object")
            .is_some());
    }
}

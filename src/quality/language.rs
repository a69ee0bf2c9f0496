//! The language a text is written in (the prompt's and the answer's), for the semantic
//! log (refusals and intents by language in Kibana, answers in another language than
//! their prompt), as an ISO 639-3 code (`eng`, `cmn`, `jpn`...), or `und` where a person
//! could not tell either ("ok", "42", an emoji).
//!
//! Prompts are short, and whatlang's trigrams need more text than most of them have
//! ("Write a Python function that reverses a string." is not reliable to it), so the
//! script speaks first: mostly Han characters is Chinese (`cmn`), with kana Japanese,
//! Hangul Korean. Latin text is whatlang's where it is sure, else English where enough
//! of its words are common English words. Measured on the labelled corpus of
//! `tests/redaction_corpus.rs`.

/// Characters looked at: enough to tell, little enough to stay off the request path.
const SAMPLE_CHARS: usize = 400;

/// ISO 639-3 code of "undetermined".
pub const UNDETERMINED: &str = "und";

/// The part of `text` [`language_of`] reads: its first characters.
pub fn sample(text: &str) -> &str {
    text.char_indices()
        .nth(SAMPLE_CHARS)
        .map_or(text, |(i, _)| &text[..i])
}

pub fn language_of(text: &str) -> &'static str {
    let prose = prose(sample(text));
    let scripts = Scripts::count(&prose);
    let words = latin_words(&prose);
    if scripts.kana > 0 && (scripts.kana + scripts.han) > 2 * words.len() {
        return "jpn";
    }
    if scripts.hangul > 2 * words.len() {
        return "kor";
    }
    // A Han character carries about as much as a Latin word: "怎么把PDF转换成Word？" is
    // Chinese, "My Chinese name is 李明华, what does it mean?" English.
    if scripts.han >= 2 && scripts.han > 2 * words.len() {
        return "cmn";
    }
    // Cyrillic, Arabic, Devanagari...: whatlang's to tell.
    let other_letters = prose
        .chars()
        .filter(|c| c.is_alphabetic() && !c.is_ascii_alphabetic())
        .count();
    if words.is_empty() && other_letters == 0 {
        return UNDETERMINED;
    }
    let common = if words.is_empty() {
        0.0
    } else {
        words
            .iter()
            .filter(|w| COMMON_ENGLISH.contains(&w.to_ascii_lowercase().as_str()))
            .count() as f64
            / words.len() as f64
    };
    let latin_letters: usize = words.iter().map(|w| w.len()).sum();
    // Mostly common English words in Latin letters: every arm below answers English, so
    // whatlang (a tenth of a proxied request's CPU) is not asked.
    if common >= 0.5 && words.len() >= 2 && other_letters <= latin_letters {
        return "eng";
    }
    match whatlang::detect(&prose) {
        Some(info)
            if info.is_reliable() && (info.lang() == whatlang::Lang::Eng || common < 0.5) =>
        {
            info.lang().code()
        }
        Some(info) if info.lang() == whatlang::Lang::Eng && words.len() >= 2 => "eng",
        // Mostly another script (Cyrillic, Arabic, Devanagari): the script narrows it
        // to a few languages, and whatlang's best guess among them beats `und`.
        Some(info) if other_letters > latin_letters => info.lang().code(),
        _ if words.len() >= 2 && common >= 0.2 => "eng",
        _ => UNDETERMINED,
    }
}

/// `text` without what is no language: runs of Latin letters, digits and marks that
/// hold digits or the marks of code, URLs, keys and paths (`sk-…`, `a=b`, `user@host`,
/// `/v1/models`, `v1.2.3`), which Chinese writes right against its characters.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        let word = run.trim_matches(|c: char| ".,!?;:'\"()".contains(c));
        let technical = word.chars().count() > 24
            || word.contains(|c: char| c.is_ascii_digit() || "=/@_\\<>|#$%&*+~^`.:".contains(c));
        if !technical {
            out.push_str(word);
        }
        out.push(' ');
        run.clear();
    };
    for c in text.chars() {
        if c.is_whitespace() || is_han(c) || !c.is_ascii() && !c.is_alphabetic() {
            flush(&mut run, &mut out);
            if !c.is_whitespace() {
                out.push(c);
            }
        } else {
            run.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

fn is_han(c: char) -> bool {
    matches!(c, '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}' | '\u{F900}'..='\u{FAFF}')
}

/// Runs of Latin letters (apostrophes inside kept) in `text`.
fn latin_words(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphabetic() || c == '\'' || c == '’'))
        .map(|w| w.trim_matches(['\'', '’']))
        .filter(|w| !w.is_empty())
        .collect()
}

/// Letters of `text` by script.
#[derive(Default)]
struct Scripts {
    han: usize,
    kana: usize,
    hangul: usize,
}

impl Scripts {
    fn count(text: &str) -> Self {
        let mut s = Scripts::default();
        for c in text.chars() {
            match c {
                c if is_han(c) => s.han += 1,
                '\u{3040}'..='\u{30FF}' => s.kana += 1,
                '\u{AC00}'..='\u{D7AF}' | '\u{1100}'..='\u{11FF}' => s.hangul += 1,
                _ => {}
            }
        }
        s
    }
}

/// The commonest English words (function words first), and the verbs prompts open with.
const COMMON_ENGLISH: &[&str] = &[
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "or",
    "for",
    "on",
    "with",
    "at",
    "by",
    "from",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "it",
    "its",
    "this",
    "that",
    "these",
    "those",
    "i",
    "i'm",
    "you",
    "he",
    "she",
    "we",
    "they",
    "me",
    "my",
    "your",
    "our",
    "their",
    "his",
    "her",
    "what",
    "how",
    "why",
    "who",
    "when",
    "where",
    "which",
    "can",
    "could",
    "would",
    "should",
    "will",
    "do",
    "does",
    "did",
    "not",
    "no",
    "yes",
    "please",
    "thanks",
    "thank",
    "hi",
    "hello",
    "have",
    "has",
    "had",
    "there",
    "here",
    "about",
    "into",
    "if",
    "but",
    "as",
    "all",
    "some",
    "any",
    "more",
    "most",
    "one",
    "two",
    "than",
    "then",
    "so",
    "just",
    "also",
    "very",
    "up",
    "out",
    "get",
    "make",
    "write",
    "explain",
    "tell",
    "give",
    "show",
    "list",
    "describe",
    "summarize",
    "summarise",
    "translate",
    "create",
    "help",
    "find",
    "fix",
    "need",
    "want",
    "like",
    "use",
    "using",
    "function",
    "code",
    "name",
    "number",
    "call",
    "send",
    "email",
    "address",
    "live",
    "work",
    "new",
    "time",
    "day",
    "way",
    "many",
    "much",
    "best",
    "good",
    "difference",
    "between",
    "example",
    "story",
    "long",
    "short",
    "poem",
    "question",
    "answer",
    "word",
    "words",
    "string",
    "file",
    "list",
    "meaning",
    "ok",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_of_the_prompt_sets() {
        let cases = [
            ("What is the capital of France and why is it famous?", "eng"),
            (
                "Quelle est la capitale de la France et pourquoi est-elle célèbre ?",
                "fra",
            ),
            (
                "Was ist die Hauptstadt von Frankreich und warum ist sie berühmt?",
                "deu",
            ),
            ("法国的首都是哪里？为什么它很有名？", "cmn"),
            ("フランスの首都はどこですか？なぜ有名なのですか？", "jpn"),
            ("Привет, расскажи мне о погоде в Москве завтра утром", "rus"),
            ("ok", UNDETERMINED),
            ("", UNDETERMINED),
        ];
        for (text, code) in cases {
            assert_eq!(language_of(text), code, "{text}");
        }
    }
}

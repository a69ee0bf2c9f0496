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

use std::collections::HashSet;
use std::sync::LazyLock;

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
    let mut lower = String::new();
    let common = if words.is_empty() {
        0.0
    } else {
        words
            .iter()
            .filter(|w| is_common_english(w, &mut lower))
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

/// Common English words: function words, contractions, the verbs prompts open with and
/// everyday nouns, adjectives and numbers, lower case. Words that are as common in
/// another language written in Latin letters are left out ("come", "per", "case", "data"
/// in Italian; "plan", "hand", "man", "still", "fast", "kind" in German; "over", "even",
/// "open", "door" in Dutch; "table", "page", "place", "type", "note" in French; "error",
/// "final", "real" in Spanish), so that a prompt in one of those is not taken for English.
const COMMON_ENGLISH: &str = "\
    the a an of to in and or for on with at by from as into about than then if but so \
    not no yes is are was were be been being am do does did have has had having doing \
    can could would should will may might must shall it its this that these those there \
    here i i'm i've i'd i'll you you're you've he she we we're they they're me my mine \
    your yours our ours their his her him them us myself yourself itself themselves \
    what how why who whom whose when where which whether because while although though \
    until unless since after before under again once only own same such both each every \
    few other another less least much many more most very too quite rather really \
    already always never often sometimes usually now today tomorrow yesterday soon later \
    ever just also almost enough instead else ago away back down off out up through \
    across against along among around behind below beside beyond during except inside \
    near outside toward towards upon within without all some any one two three four five \
    six seven eight nine ten twenty hundred thousand first second third last next half \
    isn't aren't wasn't don't doesn't didn't can't won't wouldn't shouldn't couldn't \
    it's that's what's there's here's let's please thanks thank hi hello ok \
    get gets got getting make makes made making write wrote written explain tell told \
    give gave given show shown list describe summarize summarise translate create help \
    find found fix need needs needed want wants wanted like use uses used using say said \
    says go goes going went gone comes came know knew think thought see saw seen look \
    looking take took taken keep keeps kept let put mean means seem feel try tried \
    trying leave turn stop move play pay read learn check add remove update convert \
    rewrite draft suggest compare calculate generate improve build ask asked reply \
    sound sounds become bring buy sell hold understand remember forget wait talk speak \
    spend meet lose win happen happened include allow consider expect provide follow \
    return returns work works working worked call called send live \
    thing things something anything nothing everything someone anyone everyone people \
    person woman child children friend family year years month week hour minute morning \
    night home house world life part point group fact school country city company \
    information sentence paragraph letter email address book story poem essay summary \
    title line lines step steps reason way ways issue bug user account money \
    price cost order job business language english water food car phone number numbers \
    game movie head body end side question questions answer answers result results \
    option options word words function code string file name time day example difference \
    meaning new old big small large little great high low long short right wrong \
    different able sure free full easy hard better best worse good whole quick \
    quickest slow nice happy polite friendly clear valid invalid between";

/// [`COMMON_ENGLISH`] as a set: a prompt's words are looked up one by one.
static COMMON_ENGLISH_SET: LazyLock<HashSet<&'static str, foldhash::fast::FixedState>> =
    LazyLock::new(|| COMMON_ENGLISH.split_ascii_whitespace().collect());

/// Whether `word` is a common English word, whatever its case ("The", "THE").
pub(crate) fn is_common_english(word: &str, lower: &mut String) -> bool {
    lower.clear();
    lower.extend(word.chars().map(|c| c.to_ascii_lowercase()));
    COMMON_ENGLISH_SET.contains(lower.as_str())
}

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
            ("Say something, sixty-four words or so.", "eng"),
            ("ok", UNDETERMINED),
            ("", UNDETERMINED),
        ];
        for (text, code) in cases {
            assert_eq!(language_of(text), code, "{text}");
        }
    }

    /// The common-word shortcut must not take a prompt in another language written in
    /// Latin letters for English: everyday prompts in six of them.
    #[test]
    fn other_latin_languages_are_not_english() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/latin-prompts.txt");
        let text = std::fs::read_to_string(path).expect("the prompt set");
        let mut lines = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (code, prompt) = line.split_once('\t').expect("<lang>TAB<text>");
            let said = language_of(prompt);
            assert_ne!(said, "eng", "{code}: {prompt}");
            lines += 1;
        }
        assert!(lines >= 48, "{lines} prompts");
    }

    #[test]
    fn the_common_words_are_lower_case_and_listed_once() {
        let words: Vec<&str> = COMMON_ENGLISH.split_ascii_whitespace().collect();
        assert_eq!(words.len(), COMMON_ENGLISH_SET.len(), "a word listed twice");
        assert!(words.iter().all(|w| *w == w.to_ascii_lowercase()));
    }
}

//! Names without a cue ("Forward this to Daniel Okafor", "王芳和陈建国负责这个客户") and
//! every other mention of a name found ("… met Rebecca Stone. Rebecca said …").
//!
//! Latin-script names are told by a gazetteer: the given and family names of the `fake`
//! crate's English, French, German, Italian, Portuguese, Dutch and Welsh locales (about
//! 4,500 given names), and the romanised forms of the Chinese surnames (`pinyin` crate:
//! Zhang, Wang, Ouyang). A capitalised given name is a name, with the capitalised words
//! after it as its surname (Daniel Okafor, John A. Whitfield, Sophie van der Berg); a
//! given name that is also an English word or a place (Will, May, Grace, Jordan, Austin)
//! only with a known family name after it (Will Smith); a romanised Chinese name is two
//! capitalised words made of pinyin syllables, one of them a surname (Wei Zhang, Li Na).
//! Chinese names: [`super::chinese`].
//!
//! Why a gazetteer and not a model: spaCy's small English model (what Presidio runs)
//! finds English names well and Chinese ones not at all, and no NER model in a Rust
//! crate runs in a few microseconds a line on a CPU already serving a model; the
//! gazetteer is measured beside Presidio in docs/semantic-logs.md.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::LazyLock;

use fake::locales::{Data, CY_GB, DE_DE, EN, FR_FR, IT_IT, NL_NL, PT_BR, PT_PT};
use pinyin::ToPinyin;

use super::names::{is_han, merge, COMPOUND_SURNAMES, NOT_NAMES, SURNAMES};

mod lists;
use super::Kind;
use lists::{
    ENDS_A_NAME, NOT_CHINESE_NAMES, ORDINARY, PARTICLES, PERSON_AFTER, PERSON_BEFORE, PLACE_WORDS,
};

/// The byte ranges of the names in `text` that no cue marks (in order, not
/// overlapping), Latin and Chinese.
pub(super) fn uncued(text: &str) -> Vec<Range<usize>> {
    let mut names = latin(text);
    names.extend(super::chinese::names(text));
    merge(names)
}

/// Every other mention in `text` of the names in `found` (values of any kind; the names
/// are taken): the given name or the surname alone after the full name, the full name
/// again, a Chinese given name of two characters (李小明 … 小明); outside `found`, in
/// order.
pub(super) fn mentions(text: &str, found: &[(Kind, Range<usize>)]) -> Vec<Range<usize>> {
    let mut parts: Vec<&str> = found
        .iter()
        .filter(|(kind, _)| *kind == Kind::Name)
        .flat_map(|(_, range)| parts(&text[range.clone()]))
        .collect();
    parts.sort_unstable();
    parts.dedup();
    let taken = |r: &Range<usize>| {
        found
            .iter()
            .any(|(_, f)| f.start < r.end && r.start < f.end)
    };
    let more: Vec<Range<usize>> = parts
        .iter()
        .flat_map(|part| occurrences(text, part))
        .filter(|r| !taken(r))
        .collect();
    merge(more)
}

/// What of a name may be mentioned alone: the whole name, each of its Latin words of two
/// letters or more (Rebecca, Stone, O'Connor; Grace of Grace Liu too), a Chinese
/// given name of two characters (小明 of 李小明, 雨桐 of 欧阳雨桐).
pub(super) fn parts(name: &str) -> Vec<&str> {
    let mut parts = vec![name];
    if name.chars().next().is_some_and(is_han) {
        // The given name after a compound surname (雨桐 of 欧阳雨桐) or a single one.
        let given = COMPOUND_SURNAMES
            .iter()
            .find_map(|surname| name.strip_prefix(surname))
            .or_else(|| {
                let first = name.chars().next()?;
                SURNAMES.contains(first).then(|| &name[first.len_utf8()..])
            });
        if let Some(given) = given.filter(|given| given.chars().count() == 2) {
            parts.push(given);
        }
    } else {
        parts.extend(
            words(name)
                .map(|w| possessive_off(&name[w]))
                .filter(|w| w.chars().count() >= 2 && capitalised(w) && !NOT_NAMES.contains(w)),
        );
    }
    parts
}

/// Where `value` occurs in `text`; a value that starts or ends with a letter or digit
/// only as a whole word there (Lee is not in Leeds). Han characters have no word edges.
pub(super) fn occurrences(text: &str, value: &str) -> Vec<Range<usize>> {
    let edge = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric() || is_han(c));
    text.match_indices(value)
        .map(|(at, _)| at..at + value.len())
        .filter(|r| {
            let latin_start = value.chars().next().is_some_and(|c| !is_han(c));
            let latin_end = value.chars().last().is_some_and(|c| !is_han(c));
            (!latin_start || edge(text[..r.start].chars().next_back()))
                && (!latin_end || edge(text[r.end..].chars().next()))
        })
        .collect()
}

struct Gazetteer {
    given: HashSet<&'static str>,
    family: HashSet<String>,
    /// Romanised Chinese surnames (Zhang, Ouyang), also in `family`.
    pinyin_family: HashSet<String>,
    /// Every pinyin syllable (zhang, xiao, ming), lower case.
    syllables: HashSet<String>,
}

/// Builds the gazetteer now (the name lists and the pinyin syllables of ~21,000
/// characters), so that the first request with a name does not wait for it.
pub(super) fn warm() {
    LazyLock::force(&GAZETTEER);
}

static GAZETTEER: LazyLock<Gazetteer> = LazyLock::new(|| {
    let mut given: HashSet<&'static str> = HashSet::new();
    let mut family: HashSet<String> = HashSet::new();
    macro_rules! locale {
        ($($l:ty),*) => {$(
            given.extend(<$l as Data>::NAME_FIRST_NAME.iter().copied());
            family.extend(<$l as Data>::NAME_LAST_NAME.iter().map(|s| s.to_string()));
        )*};
    }
    locale!(EN, FR_FR, DE_DE, IT_IT, PT_BR, PT_PT, NL_NL, CY_GB);
    let romanise = |s: &str| -> Option<String> {
        let mut out = String::new();
        for c in s.chars() {
            out.push_str(&c.to_pinyin()?.plain().replace('ü', "u"));
        }
        Some(capitalise(&out))
    };
    let mut pinyin_family: HashSet<String> = SURNAMES
        .chars()
        .filter_map(|c| romanise(&c.to_string()))
        .collect();
    pinyin_family.extend(
        super::names::COMPOUND_SURNAMES
            .iter()
            .filter_map(|s| romanise(s)),
    );
    family.extend(pinyin_family.iter().cloned());
    let syllables = ('\u{4E00}'..='\u{9FFF}')
        .filter_map(|c| c.to_pinyin())
        .map(|p| p.plain().replace('ü', "v"))
        .collect();
    Gazetteer {
        given,
        family,
        pinyin_family,
        syllables,
    }
});

/// Latin-script names by the gazetteer (see the module's comment).
fn latin(text: &str) -> Vec<Range<usize>> {
    let gazetteer = &*GAZETTEER;
    let words: Vec<Range<usize>> = words(text).collect();
    let mut names = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = possessive_off(&text[words[i].clone()]);
        if !capitalised(word) {
            i += 1;
            continue;
        }
        // The surname's words: capitalised, next to each other (an initial "A." and
        // particles "van der" inside), none of them a word that ends a name.
        let mut surname: Vec<&str> = Vec::new();
        let mut extent = words[i].start + word.len();
        let mut k = i + 1;
        // Sam's Club: a possessive ends the name where it is.
        let possessive = word.len() < text[words[i].clone()].len();
        while !possessive
            && k < words.len()
            && surname.len() < 3
            && adjacent(text, &words[k - 1], &words[k])
        {
            let whole = &text[words[k].clone()];
            let next = possessive_off(whole);
            if PARTICLES.contains(&next) {
                k += 1;
                continue;
            }
            if !capitalised(next) || NOT_NAMES.contains(&next) || ENDS_A_NAME.contains(&next) {
                break;
            }
            surname.push(next);
            extent = words[k].start + next.len();
            k += 1;
            if next.len() < whole.len() {
                break;
            }
        }
        // Sarah-Jane: a given name's first part will do.
        let given = gazetteer.given.contains(word)
            || word
                .split_once('-')
                .is_some_and(|(first, _)| gazetteer.given.contains(first) && !ordinary(first));
        let found = if given && !ordinary(word) {
            true
        } else if given {
            // Will Smith; Grace Whitfield where it stands as a person would ("… said");
            // not "May I", "Rose Gold", "Grace Period", "Jordan Street".
            surname.iter().any(|s| gazetteer.family.contains(*s))
                || surname.len() == 1
                    && name_shaped(surname[0])
                    && !english(surname[0])
                    && person_context(text, &words, i, i + 1)
        } else {
            surname
                .first()
                .is_some_and(|s| romanised_chinese(gazetteer, word, s))
        };
        // Names no gazetteer holds (Kofi Boateng, Oksana Shevchenko) where what is
        // around them is what is around a person ("cc …", "… said").
        let found = found || {
            let run = unknown_run(text, &words, i);
            let pair = words.get(i + 1).map(|w| &text[words[i].start..w.end]);
            if run >= 2
                && !PLACE_WORDS.contains(&word)
                && !pair.is_some_and(|p| NOT_CHINESE_NAMES.contains(&p))
                && person_context(text, &words, i, i + run - 1)
            {
                let last = possessive_off(&text[words[i + run - 1].clone()]);
                extent = words[i + run - 1].start + last.len();
                k = i + run;
                true
            } else {
                false
            }
        };
        // "the Hilton", "a Karen": a person takes no article; "San Francisco", "Port
        // Elizabeth" are places; "Sam's Club", "Trader Joe's Market" shops.
        let before = (i > 0 && adjacent(text, &words[i - 1], &words[i]))
            .then(|| &text[words[i - 1].clone()]);
        let article = before.is_some_and(|b| ARTICLES.contains(&b) || PLACE_WORDS.contains(&b));
        let whole = &text[words[i].clone()];
        let shop = surname.is_empty()
            && word.len() < whole.len()
            && words
                .get(i + 1)
                .is_some_and(|n| adjacent(text, &words[i], n) && capitalised(&text[n.clone()]));
        if found && !article && !shop {
            names.push(words[i].start..extent);
            i = k.max(i + 1);
        } else {
            i += 1;
        }
    }
    names
}

/// How many words from `i` on are shaped like names and are no English word (at most
/// three, next to each other).
fn unknown_run(text: &str, words: &[Range<usize>], i: usize) -> usize {
    let mut run = 0;
    while run < 3 && i + run < words.len() {
        let word = possessive_off(&text[words[i + run].clone()]);
        let next_to = run == 0 || adjacent(text, &words[i + run - 1], &words[i + run]);
        if !next_to || !name_shaped(word) || english(word) {
            break;
        }
        run += 1;
        if word.len() < text[words[i + run - 1].clone()].len() {
            break;
        }
    }
    run
}

/// Whether the words `first..=last` stand where a person does: after a word that takes
/// one (cc, ask, tell, with, from, thanks) or before one (said, will, asked, 's), or
/// set apart by punctuation on both sides (": Oksana Shevchenko.", "| Kofi Boateng |").
fn person_context(text: &str, words: &[Range<usize>], first: usize, last: usize) -> bool {
    let before_word = first
        .checked_sub(1)
        .filter(|&b| adjacent(text, &words[b], &words[first]))
        .map(|b| text[words[b].clone()].to_lowercase());
    let after_word = words
        .get(last + 1)
        .filter(|w| adjacent(text, &words[last], w))
        .map(|w| text[w.clone()].to_lowercase());
    let whole_last = &text[words[last].clone()];
    if before_word.is_some_and(|w| PERSON_BEFORE.contains(&w.as_str()))
        || after_word.is_some_and(|w| PERSON_AFTER.contains(&w.as_str()))
        || possessive_off(whole_last).len() < whole_last.len()
    {
        return true;
    }
    let gap_before =
        text[first.checked_sub(1).map_or(0, |b| words[b].end)..words[first].start].trim();
    let gap_after =
        text[words[last].end..words.get(last + 1).map_or(text.len(), |w| w.start)].trim();
    let apart = |gap: &str, edge: bool| {
        gap.is_empty() && edge || gap.chars().any(|c| SETS_APART.contains(c))
    };
    apart(gap_before, first == 0) && apart(gap_after, last + 1 == words.len())
}

/// Punctuation that sets a name apart from what is around it.
const SETS_APART: &str = ":,;|()–—-\"“”/";

/// Capitalised, letters only; capitals inside only after Mc/Mac, O' or a hyphen
/// (McAllister, O'Brien, Okonkwo-Bello); not CamelCase (OpenAI, DeepSeek, MacBook).
fn name_shaped(word: &str) -> bool {
    if !capitalised(word) || word.ends_with('.') || word.chars().count() < 2 {
        return false;
    }
    let mut previous = ' ';
    let mut inner_capitals = 0;
    for (at, c) in word.char_indices() {
        if at > 0 && c.is_uppercase() {
            let after_prefix = matches!(&word[..at], "Mc" | "Mac" | "O'" | "O’" | "D'" | "D’");
            if !(after_prefix || matches!(previous, '-' | '\'' | '’')) {
                return false;
            }
            inner_capitals += 1;
        }
        previous = c;
    }
    inner_capitals <= 2 && !matches!(word, "MacBook" | "McDonald's")
}

/// Whether `word` is an English word (the EFF's large list of 7,776, the language
/// detector's common words, a plural of either) or one that ends a name.
fn english(word: &str) -> bool {
    let lower = word.to_lowercase();
    let known = |w: &str| {
        ENGLISH.contains(w) || crate::quality::language::is_common_english(w, &mut String::new())
    };
    known(&lower)
        || lower.strip_suffix('s').is_some_and(known)
        || ordinary(word)
        || ENDS_A_NAME.contains(&word)
}

static ENGLISH: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| eff_wordlist::large::LIST.iter().map(|(_, w)| *w).collect());

/// Wei Zhang, Zhang Wei, Xiaoming Li: both words pinyin, one of them a surname.
fn romanised_chinese(gazetteer: &Gazetteer, first: &str, second: &str) -> bool {
    let pinyin = |w: &str| syllables(gazetteer, &w.to_lowercase());
    (gazetteer.pinyin_family.contains(first) || gazetteer.pinyin_family.contains(second))
        && pinyin(first)
        && pinyin(second)
        && !NOT_CHINESE_NAMES.contains(&format!("{first} {second}").as_str())
}

/// Whether `word` (lower case) is one to three pinyin syllables.
fn syllables(gazetteer: &Gazetteer, word: &str) -> bool {
    fn split(g: &Gazetteer, rest: &str, left: usize) -> bool {
        rest.is_empty()
            || left > 0
                && (1..=rest.len().min(6)).rev().any(|n| {
                    rest.is_char_boundary(n)
                        && g.syllables.contains(&rest[..n])
                        && split(g, &rest[n..], left - 1)
                })
    }
    !word.is_empty() && split(gazetteer, word, 3)
}

/// The words of `text`: runs of letters, with `'`, `’` and `-` inside them; byte ranges.
fn words(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let letter = |c: char| c.is_alphabetic() && !is_han(c);
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || {
        let start = loop {
            let (at, c) = chars.next()?;
            if letter(c) {
                break at;
            }
        };
        let mut end = text.len();
        while let Some(&(at, c)) = chars.peek() {
            let inner = matches!(c, '\'' | '’' | '-')
                && text[at + c.len_utf8()..].chars().next().is_some_and(letter);
            if !(letter(c) || inner || c == '.' && end == text.len() && at - start == 1) {
                end = at;
                break;
            }
            chars.next();
            // An initial: "A." ends the word after its dot.
            if c == '.' {
                end = at + 1;
                break;
            }
        }
        Some(start..end)
    })
}

/// One space or tab between two words (a name does not run across a comma or a line).
fn adjacent(text: &str, before: &Range<usize>, after: &Range<usize>) -> bool {
    matches!(&text[before.end..after.start], " " | "\t")
}

/// An upper-case letter, then lower-case ones (McAllister, O'Connor, Smith-Jones and
/// the initial "A." too); not an acronym (NY, USA).
fn capitalised(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(char::is_uppercase)
        && (word.ends_with('.') && word.len() == 2 || chars.any(char::is_lowercase))
}

fn capitalise(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// `Rebecca's` → `Rebecca`.
fn possessive_off(word: &str) -> &str {
    word.strip_suffix("'s")
        .or_else(|| word.strip_suffix("’s"))
        .unwrap_or(word)
}

/// Given names that are also English words, places, products or programming languages:
/// a name only with a family name after them.
fn ordinary(word: &str) -> bool {
    ORDINARY.contains(&word) || NOT_NAMES.contains(&word)
}

const ARTICLES: &[&str] = &["the", "a", "an", "The", "A", "An"];

#[cfg(test)]
mod tests {
    use crate::redact::{Kind, Redactor};

    fn names(text: &str) -> Vec<&str> {
        Redactor::default()
            .find(text)
            .into_iter()
            .filter(|(kind, _)| *kind == Kind::Name)
            .map(|(_, range)| &text[range])
            .collect()
    }

    #[test]
    fn a_name_needs_no_cue_and_every_other_mention_goes_with_it() {
        assert_eq!(
            names("Forward this to Daniel Okafor. Daniel said Okafor's team agreed."),
            ["Daniel Okafor", "Daniel", "Okafor"]
        );
        // A middle initial, a particle, a hyphen, an apostrophe.
        assert_eq!(names("ask John A. Whitfield"), ["John A. Whitfield"]);
        assert_eq!(
            names("cc Sophie van der Berg today"),
            ["Sophie van der Berg"]
        );
        assert_eq!(names("Sarah-Jane Doyle will call"), ["Sarah-Jane Doyle"]);
        assert_eq!(names("Michael O'Connor replied"), ["Michael O'Connor"]);
        // Romanised Chinese, in either order; a name no gazetteer holds, where a person
        // stands ("cc …").
        assert_eq!(names("Wei Zhang and Zhang Wei"), ["Wei Zhang", "Zhang Wei"]);
        assert_eq!(names("cc Kofi Boateng, please"), ["Kofi Boateng"]);
        // A given name that is a word only with a family name or a person's place.
        assert_eq!(names("Will Smith was there"), ["Will Smith"]);
        assert!(
            names("Will you review it? May I ask? Mark this done. Hope this helps.").is_empty()
        );
        assert!(names("Rose Gold or Midnight Blue? Grace Period Policy").is_empty());
        // Places, shops, articles, products.
        assert_eq!(
            names("I flew to San Francisco and ate at Sam's Club"),
            Vec::<&str>::new()
        );
        assert_eq!(
            names("The Hilton lobby, Apple Pay, Hong Kong, Visual Studio Code"),
            Vec::<&str>::new()
        );
        assert!(names("Dear Customer Service, hi Team, thanks Support").is_empty());
    }

    #[test]
    fn chinese_names_need_no_cue_either() {
        assert_eq!(names("王芳和陈建国负责这个客户"), ["王芳", "陈建国"]);
        assert_eq!(names("把合同发给刘晓红"), ["刘晓红"]);
        assert_eq!(names("由钟立新签字，钟立新出差的话"), ["钟立新", "钟立新"]);
        assert_eq!(
            names("：方志明，42岁；欧阳明辉提出预算不足"),
            ["方志明", "欧阳明辉"]
        );
        // A given name mentioned alone after the full name.
        assert_eq!(
            names("李小明说今天不来，小明的作业明天交"),
            ["李小明", "小明"]
        );
        // Words that start with a surname, a measure word, public figures.
        for clean in [
            "我今天很高兴，马上到周末了",
            "黄金价格在王国里上涨",
            "请帮我把这张卡设为默认",
            "翻译成英文：文件方法明天高速",
            "李白和杜甫谁的诗更多",
            "张开嘴的时候下巴会响",
            "支付宝和微信支付",
        ] {
            assert!(names(clean).is_empty(), "{clean}: {:?}", names(clean));
        }
    }
}

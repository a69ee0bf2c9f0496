//! Chinese names without a cue: "王芳和陈建国负责这个客户", "把合同发给刘晓红". Chinese
//! writes no spaces and no capitals, so a name is told by segmenting the sentence into
//! words and tagging each with its part of speech: jieba's dictionary and its
//! part-of-speech HMM (the `jieba-rs` crate) tag a person's name `nr`. A tagged word is
//! taken when it also starts with a surname from [`SURNAMES`] (jieba tags some ordinary
//! words `nr`: 谢谢, 杨树) or is a familiar name (小明, 老王).
//!
//! jieba's dictionary (about 350,000 words) is loaded on the first Chinese text the
//! process redacts: about 0.1 s and 40 MB, once.

use std::ops::Range;
use std::sync::LazyLock;

use jieba_rs::Jieba;

use fake::locales::{Data, ZH_CN, ZH_TW};

use super::names::{is_han, merge, COMPOUND_SURNAMES, NOT_IN_NAMES, SURNAMES};

static JIEBA: LazyLock<Jieba> = LazyLock::new(Jieba::new);

/// The byte ranges of the Chinese names in `text`, in order.
pub(super) fn names(text: &str) -> Vec<Range<usize>> {
    if !text.chars().any(is_han) {
        return Vec::new();
    }
    // jieba reads only the runs of Han characters: a name lies inside one, and a long
    // prompt of code or English with a few Chinese words costs only those.
    let mut names: Vec<Range<usize>> = han_runs(text)
        .flat_map(|run| {
            JIEBA
                .tag(&text[run.clone()], true)
                .into_iter()
                .filter(|tag| tag.tag.starts_with("nr"))
                .map(move |tag| run.start + tag.byte_start..run.start + tag.byte_end)
                .collect::<Vec<_>>()
        })
        .filter_map(|word| name_in(text, word))
        .collect();
    names.extend(between_boundaries(text));
    merge(names)
}

/// Names jieba's tagger misses (方志明, 钟立新, 欧阳明辉: its dictionary cuts 方志 off as
/// a word): a surname and one or two given characters standing between a sentence's
/// edges or the words that go around a person (由钟立新签字, 和司马云飞在, ：方志明，),
/// that is no word of jieba's dictionary. Where its first two characters are a word (方志,
/// 张开), both given characters must be ones given names are made of (the given names of
/// the `fake` crate's Chinese locales: 志, 明; not 开, 嘴).
fn between_boundaries(text: &str) -> Vec<Range<usize>> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = |i: usize| chars.get(i).map_or(text.len(), |&(offset, _)| offset);
    let edge = |c: Option<char>, set: &str| {
        c.is_none_or(|c| set.contains(c) || !is_han(c) && !c.is_alphanumeric())
    };
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_han(chars[i].1) {
            i += 1;
            continue;
        }
        let surname = if COMPOUND_SURNAMES
            .iter()
            .any(|s| text[at(i)..].starts_with(s))
        {
            2
        } else if SURNAMES.contains(chars[i].1) {
            1
        } else {
            i += 1;
            continue;
        };
        let before = i.checked_sub(1).map(|b| chars[b].1);
        let after_role = ROLES.iter().any(|role| text[..at(i)].ends_with(role));
        let before_ok = edge(before, BEFORE_A_NAME) || after_role;
        let candidate = |given: usize| {
            let end = i + surname + given;
            chars.get(i + surname..end)?;
            plausible(&text[at(i)..at(end)], surname)
                .then_some((end, edge(chars.get(end).map(|&(_, c)| c), AFTER_A_NAME)))
        };
        let (three, two) = (candidate(2), candidate(1));
        // The name ends where something that follows a name starts.
        let chosen = match (three, two) {
            _ if !before_ok => None,
            (Some((end, true)), _) => Some(end),
            (_, Some((end, true))) => Some(end),
            _ => None,
        };
        match chosen {
            Some(end) => {
                names.push(at(i)..at(end));
                i = end;
            }
            None => i += 1,
        }
    }
    names
}

/// Whether a surname of `surname` characters and the given name after it in `value` can
/// be a name: given characters that names are made of, no ordinary word of jieba's
/// dictionary (高兴), no verb or time for a given name (时续费, 于周五), and where the
/// surname and the first given character are a word (方志, 张开), both given characters
/// ones names are made of (方志明, not 张开嘴).
fn plausible(value: &str, surname: usize) -> bool {
    let chars: Vec<(usize, char)> = value.char_indices().collect();
    let given_chars = &chars[surname..];
    let given_text = &value[chars[surname].0..];
    let head = &value[..chars.get(surname + 1).map_or(value.len(), |&(at, _)| at)];
    let made_of_name_characters = given_chars
        .iter()
        .all(|&(_, c)| is_han(c) && !NOT_IN_NAMES.contains(c) && !NOT_GIVEN.contains(c));
    if !made_of_name_characters
        || ordinary_word(value)
        || public_figure(value)
        || NOT_NAMES.contains(&value)
    {
        return false;
    }
    let two = given_chars.len() == 2;
    if two && verb(given_text) {
        return false;
    }
    !(two && JIEBA.has_word(head) && !given_chars.iter().all(|&(_, c)| given_char(c)))
}

/// Whether `word` is in jieba's dictionary as something other than a name (高兴, 方志,
/// 续费; 李娜 is there as a name).
fn ordinary_word(word: &str) -> bool {
    JIEBA.has_word(word)
        && !JIEBA
            .tag(word, false)
            .first()
            .is_some_and(|t| t.tag.starts_with("nr") && t.word.len() == word.len())
}

/// Whether a two-character given name is a verb or a function word in jieba's dictionary
/// (续费, 处理): the name ended before it.
fn verb(word: &str) -> bool {
    JIEBA.has_word(word)
        && JIEBA.tag(word, false).first().is_some_and(|t| {
            t.word.len() == word.len()
                && matches!(t.tag, "v" | "vn" | "vd" | "c" | "p" | "u" | "m" | "t")
        })
}

fn given_char(c: char) -> bool {
    GIVEN_CHARS.contains(&c) || COMMON_GIVEN.contains(c)
}

/// Roles a name follows without a word between: 经理曾凡, 实习生上官雨桐.
#[rustfmt::skip]
const ROLES: &[&str] = &[
    "经理", "主任", "老师", "同学", "代表", "客户", "律师", "医生", "实习生", "师傅", "老板", "同事", "领导", "总监",
    "主管", "专员", "助理", "学生", "患者", "员工", "面试官", "负责人",
];

/// Characters no given name is made of here: titles that follow a surname in its place
/// (王总, 李姐), and words that follow one (单上, 连不, 迟到两).
const NOT_GIVEN: &str = "总姐哥叔婶爷奶董局处科部工上下不没这那些个么两几百千";

/// The commonest characters of Chinese given names, beside the `fake` crate's.
const COMMON_GIVEN: &str = "伟芳娜敏静丽强磊军洋勇艳杰娟涛明超秀霞平刚桂英华玉兰红梅鹏飞斌宇浩凯峰建国文辉力林晨欣怡婷雪琳颖倩佳思雨子轩涵博俊凡婧龙海波东来萱琪帆航";

/// What stands before a name: 和, 与, 由, 给, 把, 请, 是 and the like.
const BEFORE_A_NAME: &str = "和与跟同及给把让叫请由被向对找问是告诉知系谢喜派陪带帮替等受";

/// What follows a name: 说, 的, 和, 在, 签, 提, 汇, 主任's 主 and the like.
const AFTER_A_NAME: &str = "说讲问答的和与跟同及、是在也都已又就还会要将把被给对向去来从提出负签代汇建同上下昨今明前后刚曾主经老医律教总先女等们处委赶让家带反获替帮通收看写做拿打";

/// The characters of the given names in the `fake` crate's Chinese locales.
static GIVEN_CHARS: LazyLock<std::collections::HashSet<char>> = LazyLock::new(|| {
    ZH_CN::NAME_FIRST_NAME
        .iter()
        .chain(ZH_TW::NAME_FIRST_NAME)
        .flat_map(|name| name.chars())
        .collect()
});

/// The byte ranges of the runs of Han characters in `text`.
fn han_runs(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || {
        let (start, _) = chars.by_ref().find(|&(_, c)| is_han(c))?;
        let mut end = text.len();
        while let Some(&(at, c)) = chars.peek() {
            if !is_han(c) {
                end = at;
                break;
            }
            chars.next();
        }
        Some(start..end)
    })
}

/// The name in a word jieba tagged as one, if it holds one: the word itself when it
/// starts with a surname, or without a first character that jieba took with the name
/// (说小明, 给王芳: a verb or preposition glued to it).
fn name_in(text: &str, word: Range<usize>) -> Option<Range<usize>> {
    let value = &text[word.clone()];
    if !value.chars().all(is_han)
        || NOT_NAMES.contains(&value)
        || value.chars().skip(1).any(|c| NOT_GIVEN.contains(c))
    {
        return None;
    }
    let chars: Vec<(usize, char)> = value.char_indices().collect();
    for skip in 0..chars.len().min(2) {
        let rest: String = chars[skip..].iter().map(|(_, c)| c).collect();
        let length = rest.chars().count();
        if !(2..=4).contains(&length)
            || rest
                .chars()
                .last()
                .is_some_and(|c| ENDS_NO_NAME.contains(c))
        {
            continue;
        }
        let surname = if COMPOUND_SURNAMES.iter().any(|s| rest.starts_with(s)) {
            Some(2)
        } else {
            rest.chars()
                .next()
                .filter(|c| SURNAMES.contains(*c))
                .map(|_| 1)
        };
        let surname = surname
            .filter(|&n| length > n && plausible(&rest, n))
            .is_some();
        // 小明, 老王; a familiar form jieba knows as a word is one (老公, 小学生).
        let familiar =
            length <= 3 && rest.starts_with(['小', '老', '阿']) && !JIEBA.has_word(&rest);
        let name = word.start + chars[skip].0..word.end;
        if (surname || familiar) && !joins_a_word(text, &name) && !public_figure(&rest) {
            return Some(name);
        }
    }
    None
}

/// A name jieba's dictionary counts more than [`PUBLIC`] times in the corpus it was
/// built from: a public figure's (李白 374, 鲁迅 1507, 曹操 2410), not a user's (陈建国 3,
/// 王建华 4). `suggest_freq` of a dictionary word is its count plus one.
fn public_figure(name: &str) -> bool {
    JIEBA.has_word(name) && JIEBA.suggest_freq(name) > PUBLIC
}

const PUBLIC: usize = 200;

/// Whether the name's first character makes a word with the character before it, or its
/// last with the one after (一张卡, 支付宝, 中文翻译, 宫保鸡丁): then it is no name, but the
/// end of a word jieba's HMM tagged wrongly.
fn joins_a_word(text: &str, name: &Range<usize>) -> bool {
    let value = &text[name.clone()];
    let (Some(first), Some(last)) = (value.chars().next(), value.chars().next_back()) else {
        return false;
    };
    let before = text[..name.start]
        .chars()
        .next_back()
        .filter(|c| is_han(*c));
    let after = text[name.end..].chars().next().filter(|c| is_han(*c));
    // 这张卡, 一位同事: a measure word after a number or a demonstrative.
    let counted = before.is_some_and(|b| COUNTERS.contains(b)) && MEASURE_WORDS.contains(first);
    counted
        || before.is_some_and(|b| JIEBA.has_word(&format!("{b}{first}")))
        || after.is_some_and(|a| JIEBA.has_word(&format!("{last}{a}")))
}

/// What stands before a measure word: numbers and demonstratives.
const COUNTERS: &str = "这那一二两三四五六七八九十几每哪某此各整半0123456789";

/// Surnames that are also measure words (张 of 一张纸, 位 of 这位).
const MEASURE_WORDS: &str = "张位支台段封门部项层车";

/// Words jieba's dictionary tags as names that are not (a family name is no name alone:
/// these are ordinary words that happen to start with one).
#[rustfmt::skip]
const NOT_NAMES: &[&str] = &[
    "谢谢", "杨树", "黄金", "高兴", "马上", "白天", "方便", "文明", "安全", "武汉", "常常", "华为", "江湖", "龙头",
    "石头", "成都", "程序", "金额", "方法", "万一", "于是", "祝福", "荣耀", "张家界", "师兄弟", "师兄", "师姐", "师妹",
    "师弟", "杨梅", "白名单",
];

/// Characters a name does not end with: where jieba glued a place word to it (王国里).
const ENDS_NO_NAME: &str = "里上下中内外边们的了着过吗呢吧啊";

//! Names and street addresses: no checksum tells them, so the pattern finds a cue ("my
//! name is", "Dr.", 我叫, 先生, a number and "Street", 市/区/路/号) and these decide
//! what around it is the value: the cue's own words come off, a Chinese name is a
//! known surname and one or two given characters, words that are not names are not.

use std::ops::Range;

use super::Verdict;

/// A name candidate `text[start..end]`: Latin words after a cue or a title, or Chinese
/// characters after a cue or before an honorific.
/// `honorific`: the candidate ends where an honorific starts (`name__honorific`).
pub(super) fn name(text: &str, start: usize, end: usize, honorific: bool) -> Verdict {
    let value = &text[start..end];
    if value.chars().next().is_some_and(is_han) {
        return chinese_name(text, start, end, honorific);
    }
    // Capitalised words; the first that is no name ends it ("I'm Jane From Accounting"
    // keeps "Jane"), and no name at all when the first is not one ("I am Chinese").
    let mut kept = start;
    for (offset, word) in words(value) {
        if NOT_NAMES.contains(&word.trim_end_matches(['\'', '’'])) {
            break;
        }
        kept = start + offset + word.len();
    }
    if kept == start {
        Verdict::Unrelated
    } else {
        Verdict::Within(start, kept)
    }
}

/// Words of `value` split on spaces and tabs, with their byte offsets.
fn words(value: &str) -> impl Iterator<Item = (usize, &str)> {
    value
        .split([' ', '\t'])
        .scan(0, |offset, word| {
            let at = *offset;
            *offset += word.len() + 1;
            Some((at, word))
        })
        .filter(|(_, word)| !word.is_empty())
}

/// Capitalised words that follow "I am", "Dear" or "my name is" without being a name.
pub(super) const NOT_NAMES: &[&str] = &[
    "A",
    "An",
    "The",
    "Not",
    "Sorry",
    "Here",
    "Back",
    "Going",
    "Using",
    "Trying",
    "Happy",
    "Looking",
    "Working",
    "Writing",
    "Done",
    "In",
    "On",
    "At",
    "From",
    "So",
    "Very",
    "Just",
    "Also",
    "Still",
    "Currently",
    "Interested",
    "Curious",
    "Confused",
    "Sure",
    "Unable",
    "Able",
    "Glad",
    "New",
    "Sir",
    "Madam",
    "Sirs",
    "Team",
    "Customer",
    "Customers",
    "All",
    "Support",
    "Recruiter",
    "Service",
    "Services",
    "Care",
    "Success",
    "Relations",
    "Dispatch",
    "Admin",
    "Sales",
    "Billing",
    "Reception",
    "Folks",
    "Guys",
    "There",
    "Ops",
    "Security",
    "Legal",
    "Finance",
    "Accounts",
    "Payroll",
    "Coach",
    "Doctor",
    "Nurse",
    "Officer",
    "Agent",
    "Operator",
    "Hiring",
    "Manager",
    "Colleagues",
    "Friends",
    "Everyone",
    "Valued",
    "User",
    "Users",
    "Mr",
    "Mrs",
    "Ms",
    "Dr",
    "Prof",
    "Miss",
    "And",
    "Or",
    "But",
    "English",
    "Chinese",
    "American",
    "British",
    "Canadian",
    "Indian",
    "Japanese",
    "Korean",
    "German",
    "French",
    "Spanish",
    "Italian",
    "Russian",
    "Australian",
    "Mexican",
    "Brazilian",
    "Dutch",
    "Swedish",
    "Asian",
    "European",
    "African",
    "Muslim",
    "Christian",
    "Jewish",
    "Hindu",
    "Catholic",
    "OK",
    "Okay",
    "Fine",
    "Ready",
    "Available",
    "Free",
    "Busy",
    "Afraid",
    "Aware",
    "Excited",
    "Thinking",
    "Planning",
    "Building",
    "Learning",
    "Studying",
    "Getting",
    "Having",
    "Asking",
    "Wondering",
    "Hoping",
    "Feeling",
    "Stuck",
    "Lost",
    "Late",
    "Tired",
    "Hungry",
    "Sick",
    "Retired",
    "Married",
    "Single",
    "Pregnant",
    "Male",
    "Female",
    "Please",
    "Thanks",
    "Thank",
    "Hello",
    "Hi",
    "Hey",
    "Regards",
    "Sincerely",
    "Best",
    "Yes",
    "No",
    "Python",
    "Java",
    "Rust",
    "JavaScript",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

pub(super) fn is_han(c: char) -> bool {
    matches!(c, '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}' | '\u{F900}'..='\u{FAFF}')
}

/// A surname from [`SURNAMES`] (a compound one first) at one of the first two
/// characters (an honorific's pattern may start one character early: 联系张三先生), then
/// one or two given characters up to a character that does not start or continue a
/// name here (我叫李雷今年十岁 keeps 李雷).
fn chinese_name(text: &str, start: usize, end: usize, honorific: bool) -> Verdict {
    let chars: Vec<(usize, char)> = text[start..end]
        .char_indices()
        .map(|(i, c)| (start + i, c))
        .collect();
    // Only a name before an honorific may have a word before it in the candidate; after
    // a cue (收件人是商场客服部) the name starts right there or not at all.
    let tries = if honorific { chars.len().min(2) } else { 1 };
    for skip in 0..tries {
        let rest = &chars[skip..];
        let surname = if rest.len() >= 2
            && COMPOUND_SURNAMES.iter().any(|s| {
                let mut it = s.chars();
                it.next() == Some(rest[0].1) && it.next() == Some(rest[1].1)
            }) {
            2
        } else if SURNAMES.contains(rest[0].1) {
            1
        } else {
            continue;
        };
        let given = rest[surname..]
            .iter()
            .take(2)
            .take_while(|(_, c)| !NOT_IN_NAMES.contains(*c))
            .count();
        // Before an honorific the name runs to it (导师王建华教授 is 王建华, not 师王建).
        if given == 0 || honorific && surname + given != rest.len() {
            continue;
        }
        // 我是程序员, 我是程序员了: a word for a job, not a name.
        let job = |at: usize| rest.get(at).is_some_and(|(_, c)| JOB_ENDINGS.contains(*c));
        if job(surname + given) || job(surname + given - 1) && given == 2 {
            continue;
        }
        let from = rest[0].0;
        let to = rest.get(surname + given).map_or(end, |&(offset, _)| offset);
        return Verdict::Within(from, to);
    }
    Verdict::Unrelated
}

/// The commonest Chinese surnames (more than nine in ten people carry one of them).
pub(super) const SURNAMES: &str = "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付傅方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤常温康施文牛樊葛邢安齐易乔伍庞颜倪庄聂章鲁岳翟殷詹申欧耿关兰焦俞左柳甘祝包宁尚符舒阮柯纪梅童凌毕单季裴霍涂成苗谷盛曲翁冉骆蓝路游辛靳管柴蒙鲍华喻祁蒲房滕屈饶解牟艾尤阳时穆农司卓古吉缪简车项连芦麦褚娄窦戚岑景党宫费卜冷晏席卫米柏宗瞿桂全佟应臧闵苟邬边卞姬师仇栾隋商刁沙荣巫寇桑郎甄丛仲虞敖巩明佘池查麻苑迟邝";

pub(super) const COMPOUND_SURNAMES: &[&str] = &[
    "欧阳", "司马", "上官", "诸葛", "东方", "慕容", "令狐", "皇甫", "尉迟", "公孙", "司徒", "夏侯",
    "轩辕", "端木", "长孙", "宇文", "西门", "独孤", "南宫",
];

/// Characters that end words for jobs and roles (程序员, 工程师, 作者, 专家).
const JOB_ENDINGS: &str = "员师者家工长";

/// Characters that end a name run: words that follow a name in a sentence (今年, 是,
/// 的, 住在, 电话...), pronouns and particles.
pub(super) const NOT_IN_NAMES: &str = "今年是的在了和与跟住电手我你他她您从来去要想说请也都就还很啊呢吧吗嘛及或昨现家公先女老同医经律教身号码";

/// An address candidate: Latin ones are taken as the pattern found them; Chinese ones
/// lose the words the chain ran back into (我住在, 请寄到, 地址是).
pub(super) fn address(text: &str, start: usize, end: usize) -> Verdict {
    let value = &text[start..end];
    if !value.chars().next().is_some_and(is_han) {
        return Verdict::Accept(postcode_or_number(text, start, end));
    }
    let mut from = start;
    for (offset, c) in value.char_indices() {
        if !ADDRESS_LEAD.contains(c) {
            break;
        }
        from = start + offset + c.len_utf8();
    }
    // What is left must still name a place before its first 省/市/区/路 word.
    let rest = &text[from..end];
    let head = rest
        .find(|c: char| "省市区县旗路街道巷弄".contains(c))
        .map_or(0, |at| rest[..at].chars().count());
    if head == 0 {
        return Verdict::Unrelated;
    }
    Verdict::Within(from, end)
}

/// Where an address written with its number first ends: at `end`, unless what the
/// pattern took as its postcode is the first group of a longer number the text goes on
/// with (`... Road 2000 0100 0000 6`, a card): then before it, so that the number is
/// judged whole (a postcode taken off a card left the card's other twelve digits).
fn postcode_or_number(text: &str, start: usize, end: usize) -> usize {
    let after = &text[end..];
    let goes_on = after
        .strip_prefix([' ', '-'])
        .unwrap_or(after)
        .starts_with(|c: char| c.is_ascii_digit());
    let value = &text[start..end];
    let without = value.trim_end_matches(|c: char| c.is_ascii_digit());
    // Only a four-digit "postcode" may be a card's first group; a ZIP of five is not.
    if !goes_on || value.len() - without.len() != 4 {
        return end;
    }
    start + without.trim_end_matches([' ', '\t', ',']).len()
}

/// Characters that lead into an address without being part of it.
const ADDRESS_LEAD: &str =
    "我你他她您们住在于到往寄送发是的家从来去回搬请问想要找查看知把至位及和与址地为：:放";

/// `spans` in order, those that overlap or touch made one (诸葛 and 明轩 of 诸葛明轩).
pub(super) fn merge(mut spans: Vec<Range<usize>>) -> Vec<Range<usize>> {
    spans.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

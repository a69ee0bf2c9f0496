//! The redactor and the language detector measured on two labelled corpora of English
//! and Chinese messages (one `<lang>\t<text>` per line, each value to hide written
//! `[[kind:value]]`), both written apart from the code they measure:
//! `tests/data/pii-corpus.txt` (427 lines), which the name and address rules were then
//! tuned on, and `tests/data/pii-heldout.txt` (160 lines), written afterwards and never
//! tuned on: its figures are the honest ones.
//!
//! Per kind: recall is the share of labelled values the redactor hides whole (under
//! any placeholder: `Bearer sk-…` is a bearer token and an API key); precision the
//! share of what it hides as that kind that is a labelled value. `cargo test --test redaction_corpus -- --nocapture` prints the table that
//! docs/semantic-logs.md publishes; the test fails when a structured kind's recall falls
//! under 0.95 or a figure falls under the floor it reached when it was published.

use std::collections::BTreeMap;
use std::ops::Range;

use llmgate::quality::language::language_of;
use llmgate::redact::{Kind, Redactor};

/// One corpus line: its language, its text without the markup, and the labelled values.
struct Line {
    number: usize,
    lang: String,
    text: String,
    labels: Vec<(String, Range<usize>)>,
}

fn corpus(name: &str) -> Vec<Line> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let raw = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    raw.lines()
        .enumerate()
        .filter(|(_, line)| !line.starts_with('#') && !line.trim().is_empty())
        .map(|(i, line)| {
            let (lang, marked) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("line {}: no tab", i + 1));
            let (text, labels) = unmark(marked, i + 1);
            Line {
                number: i + 1,
                lang: lang.to_owned(),
                text,
                labels,
            }
        })
        .collect()
}

/// `a [[phone:123]] b` → (`a 123 b`, [("phone", 2..5)]).
fn unmark(marked: &str, number: usize) -> (String, Vec<(String, Range<usize>)>) {
    let mut text = String::with_capacity(marked.len());
    let mut labels = Vec::new();
    let mut rest = marked;
    while let Some(open) = rest.find("[[") {
        text.push_str(&rest[..open]);
        let inner = &rest[open + 2..];
        let close = inner
            .find("]]")
            .unwrap_or_else(|| panic!("line {number}: [[ without ]]"));
        let (kind, value) = inner[..close]
            .split_once(':')
            .unwrap_or_else(|| panic!("line {number}: a label without its kind"));
        labels.push((kind.to_owned(), text.len()..text.len() + value.len()));
        text.push_str(value);
        rest = &inner[close + 2..];
    }
    text.push_str(rest);
    (text, labels)
}

/// Kinds with a shape and, most of them, a checksum: recall must stay at 0.95 or more.
const STRUCTURED: [&str; 10] = [
    "email",
    "phone",
    "card",
    "iban",
    "ipv4",
    "ipv6",
    "ssn",
    "api_key",
    "password",
    "resident_id",
];

/// The floors the published figures reached, so a change that makes one worse is seen:
/// (kind, recall, precision).
const FLOORS: [(&str, f64, f64); 2] = [("name", 0.93, 0.80), ("address", 0.95, 0.95)];
const BLIND_FLOORS: [(&str, f64, f64); 2] = [("name", 0.88, 0.95), ("address", 0.95, 0.95)];
const BLIND_2_FLOORS: [(&str, f64, f64); 2] = [("name", 0.82, 0.95), ("address", 0.93, 0.95)];
const HELD_OUT_FLOORS: [(&str, f64, f64); 2] = [("name", 0.93, 0.80), ("address", 0.90, 0.95)];

#[derive(Default)]
struct Tally {
    labels: usize,
    hidden: usize,
    found: usize,
    right: usize,
    misses: Vec<String>,
    false_alarms: Vec<String>,
}

#[test]
fn redaction_and_language_on_the_labelled_corpus() {
    let failures = measure("pii-corpus.txt", 300, &FLOORS, Some(0.95));
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn redaction_and_language_on_the_held_out_corpus() {
    let failures = measure("pii-heldout.txt", 150, &HELD_OUT_FLOORS, Some(0.95));
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Written for issue 61 by a helper that never saw the redactor, its rules or the other
/// corpora, after the gazetteer was tuned on those. Its first run (names 0.643, addresses
/// 0.800) is in docs/semantic-logs.md; the rules were then mended on its misses, so it is
/// tuned on now, and the floors are today's figures rounded down.
#[test]
fn redaction_and_language_on_the_blind_corpus() {
    let failures = measure("pii-blind.txt", 230, &BLIND_FLOORS, None);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A second blind corpus, written by another helper the same way after the rules had been
/// mended on the first one's misses. Its first run (names 0.791, addresses 0.634) is the
/// honest estimate; the rules were mended on its misses too, and the floors are today's
/// figures rounded down.
#[test]
fn redaction_and_language_on_the_second_blind_corpus() {
    let failures = measure("pii-blind-2.txt", 190, &BLIND_2_FLOORS, None);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Prints the tables and the misses; returns what falls under a target or a floor.
/// `language_floor`: the share of English and of Chinese lines whose language must be
/// told right (`None` on the blind corpora, whose lines of names, addresses and numbers
/// hold few words to tell English by: reported, not held).
fn measure(
    name: &str,
    least_lines: usize,
    floors: &[(&str, f64, f64)],
    language_floor: Option<f64>,
) -> Vec<String> {
    let lines = corpus(name);
    assert!(
        lines.len() >= least_lines,
        "{name} has {} lines",
        lines.len()
    );
    println!("## {name}\n");
    let redactor = Redactor::default();
    let mut tallies: BTreeMap<&'static str, Tally> = BTreeMap::new();
    for kind in Kind::ALL {
        tallies.insert(kind.as_str(), Tally::default());
    }
    let mut languages: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    // Names and addresses by the line's language; clean lines changed by language.
    let mut by_language: BTreeMap<(&str, String), Tally> = BTreeMap::new();
    let mut clean: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut wrong_language = Vec::new();
    for line in &lines {
        let found = redactor.find(&line.text);
        if line.labels.is_empty() {
            let entry = clean.entry(line.lang.clone()).or_default();
            entry.0 += 1;
            entry.1 += usize::from(!found.is_empty());
        }
        for kind in ["name", "address"] {
            let tally = by_language.entry((kind, line.lang.clone())).or_default();
            for (_, range) in line.labels.iter().filter(|(k, _)| k == kind) {
                tally.labels += 1;
                tally.hidden += usize::from(
                    found
                        .iter()
                        .any(|(_, r)| r.start <= range.start && range.end <= r.end),
                );
            }
            for (_, range) in found.iter().filter(|(k, _)| k.as_str() == kind) {
                tally.found += 1;
                tally.right += usize::from(
                    line.labels
                        .iter()
                        .any(|(_, r)| r.start < range.end && range.start < r.end),
                );
            }
        }
        for (kind, range) in &line.labels {
            let tally = tallies
                .get_mut(kind.as_str())
                .unwrap_or_else(|| panic!("line {}: unknown kind {kind}", line.number));
            tally.labels += 1;
            let whole = found
                .iter()
                .any(|(_, r)| r.start <= range.start && range.end <= r.end);
            if whole {
                tally.hidden += 1;
            } else {
                tally
                    .misses
                    .push(format!("{}: {}", line.number, &line.text[range.clone()]));
            }
        }
        for (kind, range) in &found {
            let tally = tallies.get_mut(kind.as_str()).expect("a kind");
            tally.found += 1;
            let labelled = line
                .labels
                .iter()
                .any(|(_, r)| r.start < range.end && range.start < r.end);
            if labelled {
                tally.right += 1;
            } else {
                tally
                    .false_alarms
                    .push(format!("{}: {}", line.number, &line.text[range.clone()]));
            }
        }
        let said = language_of(&line.text);
        let entry = languages.entry(line.lang.clone()).or_default();
        entry.0 += 1;
        if said == line.lang {
            entry.1 += 1;
        } else {
            wrong_language.push(format!(
                "{} ({} said {said}): {}",
                line.number, line.lang, line.text
            ));
        }
    }

    println!("| kind | values | recall | found | precision |");
    println!("|---|---:|---:|---:|---:|");
    let ratio = |n: usize, d: usize| if d == 0 { 1.0 } else { n as f64 / d as f64 };
    for (kind, t) in &tallies {
        if t.labels == 0 && t.found == 0 {
            continue;
        }
        println!(
            "| {kind} | {} | {:.3} | {} | {:.3} |",
            t.labels,
            ratio(t.hidden, t.labels),
            t.found,
            ratio(t.right, t.found)
        );
    }
    println!("\n| kind | language | values | recall | found | precision |");
    println!("|---|---|---:|---:|---:|---:|");
    for ((kind, lang), t) in &by_language {
        if t.labels + t.found > 0 {
            println!(
                "| {kind} | {lang} | {} | {:.3} | {} | {:.3} |",
                t.labels,
                ratio(t.hidden, t.labels),
                t.found,
                ratio(t.right, t.found)
            );
        }
    }
    println!("\n| language | clean lines | changed |");
    println!("|---|---:|---:|");
    for (lang, (total, changed)) in &clean {
        println!("| {lang} | {total} | {changed} |");
    }
    println!("\n| language | lines | detected |");
    println!("|---|---:|---:|");
    for (lang, (total, right)) in &languages {
        println!("| {lang} | {total} | {:.3} |", ratio(*right, *total));
    }
    for (kind, t) in &tallies {
        for miss in &t.misses {
            println!("missed {kind}: {miss}");
        }
        for alarm in &t.false_alarms {
            println!("false {kind}: {alarm}");
        }
    }
    for line in &wrong_language {
        println!("language: {line}");
    }

    let mut failures = Vec::new();
    for kind in STRUCTURED {
        let t = &tallies[kind];
        assert!(t.labels >= 3, "{name} has only {} {kind} values", t.labels);
        let recall = ratio(t.hidden, t.labels);
        if recall < 0.95 {
            failures.push(format!("{kind}: recall {recall:.3} < 0.95"));
        }
    }
    for &(kind, recall_floor, precision_floor) in floors {
        let t = &tallies[kind];
        let (recall, precision) = (ratio(t.hidden, t.labels), ratio(t.right, t.found));
        if recall < recall_floor || precision < precision_floor {
            failures.push(format!(
                "{kind}: recall {recall:.3} (floor {recall_floor}), precision {precision:.3} (floor {precision_floor})"
            ));
        }
    }
    for lang in ["eng", "cmn"]
        .into_iter()
        .filter(|_| language_floor.is_some())
    {
        let (total, right) = languages.get(lang).copied().unwrap_or_default();
        let share = ratio(right, total);
        let floor = language_floor.unwrap_or_default();
        if share < floor {
            failures.push(format!("{lang}: {share:.3} of lines detected (< {floor})"));
        }
    }
    failures
}

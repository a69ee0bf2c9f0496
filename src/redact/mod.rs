//! Redaction: the gate between request text and everything that leaves the process.
//!
//! Semantic-log documents carry prompt and response excerpts to Elasticsearch, NDJSON
//! files and spans. Those sinks accept [`Redacted`] only, and the only ways to make one
//! are [`Redactor::redact`], [`Redactor::excerpt`] and [`Redacted::trusted`] (for
//! `&'static str` only), so unredacted request text cannot reach a sink by mistake: the
//! type is the boundary.
//!
//! Detection is one [`Regex`] whose alternation has a named group per [`Kind`] (or per
//! form of one: `name__cue`, `address__zh`). Each match
//! goes through its kind's validator (Luhn, mod-97, octet ranges, SSN rules, ...) and, if
//! it passes, is replaced by `<KIND>` or `<KIND:hash>` (see [`Mode`]). Text between
//! matches is copied byte for byte. Where a validator and a look-alike disagree we lean
//! towards redacting: a false positive costs a log reader a few characters, a false
//! negative leaks personal data.

use std::fmt;

use hmac::{Hmac, Mac};
use regex::{CaptureLocations, Regex, RegexBuilder};
use serde::Serialize;
use sha2::Sha256;

mod chinese;
mod kinds;
mod names;
mod pattern;
mod people;
mod validate;

pub use kinds::{Kind, RedactionCounts};

use pattern::DFA_CACHE_BYTES;
use validate::judge;

type HmacSha256 = Hmac<Sha256>;

/// What a kind's validator makes of a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// A value; it ends here (at most the candidate's end).
    Accept(usize),
    /// A value between these two byte offsets (inside the candidate): a name or an
    /// address without the words that led the pattern to it.
    Within(usize, usize),
    /// A value of another kind, ending here: an 18-digit number that fails the resident
    /// id's check but passes a card's.
    As(Kind, usize),
    /// Shaped like the kind but fails its check: an order number in card format, an
    /// IBAN with a typo, `999.1.1.1`. It survives as a whole: a value of another kind
    /// lying entirely inside it is part of it, not redacted (the digits of a bad IBAN
    /// may pass Luhn). A value of the same kind inside it still is: where a card starts
    /// in `0100 4111 1111 1111 1111` only the checksum can tell, and a false positive
    /// is the cheaper mistake.
    LookAlike,
    /// Not the kind after all (the pattern is looser than the kind); claims nothing.
    Unrelated,
}

/// Text that has been through the redactor: the only text type the sinks accept. The
/// field is private, so outside this module one can only be made by [`Redactor::redact`],
/// [`Redactor::excerpt`] or [`Redacted::trusted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Redacted(String);

impl Redacted {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// Text known to hold no personal data (enum names, ids we generated); the caller
    /// vouches for it. Only `&'static str` is accepted, so text that arrived in a request
    /// cannot be passed through here: it is never `'static`.
    pub fn trusted(text: &'static str) -> Redacted {
        Redacted(text.to_owned())
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a detected value is replaced with.
#[derive(Clone, PartialEq, Eq)]
pub enum Mode {
    /// Replace with the type: `<EMAIL>`.
    Placeholder,
    /// Replace with the type and a keyed hash of the value, so equal values can be
    /// correlated across requests without being revealed: `<EMAIL:3f1c9a0b2e7d>` is the
    /// first 12 hex digits of HMAC-SHA256(key, value), the value exactly as matched. The
    /// key must stay secret (without it a short value such as a phone number could be
    /// found by hashing candidates), so it is kept out of `Debug`.
    KeyedHash(Vec<u8>),
}

/// Written by hand rather than derived so the key never reaches a log line through
/// `{:?}` of a config struct.
impl fmt::Debug for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Placeholder => f.write_str("Placeholder"),
            Mode::KeyedHash(key) => write!(f, "KeyedHash(<{}-byte key>)", key.len()),
        }
    }
}

/// Finds and replaces personal data and secrets. Compiling the pattern takes a few
/// milliseconds, so build one at start-up and share it (`Arc<Redactor>`); it is `Send +
/// Sync` and each thread gets its own regex scratch space.
pub struct Redactor {
    /// The compiled [`pattern::PATTERN`] ([`pattern::compiled`]).
    regex: Regex,
    /// Capture-group index, kind and form of each group in the pattern: `<kind>` (form
    /// "") or `<kind>__<form>` (names and addresses come in several forms, and a
    /// validator may need to know which: `name__honorific` ends before its honorific).
    groups: Vec<(usize, Kind, String)>,
    /// Already keyed HMAC state in keyed-hash mode, cloned per match: keying costs two
    /// SHA-256 blocks that need not be redone for every value. `None`: placeholders.
    mac: Option<HmacSha256>,
    /// The key for whole values a document identifies without holding them (the
    /// request's and the answer's hashes, the client's `user`): without a key, a hash of
    /// an unredacted prompt is reversed by guessing what the redacted excerpt leaves out
    /// ([`Redactor::with_hash_key`]). `None`: no such value is stored.
    hashes: Option<HashKey>,
}

/// A secret key for hashes of whole values (HMAC-SHA256, hex), keyed once and cloned
/// per value. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct HashKey(HmacSha256);

impl HashKey {
    pub fn new(key: &[u8]) -> Self {
        Self(HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length"))
    }

    /// HMAC-SHA256 of `value` under the key, hex.
    pub fn hash(&self, value: &str) -> String {
        let mut mac = self.0.clone();
        mac.update(value.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(<redacted>)")
    }
}

impl Redactor {
    pub fn new(mode: Mode) -> Self {
        // The pattern is a constant, covered by every test below: failing here is a bug
        // in this file, not something input can cause.
        people::warm();
        let regex = RegexBuilder::new(&pattern::compiled())
            .dfa_size_limit(DFA_CACHE_BYTES)
            .build()
            .expect("the redaction pattern compiles");
        let groups = regex
            .capture_names()
            .enumerate()
            .filter_map(|(index, name)| {
                let (kind, form) = name?.split_once("__").unwrap_or((name?, ""));
                let kind = Kind::ALL.into_iter().find(|k| k.as_str() == kind);
                Some((
                    index,
                    kind.expect("every group in the redaction pattern names a kind"),
                    form.to_owned(),
                ))
            })
            .collect();
        let mac = match mode {
            Mode::Placeholder => None,
            Mode::KeyedHash(key) => {
                Some(HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any length"))
            }
        };
        Redactor {
            regex,
            groups,
            hashes: mac.clone().map(HashKey),
            mac,
        }
    }

    /// The same redactor, hashing whole values with `key` ([`Redactor::keyed_hash`]):
    /// the semantic log's hash key (docs/semantic-logs.md, "Hashes").
    pub fn with_hash_key(mut self, key: &[u8]) -> Self {
        self.hashes = Some(HashKey::new(key));
        self
    }

    /// The key whole values are hashed with, for another part of the process that
    /// writes the same hashes (the request's log line).
    pub fn hash_key(&self) -> Option<HashKey> {
        self.hashes.clone()
    }

    /// The keyed hash (HMAC-SHA256, hex) of a whole value (the client's `user`, a
    /// request's or an answer's digest), so documents can be grouped by it without
    /// holding it; `None` without a hash key (a plain hash of an e-mail address is
    /// reversed by trying addresses). With the redaction key as the hash key, its first
    /// 12 digits are the token the same value gets inside redacted text.
    pub fn keyed_hash(&self, value: &str) -> Option<String> {
        self.hashes.as_ref().map(|key| key.hash(value))
    }

    /// Redacts all of `text`; adds what it replaced to `counts`.
    pub fn redact(&self, text: &str, counts: &mut RedactionCounts) -> Redacted {
        Redacted(self.redact_until_stable(text, counts))
    }

    /// Passes over `text` until one replaces nothing (at most [`MAX_PASSES`]). A
    /// replacement changes what the validators see around it: `1.0.0.0.4216...` is a
    /// longer dotted number, not an address, until the card after it becomes
    /// `<CARD>`; the output is redacted again so that redacting it once more changes
    /// nothing. Text without values costs one pass, text with them two.
    fn redact_until_stable(&self, text: &str, counts: &mut RedactionCounts) -> String {
        let mut out = String::with_capacity(text.len());
        let replaced = self.redact_into(text, counts, &mut out);
        self.more_passes(out, replaced, counts)
    }

    /// The passes after the first, which replaced `replaced` values in making `out`.
    fn more_passes(
        &self,
        mut out: String,
        mut replaced: usize,
        counts: &mut RedactionCounts,
    ) -> String {
        for _ in 1..MAX_PASSES {
            if replaced == 0 {
                break;
            }
            let mut next = String::with_capacity(out.len());
            replaced = self.redact_into(&out, counts, &mut next);
            out = next;
        }
        out
    }

    /// [`excerpt`](Self::excerpt) of a prompt, and the values it found there (at least
    /// four characters, or two Han characters), for
    /// [`excerpt_knowing`](Self::excerpt_knowing): the first pass both redacts and
    /// finds. A value is also replaced where the prompt repeats it without the cue that
    /// marked it once.
    pub fn prompt_excerpt(
        &self,
        text: &str,
        max_chars: usize,
        counts: &mut RedactionCounts,
    ) -> (Redacted, Vec<(Kind, String)>) {
        let mut found = Vec::new();
        let mut out = String::with_capacity(text.len());
        let mut replaced = self.pass(text, counts, &mut out, Some(&mut found));
        let known = known_values(text, found);
        replaced += self.replace_known(&mut out, &known, counts);
        let out = self.more_passes(out, replaced, counts);
        (cut(out, max_chars), known)
    }

    /// [`excerpt`](Self::excerpt), with each of the `known` values replaced wherever it
    /// occurs: "My name is Bartholomew Quigglesworth" marks the name in a prompt, and the
    /// answer "Hello, Bartholomew Quigglesworth!" has no cue of its own.
    pub fn excerpt_knowing(
        &self,
        text: &str,
        known: &[(Kind, String)],
        max_chars: usize,
        counts: &mut RedactionCounts,
    ) -> Redacted {
        if !known.iter().any(|(_, value)| text.contains(value.as_str())) {
            return self.excerpt(text, max_chars, counts);
        }
        let mut text = text.to_owned();
        self.replace_known(&mut text, known, counts);
        self.excerpt(&text, max_chars, counts)
    }

    /// Replaces every occurrence of each `known` value in `text`; how many it replaced.
    fn replace_known(
        &self,
        text: &mut String,
        known: &[(Kind, String)],
        counts: &mut RedactionCounts,
    ) -> usize {
        let mut replaced = 0;
        for (kind, value) in known {
            // A name only as a whole word (Lee is not in Leeds); any other value wherever
            // it stands (a known id right after letters, `ID110105199003072311`).
            let hits = if *kind == Kind::Name {
                people::occurrences(text, value)
            } else {
                text.match_indices(value.as_str())
                    .map(|(at, _)| at..at + value.len())
                    .collect()
            };
            if hits.is_empty() {
                continue;
            }
            let mut out = String::with_capacity(text.len());
            let mut copied = 0;
            for hit in &hits {
                out.push_str(&text[copied..hit.start]);
                self.write_replacement(*kind, value, &mut out);
                counts.add(*kind);
                copied = hit.end;
            }
            out.push_str(&text[copied..]);
            *text = out;
            replaced += hits.len();
        }
        replaced
    }

    /// Redacts `text`, then keeps at most `max_chars` characters, the trailing "…" (added
    /// when the text was cut) included. Redaction happens *before* truncation, so a value
    /// cut in half is never half-revealed, and a cut that would fall inside a placeholder
    /// moves to before it, so documents never hold a broken `<CA…`. `counts` covers the
    /// whole text, also what the cut dropped: the document should still say the request
    /// held a card number.
    pub fn excerpt(&self, text: &str, max_chars: usize, counts: &mut RedactionCounts) -> Redacted {
        cut(self.redact_until_stable(text, counts), max_chars)
    }

    /// One pass behind [`redact`](Self::redact) and [`excerpt`](Self::excerpt):
    /// appends the redacted `text` to `out`; returns how many values it replaced.
    fn redact_into(&self, text: &str, counts: &mut RedactionCounts, out: &mut String) -> usize {
        self.pass(text, counts, out, None)
    }

    /// Where values are in `text` (byte ranges, in order), as one pass of
    /// [`redact`](Self::redact) finds them: for measuring the redactor on a labelled
    /// corpus (`tests/redaction_corpus.rs`) and for callers that must know what would go.
    pub fn find(&self, text: &str) -> Vec<(Kind, std::ops::Range<usize>)> {
        let mut found = Vec::new();
        let mut out = String::with_capacity(text.len());
        self.pass(
            text,
            &mut RedactionCounts::default(),
            &mut out,
            Some(&mut found),
        );
        found
    }

    /// One pass: the pattern's values, the names no cue marks ([`people::uncued`]), and
    /// every other mention of a name found ([`people::mentions`]: "Rebecca Stone …
    /// Rebecca said"), which takes a second run over the text where there are any.
    fn pass(
        &self,
        text: &str,
        counts: &mut RedactionCounts,
        out: &mut String,
        spans: Option<&mut Vec<(Kind, std::ops::Range<usize>)>>,
    ) -> usize {
        let mut names = people::uncued(text);
        let mut found = Vec::new();
        let mut first = String::with_capacity(text.len());
        let mut first_counts = RedactionCounts::default();
        let replaced = self.replace_into(
            text,
            &mut first_counts,
            &mut first,
            Some(&mut found),
            &names,
        );
        let mentions = people::mentions(text, &found);
        if mentions.is_empty() {
            out.push_str(&first);
            counts.merge(&first_counts);
            if let Some(spans) = spans {
                spans.extend(found);
            }
            return replaced;
        }
        names.extend(mentions);
        self.replace_into(text, counts, out, spans, &names::merge(names))
    }

    fn replace_into(
        &self,
        text: &str,
        counts: &mut RedactionCounts,
        out: &mut String,
        spans: Option<&mut Vec<(Kind, std::ops::Range<usize>)>>,
        names: &[std::ops::Range<usize>],
    ) -> usize {
        let mut written = Written {
            text,
            out,
            counts,
            spans,
            copied: 0,
            replaced: 0,
        };
        // The next of `names` (found apart from the pattern) not yet written.
        let mut next_name = 0;
        let mut locs: CaptureLocations = self.regex.capture_locations();
        // `at`: where the next search starts. The search runs on `text[base..]`: after a
        // replacement the text before the next match is a placeholder (ending in `>`),
        // not the value's last character, so the patterns' boundary assertions must see
        // the start of a text there, as they will when the redacted text is redacted
        // again. (`+84 20 7946 0+43 20 7946 0958`: in the original the second `+` follows
        // a digit, which is no phone's start.)
        let (mut at, mut base) = (0, 0);
        // The last look-alike rejected: its kind and where it ends (see [`Verdict`]).
        let mut look_alike: Option<(Kind, usize)> = None;
        loop {
            let next = self
                .regex
                .captures_read_at(&mut locs, &text[base..], at - base);
            // Names that start before the pattern's next match go first; one inside a
            // value already replaced (a name the cue also marked) is skipped.
            let before = next.as_ref().map_or(text.len(), |m| base + m.start());
            let mut wrote_name = false;
            while let Some(name) = names.get(next_name).filter(|n| n.start < before) {
                next_name += 1;
                if name.start >= written.copied {
                    self.write_value(&mut written, Kind::Name, name.clone());
                    base = name.end;
                    at = at.max(name.end);
                    wrote_name = true;
                }
            }
            if wrote_name {
                continue;
            }
            let Some(m) = next else {
                break;
            };
            let (m_start, m_end) = (base + m.start(), base + m.end());
            let Some((kind, verdict, group_end)) = self.judged(&locs, text, base) else {
                at = m_end;
                continue;
            };
            match verdict {
                // A placeholder is no value: a URL's password already redacted,
                // `://admin:<PASSWORD>@`, stays as it is and is not counted again.
                Verdict::Within(start, end)
                    if placeholder_len(&text[start..end]) == Some(end - start) => {}
                Verdict::Within(start, end)
                    if look_alike.is_none_or(|(other, until)| {
                        other == kind || m_start >= until || end > until
                    }) =>
                {
                    // A name found apart that starts inside this value and runs past it
                    // goes with it: "Dear Michael O'Connor", whose cue takes only "Michael
                    // O'", would otherwise leave "Connor" bare.
                    let end = names[next_name..]
                        .iter()
                        .take_while(|name| name.start < end)
                        .fold(end, |end, name| end.max(name.end));
                    self.write_value(&mut written, kind, start..end);
                    base = end;
                    // A validator may accept less than the group (a card without the
                    // short number the pattern took after it); search on from there.
                    at = if end < group_end { end } else { m_end.max(end) };
                    continue;
                }
                Verdict::LookAlike => look_alike = Some((kind, m_end)),
                Verdict::Within(..) | Verdict::Accept(_) | Verdict::As(..) | Verdict::Unrelated => {
                }
            }
            // Rejected (a Luhn-invalid order number, `12:30:45`): search again from the
            // next character, so a value that starts inside the candidate and runs past
            // it is still found (`1234 4111 1111 1111 1111`). Patterns start at a word
            // boundary, so this does not try every suffix of a word.
            at = m_start + text[m_start..].chars().next().map_or(1, char::len_utf8);
        }
        written.out.push_str(&text[written.copied..]);
        written.replaced
    }

    /// The kind of the match in `locs` (found in `text[base..]`: exactly one kind's group
    /// takes part), its validator's verdict, as `Within` where it accepts, and where the
    /// group ends; `None` for a match without a kind's group.
    fn judged(
        &self,
        locs: &CaptureLocations,
        text: &str,
        base: usize,
    ) -> Option<(Kind, Verdict, usize)> {
        let (kind, form, (start, group_end)) =
            self.groups.iter().find_map(|(group, kind, form)| {
                let (start, end) = locs.get(*group)?;
                Some((*kind, form.as_str(), (base + start, base + end)))
            })?;
        let (kind, verdict) = match judge(kind, form, text, start, group_end) {
            Verdict::Accept(end) => (kind, Verdict::Within(start, end)),
            // A resident-id-shaped number that is a card.
            Verdict::As(other, end) => (other, Verdict::Within(start, end)),
            verdict => (kind, verdict),
        };
        Some((kind, verdict, group_end))
    }

    /// Copies the text before `range` and writes the value's placeholder, counted (and
    /// recorded, where spans are asked for).
    fn write_value(&self, written: &mut Written, kind: Kind, range: std::ops::Range<usize>) {
        let text = written.text;
        written.out.push_str(&text[written.copied..range.start]);
        self.write_replacement(kind, &text[range.clone()], written.out);
        written.counts.add(kind);
        written.copied = range.end;
        if let Some(spans) = written.spans.as_deref_mut() {
            spans.push((kind, range));
        }
        written.replaced += 1;
    }

    /// Writes `<KIND>` or `<KIND:hash12>` straight into `out`: no allocation per match.
    fn write_replacement(&self, kind: Kind, value: &str, out: &mut String) {
        out.push('<');
        out.push_str(kind.placeholder());
        if let Some(mac) = &self.mac {
            let mut mac = mac.clone();
            mac.update(value.as_bytes());
            let digest = mac.finalize().into_bytes();
            out.push(':');
            // Two nibbles a byte, by hand: `hex::encode_to_slice` returns a Result for a
            // length mismatch that cannot happen here.
            const HEX: &[u8; 16] = b"0123456789abcdef";
            for &byte in &digest[..6] {
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0x0f)]));
            }
        }
        out.push('>');
    }
}

/// What one pass of [`Redactor::replace_into`] has written of `text`.
struct Written<'t, 'w> {
    text: &'t str,
    out: &'w mut String,
    counts: &'w mut RedactionCounts,
    spans: Option<&'w mut Vec<(Kind, std::ops::Range<usize>)>>,
    /// Bytes of `text` already in `out`.
    copied: usize,
    /// Values replaced.
    replaced: usize,
}

/// Keeps at most `max_chars` characters of redacted `out`, the trailing "…" (added when
/// the text was cut) included, moving a cut that would fall inside a placeholder to
/// before it.
fn cut(mut out: String, max_chars: usize) -> Redacted {
    if out.chars().nth(max_chars).is_some() {
        let placeholders = placeholder_spans(&out);
        // Keep `max_chars - 1` characters, leaving room for the ellipsis.
        let keep = max_chars.saturating_sub(1);
        let mut cut = out.char_indices().nth(keep).map_or(out.len(), |(i, _)| i);
        if let Some(&(start, _)) = placeholders
            .iter()
            .find(|&&(start, end)| start < cut && cut < end)
        {
            cut = start;
        }
        out.truncate(cut);
        if max_chars > 0 {
            out.push('…');
        }
    }
    Redacted(out)
}

/// The values `found` in `text` worth looking for elsewhere, as strings, the longest
/// first (so that a name inside a longer value goes with it), each once.
fn known_values(text: &str, found: Vec<(Kind, std::ops::Range<usize>)>) -> Vec<(Kind, String)> {
    let mut known: Vec<(Kind, String)> = found
        .into_iter()
        .flat_map(|(kind, range)| match kind {
            // "Rebecca Stone" in the prompt, "Hello Rebecca" in the answer.
            Kind::Name => people::parts(&text[range])
                .into_iter()
                .map(|part| (kind, part.to_owned()))
                .collect(),
            _ => vec![(kind, text[range].to_owned())],
        })
        .filter(|(kind, value)| worth_knowing(*kind, value))
        .collect();
    known.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
    known.dedup_by(|a, b| a.1 == b.1);
    known
}

/// Whether a value found in a prompt is long enough to look for elsewhere: a name's part
/// of two letters (Wei of Wei Zhang: names are looked for as whole words only), four
/// characters of anything else, or two Han characters (a Chinese given name and surname),
/// so that a short value does not blank out every word it is part of.
fn worth_knowing(kind: Kind, value: &str) -> bool {
    let han = value
        .chars()
        .filter(|c| ('\u{4e00}'..='\u{9fff}').contains(c))
        .count();
    let least = if kind == Kind::Name { 2 } else { 4 };
    han >= 2 || value.chars().count() >= least
}

/// Passes of [`Redactor::redact`] at most. Each pass after the first only finds values
/// a replacement exposed; none of the fuzzer's inputs needed a third.
const MAX_PASSES: usize = 4;

/// The byte ranges of the placeholders in redacted text (`<EMAIL>`, `<CARD:3d3c15a2913c>`),
/// so an excerpt is never cut inside one. A user's own `<EMAIL>` counts too: cutting
/// before it costs a few characters.
fn placeholder_spans(text: &str) -> Vec<(usize, usize)> {
    text.match_indices('<')
        .filter_map(|(start, _)| Some((start, start + placeholder_len(&text[start..])?)))
        .collect()
}

/// The length of the placeholder `text` starts with, if it does.
fn placeholder_len(text: &str) -> Option<usize> {
    let rest = text.strip_prefix('<')?;
    let name = Kind::ALL
        .into_iter()
        .map(Kind::placeholder)
        .find(|name| rest.starts_with(name))?;
    let after = &rest[name.len()..];
    let tail = if after.starts_with('>') {
        1
    } else {
        let hash = after.strip_prefix(':')?.as_bytes();
        let keyed = hash.len() > 12 && hash[..12].iter().all(u8::is_ascii_hexdigit);
        if !keyed || hash[12] != b'>' {
            return None;
        }
        14
    };
    Some(1 + name.len() + tail)
}

/// A placeholder-mode redactor for the whole process, for checks outside the semantic
/// log (a client's request id, an upstream's error text); compiled on first use.
pub fn shared() -> &'static Redactor {
    static SHARED: std::sync::LazyLock<Redactor> = std::sync::LazyLock::new(Redactor::default);
    &SHARED
}

impl Default for Redactor {
    /// Placeholder mode.
    fn default() -> Self {
        Redactor::new(Mode::Placeholder)
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.mac.is_some() {
            "keyed_hash"
        } else {
            "placeholder"
        };
        f.debug_struct("Redactor")
            .field("mode", &mode)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;

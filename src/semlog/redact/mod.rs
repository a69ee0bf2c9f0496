//! Redaction: the gate between request text and everything that leaves the process.
//!
//! Semantic-log documents carry prompt and response excerpts to Elasticsearch, NDJSON
//! files and spans. Those sinks accept [`Redacted`] only, and the only ways to make one
//! are [`Redactor::redact`], [`Redactor::excerpt`] and [`Redacted::trusted`] (for
//! `&'static str` only), so unredacted request text cannot reach a sink by mistake: the
//! type is the boundary.
//!
//! Detection is one [`Regex`] whose alternation has a named group per [`Kind`]. Each match
//! goes through its kind's validator (Luhn, mod-97, octet ranges, SSN rules, ...) and, if
//! it passes, is replaced by `<KIND>` or `<KIND:hash>` (see [`Mode`]). Text between
//! matches is copied byte for byte. Where a validator and a look-alike disagree we lean
//! towards redacting: a false positive costs a log reader a few characters, a false
//! negative leaks personal data.

use std::fmt;

use hmac::{Hmac, Mac};
use regex::{CaptureLocations, Regex};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// What kind of value was replaced. The kind stays visible in the placeholder, so a log
/// reader still knows *that* the user sent a card number, just not which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Email,
    Phone,
    Card,
    Iban,
    Ipv4,
    Ipv6,
    Ssn,
    ApiKey,
    BearerToken,
    Jwt,
    PrivateKey,
    Password,
}

impl Kind {
    /// Every kind, in the order used for counts, documents and metric labels.
    pub const ALL: [Kind; 12] = [
        Kind::Email,
        Kind::Phone,
        Kind::Card,
        Kind::Iban,
        Kind::Ipv4,
        Kind::Ipv6,
        Kind::Ssn,
        Kind::ApiKey,
        Kind::BearerToken,
        Kind::Jwt,
        Kind::PrivateKey,
        Kind::Password,
    ];

    /// snake_case name, used as a field name in documents and as a metric label value (a
    /// small fixed set, so label cardinality stays bounded). Also the name of the kind's
    /// group in the detection pattern.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Email => "email",
            Kind::Phone => "phone",
            Kind::Card => "card",
            Kind::Iban => "iban",
            Kind::Ipv4 => "ipv4",
            Kind::Ipv6 => "ipv6",
            Kind::Ssn => "ssn",
            Kind::ApiKey => "api_key",
            Kind::BearerToken => "bearer_token",
            Kind::Jwt => "jwt",
            Kind::PrivateKey => "private_key",
            Kind::Password => "password",
        }
    }

    /// The word inside the placeholder, `<EMAIL>`: upper case so it stands out from the
    /// surrounding prose and cannot be mistaken for something the user wrote.
    pub fn placeholder(self) -> &'static str {
        match self {
            Kind::Email => "EMAIL",
            Kind::Phone => "PHONE",
            Kind::Card => "CARD",
            Kind::Iban => "IBAN",
            Kind::Ipv4 => "IPV4",
            Kind::Ipv6 => "IPV6",
            Kind::Ssn => "SSN",
            Kind::ApiKey => "API_KEY",
            Kind::BearerToken => "BEARER_TOKEN",
            Kind::Jwt => "JWT",
            Kind::PrivateKey => "PRIVATE_KEY",
            Kind::Password => "PASSWORD",
        }
    }
}

/// How many values of each kind were replaced. Goes into the semantic-log document and
/// the redaction metrics, so "this request contained a card number" stays answerable
/// after the number itself is gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedactionCounts {
    /// Indexed by `Kind as usize`, which is the position in [`Kind::ALL`].
    by_kind: [u32; Kind::ALL.len()],
}

impl RedactionCounts {
    pub fn get(&self, kind: Kind) -> u32 {
        self.by_kind[kind as usize]
    }

    /// Adds one replacement of `kind`.
    pub fn add(&mut self, kind: Kind) {
        let n = &mut self.by_kind[kind as usize];
        *n = n.saturating_add(1);
    }

    /// Adds `other`'s counts, e.g. the response's to the prompt's.
    pub fn merge(&mut self, other: &RedactionCounts) {
        for (n, m) in self.by_kind.iter_mut().zip(other.by_kind) {
            *n = n.saturating_add(m);
        }
    }

    pub fn total(&self) -> u32 {
        self.by_kind.iter().fold(0, |a, &n| a.saturating_add(n))
    }

    /// The non-zero counts, in [`Kind::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Kind, u32)> + '_ {
        Kind::ALL
            .into_iter()
            .map(|kind| (kind, self.get(kind)))
            .filter(|&(_, n)| n > 0)
    }
}

/// A JSON object of the non-zero counts keyed by [`Kind::as_str`], e.g.
/// `{"email":2,"card":1}`; `{}` when nothing was replaced. Zeros are left out so a
/// document does not carry twelve fields that are almost always 0.
impl Serialize for RedactionCounts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.iter().count()))?;
        for (kind, n) in self.iter() {
            map.serialize_entry(kind.as_str(), &n)?;
        }
        map.end()
    }
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

/// The detection pattern: one alternation, a named group per kind around the part that
/// is replaced (for bearer tokens and URL passwords the match is wider than the group:
/// `Bearer ` and `scheme://user:` stay). The regex crate has no look-around, so edges
/// are ASCII word boundaries (`(?-u:\b)`, which also keeps the lazy DFA on non-ASCII
/// text, where a Unicode `\b` would push it to the slow engine) and the validators
/// check what the pattern cannot.
///
/// The alternation is leftmost-first: at the same start position an earlier branch wins,
/// so secrets and the most specific shapes come first, and phones come before cards
/// (`0044 20 7946 0958` is also 14 grouped digits).
const PATTERN: &str = concat!(
    // PEM private key, across lines. A block without its END line (text cut mid-key) is
    // still key material, so it is redacted up to where the base64 stops.
    r"(?P<private_key>-----BEGIN[A-Z ]*PRIVATE KEY-----",
    r"(?:(?s:.*?)-----END[A-Z ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s:,-]*))",
    // JWT: header and payload are base64url JSON objects, so both start with `eyJ`.
    r"|(?-u:\b)(?P<jwt>eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*)",
    // `Bearer <token>`: the word stays, the token goes. The validator tells a token from
    // the English word ("the bearer of bad news").
    r"|(?-u:\b)(?i:bearer)[ \t]+(?P<bearer_token>[A-Za-z0-9._~+/-]+=*)",
    // Provider API keys, by their documented prefixes. Open-ended lengths are greedy,
    // so they take the whole key; fixed-length ones need a word boundary after.
    r"|(?-u:\b)(?P<api_key>sk-ant-[A-Za-z0-9_-]{20,}|sk-[A-Za-z0-9_-]{20,}",
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?-u:\b)|gh[pousr]_[A-Za-z0-9]{36,}",
    r"|github_pat_[A-Za-z0-9_]{22,}|AIza[A-Za-z0-9_-]{35}|xox[abposr]-[A-Za-z0-9-]{10,}",
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|glpat-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,})",
    // Password in a URL's userinfo. The password may itself hold `@`; the greedy run
    // stops at the last one before the host.
    r"|(?-u:\b)[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*:(?P<password>[^\s/?#]+)@",
    r"|(?-u:\b)(?P<email>[A-Za-z0-9_][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*",
    r"\.[A-Za-z]{2,63})(?-u:\b)",
    // IBAN: country, check digits, then 4-character groups with optional single spaces.
    r"|(?-u:\b)(?P<iban>[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?)(?-u:\b)",
    // IPv6 candidate: hex groups and colons (`::` included), optionally ending in a
    // dotted IPv4 tail. Loose on purpose; `Ipv6Addr::from_str` decides.
    r"|(?-u:\b)(?P<ipv6>[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{0,4}){2,8}(?:\.[0-9]{1,3}){0,3})",
    r"|(?-u:\b)(?P<ipv4>(?:[0-9]{1,3}\.){3}[0-9]{1,3})(?-u:\b)",
    r"|(?-u:\b)(?P<ssn>[0-9]{3}-[0-9]{2}-[0-9]{4})(?-u:\b)",
    // Phones: `+` country code (not after a word character, so `3+4` is left alone);
    // `00` + country code with separated groups (a bare digit run is an order number,
    // not a phone); North-American `(202) 555-0143`, `202-555-0143`, `202.555.0143`.
    r"|(?P<phone>(?-u:\B)\+[1-9][0-9]{0,3}(?:[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,6}){1,7}",
    r"|(?-u:\b)00[1-9][0-9]{0,3}(?:[ .-](?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,6}){2,7}",
    r"|\([0-9]{3}\) ?[0-9]{3}[-. ][0-9]{4}",
    r"|(?-u:\b)[0-9]{3}-[0-9]{3}-[0-9]{4}|(?-u:\b)[0-9]{3}\.[0-9]{3}\.[0-9]{4})(?-u:\b)",
    // Cards: groups of four (13-19 digits), Amex/Diners 4-6-5 and 4-6-4, or one run.
    r"|(?-u:\b)(?P<card>[0-9]{4}(?:[ -][0-9]{4}){2}[ -][0-9]{1,4}(?:[ -][0-9]{1,3})?",
    r"|[0-9]{4}[ -][0-9]{6}[ -][0-9]{4,5}|[0-9]{13,19})(?-u:\b)",
);

/// Finds and replaces personal data and secrets. Compiling the pattern takes a few
/// milliseconds, so build one at start-up and share it (`Arc<Redactor>`); it is `Send +
/// Sync` and each thread gets its own regex scratch space.
pub struct Redactor {
    /// The compiled [`PATTERN`].
    regex: Regex,
    /// Capture-group index of each kind's group, indexed by `Kind as usize`.
    groups: [usize; Kind::ALL.len()],
    /// Already keyed HMAC state in keyed-hash mode, cloned per match: keying costs two
    /// SHA-256 blocks that need not be redone for every value. `None`: placeholders.
    mac: Option<HmacSha256>,
}

impl Redactor {
    pub fn new(mode: Mode) -> Self {
        // The pattern is a constant, covered by every test below: failing here is a bug
        // in this file, not something input can cause.
        let regex = Regex::new(PATTERN).expect("the redaction pattern compiles");
        let groups = Kind::ALL.map(|kind| {
            regex
                .capture_names()
                .position(|name| name == Some(kind.as_str()))
                .expect("the redaction pattern has a group for every kind")
        });
        let mac = match mode {
            Mode::Placeholder => None,
            Mode::KeyedHash(key) => {
                Some(HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any length"))
            }
        };
        Redactor { regex, groups, mac }
    }

    /// Redacts all of `text`; adds what it replaced to `counts`.
    pub fn redact(&self, text: &str, counts: &mut RedactionCounts) -> Redacted {
        let mut out = String::with_capacity(text.len());
        self.redact_into(text, counts, &mut out, None);
        Redacted(out)
    }

    /// Redacts `text`, then keeps at most `max_chars` characters, the trailing "…" (added
    /// when the text was cut) included. Redaction happens *before* truncation, so a value
    /// cut in half is never half-revealed, and a cut that would fall inside a placeholder
    /// moves to before it, so documents never hold a broken `<CA…`. `counts` covers the
    /// whole text, also what the cut dropped: the document should still say the request
    /// held a card number.
    pub fn excerpt(&self, text: &str, max_chars: usize, counts: &mut RedactionCounts) -> Redacted {
        let mut out = String::with_capacity(text.len());
        let mut placeholders = Vec::new();
        self.redact_into(text, counts, &mut out, Some(&mut placeholders));
        if out.chars().nth(max_chars).is_some() {
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

    /// The one pass behind [`redact`](Self::redact) and [`excerpt`](Self::excerpt):
    /// appends the redacted `text` to `out` and, when asked, the byte range of each
    /// placeholder written.
    fn redact_into(
        &self,
        text: &str,
        counts: &mut RedactionCounts,
        out: &mut String,
        mut placeholders: Option<&mut Vec<(usize, usize)>>,
    ) {
        let mut locs: CaptureLocations = self.regex.capture_locations();
        // `copied`: bytes of `text` already in `out`. `at`: where the next search starts.
        let (mut copied, mut at) = (0, 0);
        // The last look-alike rejected: its kind and where it ends (see [`Verdict`]).
        let mut look_alike: Option<(Kind, usize)> = None;
        while let Some(m) = self.regex.captures_read_at(&mut locs, text, at) {
            // Exactly one kind's group takes part in a match.
            let found = Kind::ALL
                .into_iter()
                .find_map(|kind| Some((kind, locs.get(self.groups[kind as usize])?)));
            let Some((kind, (start, group_end))) = found else {
                at = m.end();
                continue;
            };
            match judge(kind, text, start, group_end) {
                Verdict::Accept(end)
                    if look_alike.is_none_or(|(other, until)| {
                        other == kind || m.start() >= until || end > until
                    }) =>
                {
                    out.push_str(&text[copied..start]);
                    let from = out.len();
                    self.write_replacement(kind, &text[start..end], out);
                    if let Some(spans) = placeholders.as_deref_mut() {
                        spans.push((from, out.len()));
                    }
                    counts.add(kind);
                    copied = end;
                    // A validator may accept less than the group (a card without the
                    // short number the pattern took after it); search on from there.
                    at = if end < group_end { end } else { m.end() };
                    continue;
                }
                Verdict::LookAlike => look_alike = Some((kind, m.end())),
                Verdict::Accept(_) | Verdict::Unrelated => {}
            }
            // Rejected (a Luhn-invalid order number, `12:30:45`): search again from the
            // next character, so a value that starts inside the candidate and runs past
            // it is still found (`1234 4111 1111 1111 1111`). Patterns start at a word
            // boundary, so this does not try every suffix of a word.
            at = m.start() + text[m.start()..].chars().next().map_or(1, char::len_utf8);
        }
        out.push_str(&text[copied..]);
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

/// What a kind's validator makes of a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// A value; it ends here (at most the candidate's end).
    Accept(usize),
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

/// Runs `kind`'s validator on the candidate `text[start..end]`.
fn judge(kind: Kind, text: &str, start: usize, end: usize) -> Verdict {
    let value = &text[start..end];
    let (ok, shaped) = match kind {
        Kind::Card => return judge_groups(text, start, end, b" -", card_valid, card_shaped),
        Kind::Iban => return judge_groups(text, start, end, b" ", iban_valid, iban_shaped),
        Kind::Ipv4 => (ipv4_valid(text, start, end), true),
        Kind::Ssn => (ssn_valid(value), true),
        Kind::Ipv6 => (ipv6_valid(text, start, end), false),
        Kind::Phone => return judge_groups(text, start, end, b" .-", phone_valid, |_| false),
        Kind::BearerToken => {
            // Tokens have digits or symbols; English words after "bearer" do not. A long
            // all-letter run (no word is 24 letters) is a token too.
            let token = value.len() >= 24
                || (value.len() >= 8 && value.bytes().any(|b| !b.is_ascii_alphabetic()));
            (token, false)
        }
        Kind::Email | Kind::ApiKey | Kind::Jwt | Kind::PrivateKey | Kind::Password => (true, false),
    };
    match (ok, shaped) {
        (true, _) => Verdict::Accept(end),
        (false, true) => Verdict::LookAlike,
        (false, false) => Verdict::Unrelated,
    }
}

/// Tries `text[start..end]`, then the same without its last separator-delimited group,
/// and so on, longest first. The pattern cannot tell a card from a card followed by a
/// short number (`4111 1111 1111 1 and 23`), the checksum can; likewise IBANs and
/// phones.
fn judge_groups(
    text: &str,
    start: usize,
    mut end: usize,
    separators: &[u8],
    valid: fn(&str) -> bool,
    shaped: fn(&str) -> bool,
) -> Verdict {
    let mut look_alike = false;
    loop {
        let value = &text[start..end];
        if valid(value) {
            return Verdict::Accept(end);
        }
        look_alike |= shaped(value);
        match value.bytes().rposition(|b| separators.contains(&b)) {
            Some(cut) => end = start + cut,
            None if look_alike => return Verdict::LookAlike,
            None => return Verdict::Unrelated,
        }
    }
}

/// E.164: at most 15 digits, country code included, not counting the trunk `(0)`
/// some countries print (`+49 (0)30 123456`); at least 7. The pattern happily runs on
/// into the numbers after a phone (`+44 20 7946 0958 2025`); dropping trailing groups
/// until the count fits gives the phone back.
fn phone_valid(value: &str) -> bool {
    let digits = value.bytes().filter(u8::is_ascii_digit).count();
    let trunk = usize::from(value.contains("(0)"));
    (7..=15).contains(&(digits - trunk))
}

fn card_shaped(value: &str) -> bool {
    (13..=19).contains(&value.bytes().filter(u8::is_ascii_digit).count())
}

fn card_valid(value: &str) -> bool {
    card_shaped(value) && luhn_valid(value)
}

/// Luhn checksum over the ASCII digits of `value`, separators skipped. Written by hand:
/// ten lines are not worth a dependency.
fn luhn_valid(value: &str) -> bool {
    let digits = value.bytes().rev().filter(u8::is_ascii_digit);
    let sum: u32 = digits
        .map(|b| u32::from(b - b'0'))
        .enumerate()
        .map(|(i, d)| match (i % 2 == 1, d * 2) {
            (false, _) => d,
            (true, twice) if twice > 9 => twice - 9,
            (true, twice) => twice,
        })
        .sum();
    sum % 10 == 0
}

/// IBAN check (ISO 13616): a known country with its length (see [`iban_length`]),
/// then the country code and check digits moved to the end, letters as 10..35, must
/// leave 1 modulo 97. Computed digit by digit on a small remainder, without building
/// the big number; by hand for the same reason as [`luhn_valid`].
fn iban_valid(value: &str) -> bool {
    let compact = || value.bytes().filter(|&b| b != b' ');
    let length = compact().count();
    let known = match iban_length(&value.as_bytes()[..2]) {
        IbanLength::Registered(n) => length == n,
        IbanLength::Any => (15..=34).contains(&length),
        IbanLength::NoIban => false,
    };
    if !known {
        return false;
    }
    let mut rem = 0u32;
    for b in compact().skip(4).chain(compact().take(4)) {
        rem = match b {
            b'0'..=b'9' => (rem * 10 + u32::from(b - b'0')) % 97,
            b'A'..=b'Z' => (rem * 100 + u32::from(b - b'A') + 10) % 97,
            _ => return false,
        };
    }
    rem == 1
}

/// An IBAN with a typo rather than a word followed by a number: a registered country,
/// its exact length, and printed the way IBANs are, either in one run or in groups of
/// four from the country code on. `CF00 1000000000009` is a word and a card number.
fn iban_shaped(value: &str) -> bool {
    let length = value.bytes().filter(|&b| b != b' ').count();
    let mut groups = value.split(' ');
    let grouped_by_four = groups.next_back().is_some_and(|last| last.len() <= 4)
        && groups.all(|group| group.len() == 4);
    iban_length(&value.as_bytes()[..2]) == IbanLength::Registered(length)
        && (!value.contains(' ') || grouped_by_four)
}

#[derive(Debug, PartialEq, Eq)]
enum IbanLength {
    Registered(usize),
    /// IBAN-like numbers outside the registry; lengths vary, 15 to 34 is accepted.
    Any,
    NoIban,
}

/// IBAN lengths by country, from the SWIFT IBAN registry. mod-97 alone lets one
/// uppercase-and-digits run in 97 through (`AA00 ...`); a real country and its exact
/// length cut that to almost none. Countries that use IBAN-like numbers outside the
/// registry (much of West and Central Africa, Iran, Morocco) are [`IbanLength::Any`],
/// so their accounts are still redacted.
fn iban_length(country: &[u8]) -> IbanLength {
    let n = match country {
        b"NO" => 15,
        b"BE" => 16,
        b"DK" | b"FI" | b"FK" | b"FO" | b"GL" | b"NL" | b"SD" => 18,
        b"MK" | b"SI" => 19,
        b"AT" | b"BA" | b"EE" | b"KZ" | b"LT" | b"LU" | b"MN" | b"XK" => 20,
        b"CH" | b"HR" | b"LI" | b"LV" => 21,
        b"BG" | b"BH" | b"CR" | b"DE" | b"GB" | b"GE" | b"IE" | b"ME" | b"RS" => 22,
        b"VA" => 22,
        b"AE" | b"GI" | b"IL" | b"IQ" | b"OM" | b"SO" | b"TL" => 23,
        b"AD" | b"CZ" | b"ES" | b"MD" | b"PK" | b"RO" | b"SA" | b"SE" | b"SK" => 24,
        b"TN" | b"VG" => 24,
        b"LY" | b"PT" | b"ST" => 25,
        b"IS" | b"TR" => 26,
        b"BI" | b"DJ" | b"FR" | b"GR" | b"IT" | b"MC" | b"MR" | b"SM" => 27,
        b"AL" | b"AZ" | b"BY" | b"CY" | b"DO" | b"GT" | b"HN" | b"HU" | b"LB" => 28,
        b"NI" | b"PL" | b"SV" => 28,
        b"BR" | b"EG" | b"PS" | b"QA" | b"UA" => 29,
        b"JO" | b"KW" | b"MU" | b"YE" => 30,
        b"MT" | b"SC" => 31,
        b"LC" => 32,
        b"RU" => 33,
        b"AO" | b"BF" | b"BJ" | b"CF" | b"CG" | b"CI" | b"CM" | b"CV" | b"DZ" | b"GA" => {
            return IbanLength::Any
        }
        b"GQ" | b"GW" | b"IR" | b"KM" | b"MA" | b"MG" | b"ML" | b"MZ" | b"NE" | b"SN" => {
            return IbanLength::Any
        }
        b"TD" | b"TG" => return IbanLength::Any,
        _ => return IbanLength::NoIban,
    };
    IbanLength::Registered(n)
}

/// Octets 0-255, and not part of a longer dotted number (`1.2.3.4.5` is a version or
/// an OID, not an address).
fn ipv4_valid(text: &str, start: usize, end: usize) -> bool {
    let bytes = text.as_bytes();
    let dotted_digit_before =
        start >= 2 && bytes[start - 1] == b'.' && bytes[start - 2].is_ascii_digit();
    let dotted_digit_after =
        bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit);
    !dotted_digit_before
        && !dotted_digit_after
        && text[start..end]
            .split('.')
            .all(|octet| octet.parse::<u8>().is_ok())
}

/// Keeps Rust and C++ paths (`std::net::Ipv6Addr`, `Vec::new`, `cafe::face`), times
/// (`12:30:45`) and MAC addresses out: at least 3 colons, or `::` with at least 2 hex
/// groups; at least one decimal digit (the paths that are also valid IPv6 are made of
/// words); not glued to more word characters or colons; and the standard parser agrees.
fn ipv6_valid(text: &str, start: usize, end: usize) -> bool {
    let value = &text[start..end];
    let bytes = text.as_bytes();
    let glued_before = start > 0 && bytes[start - 1] == b':';
    let glued_after = bytes
        .get(end)
        .is_some_and(|&b| b == b':' || b == b'_' || b.is_ascii_alphanumeric());
    let colons = value.bytes().filter(|&b| b == b':').count();
    let groups = value.split(':').filter(|g| !g.is_empty()).count();
    let shape = colons >= 3 || (value.contains("::") && groups >= 2);
    !glued_before
        && !glued_after
        && shape
        && value.bytes().any(|b| b.is_ascii_digit())
        && value.parse::<std::net::Ipv6Addr>().is_ok()
}

/// SSA rules: area 000, 666 and 900-999, group 00 and serial 0000 are never issued.
fn ssn_valid(value: &str) -> bool {
    let (area, group, serial) = (&value[0..3], &value[4..6], &value[7..11]);
    area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
}

#[cfg(test)]
mod tests;

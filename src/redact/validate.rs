//! The validators behind each redaction kind: a regex finds candidates, these decide
//! whether a candidate is the kind (Luhn for cards, mod-97 for IBANs, octet ranges for
//! IPv4, SSN area rules...), only shaped like it, or unrelated.

use super::{names, Kind, Verdict};

/// Runs `kind`'s validator on the candidate `text[start..end]`.
/// `form` is the part of the group's name after `__` ("" for most kinds).
pub(super) fn judge(kind: Kind, form: &str, text: &str, start: usize, end: usize) -> Verdict {
    let value = &text[start..end];
    let (ok, shaped) = match kind {
        Kind::Card => return judge_groups(text, start, end, b" -", card_valid, card_shaped),
        Kind::Iban => return judge_groups(text, start, end, b" ", iban_valid, iban_shaped),
        Kind::Ipv4 => (ipv4_valid(text, start, end), true),
        Kind::Ssn => (ssn_valid(value), true),
        Kind::ResidentId if form == "cut" => (province(value), false),
        Kind::ResidentId if resident_id_valid(&value.replace([' ', '-'], "")) => (true, true),
        Kind::ResidentId if card_valid(value) => return Verdict::As(Kind::Card, end),
        Kind::ResidentId => (false, true),
        Kind::Name => return names::name(text, start, end, form == "honorific"),
        Kind::Address => return names::address(text, start, end),
        Kind::Ipv6 => (ipv6_valid(text, start, end), false),
        Kind::Phone => return judge_groups(text, start, end, b" .-", phone_valid, |_| false),
        Kind::BearerToken => {
            // Tokens have digits or symbols; English words after "bearer" do not. A long
            // all-letter run (no word is 24 letters) is a token too.
            let token = value.len() >= 24
                || (value.len() >= 8 && value.bytes().any(|b| !b.is_ascii_alphabetic()));
            (token, false)
        }
        // `<PASSWORD:3f1c9a0b2e7d>` is our own placeholder in keyed-hash mode.
        Kind::Password if form == "after" => {
            let placeholder = text[..start].ends_with("<PASSWORD:");
            (!placeholder && password_like(value), false)
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
pub(super) fn luhn_valid(value: &str) -> bool {
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
    let digits: String = value.chars().filter(char::is_ascii_digit).collect();
    if digits.len() != 9 {
        return false;
    }
    let (area, group, serial) = (&digits[0..3], &digits[3..5], &digits[5..9]);
    area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
}

/// Whether what follows "password:" is one: not a word ("required", "incorrect"), a
/// variable (`${DB_PASS}`, `%PASS%`, `<secret>`) or a mask (`****`); anything with a digit,
/// a symbol or both cases is (in ASCII: what follows 密码 in a sentence is no password).
fn password_like(value: &str) -> bool {
    let masked = value
        .chars()
        .all(|c| matches!(c, '*' | 'x' | 'X' | '•' | '.'));
    let variable = value.starts_with(['$', '%', '<', '{', '[']);
    let word = value.chars().all(|c| c.is_ascii_lowercase())
        || value.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    value.is_ascii() && !masked && !variable && !word
}

/// Whether a resident id starts with a province's code (GB/T 2260: 11-15 north, 21-23
/// north-east, 31-37 east, 41-46 centre and south, 50-54 south-west, 61-65 north-west;
/// 71 Taiwan, 81 Hong Kong, 82 Macao): what the start of one cut off must show.
fn province(value: &str) -> bool {
    matches!(
        value.get(..2).and_then(|p| p.parse::<u8>().ok()),
        Some(11..=15 | 21..=23 | 31..=37 | 41..=46 | 50..=54 | 61..=65 | 71 | 81 | 82)
    )
}

/// GB 11643: the 18th character is the ISO 7064 MOD 11-2 check over the first 17 digits
/// (`X` stands for 10).
fn resident_id_valid(value: &str) -> bool {
    const WEIGHTS: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    const CHECK: &[u8; 11] = b"10X98765432";
    let bytes = value.as_bytes();
    if bytes.len() != 18 || !bytes[..17].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let sum: u32 = bytes[..17]
        .iter()
        .zip(WEIGHTS)
        .map(|(&b, w)| u32::from(b - b'0') * w)
        .sum();
    bytes[17].to_ascii_uppercase() == CHECK[(sum % 11) as usize]
}

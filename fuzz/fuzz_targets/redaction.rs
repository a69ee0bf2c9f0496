//! Redaction, any text around a value it must catch: it never panics, the value never
//! survives (in the text or an excerpt of it), redacting the result again changes
//! nothing, and an excerpt keeps to its length.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use llmgate::redact::{Mode, RedactionCounts, Redactor};

/// The input's layout: the kind of value planted (1 byte), keyed hashes or placeholders
/// (1 byte, odd: keyed), the excerpt's length (1 byte), then text (UTF-8, lossily)
/// split at NUL characters into the text before the value, the value's seed and the
/// text after it.
struct Input {
    kind: u8,
    keyed: bool,
    max_chars: u8,
    before: String,
    seed: Vec<u8>,
    after: String,
}

impl Input {
    fn of(data: &[u8]) -> Option<Self> {
        let [kind, keyed, max_chars, rest @ ..] = data else {
            return None;
        };
        let text = String::from_utf8_lossy(rest);
        let mut parts = text.splitn(3, '\0');
        Some(Self {
            kind: *kind,
            keyed: keyed % 2 == 1,
            max_chars: *max_chars,
            before: parts.next().unwrap_or_default().to_owned(),
            seed: parts.next().unwrap_or_default().as_bytes().to_vec(),
            after: parts.next().unwrap_or_default().to_owned(),
        })
    }
}

fn redactors() -> &'static [Redactor; 2] {
    static R: OnceLock<[Redactor; 2]> = OnceLock::new();
    R.get_or_init(|| {
        [
            Redactor::new(Mode::Placeholder),
            Redactor::new(Mode::KeyedHash(b"fuzz".to_vec())),
        ]
    })
}

/// `seed` spelled in `alphabet`, at least `min` characters.
fn spelled(seed: &[u8], alphabet: &[u8], min: usize) -> String {
    (0..seed.len().max(min))
        .map(|i| {
            char::from(alphabet[usize::from(seed.get(i).copied().unwrap_or(7)) % alphabet.len()])
        })
        .collect()
}

/// A value of one kind the redactor must catch, made from `seed`.
fn secret(kind: u8, seed: &[u8]) -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let seed = &seed[..seed.len().min(40)];
    match kind % 3 {
        0 => format!(
            "{}@{}.com",
            spelled(seed, ALNUM, 1),
            spelled(seed, b"abcdefghij", 3)
        ),
        1 => {
            // 15 digits and the Luhn check digit.
            let mut digits: Vec<u32> = spelled(seed, b"0123456789", 15)
                .chars()
                .take(15)
                .map(|c| c.to_digit(10).unwrap_or(0))
                .collect();
            digits[0] = 4;
            let sum: u32 = digits
                .iter()
                .rev()
                .enumerate()
                .map(|(i, &d)| {
                    if i % 2 == 0 {
                        let x = d * 2;
                        if x > 9 {
                            x - 9
                        } else {
                            x
                        }
                    } else {
                        d
                    }
                })
                .sum();
            digits.push((10 - sum % 10) % 10);
            digits
                .iter()
                .map(|d| char::from_digit(*d, 10).unwrap_or('0'))
                .collect()
        }
        _ => format!("sk-{}", spelled(seed, ALNUM, 24)),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = Input::of(data) else { return };
    let redactor = &redactors()[usize::from(input.keyed)];
    let secret = secret(input.kind, &input.seed);
    // The property is about the planted value. The same characters inside a longer run
    // of the fuzzer's own text (a 26-digit number holding the card's 16) are not a
    // value, and rightly survive.
    if input.before.contains(&secret) || input.after.contains(&secret) {
        return;
    }
    let text = format!("{} {secret} {}", input.before, input.after);
    let mut counts = RedactionCounts::default();
    let once = redactor.redact(&text, &mut counts);
    assert!(
        !once.as_str().contains(&secret),
        "{secret:?} survived: {:?}",
        once.as_str()
    );
    assert!(counts.total() >= 1);
    let twice = redactor.redact(once.as_str(), &mut RedactionCounts::default());
    assert_eq!(
        once.as_str(),
        twice.as_str(),
        "redacting again changed the text"
    );
    let max = usize::from(input.max_chars);
    let excerpt = redactor.excerpt(&text, max, &mut RedactionCounts::default());
    assert!(
        excerpt.as_str().chars().count() <= max,
        "an excerpt over {max} chars"
    );
    assert!(!excerpt.as_str().contains(&secret));
});

//! What redaction costs the response path: `Redactor::redact` over ~8 MB of chat-like
//! text cut into 4 KB excerpts (the size the semantic log keeps), in placeholder and in
//! keyed-hash mode, reported as MB/s and values replaced.
//!
//! The corpus is generated from a fixed seed, so every run redacts the same bytes: prose
//! with about one value (e-mail, phone, card, IBAN, IP, key, token, SSN, URL password)
//! per 500 bytes, and look-alikes that must survive (versions, years, times, paths).
//!
//! `cargo bench --bench redaction` measures. Without `--bench` (as `cargo test` runs it)
//! it redacts 64 KB once per mode and checks that none of the planted values survived
//! (and that at least as many values were replaced as were planted).

use std::hint::black_box;
use std::time::{Duration, Instant};

use llmgate::redact::{Mode, RedactionCounts, Redactor};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

const EXCERPT_BYTES: usize = 4 * 1024;
const BENCH_BYTES: usize = 8 * 1024 * 1024;
const SMOKE_BYTES: usize = 64 * 1024;
/// Passes over the corpus per mode; the fastest is reported (the others absorb noise
/// from a shared machine).
const PASSES: usize = 3;

#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "a", "to", "and", "of", "in", "is", "it", "you", "that", "for", "on", "with",
    "can", "this", "be", "are", "not", "have", "your", "please", "help", "me", "write",
    "function", "error", "when", "I", "try", "run", "server", "request", "response",
    "model", "token", "thanks", "could", "explain", "why", "does", "work", "should",
    "return", "value", "string", "number", "account", "payment", "order", "customer",
    "address", "send", "email", "call", "support", "team", "issue", "ticket", "update",
    "config", "database", "password", "reset", "login", "user", "deploy", "cluster",
    "latency", "timeout", "retry", "queue", "summary", "draft", "letter", "meeting",
    "tomorrow", "schedule", "invoice", "refund", "shipping", "delivery", "report",
    "café", "naïve", "über", "résumé", "日本語", "données", "привет",
    // Look-alikes: must survive redaction.
    "v1.2.3", "2024", "2025", "12:30", "09:15:00", "std::vec::Vec", "Vec::new()", "#4821",
    "3.14", "10%", "1.0.0-beta",
];

/// IBANs with valid checksums (the registry's examples), printed both ways.
const IBANS: &[&str] = &[
    "DE89 3704 0044 0532 0130 00",
    "GB82WEST12345698765432",
    "FR14 2004 1010 0505 0001 3M02 606",
    "NL91ABNA0417164300",
];

struct Gen {
    rng: ChaCha8Rng,
}

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.below(10) as u8))
            .collect()
    }

    fn alnum(&mut self, n: usize) -> String {
        const SET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..n)
            .map(|_| char::from(SET[self.below(SET.len())]))
            .collect()
    }

    /// A Luhn-valid 16-digit Visa-like number, grouped like people type them.
    fn card(&mut self) -> String {
        let mut digits = format!("4{}", self.digits(14));
        let check = (0..10u8)
            .find(|d| luhn_valid(&format!("{digits}{d}")))
            .expect("one check digit fits");
        digits.push(char::from(b'0' + check));
        let sep = self.pick(&["", " ", "-"]);
        let groups: Vec<&str> = (0..4).map(|i| &digits[i * 4..i * 4 + 4]).collect();
        groups.join(sep)
    }

    /// One personal value or secret, as it would appear in a chat message.
    fn value(&mut self) -> String {
        match self.below(11) {
            0 | 1 => {
                let name = self.pick(&["jane", "john.smith", "m.garcia", "li.wei", "ops"]);
                let domain = self.pick(&["example.com", "corp.io", "mail.example.org"]);
                format!("{name}{}@{domain}", self.below(1000))
            }
            2 => match self.below(4) {
                0 => format!("+44 20 7946 {}", self.digits(4)),
                1 => format!("+1-202-555-{}", self.digits(4)),
                2 => format!("(415) 555-{}", self.digits(4)),
                _ => format!("+49 (0)30 {}", self.digits(6)),
            },
            3 => self.card(),
            4 => self.pick(IBANS).to_owned(),
            5 => format!(
                "10.{}.{}.{}",
                self.below(256),
                self.below(256),
                self.below(256)
            ),
            6 => format!(
                "2001:db8:{:x}::{:x}",
                self.below(0xffff),
                self.below(0xffff)
            ),
            7 => match self.below(3) {
                0 => format!("sk-proj-{}", self.alnum(40)),
                1 => format!("AKIA{}", self.alnum(16).to_ascii_uppercase()),
                _ => format!("ghp_{}", self.alnum(36)),
            },
            8 => format!("Authorization: Bearer {}7", self.alnum(31)),
            9 => format!(
                "{}-{}-{}",
                100 + self.below(500),
                10 + self.below(90),
                1000 + self.below(9000)
            ),
            _ => format!(
                "postgres://app:{}@db{}.internal:5432/app",
                self.alnum(12),
                self.below(9)
            ),
        }
    }

    /// Excerpts of at most [`EXCERPT_BYTES`], made of whole sentences so no planted
    /// value is split between two, `total` bytes in all.
    fn corpus(&mut self, total: usize) -> Vec<Excerpt> {
        let mut excerpts = Vec::new();
        let mut excerpt = Excerpt::default();
        let (mut bytes, mut until_value) = (0, 250 + self.below(500));
        while bytes < total {
            let (mut sentence, mut planted) = (String::new(), Vec::new());
            for i in 0..6 + self.below(14) {
                if i > 0 {
                    sentence.push(' ');
                }
                if until_value == 0 {
                    let value = self.value();
                    sentence.push_str(&value);
                    planted.push(value);
                    until_value = 250 + self.below(500);
                } else {
                    let word = self.pick(WORDS);
                    sentence.push_str(word);
                    until_value = until_value.saturating_sub(word.len() + 1);
                }
            }
            sentence.push_str(self.pick(&[". ", "? ", "! ", ".\n\n"]));
            if excerpt.text.len() + sentence.len() > EXCERPT_BYTES {
                excerpts.push(std::mem::take(&mut excerpt));
            }
            bytes += sentence.len();
            excerpt.text.push_str(&sentence);
            excerpt.planted.append(&mut planted);
        }
        if !excerpt.text.is_empty() {
            excerpts.push(excerpt);
        }
        excerpts
    }
}

#[derive(Default)]
struct Excerpt {
    text: String,
    /// The values planted in `text`, which must all be gone after redaction.
    planted: Vec<String>,
}

/// Luhn, for planting valid card numbers (the module's own is private).
fn luhn_valid(digits: &str) -> bool {
    let sum: u32 = digits
        .bytes()
        .rev()
        .map(|b| u32::from(b - b'0'))
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 1 {
                (d * 2) % 10 + d * 2 / 10
            } else {
                d
            }
        })
        .sum();
    sum % 10 == 0
}

struct Run {
    best: Duration,
    replaced: u32,
    out: Vec<String>,
}

fn run(redactor: &Redactor, excerpts: &[Excerpt], passes: usize) -> Run {
    let mut best = Duration::MAX;
    let (mut replaced, mut out) = (0, Vec::new());
    for _ in 0..passes {
        let mut counts = RedactionCounts::default();
        let start = Instant::now();
        let redacted: Vec<_> = excerpts
            .iter()
            .map(|e| redactor.redact(black_box(&e.text), &mut counts))
            .collect();
        best = best.min(start.elapsed());
        replaced = counts.total();
        out = redacted.into_iter().map(|r| r.into_string()).collect();
    }
    Run {
        best,
        replaced,
        out,
    }
}

/// Fails the run if a planted value survived or the count is off: a benchmark of a
/// redactor that misses values measures nothing useful.
fn check(name: &str, excerpts: &[Excerpt], run: &Run) {
    let mut survived = 0;
    for (excerpt, out) in excerpts.iter().zip(&run.out) {
        for value in excerpt.planted.iter().filter(|v| out.contains(v.as_str())) {
            eprintln!("{name}: {value:?} survived in this excerpt:\n{out}");
            survived += 1;
        }
    }
    let planted: usize = excerpts.iter().map(|e| e.planted.len()).sum();
    assert_eq!(survived, 0, "{name}: planted values survived");
    // More than were planted where the word salad makes a cue: "customer Vec::new()"
    // marks a name, and every other "Vec" goes with it; "password is 2024" a password.
    assert!(
        run.replaced as usize >= planted,
        "{name}: {} values replaced, {planted} planted",
        run.replaced
    );
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (total, passes) = if measuring {
        (BENCH_BYTES, PASSES)
    } else {
        (SMOKE_BYTES, 1)
    };
    let mut generator = Gen {
        rng: ChaCha8Rng::seed_from_u64(0x5EED_2ED4),
    };
    let excerpts = generator.corpus(total);
    let mb = excerpts.iter().map(|e| e.text.len()).sum::<usize>() as f64 / 1e6;
    let planted: usize = excerpts.iter().map(|e| e.planted.len()).sum();
    println!(
        "corpus: {mb:.1} MB in {} excerpts of at most {EXCERPT_BYTES} bytes, {planted} values planted",
        excerpts.len(),
    );
    let modes = [
        ("placeholder", Mode::Placeholder),
        ("keyed_hash", Mode::KeyedHash(b"bench-key".to_vec())),
    ];
    for (name, mode) in modes {
        let redactor = Redactor::new(mode);
        let result = run(&redactor, &excerpts, passes);
        println!(
            "{name:>11}: {:>6.1} MB/s ({:.1} ms for {mb:.1} MB, best of {passes}), {} values replaced",
            mb / result.best.as_secs_f64(),
            result.best.as_secs_f64() * 1e3,
            result.replaced,
        );
        check(name, &excerpts, &result);
    }
}

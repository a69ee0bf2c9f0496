use super::*;
use crate::clock::ManualClock;

fn line(id: &str, key: &str) -> String {
    format!("{id} {}\n", hex::encode(sha256(key)))
}

#[test]
fn parses_ids_and_hashes_with_comments_and_blank_lines() {
    let text = format!(
        "# team keys\n\n{}   {}",
        line("alice", "k1"),
        line("ci.bot-2", "k2")
    );
    let table = KeyTable::parse(&text).expect("valid");
    assert_eq!(table.len(), 2);
    assert_eq!(table.verify("k1"), Some("alice"));
    assert_eq!(table.verify("k2"), Some("ci.bot-2"));
    assert_eq!(table.verify("k3"), None);
    assert_eq!(table.verify(""), None);
}

#[test]
fn a_malformed_line_is_named() {
    let good = line("alice", "k1");
    let cases = [
        (format!("{good}bob\n"), "line 2: expected"),
        (format!("{good}bob abc\n"), "line 2: 'bob' needs the sha256"),
        (
            format!("# c\n{good}bob {KEY_PREFIX}abc\n"),
            "line 3: 'bob' needs",
        ),
        (
            format!("{good}{good}"),
            "line 2: the key id 'alice' is listed twice",
        ),
        (
            format!("{good}{}", line("bob", "k1")),
            "line 2: 'bob' has the same key",
        ),
        (
            format!("b@d {}\n", "0".repeat(64)),
            "line 1: the key id must be",
        ),
    ];
    assert_each_refused(cases);
}

/// Each key file text is refused, with an error that begins as its case says.
fn assert_each_refused(cases: impl IntoIterator<Item = (String, &'static str)>) {
    for (text, expected) in cases {
        let error = KeyTable::parse(&text).expect_err(&text);
        assert!(error.starts_with(expected), "{error} for {text:?}");
    }
}

#[test]
fn new_keys_are_prefixed_random_and_url_safe() {
    let a = new_key().expect("key");
    let b = new_key().expect("key");
    assert_ne!(a, b);
    let body = a.strip_prefix(KEY_PREFIX).expect("prefix");
    assert_eq!(body.len(), 43, "32 bytes in base64url without padding");
    assert!(body
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
}

#[test]
fn add_appends_a_line_that_verifies_and_refuses_a_taken_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let alice = add_key(&file, "alice").expect("add");
    let bob = add_key(&file, "bob").expect("add");
    let text = std::fs::read_to_string(&file).expect("read");
    assert!(
        !text.contains(&alice) && !text.contains(&bob),
        "no key on disk"
    );
    let table = KeyTable::parse(&text).expect("valid");
    assert_eq!(table.verify(&alice), Some("alice"));
    assert_eq!(table.verify(&bob), Some("bob"));
    assert!(add_key(&file, "alice").is_err());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_reload_swaps_in_a_good_version_and_keeps_the_old_one_on_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    std::fs::write(&file, line("alice", "k1")).expect("write");
    let keys = Keys::load(&file, Limits::default(), Arc::new(ManualClock::new())).expect("load");
    assert_eq!(keys.reload(false), Ok(false), "unchanged");
    std::fs::write(
        &file,
        format!("{}{}", line("alice", "k1"), line("bob", "k2")),
    )
    .expect("write");
    assert_eq!(keys.reload(true), Ok(true));
    assert_eq!(keys.current().verify("k2"), Some("bob"));
    std::fs::write(&file, "bob\n").expect("write");
    let error = keys.reload(true).expect_err("malformed");
    assert!(error.contains("line 1"), "{error}");
    assert_eq!(
        keys.current().verify("k2"),
        Some("bob"),
        "the old keys stay"
    );
    // A file being rewritten in place reads empty for a moment (CI caught the poll
    // there, and the malformed version after it kept everyone out): not "no keys".
    std::fs::write(&file, "").expect("truncate");
    let error = keys.reload(true).expect_err("empty");
    assert!(error.contains("holds no key"), "{error}");
    assert_eq!(keys.current().verify("k2"), Some("bob"), "still in use");
}

#[test]
fn a_line_may_set_its_own_limits_over_the_defaults() {
    let text = format!(
        "{} rpm=5 tpm=none\n{}{} tpm=900\n",
        line("alice", "k1").trim_end(),
        line("bob", "k2"),
        line("carol", "k3").trim_end()
    );
    let table = KeyTable::parse(&text).expect("valid");
    let defaults = Limits {
        requests_per_minute: NonZeroU32::new(60),
        tokens_per_minute: NonZeroU32::new(10_000),
    };
    let limits = |id| table.limits(id, defaults).expect("listed");
    assert_eq!(
        limits("alice"),
        Limits {
            requests_per_minute: NonZeroU32::new(5),
            tokens_per_minute: None,
        }
    );
    assert_eq!(limits("bob"), defaults);
    assert_eq!(
        limits("carol").tokens_per_minute,
        NonZeroU32::new(900),
        "tpm set, rpm from the defaults"
    );
    assert_eq!(limits("carol").requests_per_minute, NonZeroU32::new(60));
    let bad = [
        (
            format!("{} rpm=0\n", line("a", "k").trim_end()),
            "line 1: 'a' has 'rpm=0'",
        ),
        (
            format!("{} rps=5\n", line("a", "k").trim_end()),
            "line 1: 'a' has 'rps=5'",
        ),
        (
            format!("{} rpm=5 rpm=6\n", line("a", "k").trim_end()),
            "line 1: 'a' sets rpm twice",
        ),
    ];
    assert_each_refused(bad);
}

#[test]
fn a_reload_keeps_what_a_key_has_used_unless_its_limits_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    let alice = format!("{} rpm=2\n", line("alice", "k1").trim_end());
    std::fs::write(&file, &alice).expect("write");
    let keys = Keys::load(&file, Limits::default(), Arc::new(ManualClock::new())).expect("load");
    let spend = || keys.caller("k1").expect("known").budget.charge(1);
    assert!(spend().is_ok() && spend().is_ok());
    assert!(spend().is_err(), "two requests a minute");
    std::fs::write(&file, format!("{alice}{}", line("bob", "k2"))).expect("write");
    assert_eq!(keys.reload(true), Ok(true));
    assert!(spend().is_err(), "adding bob does not refill alice");
    std::fs::write(&file, format!("{} rpm=3\n", line("alice", "k1").trim_end())).expect("write");
    assert_eq!(keys.reload(true), Ok(true));
    assert!(spend().is_ok(), "a new limit starts a new budget");
    assert!(keys.caller("k2").is_none(), "bob is gone");
}

#[test]
fn the_bearer_scheme_is_read_in_any_case() {
    assert_eq!(bearer_token("Bearer abc"), Some("abc"));
    assert_eq!(bearer_token("BEARER  abc "), Some("abc"));
    assert_eq!(bearer_token("bearer abc"), Some("abc"));
    assert_eq!(bearer_token("Basic abc"), None);
    assert_eq!(bearer_token("Bearer "), None);
    assert_eq!(bearer_token("Bearerabc"), None);
}

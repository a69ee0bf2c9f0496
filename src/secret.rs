//! Secrets the gateway is given (upstream API keys, Elasticsearch credentials, the
//! redaction key, passwords in URLs): a type whose `Debug` shows none of it, the one way
//! a secret is read from a file, as Kubernetes and compose mount them, and [`scrub`],
//! which takes every secret the gateway holds out of text that came from elsewhere (an
//! upstream's error message) before a client, a log line, a span or a document sees it.

use std::path::Path;
use std::sync::RwLock;

use crate::redact::{self, RedactionCounts};

/// Every secret value made in this process ([`Secret::new`], [`hold`]), longest first,
/// so [`scrub`] replaces a key before a shorter secret inside it.
static HELD: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Values shorter than this are not held: replacing every "admin" in an error message
/// would say more about the password than leaving it.
const SHORTEST_HELD: usize = 6;

/// Remembers `value` as a secret the gateway holds, with the forms it travels in and
/// an upstream may quote back: percent-encoded (in a URL) and base64 (in a header).
pub fn hold(value: &str) {
    use base64::Engine as _;
    // A short value is not held (see SHORTEST_HELD), nor are its longer encodings.
    if value.len() < SHORTEST_HELD {
        return;
    }
    hold_as_is(value);
    let encoded = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    hold_as_is(&encoded);
    hold_as_is(&base64::engine::general_purpose::STANDARD.encode(value));
    hold_as_is(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value));
}

/// Remembers the user and password of a URL's userinfo (as typed, not percent-encoded):
/// the password, and `user:password`, which the HTTP client sends as `Authorization:
/// Basic base64(user:password)` where no API key replaces it, and an upstream may quote
/// (issue 61 found `Basic c3Zj…` in an answer and five log lines).
pub fn hold_credentials(user: &str, password: &str) {
    hold(password);
    hold(&format!("{user}:{password}"));
}

fn hold_as_is(value: &str) {
    if value.len() < SHORTEST_HELD {
        return;
    }
    let mut held = HELD.write().unwrap_or_else(|e| e.into_inner());
    if !held.iter().any(|h| h == value) {
        held.push(value.to_owned());
        held.sort_by_key(|h| std::cmp::Reverse(h.len()));
    }
}

/// The placeholder [`scrub`] leaves where a secret the gateway holds was.
pub const SCRUBBED: &str = "<SECRET>";

/// `text` from outside (an upstream's error body, a transport error) without any secret
/// the gateway holds, and without what the redactor finds in it (any API key, password
/// in a URL, card or phone number, name...). Costs a pass of the redactor: for error
/// paths, not for every token.
pub fn scrub(text: &str) -> String {
    redact::shared()
        .redact(&scrub_held(text), &mut RedactionCounts::default())
        .into_string()
}

/// `text` without any secret the gateway holds, and nothing else changed: for text the
/// gateway's own HTTP client wrote about a URL the operator configured (a connection
/// refused by `http://10.0.0.5:8000/v1`), where the address is what the operator needs
/// and no user's data can be.
pub fn scrub_held(text: &str) -> String {
    let mut out = text.to_owned();
    let held = HELD.read().unwrap_or_else(|e| e.into_inner());
    for secret in held.iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), SCRUBBED);
        }
    }
    out
}

/// A secret read from a file or the environment at start-up. Its `Debug` prints no
/// part of it, so a config dump or an error cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret; [`scrub`] keeps it out of text from outside from now on.
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        hold(&value);
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The secret in `path`, without the surrounding white space a mounted file or an
/// `echo` leaves (a trailing newline would otherwise become part of a password). The
/// error names the file, never its contents.
pub fn read_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(secret.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_takes_out_every_secret_held_and_what_the_redactor_finds() {
        let key = Secret::new("upstream-key-Zq81vX0");
        hold("pa55word-in-url");
        let text = format!(
            "bad request (key {}) for postgres://u:pa55word-in-url@db and sk-AbCdEfGhIjKlMnOpQrStUvWxYz0123 from jane@example.com",
            key.expose()
        );
        let clean = scrub(&text);
        for leaked in [key.expose(), "pa55word-in-url", "sk-AbCdEf", "jane@"] {
            assert!(!clean.contains(leaked), "{leaked} in {clean}");
        }
        assert!(clean.starts_with("bad request (key <SECRET>)"), "{clean}");
        hold("short");
        assert_eq!(scrub("a short answer"), "a short answer");
    }

    #[test]
    fn the_forms_a_secret_travels_in_are_scrubbed_too() {
        use base64::Engine as _;
        hold_credentials("svcuser", "Pa55w0rd/x");
        let basic = base64::engine::general_purpose::STANDARD.encode("svcuser:Pa55w0rd/x");
        let echoed =
            format!("echo: Authorization: Basic {basic}; password=Pa55w0rd%2Fx; raw Pa55w0rd/x");
        let clean = scrub_held(&echoed);
        assert_eq!(
            clean,
            "echo: Authorization: Basic <SECRET>; password=<SECRET>; raw <SECRET>"
        );
        let key = Secret::new("opaque-upstream-token-9f8e7d");
        let b64 = base64::engine::general_purpose::STANDARD.encode(key.expose());
        assert_eq!(scrub_held(&format!("x {b64} y")), "x <SECRET> y");
    }

    #[test]
    fn secrets_do_not_print() {
        let secret = Secret::new("sk-very-secret");
        assert!(!format!("{secret:?}").contains("very"));
        assert_eq!(secret.expose(), "sk-very-secret");
    }
}

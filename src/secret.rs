//! Secrets the gateway is given (upstream API keys, Elasticsearch credentials, the
//! redaction key): a type whose `Debug` shows none of it, and the one way a secret is read
//! from a file, as Kubernetes and compose mount them.

use std::path::Path;

/// A secret read from a file or the environment at start-up. Its `Debug` prints no
/// part of it, so a config dump or an error cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
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
    fn secrets_do_not_print() {
        let secret = Secret::new("sk-very-secret");
        assert!(!format!("{secret:?}").contains("very"));
        assert_eq!(secret.expose(), "sk-very-secret");
    }
}

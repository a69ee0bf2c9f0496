//! The API keys file (`--api-keys-file`), any text: refused with the line it stops at, or
//! a table that never takes a listed hash for a key.

#![no_main]

use libfuzzer_sys::fuzz_target;
use llmgate::auth::limits::Limits;
use llmgate::auth::KeyTable;

fuzz_target!(|text: &str| {
    let lines = text.lines().count();
    match KeyTable::parse(text) {
        Err(message) => {
            let line: usize = message
                .strip_prefix("line ")
                .and_then(|rest| rest.split(':').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("an error without its line: {message}"));
            assert!(
                line >= 1 && line <= lines,
                "line {line} of {lines}: {message}"
            );
        }
        Ok(table) => {
            assert!(table.len() <= lines);
            // The file holds hashes, never keys: a hash presented as a key is no key.
            for word in text.split_whitespace() {
                assert_eq!(table.verify(word), None, "{word:?} passed as a key");
            }
            if let Some(id) = table.verify("") {
                assert!(table.limits(id, Limits::default()).is_some());
            }
            assert_eq!(KeyTable::parse(text), Ok(table));
        }
    }
});

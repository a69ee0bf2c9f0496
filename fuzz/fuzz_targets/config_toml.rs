//! The TOML configuration file, any text: a configuration or an error that says what is
//! wrong, the same every time; never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use llmgate::config::{Config, ServeArgs};

fuzz_target!(|text: &str| {
    let args = ServeArgs::default();
    let first = Config::from_toml(&args, text);
    match &first {
        Err(error) => assert!(!error.to_string().is_empty()),
        Ok(config) => {
            assert!(!config.models.is_empty(), "a configuration without a model");
            assert!(config.server.max_body_bytes > 0);
        }
    }
    let again = Config::from_toml(&args, text);
    assert_eq!(
        format!("{first:?}"),
        format!("{again:?}"),
        "not deterministic"
    );
});

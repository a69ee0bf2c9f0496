//! `/tokenize` and `/detokenize` bodies: refused in OpenAI's shape, or accepted within
//! the limits.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use llmgate::api::request::{parse_detokenize_request, parse_tokenize_request};

fuzz_target!(|body: &[u8]| {
    let limits = common::limits();
    match parse_tokenize_request(body, &limits) {
        Err(error) => common::check_refusal(&error),
        Ok(request) => assert!(request.model.as_deref().is_none_or(|m| m == common::MODEL)),
    }
    match parse_detokenize_request(body, &limits) {
        Err(error) => common::check_refusal(&error),
        Ok(request) => assert!(request.model.as_deref().is_none_or(|m| m == common::MODEL)),
    }
});

//! `POST /v1/chat/completions` bodies through the real validation. Accepted: within every
//! limit, hashed as what it asks, and re-serialised for an upstream server it parses to
//! the same request. Refused: a 4xx in OpenAI's shape.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use llmgate::api::request::parse_chat_request;

fuzz_target!(|body: &[u8]| {
    let limits = common::limits();
    let first = parse_chat_request(body, &limits, "fuzz");
    match &first {
        Err(error) => common::check_refusal(error),
        Ok(request) => {
            common::check_accepted(request);
            let again =
                parse_chat_request(&common::upstream_body(&request.generation), &limits, "fuzz")
                    .unwrap_or_else(|e| panic!("the upstream body is refused: {e:?}"));
            common::assert_same_generation(&request.generation, &again.generation);
        }
    }
    assert_eq!(
        first,
        parse_chat_request(body, &limits, "fuzz"),
        "parsing is not deterministic"
    );
});

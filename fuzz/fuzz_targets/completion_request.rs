//! `POST /v1/completions` bodies, as `chat_request` does for chat.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use llmgate::api::request::parse_completion_request;

fuzz_target!(|body: &[u8]| {
    let limits = common::limits();
    let first = parse_completion_request(body, &limits, "fuzz");
    match &first {
        Err(error) => common::check_refusal(error),
        Ok(request) => {
            common::check_accepted(request);
            // `echo` is the gateway's to honour; the upstream never sees it.
            let again = parse_completion_request(
                &common::upstream_body(&request.generation),
                &limits,
                "fuzz",
            )
            .unwrap_or_else(|e| panic!("the upstream body is refused: {e:?}"));
            common::assert_same_generation(&request.generation, &again.generation);
        }
    }
    assert_eq!(first, parse_completion_request(body, &limits, "fuzz"));
});

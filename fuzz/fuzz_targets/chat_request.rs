//! `POST /v1/chat/completions` bodies through the real validation. Accepted: within every
//! limit, hashed as what it asks, and re-serialised for an upstream server it parses to
//! the same request. Refused: a 4xx in OpenAI's shape.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use llmgate::api::request::parse_chat_request;

fuzz_target!(|body: &[u8]| common::check_body(parse_chat_request, body));

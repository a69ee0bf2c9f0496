//! `POST /v1/completions` bodies, as `chat_request` does for chat. `echo` is the
//! gateway's to honour; the upstream never sees it, and the re-parsed request matches
//! all the same.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use llmgate::api::request::parse_completion_request;

fuzz_target!(|body: &[u8]| common::check_body(parse_completion_request, body));

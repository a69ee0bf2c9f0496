//! Elasticsearch's (or a proxy's) answer to a `_bulk`, any status, header and body: one
//! outcome per document sent or one for the whole request, as the status says, with
//! reasons short enough for a log line.

#![no_main]

use libfuzzer_sys::fuzz_target;
use llmgate::semlog::elasticsearch::{parse_bulk, BulkResult, Item};

/// The input's layout: status (2 bytes, big endian), documents sent (1 byte), the length
/// of the `Retry-After` value (1 byte; 255: no header), that value, then the body.
struct Input<'a> {
    status: u16,
    retry_after: Option<String>,
    sent: u8,
    body: &'a [u8],
}

impl<'a> Input<'a> {
    fn of(data: &'a [u8]) -> Option<Self> {
        let [s1, s2, sent, len, rest @ ..] = data else {
            return None;
        };
        let (retry_after, body) = match *len {
            255 => (None, rest),
            n => {
                let n = usize::from(n).min(rest.len());
                (
                    Some(String::from_utf8_lossy(&rest[..n]).into_owned()),
                    &rest[n..],
                )
            }
        };
        Some(Self {
            status: u16::from_be_bytes([*s1, *s2]),
            retry_after,
            sent: *sent,
            body,
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = Input::of(data) else { return };
    let sent = usize::from(input.sent);
    let result = parse_bulk(input.status, input.retry_after.as_deref(), input.body, sent);
    let short = |reason: &str| {
        assert!(
            reason.chars().count() <= 512,
            "a reason of {} chars",
            reason.len()
        )
    };
    match &result {
        BulkResult::Items(items) => {
            assert!((200..300).contains(&input.status));
            assert_eq!(items.len(), sent);
            for item in items {
                if let Item::Rejected {
                    error_type, reason, ..
                } = item
                {
                    short(error_type);
                    short(reason);
                }
            }
        }
        BulkResult::Split => assert_eq!(input.status, 413),
        BulkResult::RejectAll { status, reason } => {
            assert_eq!(*status, 400);
            short(reason);
        }
        BulkResult::RetryAll { reason, .. } => {
            assert!(input.status != 400 && input.status != 413);
            short(reason);
        }
    }
});

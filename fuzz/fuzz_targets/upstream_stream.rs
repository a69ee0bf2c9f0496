//! An upstream server's answer, any bytes cut at any places, through the gateway's SSE
//! and chunk parser. The answer always ends in exactly one `Finished` or `Failed`, never
//! gives more alternatives per token than asked, and what it gives does not depend on
//! where the bytes were cut on the way (only how its tokens are grouped into events).

#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use llmgate::engine::upstream::stream::events_of;
use llmgate::engine::{EngineEvent, ToolCalls};

/// The input's layout: the gateway's cap (0: none), the alternatives asked for, the
/// seed of where the bytes are cut, then the body.
struct Input<'a> {
    max_tokens: u32,
    top_logprobs: usize,
    cut_seed: u8,
    body: &'a [u8],
}

impl<'a> Input<'a> {
    fn of(data: &'a [u8]) -> Option<Self> {
        let [max, top, seed, body @ ..] = data else {
            return None;
        };
        Some(Self {
            max_tokens: if *max == 0 { u32::MAX } else { u32::from(*max) },
            top_logprobs: usize::from(*top % 21),
            cut_seed: *seed,
            body,
        })
    }

    /// The body in chunks of 1 to 64 bytes, as a pseudo-random walk from the seed decides.
    fn chunks(&self) -> Vec<Bytes> {
        let body = Bytes::copy_from_slice(self.body);
        let mut state = u32::from(self.cut_seed) | 1;
        let mut chunks = Vec::new();
        let mut from = 0;
        while from < body.len() {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let len = (state % 64 + 1) as usize;
            let to = (from + len).min(body.len());
            chunks.push(body.slice(from..to));
            from = to;
        }
        chunks
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

/// The events without the instants they were stamped with, and without how the tokens
/// were grouped: tokens whose bytes came in one read go as one event, so where the bytes
/// were cut may change the grouping, never the tokens, their order or the ending.
fn comparable(events: &[EngineEvent]) -> Vec<String> {
    let (mut text, mut ids, mut logprobs) = (String::new(), Vec::new(), Vec::new());
    let (mut reasoning, mut calls) = (String::new(), ToolCalls::default());
    let mut ends = Vec::new();
    for event in events {
        match event {
            EngineEvent::Token {
                text: t,
                ids: i,
                logprobs: l,
                ..
            } => {
                text.push_str(t);
                ids.extend_from_slice(i);
                logprobs.extend(l.iter().map(|lp| format!("{lp:?}")));
            }
            EngineEvent::Finished { reason, usage } => {
                ends.push(format!("finished {reason:?} {usage:?}"))
            }
            EngineEvent::Failed(error) => ends.push(format!("failed {error}")),
            // Sent by the attempts, never by the one stream read here.
            EngineEvent::Restarted => ends.push("restarted".to_owned()),
            // An upstream reports no prompt progress; the llama.cpp engine alone does.
            EngineEvent::Progress { .. } => ends.push("progress".to_owned()),
            EngineEvent::Reasoning { text: r, .. } => reasoning.push_str(r),
            EngineEvent::ToolCall { delta, .. } => calls.push(delta),
        }
    }
    let mut all = vec![format!("tokens {text:?} {ids:?} {logprobs:?}")];
    all.push(format!("reasoning {reasoning:?} calls {:?}", calls.0));
    all.extend(ends);
    all
}

fn read(chunks: Vec<Bytes>, max_tokens: u32, top: usize) -> Vec<EngineEvent> {
    let body = Box::pin(futures_util::stream::iter(chunks.into_iter().map(Ok)));
    runtime().block_on(events_of(body, max_tokens, top))
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = Input::of(data) else { return };
    let (max_tokens, top) = (input.max_tokens, input.top_logprobs);
    let events = read(input.chunks(), max_tokens, top);
    let ends = events
        .iter()
        .filter(|e| matches!(e, EngineEvent::Finished { .. } | EngineEvent::Failed(_)))
        .count();
    assert_eq!(ends, 1, "{events:?}");
    assert!(matches!(
        events.last(),
        Some(EngineEvent::Finished { .. } | EngineEvent::Failed(_))
    ));
    for event in &events {
        if let EngineEvent::Token { logprobs, .. } = event {
            assert!(
                logprobs.iter().all(|lp| lp.top.len() <= top),
                "{logprobs:?}"
            );
        }
    }
    let whole = read(vec![Bytes::copy_from_slice(input.body)], max_tokens, top);
    assert_eq!(
        comparable(&events),
        comparable(&whole),
        "cutting the bytes changed the answer"
    );
});

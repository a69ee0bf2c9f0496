//! The answer state machine on canned events: no network, no clock; each event is stamped
//! with a moment the test chooses.

use super::*;

#[test]
fn a_piece_past_the_budget_keeps_the_tokens_within_it_and_their_text() {
    let token = |t: &str| crate::tokens::TokenLogprob {
        sampled: None,
        token: crate::tokens::TokenText::from_bytes(t.as_bytes().to_vec()),
        logprob: -0.5,
        top: Vec::new(),
    };
    let mut piece = Piece {
        text: "a b c".into(),
        logprobs: vec![token("a"), token(" b"), token(" c")],
        ..Piece::default()
    };
    within_budget(&mut piece, 2);
    assert_eq!((piece.text.as_str(), piece.logprobs.len()), ("a b", 2));
    // Tokens that do not spell the text: the count is cut, the text kept.
    let mut odd = Piece {
        text: "xyz".into(),
        logprobs: vec![token("a"), token("b")],
        ..Piece::default()
    };
    within_budget(&mut odd, 1);
    assert_eq!((odd.text.as_str(), odd.logprobs.len()), ("xyz", 1));
    let mut within = Piece {
        text: "a".into(),
        logprobs: vec![token("a")],
        ..Piece::default()
    };
    within_budget(&mut within, 5);
    assert_eq!(within.text, "a");
}

#[test]
fn dated_names_are_the_same_model_and_longer_names_are_not() {
    assert!(same_model("gpt-4o", "gpt-4o"));
    assert!(same_model("gpt-4o", "gpt-4o-2024-08-06"));
    assert!(same_model("gpt-4", "gpt-4-0613"));
    assert!(same_model(
        "claude-3-5-sonnet",
        "claude-3-5-sonnet-20241022"
    ));
    assert!(same_model("gemini-1.5-pro", "gemini-1.5-pro-002"));
    assert!(same_model("claude", "claude@20250101"));
    assert!(!same_model("gpt-4o", "gpt-4o-mini"));
    assert!(!same_model("llama-3.1-8b", "llama-3.1-8b-instruct"));
    assert!(!same_model("gpt-4o", "gpt-4o2"));
    assert!(!same_model("gpt-4o", "gpt-4o-2024-8-6"));
    assert!(!same_model("smollm2", "llama"));
}

#[test]
fn a_stream_without_a_finish_is_cut() {
    let cut = end_of_stream(&StreamEnd {
        tokens: 3,
        ..StreamEnd::default()
    });
    assert!(matches!(cut, Err(Fault::Cut(_))));
    let done = end_of_stream(&StreamEnd {
        finish: Some(FinishReason::Length),
        tokens: 3,
        ..StreamEnd::default()
    })
    .expect("finished");
    assert_eq!(done.finish, Some(FinishReason::Length));
    assert_eq!(finish_reason("eos"), FinishReason::Stop);
    assert_eq!(finish_reason("length"), FinishReason::Length);
}

/// A chunk of chat content, and one that finishes with the upstream's usage.
const HELLO: &str = r#"{"model":"m-0613","choices":[{"delta":{"content":"Hello"}}]}"#;
const DONE_WITH_USAGE: &str = r#"{"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#;

/// The terms of a request with `max_tokens`, sent to the upstream or kept as the cap.
fn terms(max_tokens: u32, budget_sent: bool) -> Terms {
    Terms {
        expected_model: Some("m".into()),
        top_logprobs: 0,
        budget: if budget_sent {
            Budget::Asked(max_tokens)
        } else {
            Budget::Cap(max_tokens)
        },
        prompt_tokens: 5,
    }
}

fn answer(terms: Terms, sent: Instant) -> (AnswerSoFar, Arc<Reported>) {
    let reported = Arc::new(Reported::default());
    let answer = AnswerSoFar::new(terms, Arc::clone(&reported), TokenReader::new(None), sent);
    (answer, reported)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn content_is_handed_on_and_a_finish_with_usage_ends_the_answer_before_done() {
    let sent = Instant::now();
    let (mut answer, reported) = answer(terms(100, true), sent);
    let first = answer.on_event("", HELLO, sent + ms(100));
    assert!(first.opened && first.stop.is_none());
    assert!(matches!(first.token, Some(EngineEvent::Token { ref text, .. }) if text == "Hello"));
    assert!(answer.handed_on());
    assert_eq!(reported.model.get().map(String::as_str), Some("m-0613"));
    let second = answer.on_event("", HELLO, sent + ms(130));
    assert!(second.token.is_some() && second.stop.is_none());
    let last = answer.on_event("", DONE_WITH_USAGE, sent + ms(160));
    assert!(last.token.is_none());
    assert!(matches!(last.stop, Some(Stop::Whole { drain: true })));
    // The words still pending (no space ended them) go with a last, empty token.
    let flush = answer.flush(sent + ms(170));
    assert!(matches!(
        flush,
        Some(EngineEvent::Token { ref text, ref ids, at, .. })
            if text.is_empty() && !ids.is_empty() && at == sent + ms(170)
    ));
    let (answered, event) = answer.answered();
    assert_eq!(answered.tokens, 3, "the upstream's count");
    assert_eq!(answered.ttft_ms, Some(100.0));
    assert_eq!(answered.tpot_ms, Some(30.0));
    assert!(matches!(
        event,
        EngineEvent::Finished { reason: FinishReason::Stop, usage } if usage.prompt_tokens == 7
    ));
    assert_eq!(reported.usage_estimated.get(), None);
}

#[test]
fn an_answer_without_usage_ends_at_done_and_counts_its_chunks() {
    let sent = Instant::now();
    let (mut answer, reported) = answer(terms(100, true), sent);
    answer.on_event("", HELLO, sent + ms(10));
    let finish = r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#;
    assert!(answer.on_event("", finish, sent + ms(20)).stop.is_none());
    let done = answer.on_event("", " [DONE] ", sent + ms(30));
    assert!(matches!(done.stop, Some(Stop::Whole { drain: false })));
    let (answered, event) = answer.answered();
    assert_eq!((answered.tokens, answered.tpot_ms), (1, None));
    assert!(matches!(
        event,
        EngineEvent::Finished { reason: FinishReason::Length, usage } if usage.prompt_tokens == 5
    ));
    assert_eq!(reported.usage_estimated.get(), Some(&true));
}

#[test]
fn the_cap_ends_an_answer_the_upstream_was_not_sent_it() {
    let sent = Instant::now();
    let (mut answer, _) = answer(terms(2, false), sent);
    assert!(answer.on_event("", HELLO, sent).stop.is_none());
    let capped = answer.on_event("", HELLO, sent);
    assert!(capped.token.is_some());
    assert!(matches!(capped.stop, Some(Stop::Whole { drain: false })));
    let (_, event) = answer.answered();
    assert!(matches!(
        event,
        EngineEvent::Finished {
            reason: FinishReason::Length,
            ..
        }
    ));
}

#[test]
fn content_past_a_budget_the_upstream_was_sent_is_cut_there() {
    let sent = Instant::now();
    let (mut answer, _) = answer(terms(1, true), sent);
    assert!(
        answer.on_event("", HELLO, sent).stop.is_none(),
        "the upstream may end it"
    );
    let past = answer.on_event("", HELLO, sent);
    assert!(past.token.is_none());
    assert!(matches!(past.stop, Some(Stop::Whole { drain: false })));
}

#[test]
fn faults_stop_the_reading_and_a_refusal_comes_only_before_content() {
    let sent = Instant::now();
    let failed = |step: EventEffects| match step.stop {
        Some(Stop::Failed(fault)) => fault,
        other => panic!("not a failure: {other:?}"),
    };
    let refusal = r#"{"error":{"message":"bad top_k","param":"top_k","code":400}}"#;
    let (mut fresh, _) = answer(terms(10, true), sent);
    let refused = failed(fresh.on_event("", refusal, sent));
    assert!(matches!(refused, Fault::Refused { param: Some(ref p), .. } if p == "top_k"));
    assert!(!fresh.handed_on());
    let (mut begun, _) = answer(terms(10, true), sent);
    begun.on_event("", HELLO, sent);
    assert!(matches!(
        failed(begun.on_event("", refusal, sent)),
        Fault::Stream(_)
    ));
    let (mut other, _) = answer(terms(10, true), sent);
    let mismatch = failed(other.on_event("", r#"{"model":"n","choices":[]}"#, sent));
    assert!(matches!(mismatch, Fault::ModelMismatch { .. }));
    let (mut garbled, _) = answer(terms(10, true), sent);
    assert!(matches!(
        failed(garbled.on_event("", "{", sent)),
        Fault::Protocol(_)
    ));
    assert!(matches!(
        failed(garbled.on_event("error", "boom", sent)),
        Fault::Stream(_)
    ));
    assert!(matches!(garbled.on_body_end(), Stop::Failed(Fault::Cut(_))));
}

/// llama.cpp's server lists the end token's log-probability in a chunk of its own (no
/// text, no bytes), just before the chunk that says the answer stopped: it is not
/// content. The same entry before more content is the answer's.
#[test]
fn an_end_token_listed_in_a_chunk_before_the_stop_is_not_content() {
    const WORD: &str = r#"{"choices":[{"text":"Hi","index":0,"logprobs":{"content":[{"id":7,"token":"Hi","bytes":[72,105],"logprob":-0.1}]},"finish_reason":null}]}"#;
    const NOTHING: &str = r#"{"choices":[{"text":"","index":0,"logprobs":{"content":[{"id":2,"token":"","bytes":[],"logprob":-1.4}]},"finish_reason":null}]}"#;
    const STOP: &str = r#"{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
    let listed = |step: &EventEffects| match &step.token {
        Some(EngineEvent::Token { logprobs, .. }) => logprobs.len(),
        _ => 0,
    };
    let sent = Instant::now();
    let mut terms = terms(100, true);
    terms.expected_model = None;
    terms.top_logprobs = 1;
    let (mut stopped, _) = answer(terms.clone(), sent);
    let counts: Vec<usize> = [WORD, NOTHING, STOP]
        .iter()
        .map(|data| listed(&stopped.on_event("", data, sent + ms(10))))
        .collect();
    assert_eq!(counts, vec![1, 0, 0], "the end token is not listed");
    let (mut went_on, _) = answer(terms, sent);
    let counts: Vec<usize> = [NOTHING, WORD]
        .iter()
        .map(|data| listed(&went_on.on_event("", data, sent + ms(10))))
        .collect();
    assert_eq!(counts, vec![0, 2], "given back before the next token");
}

use super::*;

fn meta() -> ResponseMeta {
    ResponseMeta {
        id: "chatcmpl-r1".into(),
        created: 1_767_225_600,
        model: "m".into(),
        system_fingerprint: "fp_x".into(),
        shape: Shape::Chat,
        echo: None,
        native: None,
        legacy_functions: false,
        offers_tools: false,
    }
}

pub(super) fn timings() -> ResponseTimings {
    ResponseTimings {
        timings: crate::timing::Timings {
            ttft_ms: Some(1.0),
            engine_ttft_ms: None,
            tpot_ms: None,
            e2e_ms: 2.0,
            queue_ms: None,
            itl_ms: None,
            tokens_per_second: None,
            output_tokens: 1,
            chunks: 1,
            delivery_ms: None,
            client_wait_ms: None,
            upstream_ttft_ms: None,
            kinds: Default::default(),
            overhead_ms: 0.0,
        },
        quality: crate::quality::Quality {
            repetition_rate: 0.0,
            degenerated: false,
            refusal: false,
            intent: "general".into(),
            language: "und",
            answer_language: "und",
            mean_logprob: None,
            min_logprob: None,
            low_confidence_share: None,
            repetition_basis: Default::default(),
        },
        upstream: None,
    }
}

const HEAD: &str = r#"data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1767225600,"model":"m","system_fingerprint":"fp_x","choices":"#;

fn text(b: &Bytes) -> &str {
    std::str::from_utf8(b).expect("utf-8")
}

#[test]
fn frames_without_usage() {
    let mut a = ChunkAssembler::new(meta(), false);
    assert_eq!(
        text(&a.first_frame().expect("chat has a role frame")),
        format!("{HEAD}[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n")
    );
    assert_eq!(
        text(&a.token_frame("Hi \"you\"", &mut Vec::new()).expect("frame")),
        format!("{HEAD}[{{\"index\":0,\"delta\":{{\"content\":\"Hi \\\"you\\\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n")
    );
    assert!(
        a.token_frame("", &mut Vec::new()).is_none(),
        "empty tokens send nothing"
    );
    let end = a.finish_frames(
        FinishReason::Length,
        Usage {
            prompt_tokens: 3,
            completion_tokens: 1,
            cached_tokens: None,
            reasoning_tokens: None,
        },
        &timings(),
        &[],
        ("eos", None),
    );
    assert_eq!(end.len(), 2);
    assert_eq!(
        text(&end[0]),
        format!("{HEAD}[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"length\"}}],\"timings\":{{\"ttft_ms\":1.0,\"engine_ttft_ms\":null,\"tpot_ms\":null,\"e2e_ms\":2.0,\"queue_ms\":null,\"itl_ms\":null,\"tokens_per_second\":null,\"output_tokens\":1,\"chunks\":1,\"delivery_ms\":null,\"client_wait_ms\":null,\"overhead_ms\":0.0,\"repetition_rate\":0.0,\"degenerated\":false,\"refusal\":false,\"intent\":\"general\",\"language\":\"und\",\"answer_language\":\"und\",\"mean_logprob\":null,\"min_logprob\":null,\"low_confidence_share\":null}}}}\n\n")
    );
    assert_eq!(text(&end[1]), "data: [DONE]\n\n");
}

#[test]
fn frames_with_usage() {
    let mut a = ChunkAssembler::new(meta(), true);
    assert!(text(&a.first_frame().expect("role"))
        .ends_with("\"finish_reason\":null}],\"usage\":null}\n\n"));
    assert!(text(&a.token_frame("x", &mut Vec::new()).expect("frame"))
        .ends_with(",\"usage\":null}\n\n"));
    let end = a.finish_frames(
        FinishReason::Stop,
        Usage {
            prompt_tokens: 3,
            completion_tokens: 1,
            cached_tokens: None,
            reasoning_tokens: None,
        },
        &timings(),
        &[],
        ("eos", None),
    );
    assert_eq!(end.len(), 3);
    assert!(text(&end[0]).ends_with("\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"));
    assert!(text(&end[1]).starts_with(&format!("{HEAD}[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}},\"timings\":{{")));
    assert_eq!(text(&end[2]), "data: [DONE]\n\n");
}

#[test]
fn logprobs_ride_on_content_chunks_as_openai_shapes_them() {
    let mut a = ChunkAssembler::new(meta(), false).with_logprobs(true);
    let token = |t: &str| crate::tokens::TokenText::from_bytes(t.as_bytes().to_vec());
    let tokens = [TokenLogprob {
        sampled: None,
        token: token("Hi"),
        logprob: -0.5,
        top: vec![(token("Hi"), -0.5), (token("Yo"), -1.25)],
    }];
    assert_eq!(
        text(&a.token_frame("Hi", &mut tokens.to_vec()).expect("frame")),
        format!("{HEAD}[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}},\"logprobs\":{{\"content\":[{{\"token\":\"Hi\",\"logprob\":-0.5,\"bytes\":[72,105],\"top_logprobs\":[{{\"token\":\"Hi\",\"logprob\":-0.5,\"bytes\":[72,105]}},{{\"token\":\"Yo\",\"logprob\":-1.25,\"bytes\":[89,111]}}]}}],\"refusal\":null}},\"finish_reason\":null}}]}}\n\n")
    );
    assert!(text(&a.first_frame().expect("role")).contains("\"logprobs\":null"));
    let mut quiet = ChunkAssembler::new(meta(), false);
    assert!(text(
        &quiet
            .token_frame("Hi", &mut tokens.to_vec())
            .expect("frame")
    )
    .contains("\"logprobs\":null"));
    let report = timings();
    let usage = Usage::default();
    let body = serde_json::to_value(Completion::new(
        &meta(),
        "Hi",
        FinishReason::Stop,
        usage,
        &report,
        Some(&tokens),
    ))
    .expect("json");
    assert_eq!(
        body["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"],
        "Yo"
    );
}

#[test]
fn text_completions_stream_text_pieces_without_a_role() {
    let mut a = ChunkAssembler::new(
        ResponseMeta {
            id: "cmpl-r1".into(),
            shape: Shape::Text,
            ..meta()
        },
        false,
    );
    assert!(a.first_frame().is_none());
    assert_eq!(
        text(&a.token_frame("Once", &mut Vec::new()).expect("frame")),
        "data: {\"id\":\"cmpl-r1\",\"object\":\"text_completion\",\"created\":1767225600,\"model\":\"m\",\"system_fingerprint\":\"fp_x\",\"choices\":[{\"text\":\"Once\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    );
    let usage = Usage {
        prompt_tokens: 3,
        completion_tokens: 1,
        cached_tokens: None,
        reasoning_tokens: None,
    };
    let end = a.finish_frames(FinishReason::Stop, usage, &timings(), &[], ("eos", None));
    assert!(text(&end[0]).contains(
        "\"choices\":[{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":\"stop\"}]"
    ));
    let meta = ResponseMeta {
        shape: Shape::Text,
        ..meta()
    };
    let report = timings();
    let body = serde_json::to_value(Completion::new(
        &meta,
        "upon",
        FinishReason::Length,
        usage,
        &report,
        None,
    ))
    .expect("json");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], "upon");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert!(body["choices"][0].get("message").is_none());
}

#[test]
fn text_completions_echo_the_prompt_first() {
    // `echo` comes without `logprobs` (the parser refuses both), so no offsets here.
    let meta = ResponseMeta {
        shape: Shape::Text,
        echo: Some("Say:".into()),
        native: None,
        ..meta()
    };
    let mut a = ChunkAssembler::new(meta.clone(), false);
    let first = text(&a.first_frame().expect("the echo comes first")).to_owned();
    assert!(first.contains("\"text\":\"Say:\",\"index\":0,\"logprobs\":null"));
    let one = text(&a.token_frame(" hi", &mut Vec::new()).expect("frame")).to_owned();
    assert!(one.contains("\"text\":\" hi\""), "{one}");
    let report = timings();
    let body = serde_json::to_value(Completion::new(
        &meta,
        " hi!",
        FinishReason::Stop,
        Usage::default(),
        &report,
        None,
    ))
    .expect("json");
    assert_eq!(body["choices"][0]["text"], "Say: hi!");
}

#[test]
fn legacy_offsets_run_on_across_frames_and_wait_for_held_text() {
    let lp = |text: &str| TokenLogprob {
        sampled: None,
        token: crate::tokens::TokenText::from_bytes(text.as_bytes().to_vec()),
        logprob: -1.0,
        top: Vec::new(),
    };
    let meta = ResponseMeta {
        shape: Shape::Text,
        ..meta()
    };
    let mut a = ChunkAssembler::new(meta.clone(), false).with_logprobs(true);
    let one = text(
        &a.token_frame(" hi", &mut vec![lp(" h"), lp("i")])
            .expect("frame"),
    )
    .to_owned();
    assert!(one.contains("\"text_offset\":[0,2]"), "{one}");
    let two = text(&a.token_frame("!", &mut vec![lp("!")]).expect("frame")).to_owned();
    assert!(two.contains("\"tokens\":[\"!\"],\"token_logprobs\":[-1.0],\"top_logprobs\":[{\"!\":-1.0}],\"text_offset\":[3]"), "{two}");

    // With stops, text may be held back: a token waits for the frame its text is in.
    let mut held = ChunkAssembler::new(meta.clone(), false).with_logprobs(true);
    let mut waiting = vec![lp("The E")];
    let first = text(&held.token_frame("The ", &mut waiting).expect("frame")).to_owned();
    assert!(first.contains("\"logprobs\":null"), "{first}");
    assert_eq!(waiting.len(), 1, "its 'E' is still held");
    waiting.push(lp("nd"));
    let second = text(&held.token_frame("End", &mut waiting).expect("frame")).to_owned();
    assert!(second.contains("\"text_offset\":[0,5]"), "{second}");
    assert!(waiting.is_empty());

    // Tokens handed over ahead of their text go with the frames that carry it, so each
    // chunk's tokens spell its text.
    let mut ahead = ChunkAssembler::new(meta, false).with_logprobs(true);
    let mut waiting = vec![lp("."), lp(" The"), lp(" sky")];
    let first = text(&ahead.token_frame(".", &mut waiting).expect("frame")).to_owned();
    assert!(first.contains("\"tokens\":[\".\"]"), "{first}");
    assert_eq!(waiting.len(), 2);
    let second = text(&ahead.token_frame(" The", &mut waiting).expect("frame")).to_owned();
    assert!(
        second.contains("\"tokens\":[\" The\"]") && second.contains("\"text_offset\":[1]"),
        "{second}"
    );
    let third = text(&ahead.token_frame(" sky", &mut waiting).expect("frame")).to_owned();
    assert!(third.contains("\"tokens\":[\" sky\"]"), "{third}");
    assert!(waiting.is_empty());
}

#[test]
fn error_frames_are_openai_errors_then_done() {
    let frames = ChunkAssembler::new(meta(), false).error_frames(&ApiError::Engine);
    assert_eq!(
        text(&frames[0]),
        "data: {\"error\":{\"message\":\"The engine failed while generating; the error was logged with the request id\",\"type\":\"server_error\",\"param\":null,\"code\":\"engine_error\"}}\n\n"
    );
    assert_eq!(text(&frames[1]), "data: [DONE]\n\n");
}

#[test]
fn llama_cpp_frames_carry_ids_and_end_without_done() {
    let mut a = ChunkAssembler::new(
        ResponseMeta {
            native: Some(Box::default()),
            ..meta()
        },
        false,
    );
    assert!(a.first_frame().is_none(), "no role frame");
    a.tokens_arrived(&[7], "Hi");
    a.tokens_arrived(&[8, 9], " the\nend");
    // A stop sequence " the" cut the answer after "Hi": tokens 8 and 9 began after it.
    a.drop_cut_tokens(&mut Vec::new(), "Hi");
    let frame = a.token_frame("Hi", &mut Vec::new()).expect("frame");
    let frame = text(&frame);
    assert!(frame.contains("\"tokens\":[7]"), "{frame}");
    assert!(frame.contains("\"stop\":false"), "{frame}");
    let end = a.finish_frames(
        FinishReason::Stop,
        Usage::default(),
        &timings(),
        &[],
        ("word", Some(" the")),
    );
    assert_eq!(end.len(), 1, "no [DONE]");
    let last: serde_json::Value =
        serde_json::from_str(text(&end[0]).trim_start_matches("data: ").trim()).expect("json");
    assert_eq!(last["stop"], true);
    assert_eq!(last["stop_type"], "word");
    assert_eq!(last["stopping_word"], " the");
    assert_eq!(
        last["tokens"],
        serde_json::json!([]),
        "the cut ids are gone"
    );
    let errors = a.error_frames(&ApiError::Engine);
    assert_eq!(errors.len(), 1, "no [DONE] after an error either");
}

fn json_of(frame: &Bytes) -> serde_json::Value {
    serde_json::from_str(text(frame).trim_start_matches("data: ").trim()).expect("json")
}

#[test]
fn timings_per_token_put_llama_cpp_figures_in_every_content_chunk() {
    let so_far = native::LlamaTimings::new(10, 0, 40.0, 3, 20.0);
    let usage = Usage {
        prompt_tokens: 10,
        completion_tokens: 3,
        cached_tokens: Some(4),
        reasoning_tokens: None,
    };
    // Off: no timings before the last chunk, and only the gateway's there.
    let mut plain = ChunkAssembler::new(meta(), true);
    plain.timed(so_far);
    assert!(!plain.wants_timings());
    assert!(
        json_of(&plain.token_frame("x", &mut Vec::new()).expect("frame"))
            .get("timings")
            .is_none()
    );
    let end = plain.finish_frames(FinishReason::Stop, usage, &timings(), &[], ("eos", None));
    assert!(json_of(&end[1])["timings"].get("predicted_n").is_none());

    let mut a = ChunkAssembler::new(meta(), true).with_timings_per_token(true);
    assert!(a.wants_timings());
    assert!(json_of(&a.first_frame().expect("role"))
        .get("timings")
        .is_none());
    a.timed(so_far);
    let chunk = json_of(&a.token_frame("x", &mut Vec::new()).expect("frame"));
    let t = &chunk["timings"];
    assert_eq!(
        (
            &t["prompt_n"],
            &t["prompt_ms"],
            &t["predicted_n"],
            &t["predicted_ms"]
        ),
        (
            &serde_json::json!(10),
            &serde_json::json!(40.0),
            &serde_json::json!(3),
            &serde_json::json!(20.0)
        )
    );
    assert_eq!(
        t["predicted_per_token_ms"], 10.0,
        "20 ms over the 2 tokens after the first"
    );
    assert_eq!(t["predicted_per_second"], 100.0);
    assert_eq!(t["prompt_per_second"], 250.0);
    let end = a.finish_frames(FinishReason::Stop, usage, &timings(), &[], ("eos", None));
    let last = &json_of(&end[1])["timings"];
    assert_eq!(last["ttft_ms"], 1.0, "the gateway's own figures stay");
    assert_eq!(
        (&last["cache_n"], &last["prompt_n"]),
        (&serde_json::json!(4), &serde_json::json!(6))
    );
    assert_eq!(last["predicted_n"], 1, "the record's output tokens");

    // llama.cpp's shape: the frame's own timings.
    let mut native = ChunkAssembler::new(
        ResponseMeta {
            native: Some(Box::default()),
            ..meta()
        },
        false,
    )
    .with_timings_per_token(true);
    native.tokens_arrived(&[7], "Hi");
    native.timed(so_far);
    let frame = json_of(&native.token_frame("Hi", &mut Vec::new()).expect("frame"));
    assert_eq!(frame["timings"]["predicted_n"], 3, "{frame}");
}

use super::*;
use serde_json::json;

fn limits() -> RequestLimits {
    RequestLimits {
        served_model: "m".into(),
        max_tokens_cap: 100,
        default_max_tokens: 16,
    }
}

fn parse(body: Value) -> Result<ChatRequest, ApiError> {
    parse_chat_request(body.to_string().as_bytes(), &limits(), "req-1")
}

fn param_of(result: Result<ChatRequest, ApiError>) -> (String, String) {
    let error = result.expect_err("should be rejected");
    (
        error.kind().to_owned(),
        error.param().unwrap_or("").to_owned(),
    )
}

#[test]
fn minimal_request_gets_defaults() {
    let request = parse(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .expect("valid");
    assert!(!request.stream);
    assert_eq!(request.generation.max_tokens, 16);
    assert_eq!(request.generation.messages[0].role, Role::User);
    assert_eq!(request.generation.sampling, Sampling::default());
}

#[test]
fn full_request_is_carried_over() {
    let request = parse(json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
                      {"role": "user", "content": "hi"}],
        "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stop": "END", "seed": -1,
        "presence_penalty": 0.1, "frequency_penalty": -0.1, "user": "u1", "n": 1, "tools": [], "logprobs": false
    }))
    .expect("valid");
    assert!(request.stream && request.include_usage);
    assert_eq!(request.generation.messages[0].content, "be brief");
    assert_eq!(request.generation.messages[0].role, Role::System);
    assert_eq!(request.generation.max_tokens, 7);
    assert_eq!(request.generation.sampling.stop, vec!["END".to_owned()]);
    assert_eq!(request.generation.sampling.seed, Some(u64::MAX));
    assert_eq!(request.user.as_deref(), Some("u1"));
}

#[test]
fn rejections_name_the_parameter() {
    let msg = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            json!({"model": "m", "messages": msg, "n": 2}),
            "unsupported_parameter",
            "n",
        ),
        (
            json!({"model": "m", "messages": msg, "tools": [{"type": "function"}]}),
            "unsupported_parameter",
            "tools",
        ),
        (
            json!({"model": "m", "messages": msg, "logprobs": true}),
            "unsupported_parameter",
            "logprobs",
        ),
        (
            json!({"model": "m", "messages": msg, "response_format": {"type": "json_object"}}),
            "unsupported_parameter",
            "response_format",
        ),
        (
            json!({"model": "m", "messages": msg, "bogus": 1}),
            "unknown_parameter",
            "bogus",
        ),
        (
            json!({"model": "m", "messages": msg, "temperature": "hot"}),
            "invalid_value",
            "temperature",
        ),
        (
            json!({"model": "m", "messages": msg, "temperature": 3.0}),
            "invalid_value",
            "temperature",
        ),
        (
            json!({"model": "m", "messages": msg, "max_tokens": 101}),
            "invalid_value",
            "max_tokens",
        ),
        (
            json!({"model": "m", "messages": msg, "max_tokens": -1}),
            "invalid_value",
            "max_tokens",
        ),
        (
            json!({"model": "m", "messages": msg, "stop": ["a", "b", "c", "d", "e"]}),
            "invalid_value",
            "stop",
        ),
        (
            json!({"model": "m", "messages": msg, "stream_options": {"include_usage": true}}),
            "invalid_value",
            "stream_options",
        ),
        (
            json!({"model": "m", "messages": []}),
            "invalid_value",
            "messages",
        ),
        (json!({"model": "m"}), "invalid_value", "messages"),
        (
            json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}),
            "invalid_value",
            "messages[0].role",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            "invalid_value",
            "messages[0].content",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user"}]}),
            "invalid_value",
            "messages[0].content",
        ),
        (
            json!({"model": "m", "messages": [{"role": "tool", "content": "x"}]}),
            "unsupported_parameter",
            "messages[0].role",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "unsupported_parameter",
            "messages[0].content[0].type",
        ),
        (
            json!({"model": "other", "messages": msg}),
            "model_not_found",
            "model",
        ),
        (
            json!({"model": "m", "messages": msg, "store": true}),
            "unsupported_parameter",
            "store",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "x", "name": "ann"}]}),
            "unsupported_parameter",
            "messages[0].name",
        ),
    ];
    for (body, kind, param) in cases {
        let text = body.to_string();
        assert_eq!(
            param_of(parse(body)),
            (kind.to_owned(), param.to_owned()),
            "{text}"
        );
    }
}

#[test]
fn input_hash_ignores_spelling_but_not_content() {
    let a = parse(
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}),
    )
    .expect("valid");
    let b = parse(json!({"temperature": 0.5, "messages": [{"content": [{"type": "text", "text": "hi"}], "role": "user"}], "model": "m", "max_tokens": 16})).expect("valid");
    let c = parse(
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.6}),
    )
    .expect("valid");
    assert_eq!(
        a.input_hash, b.input_hash,
        "same request, other JSON spelling"
    );
    assert_ne!(a.input_hash, c.input_hash);
    assert_eq!(a.input_hash.len(), 64);
}

#[test]
fn malformed_json_is_invalid_json() {
    let error = parse_chat_request(b"{\"model\": ", &limits(), "r").expect_err("malformed");
    assert_eq!(error.kind(), "invalid_json");
    let error = parse_chat_request(b"[1]", &limits(), "r").expect_err("not an object");
    assert_eq!(error.kind(), "invalid_json");
}

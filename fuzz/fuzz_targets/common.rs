//! What the request targets share: the limits they parse under, and the checks every
//! accepted request must pass.

#![allow(dead_code)]

use std::time::Duration;

use actix_web::ResponseError;
use llmgate::api::request::{input_hash, RequestLimits, ValidatedRequest, MAX_STOP_CHARS};
use llmgate::engine::upstream::config::UpstreamConfig;
use llmgate::engine::upstream::wire::{request_body, Asks};
use llmgate::engine::GenerationRequest;
use llmgate::error::ApiError;

pub const MODEL: &str = "smollm2-135m";
pub const CAP: u32 = 2048;

pub fn limits() -> RequestLimits {
    RequestLimits::single(MODEL, CAP)
}

/// A request parser of the API: a body, its limits and a request id in, the validated
/// request or the refusal out.
pub type Parser = fn(&[u8], &RequestLimits, &str) -> Result<ValidatedRequest, ApiError>;

/// What a request target checks of one body: a refusal is in OpenAI's shape; an accepted
/// request is within every limit and, re-serialised for an upstream server, parses to the
/// same request; parsing twice gives the same answer.
pub fn check_body(parse: Parser, body: &[u8]) {
    let limits = limits();
    let first = parse(body, &limits, "fuzz");
    match &first {
        Err(error) => check_refusal(error),
        Ok(request) => {
            check_accepted(request);
            let again = parse(&upstream_body(&request.generation), &limits, "fuzz")
                .unwrap_or_else(|e| panic!("the upstream body is refused: {e:?}"));
            assert_same_generation(&request.generation, &again.generation);
        }
    }
    assert_eq!(
        first,
        parse(body, &limits, "fuzz"),
        "parsing is not deterministic"
    );
}

/// A refusal is a 4xx in OpenAI's shape, with a message that says something.
pub fn check_refusal(error: &ApiError) {
    let status = error.status_code().as_u16();
    assert!(
        (400..500).contains(&status),
        "a parse error answered {status}: {error:?}"
    );
    let body = serde_json::to_value(error.body()).expect("the error body serialises");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "an error without a message: {body}");
    assert!(
        body["error"]["type"].is_string(),
        "an error without a type: {body}"
    );
}

/// What validation promises about an accepted request.
pub fn check_accepted(request: &ValidatedRequest) {
    let g = &request.generation;
    assert!(
        g.budget.tokens() >= 1 && g.budget.tokens() <= CAP,
        "max_tokens {}",
        g.budget.tokens()
    );
    assert!(
        g.sampling.stop.len() <= 4,
        "{} stops",
        g.sampling.stop.len()
    );
    for stop in &g.sampling.stop {
        assert!(
            !stop.is_empty() && stop.chars().count() <= MAX_STOP_CHARS,
            "stop {stop:?}"
        );
    }
    assert!(g.top_logprobs.is_none_or(|n| n <= 20));
    assert_eq!(
        request.input_hash,
        input_hash(&request.model, g),
        "the hash is not the request's"
    );
}

/// The upstream engine's body for `g`: what an OpenAI-compatible server is asked.
pub fn upstream_body(g: &GenerationRequest) -> Vec<u8> {
    let config = UpstreamConfig {
        urls: vec!["http://upstream.invalid/v1".into()],
        model: MODEL.into(),
        api_key: None,
        tokenizer: None,
        logprobs: false,
        connect_timeout: Duration::from_secs(1),
        first_byte_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        probe_interval: Duration::from_secs(1),
        context_length: 8192,
        check_model: false,
        max_tokens_param: "max_tokens".into(),
        fleet: Default::default(),
    };
    let (_, body) = request_body(g, &config, Asks { logprobs: false });
    serde_json::to_vec(&body).expect("the upstream body serialises")
}

/// `a` and `b` ask the engine for the same thing: equal but for the request id, the
/// alternatives asked of the upstream (at least one) and floats within a rounding.
pub fn assert_same_generation(a: &GenerationRequest, b: &GenerationRequest) {
    let close = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * x.abs().max(1.0),
        (x, y) => x == y,
    };
    let (sa, sb) = (&a.sampling, &b.sampling);
    assert!(
        close(sa.temperature, sb.temperature),
        "temperature {sa:?} / {sb:?}"
    );
    assert!(close(sa.top_p, sb.top_p), "top_p {sa:?} / {sb:?}");
    assert!(close(sa.min_p, sb.min_p), "min_p {sa:?} / {sb:?}");
    let mut a = a.clone();
    let mut b = b.clone();
    for g in [&mut a, &mut b] {
        g.request_id.clear();
        g.sampling.temperature = None;
        g.sampling.top_p = None;
        g.sampling.min_p = None;
        g.top_logprobs = g.top_logprobs.map(|n| n.max(1));
        // How the client takes the answer is the gateway's: the upstream always streams.
        g.whole = false;
    }
    assert_eq!(
        a, b,
        "the upstream is asked something else than the client asked"
    );
}

//! The worst case of each request field within its limits: the input that costs the
//! gateway the most CPU, found by construction, timed, and checked to grow linearly
//! (or be refused with a clear error where a limit is needed).
//!
//! - a 1 MiB body nested as deep as JSON allows, and one as wide (50,000 messages);
//! - 4 stop sequences of 256 characters against a 2,048-token answer, shaped so each
//!   token leaves a near-match held back;
//! - redaction of text made only of look-alikes (card-shaped digits failing Luhn,
//!   IBAN-shaped runs, phone-like and IP-like numbers), at 64 KiB and 1 MiB;
//! - a JSON schema inside 1 MiB that compiles to the biggest grammar (many properties,
//!   long enums, deep nesting), against the default model's vocabulary;
//! - an upstream's 2,048-token stream in 1-byte chunks against the same in one chunk.
//!
//! `cargo bench --bench worst_case` prints the table (best of 3). Without `--bench` (as
//! `cargo test` runs it) each case runs once and its verdict (accepted, or refused
//! naming the parameter) is checked.

use std::hint::black_box;
use std::time::{Duration, Instant};

use actix_web::ResponseError;
use bytes::Bytes;
use futures_util::stream;
use llmgate::api::request::{parse_chat_request, RequestLimits, ValidatedRequest};
use llmgate::engine::gguf::GgufFacts;
use llmgate::engine::upstream::stream::events_of;
use llmgate::engine::{EngineEvent, ResponseFormat};
use llmgate::error::ApiError;
use llmgate::redact::{Mode, RedactionCounts, Redactor};
use llmgate::stream::stops::StopScreen;
use serde_json::{json, Value};

const MIB: usize = 1 << 20;

fn best_of<T>(rounds: usize, mut run: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..rounds {
        let started = Instant::now();
        let out = black_box(run());
        best = best.min(started.elapsed());
        last = Some(out);
    }
    (best, last.expect("at least one round"))
}

fn row(case: &str, size: &str, took: Duration, verdict: &str) {
    println!(
        "{case:<44} {size:>10} {:>11.3} ms  {verdict}",
        took.as_secs_f64() * 1e3
    );
}

fn limits() -> RequestLimits {
    RequestLimits::single("m", 2048)
}

fn verdict(result: &Result<ValidatedRequest, ApiError>) -> String {
    match result {
        Ok(_) => "accepted".into(),
        Err(e) => {
            let body = serde_json::to_value(e.body()).expect("error body");
            format!(
                "{} {} ({})",
                e.status_code(),
                body["error"]["code"].as_str().unwrap_or(""),
                body["error"]["param"].as_str().unwrap_or("-")
            )
        }
    }
}

fn bodies(rounds: usize) {
    // As deep as fits: `[` x ~1 MiB in a field the parser must look at.
    let deep = format!(
        "{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\"metadata\":{}{}}}",
        "[".repeat(MIB / 2 - 64),
        "]".repeat(MIB / 2 - 64)
    );
    let (took, result) = best_of(rounds, || {
        parse_chat_request(deep.as_bytes(), &limits(), "w")
    });
    row("body: nesting 1 MiB deep", "1 MiB", took, &verdict(&result));
    assert!(
        result.is_err(),
        "a body nested 500,000 deep must be refused"
    );

    let many: Vec<Value> = (0..50_000)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "hi"}))
        .collect();
    let (size, took, result) = parse_messages(rounds, &many);
    row("body: 50,000 messages", &size, took, &verdict(&result));
    let (size, took_half, _) = parse_messages(rounds, &many[..25_000]);
    row("body: 25,000 messages", &size, took_half, "linear check");
}

/// Times the parse of a chat body made of `messages`: the body's size in KiB, the best
/// time of `rounds` and the parser's answer.
fn parse_messages(
    rounds: usize,
    messages: &[Value],
) -> (String, Duration, Result<ValidatedRequest, ApiError>) {
    let body = serde_json::to_vec(&json!({"model": "m", "messages": messages})).expect("body");
    let (took, result) = best_of(rounds, || parse_chat_request(&body, &limits(), "w"));
    (format!("{} KiB", body.len() >> 10), took, result)
}

fn stops(rounds: usize) {
    // Each stop is 255 'a's and a 'b'; the answer is 'a's: after every token the held
    // text ends in a 255-byte near-match, the longest a 256-character stop allows.
    let stops: Vec<String> = (0..4)
        .map(|i| format!("{}{}", "a".repeat(255), (b'b' + i) as char))
        .collect();
    let run = |tokens: usize| {
        let mut screen = StopScreen::new(&stops);
        let mut sent = 0;
        for _ in 0..tokens {
            sent += screen.push("aaaa").text.len();
        }
        sent + screen.finish().len()
    };
    let (took, sent) = best_of(rounds, || run(2048));
    assert_eq!(sent, 2048 * 4);
    row(
        "stops: 4 x 256 chars, 2,048 tokens",
        "2048 tok",
        took,
        &format!("{:.2} us/token", took.as_secs_f64() * 1e6 / 2048.0),
    );
    let (took, _) = best_of(rounds, || run(1024));
    row(
        "stops: 4 x 256 chars, 1,024 tokens",
        "1024 tok",
        took,
        "linear check",
    );
}

fn look_alikes(bytes: usize) -> String {
    let shapes = [
        "4111 1111 1111 1112 ",         // card-shaped, fails Luhn
        "GB82 WEST 1234 5698 7654 33 ", // IBAN-shaped, bad check digits
        "999.1.1.1 ",
        "+1 ",
        "00 44 20 79 ",
        "123-45-678 ",
        "1.2.3.4.5.6.7.8 ",
        "fe80:: ",
        "bearer of bad news ",
        "sk-short ",
        "a@b ",
    ];
    let mut text = String::with_capacity(bytes + 64);
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(shapes[i % shapes.len()]);
        i += 1;
    }
    text.truncate(bytes);
    text
}

fn redaction(rounds: usize) {
    let redactor = Redactor::new(Mode::Placeholder);
    for size in [64 << 10, MIB] {
        let text = look_alikes(size);
        let (took, replaced) = best_of(rounds, || {
            let mut counts = RedactionCounts::default();
            redactor.redact(&text, &mut counts);
            counts
        });
        let label = if size == MIB {
            "1 MiB".to_owned()
        } else {
            "64 KiB".to_owned()
        };
        row(
            "redaction: look-alikes only",
            &label,
            took,
            &format!(
                "{:.1} MB/s, {} replaced",
                size as f64 / took.as_secs_f64() / 1e6,
                replaced.total()
            ),
        );
    }
}

fn grammar(rounds: usize) {
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(llmgate::config::DEFAULT_MODEL_PATH);
    let Ok(vocabulary) = GgufFacts::read(&model)
        .map_err(anyhow::Error::from)
        .and_then(|f| f.vocabulary())
    else {
        println!("(no model file: the grammar cases need scripts/fetch-model)");
        return;
    };
    let wide = |properties: usize| {
        let props: serde_json::Map<String, Value> = (0..properties)
            .map(|i| {
                let values: Vec<String> = (0..20).map(|v| format!("value-{i}-{v}")).collect();
                (format!("field_{i}"), json!({"enum": values}))
            })
            .collect();
        let required: Vec<&String> = props.keys().collect();
        json!({"type": "object", "properties": props, "required": required})
    };
    let mut deep = json!({"type": "string"});
    for _ in 0..100 {
        deep = json!({"type": "object", "properties": {"x": deep, "y": {"type": "array", "items": {"type": "integer"}}}, "required": ["x", "y"]});
    }
    for (case, schema) in [
        ("grammar: 500 required properties x 20 enums", wide(500)),
        ("grammar: 2,000 required properties x 20 enums", wide(2000)),
        ("grammar: 3,000 required properties x 20 enums", wide(3000)),
        ("grammar: nested 100 deep", deep),
        (
            "grammar: pattern ^(a{1,100}){1,100}$",
            json!({"type": "string", "pattern": "^(a{1,100}){1,100}$"}),
        ),
        (
            "grammar: pattern ^[a-z]{1000}[0-9]{1000}$",
            json!({"type": "string", "pattern": "^[a-z]{1000}[0-9]{1000}$"}),
        ),
        (
            "grammar: anyOf 2,000 long constants",
            json!({"anyOf": (0..2000).map(|i| json!({"const": format!("{i}-{}", "x".repeat(200))})).collect::<Vec<_>>()}),
        ),
    ] {
        let size = serde_json::to_vec(&schema).expect("schema").len();
        let format = ResponseFormat::JsonSchema(schema);
        let (took, result) = best_of(rounds, || vocabulary.compile(&format));
        let verdict = match result {
            Ok(Some(grammar)) => format!("compiled; mask {}", mask_cost(&grammar)),
            Ok(None) => "free text".to_owned(),
            Err(e) => format!("refused: {e}"),
        };
        row(
            case,
            &format!("{} KiB", size >> 10),
            took,
            &verdict.chars().take(90).collect::<String>(),
        );
    }
}

/// The grammar's per-token cost: masking SmolLM2's 49,152 logits, then taking the
/// lowest allowed id, for up to 32 tokens.
fn mask_cost(grammar: &llmgate::engine::grammar::Grammar) -> String {
    let mut logits = vec![0.0f32; 49_152];
    let started = Instant::now();
    let mut steps = 0u32;
    for _ in 0..32 {
        logits.fill(0.0);
        if grammar.mask(&mut logits).is_err() {
            break;
        }
        let Some(id) = logits.iter().position(|l| l.is_finite()) else {
            break;
        };
        steps += 1;
        if grammar.consume(id as u32).is_err() {
            break;
        }
    }
    let per = started.elapsed().as_secs_f64() * 1e3 / f64::from(steps.max(1));
    format!("{per:.3} ms/token over {steps} tokens")
}

fn answer(tokens: usize) -> Vec<u8> {
    let mut body = Vec::new();
    for i in 0..tokens {
        let frame = json!({"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {"content": format!("t{i} ")}, "finish_reason": null}]});
        body.extend_from_slice(format!("data: {frame}\n\n").as_bytes());
    }
    let last = json!({"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}});
    body.extend_from_slice(format!("data: {last}\n\ndata: [DONE]\n\n").as_bytes());
    body
}

fn sse(rounds: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let body = answer(2048);
    for (case, chunk) in [
        ("sse: 2,048 tokens, one chunk", body.len()),
        ("sse: 2,048 tokens, 1-byte chunks", 1),
    ] {
        let (took, events) = best_of(rounds, || {
            let chunks: Vec<Result<Bytes, String>> = body
                .chunks(chunk)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            runtime.block_on(events_of(Box::pin(stream::iter(chunks)), u32::MAX, 0))
        });
        let tokens = events
            .iter()
            .filter(|e| matches!(e, EngineEvent::Token { .. }))
            .count();
        assert!(
            matches!(events.last(), Some(EngineEvent::Finished { .. })),
            "{case}"
        );
        row(
            case,
            &format!("{} KiB", body.len() >> 10),
            took,
            &format!("{tokens} token events"),
        );
    }
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let rounds = if benchmarking { 3 } else { 1 };
    println!("{:<44} {:>10} {:>14}  result", "case", "size", "time");
    bodies(rounds);
    stops(rounds);
    redaction(rounds);
    grammar(rounds);
    sse(rounds);
}

use std::time::UNIX_EPOCH;

use super::*;
use crate::redact::Mode;

fn record() -> RequestRecord {
    crate::record::sample()
}

/// The settings of a gateway left at its defaults, with excerpts or not.
fn settings(stats_only: bool) -> DocumentSettings {
    DocumentSettings {
        namespace: "default".into(),
        excerpt_chars: 512,
        stats_only,
    }
}

/// The hash key of the documents below (a gateway's own, or its redaction key).
const HASH_KEY: &[u8] = b"a-test-hash-key";

/// The document of `r` under `id`, stamped with its own arrival, redacted without a
/// redaction key, its hashes keyed with [`HASH_KEY`].
fn document(r: &RequestRecord, id: &str, settings: &DocumentSettings) -> RedactedLog {
    let redactor = Redactor::default().with_hash_key(HASH_KEY);
    RedactedLog::build(r, id.into(), r.received_at, &redactor, settings)
}

#[test]
fn encodes_a_bulk_pair_byte_for_byte() {
    let doc = document(&record(), "0123abcd", &settings(false));
    let encoded = doc.encode().expect("encode");
    let expected = concat!(
        r#"{"create":{"_id":"0123abcd"}}"#,
        "\n",
        r#"{"@timestamp":"2025-11-30T00:00:00.123Z","#,
        r#""event":{"id":"0123abcd","kind":"event","category":["web"],"type":["access"],"dataset":"llmgate.requests","outcome":"success","duration":170500000},"#,
        r#""service":{"name":"llmgate","version":""#,
        env!("CARGO_PKG_VERSION"),
        r#""},"trace":{"id":"4bf92f3577b34da6a3ce929d0e0e4736"},"span":{"id":"00f067aa0ba902b7"},"#,
        // The client's `user`, keyed like the hashes below.
        r#""user":{"hash":"462a527eb2314d2ceae6bc9268e831ef1809d0d04afc2d5e1bb7a3183ca831bd"},"#,
        r#""gen_ai":{"operation":{"name":"chat"},"provider":{"name":"llmgate"},"#,
        r#""request":{"model":"smollm2","max_tokens":3,"temperature":0.5,"seed":42},"#,
        r#""response":{"id":"chatcmpl-req-1","model":"smollm2","finish_reasons":["length"]},"#,
        r#""usage":{"input_tokens":12,"output_tokens":3}},"#,
        r#""llm":{"request_id":"req-1","api_key_id":"ci-bot","status":"ok","stream":true,"ttft_ms":120.5,"engine_ttft_ms":118.25,"#,
        r#""tpot_ms":21.0,"e2e_ms":170.5,"overhead_ms":0.0,"queue_ms":1.5,"client_wait_ms":0.25,"itl":{"p50_ms":21.0,"p95_ms":22.0,"max_ms":22.0},"#,
        r#""chunks":3,"delivery":{"p50_ms":0.05,"p95_ms":0.08,"max_ms":0.08},"#,
        r#""tokens_per_second":17.595,"repetition_rate":0.0,"mean_logprob":-0.42,"min_logprob":-2.5,"low_confidence_share":0.0,"degenerated":false,"refusal":false,"#,
        r#""intent":"general","language":"eng","answer_language":"eng","#,
        // HMAC-SHA256 under HASH_KEY of the record's digests ("in", "out").
        r#""input_hash":"961486e955cc90e31fa03f7b1c89d61842215f05f978a350bbc365d0505f5a6e","#,
        r#""output_hash":"77e3c12cbfd4959aa4fb779c8e7eaca4c448d37fc1abbf94ffe86e972af31fed","#,
        r#""system_fingerprint":"fp_1","#,
        r#""model":{"sha256":"0c1d","quant":"Q8_0","device":"cpu/quantized","context_length":8192},"#,
        r#""build":{"commit":""#,
        env!("LLMGATE_GIT_COMMIT"),
        r#"","target_features":""#,
        env!("LLMGATE_TARGET_FEATURES"),
        r#""},"#,
        r#""prompt_excerpt":"Mail me at <EMAIL>","response_excerpt":"Sure.","#,
        r#""redactions":{"email":1},"redactions_total":1},"#,
        r#""data_stream":{"type":"logs","dataset":"llmgate.requests","namespace":"default"}}"#,
        "\n"
    );
    assert_eq!(
        std::str::from_utf8(&encoded.lines).expect("utf-8"),
        expected
    );
    assert_eq!(encoded.id, "0123abcd");
}

#[test]
fn stats_only_keeps_no_excerpt_but_counts_and_hashes() {
    let doc = document(&record(), "id", &settings(true));
    let json = serde_json::to_value(&doc).expect("json");
    let llm = &json["llm"];
    assert!(llm.get("prompt_excerpt").is_none() && llm.get("response_excerpt").is_none());
    assert_eq!(llm["redactions"]["email"], 1, "still counted");
    assert_eq!(
        llm["input_hash"],
        crate::redact::HashKey::new(HASH_KEY).hash("in")
    );
    assert_eq!(llm["repetition_rate"], 0.0);
    let text = String::from_utf8(doc.encode().expect("encode").lines.to_vec()).expect("utf-8");
    assert!(
        !text.contains("Mail me") && !text.contains("Sure."),
        "{text}"
    );
}

#[test]
fn the_user_field_is_kept_only_as_a_keyed_hash() {
    let settings = settings(false);
    let build = |redactor: &Redactor| {
        let doc = RedactedLog::build(&record(), "x".into(), UNIX_EPOCH, redactor, &settings);
        serde_json::to_value(&doc).expect("json")
    };
    // Without a key, nothing: an unkeyed hash of an address is reversed by guessing.
    let unkeyed = build(&Redactor::default());
    assert!(unkeyed.get("user").is_none());
    assert!(
        unkeyed["llm"].get("input_hash").is_none() && unkeyed["llm"].get("output_hash").is_none()
    );
    let keyed = Redactor::new(Mode::KeyedHash(b"a-redaction-key-of-16+".to_vec()));
    let value = build(&keyed);
    let hash = value["user"]["hash"].as_str().expect("user.hash");
    assert_eq!(hash.len(), 64);
    assert!(!value.to_string().contains("jane@example.com"));
    // The same address inside the prompt gets the hash's first 12 digits as its token.
    let excerpt = value["llm"]["prompt_excerpt"].as_str().expect("excerpt");
    assert_eq!(excerpt, format!("Mail me at <EMAIL:{}>", &hash[..12]));
}

#[test]
fn failed_requests_carry_their_error_type_and_no_response() {
    let mut r = record();
    r.status = Status::Error;
    r.error_kind = Some("context_length_exceeded");
    r.quality = None;
    r.finish_reason = None;
    let settings = DocumentSettings {
        namespace: "prod".into(),
        excerpt_chars: 8,
        stats_only: false,
    };
    let doc = document(&r, "x", &settings);
    let value = serde_json::to_value(&doc).expect("json");
    assert_eq!(value["error"]["type"], "context_length_exceeded");
    assert_eq!(value["event"]["outcome"], "failure");
    assert!(value["gen_ai"].get("response").is_none());
    assert_eq!(value["data_stream"]["namespace"], "prod");
    // Redacted first, then cut to 8 characters, the ellipsis included.
    assert_eq!(value["llm"]["prompt_excerpt"], "Mail me…");
    assert_eq!(value["llm"]["redactions"]["email"], 1);
}

#[test]
fn an_upstream_answer_names_the_upstream_and_what_stood_in_for_its_tokens() {
    let mut r = record();
    r.model = "llama".into();
    r.timings.upstream_ttft_ms = Some(95.5);
    if let Some(q) = r.quality.as_mut() {
        q.repetition_basis = crate::tokens::RepetitionBasis::Tokenizer;
    }
    r.served = Some(std::sync::Arc::new(crate::engine::ModelInfo {
        id: "llama".into(),
        device: "upstream".into(),
        upstream: Some(crate::engine::UpstreamFacts {
            url: "http://vllm:8000/v1".into(),
            model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        }),
        ..crate::engine::ModelInfo::default()
    }));
    r.upstream = Some(crate::record::UpstreamRecord {
        model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
        system_fingerprint: Some("fp_vllm".into()),
        usage_estimated: true,
        endpoint: Some("http://10.0.0.2:8000/v1".into()),
        attempts: vec![
            crate::engine::Attempt {
                endpoint: "http://10.0.0.1:8000/v1".into(),
                error_type: Some("upstream_unreachable"),
                ttft_ms: None,
                tpot_ms: None,
            },
            crate::engine::Attempt {
                endpoint: "http://10.0.0.2:8000/v1".into(),
                error_type: None,
                ttft_ms: Some(80.0),
                tpot_ms: Some(20.0),
            },
        ],
    });
    let doc = document(&r, "id", &settings(false));
    let json = serde_json::to_value(&doc).expect("json");
    assert_eq!(json["gen_ai"]["request"]["model"], "llama", "the served id");
    assert_eq!(
        json["gen_ai"]["response"]["model"], "meta-llama/Llama-3.1-8B-Instruct",
        "what the upstream said"
    );
    assert_eq!(json["llm"]["upstream_ttft_ms"], 95.5);
    assert_eq!(json["llm"]["repetition_basis"], "tokenizer");
    assert_eq!(json["llm"]["model"]["upstream_url"], "http://vllm:8000/v1");
    assert_eq!(
        json["llm"]["upstream"],
        serde_json::json!({"model": "meta-llama/Llama-3.1-8B-Instruct", "system_fingerprint": "fp_vllm", "usage_estimated": true,
            "endpoint": "http://10.0.0.2:8000/v1", "attempts": 2,
            "failed_attempts": [{"endpoint": "http://10.0.0.1:8000/v1", "error_type": "upstream_unreachable"}]})
    );
    // The in-process record above says none of it.
    let local = serde_json::to_value(document(&record(), "id", &settings(false))).expect("json");
    assert!(
        local["llm"].get("repetition_basis").is_none() && local["llm"].get("upstream").is_none()
    );
}

/// Issue 61's attack: the excerpt gives the words around a redacted phone number, and a
/// plain SHA-256 of the text gave the number back after a few thousand guesses. The
/// stored hashes are keyed: the same guesses find nothing without the key, and find the
/// number with it (so the search would have succeeded on a plain hash).
#[test]
fn a_redacted_value_cannot_be_recovered_from_the_stored_hashes_without_the_key() {
    use crate::engine::{ChatMessage, GenerationRequest, Prompt, Role};
    let said = |number: u64| format!("请回拨{number}");
    let request = |text: String| GenerationRequest {
        prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, text)]),
        ..GenerationRequest::default()
    };
    let input_digest = |number| crate::api::request::input_hash("smollm2", &request(said(number)));
    let secret_number = 13_812_345_678;
    let mut r = record();
    r.prompt = Some(said(secret_number));
    r.input_hash = Some(input_digest(secret_number));
    r.output_hash = Some(crate::record::output_hash(&said(secret_number)));
    let doc = serde_json::to_value(document(&r, "x", &settings(false))).expect("json");
    assert_eq!(
        doc["llm"]["prompt_excerpt"], "请回拨<PHONE>",
        "what an attacker reads"
    );
    let stored_in = doc["llm"]["input_hash"].as_str().expect("input_hash");
    let stored_out = doc["llm"]["output_hash"].as_str().expect("output_hash");
    // Every number around the true one, as the attacker tries them.
    let guesses = 13_812_340_000..13_812_350_000;
    let plain_hit = guesses.clone().find(|&n| {
        input_digest(n) == stored_in || crate::record::output_hash(&said(n)) == stored_out
    });
    assert_eq!(
        plain_hit, None,
        "found from the stored hashes without the key"
    );
    let key = crate::redact::HashKey::new(HASH_KEY);
    let keyed_hit = guesses
        .clone()
        .find(|&n| key.hash(&input_digest(n)) == stored_in);
    assert_eq!(
        keyed_hit,
        Some(secret_number),
        "with the key, the same search finds it"
    );
}

#[test]
fn an_agents_turn_keeps_its_tools_and_times_with_the_arguments_redacted() {
    let mut r = record();
    r.timings.kinds.tool_call_ttft_ms = Some(40.5);
    r.timings.kinds.tool_calls_done_ms = Some(61.0);
    r.timings.kinds.reasoning_ms = Some(900.0);
    r.timings.kinds.reasoning_tokens = Some(30);
    r.agent = Some(crate::record::AgentRecord {
        offered: vec!["send_mail".into(), "get_time".into()],
        calls: vec![crate::engine::ToolCall {
            id: "call_1".into(),
            name: "send_mail".into(),
            arguments: r#"{"to":"jane.doe@example.com","body":"hi"}"#.into(),
        }],
        reasoning_chars: 120,
    });
    let json = serde_json::to_value(document(&r, "id", &settings(false))).expect("json");
    let llm = &json["llm"];
    assert_eq!(llm["tool_call_ttft_ms"], 40.5);
    assert_eq!(llm["tool_calls_done_ms"], 61.0);
    assert_eq!(llm["reasoning_ms"], 900.0);
    assert_eq!(llm["reasoning_tokens"], 30);
    assert_eq!(llm["reasoning_chars"], 120);
    let tools = &llm["tools"];
    assert_eq!(
        tools["offered"],
        serde_json::json!(["send_mail", "get_time"])
    );
    assert_eq!(tools["called"], serde_json::json!(["send_mail"]));
    assert_eq!(tools["calls"], 1);
    assert_eq!(tools["argument_bytes"], 41);
    let excerpt = tools["arguments_excerpt"].as_str().expect("excerpt");
    assert!(excerpt.starts_with("send_mail("), "{excerpt}");
    assert!(!excerpt.contains("jane.doe"), "redacted: {excerpt}");
    assert!(llm["redactions_total"].as_u64() >= Some(1));
    // Stats only: the names and sizes stay, the excerpt goes.
    let stats = serde_json::to_value(document(&r, "id", &settings(true))).expect("json");
    assert!(stats["llm"]["tools"].get("arguments_excerpt").is_none());
    assert_eq!(stats["llm"]["tools"]["calls"], 1);
    // A plain answer has none of these fields.
    let plain = serde_json::to_value(document(&record(), "id", &settings(false))).expect("json");
    for field in [
        "tools",
        "reasoning_ms",
        "tool_call_ttft_ms",
        "answer_ttft_ms",
    ] {
        assert!(plain["llm"].get(field).is_none(), "{field}");
    }
}

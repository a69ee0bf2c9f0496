use super::chat::KNOWN;
use super::*;
use crate::engine::grammar::SCHEMA_PARAM;
use crate::engine::{ChatMessage, Role};
use serde_json::json;

pub(super) fn limits() -> RequestLimits {
    let mut limits = RequestLimits::single("m", 100);
    limits.models[0].default_max_tokens = Some(16);
    limits
}

fn messages(request: &ValidatedRequest) -> &[ChatMessage] {
    match &request.generation.prompt {
        Prompt::Chat(messages) => messages,
        Prompt::Text(_) | Prompt::Tokens(_) => panic!("a chat request"),
    }
}

/// A chat request to `m` of one user message, "hi", with `extra`'s fields added (or in
/// place of the defaults).
fn chat_body(extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for (key, value) in extra.as_object().expect("object") {
        body[key] = value.clone();
    }
    body
}

fn parse(body: Value) -> Result<ValidatedRequest, ApiError> {
    parse_chat_request(body.to_string().as_bytes(), &limits(), "req-1")
}

fn param_of(result: Result<ValidatedRequest, ApiError>) -> (String, String) {
    let error = result.expect_err("should be rejected");
    (
        error.kind().to_owned(),
        error.param().unwrap_or("").to_owned(),
    )
}

#[test]
fn minimal_request_gets_defaults() {
    let request = parse(chat_body(json!({}))).expect("valid");
    assert!(!request.stream);
    assert_eq!(request.generation.budget, Budget::ModelDefault(16));
    assert_eq!(messages(&request)[0].role, Role::User);
    assert_eq!(request.generation.sampling, Sampling::default());
}

#[test]
fn model_defaults_fill_only_what_the_request_leaves_out() {
    let mut limits = limits();
    limits.models[0].default_temperature = Some(0.7);
    limits.models[0].default_top_p = Some(0.9);
    let parse = |extra: Value| {
        let body = chat_body(extra);
        parse_chat_request(body.to_string().as_bytes(), &limits, "req-1").expect("valid")
    };
    let sampling = |r: &ValidatedRequest| {
        (
            r.generation.sampling.temperature,
            r.generation.sampling.top_p,
        )
    };
    let left_out = parse(json!({}));
    assert_eq!(sampling(&left_out), (Some(0.7), Some(0.9)));
    let set = parse(json!({"temperature": 0, "top_p": 1}));
    assert_eq!(
        sampling(&set),
        (Some(0.0), Some(1.0)),
        "a client's value is kept"
    );
    let null = parse(json!({"temperature": null}));
    assert_eq!(sampling(&null).0, Some(0.7), "null is left out");
    assert_ne!(
        left_out.input_hash,
        parse_chat_request(
            chat_body(json!({})).to_string().as_bytes(),
            &super::tests::limits(),
            "req-2"
        )
        .expect("valid")
        .input_hash,
        "the hash is of what the model sees, defaults applied"
    );
}

#[test]
fn a_default_seed_seeds_only_a_request_that_sets_none() {
    let mut limits = limits();
    limits.models[0].default_seed = Some(42);
    let seed = |extra: Value| {
        parse_chat_request(chat_body(extra).to_string().as_bytes(), &limits, "r")
            .expect("valid")
            .generation
            .sampling
            .seed
    };
    assert_eq!(seed(json!({})), Some(42));
    assert_eq!(seed(json!({"seed": null})), Some(42));
    assert_eq!(seed(json!({"seed": 7})), Some(7), "the client's wins");
    let plain = parse(chat_body(json!({}))).expect("valid");
    assert_eq!(
        plain.generation.sampling.seed, None,
        "none configured: random"
    );
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
    assert_eq!(messages(&request)[0].content, "be \nbrief");
    assert_eq!(messages(&request)[0].role, Role::System);
    assert_eq!(request.generation.budget, Budget::Asked(7));
    assert_eq!(request.generation.sampling.stop, vec!["END".to_owned()]);
    assert_eq!(request.generation.sampling.seed, Some(u64::MAX));
    assert_eq!(request.user.as_deref(), Some("u1"));
}

#[test]
fn n_asks_for_that_many_choices() {
    let choices = |extra: Value| parse(chat_body(extra)).expect("valid").choices;
    assert_eq!(choices(json!({})), 1);
    assert_eq!(choices(json!({"n": 1})), 1);
    assert_eq!(choices(json!({"n": 8})), 8);
}

#[test]
fn rejections_name_the_parameter() {
    let cases = [
        (chat_body(json!({"n": 9})), "invalid_value", "n"),
        (chat_body(json!({"n": 0})), "invalid_value", "n"),
        (chat_body(json!({"n": 1.5})), "invalid_value", "n"),
        (
            chat_body(json!({"n": 2, "stream": true,
                "stream_options": {"include_usage": true, "continuous_usage_stats": true}})),
            "invalid_value",
            "stream_options.continuous_usage_stats",
        ),
        (
            chat_body(json!({"tools": [{"type": "function"}]})),
            "invalid_value",
            "tools[0].function",
        ),
        (
            chat_body(json!({"logprobs": true, "top_logprobs": 21})),
            "invalid_value",
            "top_logprobs",
        ),
        (
            chat_body(json!({"top_logprobs": 3})),
            "invalid_value",
            "top_logprobs",
        ),
        (
            chat_body(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "no spaces"}}}),
            ),
            "invalid_value",
            "response_format.json_schema.name",
        ),
        (
            chat_body(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}}),
            ),
            "invalid_value",
            "response_format.json_schema.schema",
        ),
        (
            chat_body(json!({"response_format": {"type": "yaml"}})),
            "invalid_value",
            "response_format.type",
        ),
        (
            chat_body(json!({"response_format": {"type": "json_object", "x": 1}})),
            "invalid_value",
            "response_format",
        ),
        (
            chat_body(json!({"response_format": {"type": "text", "schema": {}}})),
            "invalid_value",
            "response_format",
        ),
        (chat_body(json!({"top_k": 0})), "invalid_value", "top_k"),
        (chat_body(json!({"min_p": 1.5})), "invalid_value", "min_p"),
        (
            chat_body(json!({"repetition_penalty": 0})),
            "invalid_value",
            "repetition_penalty",
        ),
        (chat_body(json!({"bogus": 1})), "unknown_parameter", "bogus"),
        (
            chat_body(json!({"temperature": "hot"})),
            "invalid_value",
            "temperature",
        ),
        (
            chat_body(json!({"temperature": 3.0})),
            "invalid_value",
            "temperature",
        ),
        (
            chat_body(json!({"max_tokens": 101})),
            "invalid_value",
            "max_tokens",
        ),
        (
            chat_body(json!({"max_tokens": -1})),
            "invalid_value",
            "max_tokens",
        ),
        (
            chat_body(json!({"stop": ["a", "b", "c", "d", "e"]})),
            "invalid_value",
            "stop",
        ),
        (
            chat_body(json!({"stop": ["é".repeat(257)]})),
            "invalid_value",
            "stop",
        ),
        (
            chat_body(json!({"stream_options": {"include_usage": true}})),
            "invalid_value",
            "stream_options",
        ),
        (
            chat_body(json!({"messages": []})),
            "invalid_value",
            "messages",
        ),
        (json!({"model": "m"}), "invalid_value", "messages"),
        (
            chat_body(json!({"messages": [{"role": "wizard", "content": "x"}]})),
            "invalid_value",
            "messages[0].role",
        ),
        (
            chat_body(json!({"messages": [{"role": "user", "content": 5}]})),
            "invalid_value",
            "messages[0].content",
        ),
        (
            chat_body(json!({"messages": [{"role": "user"}]})),
            "invalid_value",
            "messages[0].content",
        ),
        (
            chat_body(json!({"messages": [{"role": "tool", "content": "x"}]})),
            "invalid_value",
            "messages[0].tool_call_id",
        ),
        (
            chat_body(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            "invalid_value",
            "messages[0].content[0].image_url",
        ),
        (
            chat_body(json!({"messages": [{"role": "user", "content": [{"type": "video"}]}]})),
            "invalid_value",
            "messages[0].content[0].type",
        ),
        (
            chat_body(json!({"model": "other"})),
            "model_not_found",
            "model",
        ),
        (
            chat_body(json!({"store": true})),
            "unsupported_parameter",
            "store",
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
    let a = parse(chat_body(json!({"temperature": 0.5}))).expect("valid");
    let b = parse(json!({"temperature": 0.5, "messages": [{"content": [{"type": "text", "text": "hi"}], "role": "user"}], "model": "m", "max_tokens": 16})).expect("valid");
    let c = parse(chat_body(json!({"temperature": 0.6}))).expect("valid");
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

// Fuzzing the parser that faces every client: property tests with many cases (cargo-fuzz
// needs a nightly toolchain). Whatever arrives, the parser answers without panicking,
// refusals are OpenAI-shaped 4xx errors, and what it accepts is within the limits.
mod fuzz {
    use super::*;
    use actix_web::ResponseError;
    use proptest::prelude::*;

    /// Keys inside messages, stream options and response formats; the top-level ones are
    /// the parser's own lists, so generated objects often hit the real fields.
    const NESTED: &[&str] = &[
        "role",
        "content",
        "type",
        "text",
        "name",
        "include_usage",
        "json_schema",
        "schema",
    ];

    fn top_level() -> Vec<&'static str> {
        [COMMON, KNOWN, EXTENSIONS].concat()
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            2 => prop::sample::select(top_level()).prop_map(str::to_owned),
            1 => prop::sample::select(NESTED).prop_map(str::to_owned),
            1 => "[a-z_]{1,8}",
        ]
    }

    /// Any JSON value, a few levels deep.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e20f64..1e20).prop_map(Value::from),
            prop::sample::select(vec![
                "m",
                "user",
                "system",
                "assistant",
                "developer",
                "text"
            ])
            .prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(key(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn valid() -> Map<String, Value> {
        let Value::Object(map) = json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8, "temperature": 0.7, "stop": ["x"], "stream": true
        }) else {
            unreachable!()
        };
        map
    }

    /// A refusal is a client error in OpenAI's shape.
    fn check_refusal(error: &ApiError) -> Result<(), TestCaseError> {
        let status = error.status_code().as_u16();
        prop_assert!((400..500).contains(&status), "{status}: {error}");
        let body = serde_json::to_value(error.body()).expect("body serialises");
        prop_assert!(body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        prop_assert!(body["error"]["type"].is_string() && body["error"]["code"].is_string());
        Ok(())
    }

    /// What is accepted is within the limits.
    fn check_accepted(request: &ValidatedRequest) -> Result<(), TestCaseError> {
        let g = &request.generation;
        prop_assert!((1..=limits().models[0].max_tokens_cap).contains(&g.budget.tokens()));
        prop_assert!(!messages(request).is_empty());
        prop_assert!(g
            .sampling
            .temperature
            .is_none_or(|t| (0.0..=2.0).contains(&t)));
        prop_assert!(g.sampling.top_p.is_none_or(|p| p > 0.0 && p <= 1.0));
        prop_assert!(g.sampling.stop.len() <= 4);
        prop_assert!(g
            .sampling
            .stop
            .iter()
            .all(|s| !s.is_empty() && s.chars().count() <= MAX_STOP_CHARS));
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn any_bytes_get_an_answer(body in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Err(error) = parse_chat_request(&body, &limits(), "req-1") {
                check_refusal(&error)?;
            }
        }

        #[test]
        fn any_json_gets_an_answer(value in json_value()) {
            match parse(value) {
                Ok(request) => check_accepted(&request)?,
                Err(error) => check_refusal(&error)?,
            }
        }

        #[test]
        fn a_bad_field_is_named_in_the_refusal(
            field in prop::sample::select(top_level()),
            value in json_value(),
        ) {
            let mut body = valid();
            body.insert(field.to_owned(), value);
            match parse(Value::Object(body)) {
                Ok(request) => check_accepted(&request)?,
                Err(error) => {
                    check_refusal(&error)?;
                    let param = error.param().unwrap_or_default();
                    prop_assert!(
                        param.starts_with(field)
                            || (field == "stream_options" && param.starts_with("stream"))
                            || (field == "max_completion_tokens" && param == "max_tokens"),
                        "{field} -> {error} (param {param:?})"
                    );
                }
            }
        }
    }
}

#[test]
fn sampling_extensions_are_taken_unless_strict() {
    let body = json!({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1
    });
    let request = parse(body.clone()).expect("valid");
    let s = &request.generation.sampling;
    assert_eq!((s.top_k, s.min_p), (Some(40), Some(0.05)));
    assert_eq!(s.repetition_penalty, Some(1.1));
    let neutral = parse(json!({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "min_p": 0.0, "repetition_penalty": 1.0
    }))
    .expect("valid");
    assert_eq!(
        neutral.generation.sampling,
        Sampling::default(),
        "neutral values are none"
    );
    let strict = RequestLimits {
        strict_params: true,
        ..limits()
    };
    let error = parse_chat_request(body.to_string().as_bytes(), &strict, "r").expect_err("strict");
    assert_eq!(error.kind(), "unknown_parameter");
    assert_eq!(error.param(), Some("top_k"));
}

#[test]
fn llama_cpp_grammars_and_schemas_become_constraints() {
    for route in ["chat", "text"] {
        let parse_on = |extra: Value| match route {
            "chat" => parse(chat_body(extra)),
            _ => {
                let mut body = json!({"model": "m", "prompt": "Hi"});
                for (k, v) in extra.as_object().expect("object") {
                    body[k] = v.clone();
                }
                parse_completion_request(body.to_string().as_bytes(), &limits(), "r")
            }
        };
        let held = |extra: Value| parse_on(extra).expect("valid");
        let grammar = held(json!({"grammar": "root ::= \"a\"{5}"}));
        assert_eq!(
            grammar.generation.response_format,
            ResponseFormat::Grammar("root ::= \"a\"{5}".into())
        );
        assert!(grammar.renamed.is_empty());
        let none = held(json!({"grammar": ""}));
        assert_eq!(
            none.generation.response_format,
            ResponseFormat::Text,
            "llama.cpp's none"
        );
        assert_ne!(
            grammar.input_hash, none.input_hash,
            "the grammar is part of what is asked"
        );
        let schema = json!({"const": "42"});
        let top = held(json!({"json_schema": schema}));
        assert_eq!(
            top.generation.response_format,
            ResponseFormat::JsonSchema(schema)
        );
        assert_eq!(
            top.renamed,
            vec![
                (SCHEMA_PARAM, "json_schema"),
                ("response_format", "json_schema")
            ]
        );

        for (extra, param, words) in [
            (
                json!({"grammar": "root ::= (\"a\""}),
                "grammar",
                "line 1, column 14",
            ),
            (json!({"grammar": 5}), "grammar", "expected a string"),
            (
                json!({"json_schema": [1]}),
                "json_schema",
                "JSON Schema object",
            ),
            (
                json!({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}),
                "grammar",
                "only one of response_format, grammar",
            ),
            (
                json!({"json_schema": {}, "grammar": "root ::= \"a\""}),
                "grammar",
                "only one of json_schema, grammar",
            ),
        ] {
            let error = parse_on(extra.clone()).expect_err("refused");
            assert_eq!(error.param(), Some(param), "{extra}: {error:?}");
            assert!(error.to_string().contains(words), "{extra}: {error}");
        }
    }
}

#[test]
fn response_formats_become_constraints() {
    let with = |format: Value| {
        parse(chat_body(json!({"response_format": format})))
            .expect("valid")
            .generation
            .response_format
    };
    assert_eq!(with(json!({"type": "text"})), ResponseFormat::Text);
    assert_eq!(
        with(json!({"type": "json_object"})),
        ResponseFormat::JsonObject
    );
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    assert_eq!(
        with(
            json!({"type": "json_schema", "json_schema": {"name": "place", "strict": true, "schema": schema}})
        ),
        ResponseFormat::JsonSchema(schema)
    );
    let a = parse(chat_body(json!({}))).expect("valid");
    let b = parse(chat_body(
        json!({"response_format": {"type": "json_object"}}),
    ))
    .expect("valid");
    assert_ne!(
        a.input_hash, b.input_hash,
        "the format is part of what is asked"
    );
    let stray = parse(chat_body(
        json!({"response_format": {"type": "json_object", "schema": {}}}),
    ))
    .expect_err("a field json_object does not have");
    assert!(
        stray.to_string().contains("unknown field `schema`"),
        "{stray}"
    );
}

#[test]
fn without_a_default_the_budget_is_the_cap_for_the_engine_to_fit() {
    let open = RequestLimits::single("m", 100);
    let request =
        parse_chat_request(chat_body(json!({})).to_string().as_bytes(), &open, "r").expect("valid");
    assert_eq!(
        request.generation.budget,
        Budget::Cap(100),
        "the front shrinks it to the context"
    );
}

#[test]
fn logprobs_are_asked_for_as_openai_takes_them() {
    let with = |extra: Value| parse(chat_body(extra)).expect("valid");
    assert_eq!(with(json!({})).generation.top_logprobs, None);
    assert_eq!(
        with(json!({"logprobs": false, "top_logprobs": 0}))
            .generation
            .top_logprobs,
        None
    );
    assert_eq!(
        with(json!({"logprobs": true})).generation.top_logprobs,
        Some(0)
    );
    let top = with(json!({"logprobs": true, "top_logprobs": 20}));
    assert_eq!(top.generation.top_logprobs, Some(20));
    assert_eq!(
        top.input_hash,
        with(json!({})).input_hash,
        "the answer is the same"
    );
}

#[test]
fn newer_openai_parameters_are_taken_where_they_mean_something() {
    let body = |extra: Value| parse(chat_body(extra));
    let request =
        body(json!({"safety_identifier": "u-42", "prompt_cache_key": "k", "verbosity": "medium"}))
            .expect("valid");
    assert_eq!(request.user.as_deref(), Some("u-42"), "hashed like user");
    let both = body(json!({"safety_identifier": "u-42", "user": "u-1"})).expect("valid");
    assert_eq!(both.user.as_deref(), Some("u-1"));
    assert_eq!(param_of(body(json!({"verbosity": "high"}))).1, "verbosity");
    assert_eq!(
        param_of(body(json!({"prompt_cache_key": 5}))).1,
        "prompt_cache_key"
    );
}

#[test]
fn text_parts_are_joined_as_lines() {
    let parts =
        json!([{"type": "text", "text": "What is"}, {"type": "text", "text": "the best book"}]);
    let request = parse(chat_body(
        json!({"messages": [{"role": "user", "content": parts}]}),
    ))
    .expect("valid");
    assert_eq!(messages(&request)[0].content, "What is\nthe best book");
}

#[test]
fn a_wrong_shape_is_told_in_words_not_type_names() {
    for (body, param) in [
        (
            chat_body(json!({"messages": [{"role": "user", "content": 5}]})),
            "messages[0].content",
        ),
        (
            chat_body(json!({"messages": [{"role": "user", "content": ["a"]}]})),
            "messages[0].content",
        ),
        (chat_body(json!({"stop": 3})), "stop"),
    ] {
        let error = parse(body).expect_err("refused");
        let message = error.to_string();
        assert_eq!(error.param(), Some(param), "{message}");
        assert!(
            !message.contains("Wire") && !message.contains("untagged"),
            "{message}"
        );
    }
}

#[test]
fn an_alias_or_with_serve_any_model_any_name_is_the_served_model() {
    let mut aliased = limits();
    aliased.models[0].aliases = vec!["gpt-4o-mini".into()];
    let parse_with = |limits: &RequestLimits, model: &str| {
        parse_chat_request(
            chat_body(json!({"model": model})).to_string().as_bytes(),
            limits,
            "r",
        )
    };
    let request = parse_with(&aliased, "gpt-4o-mini").expect("an alias");
    assert_eq!(request.model, "m", "answered under its id");
    assert_eq!(
        request.input_hash,
        parse_with(&aliased, "m").expect("the id").input_hash,
        "the same request whatever the name"
    );
    assert_eq!(
        param_of(parse_with(&aliased, "gpt-4o")),
        ("model_not_found".into(), "model".into())
    );
    let any = RequestLimits {
        any_name: true,
        ..limits()
    };
    assert_eq!(
        parse_with(&any, "gpt-3.5-turbo").expect("any name").model,
        "m"
    );
    let mut nameless = chat_body(json!({}));
    nameless.as_object_mut().expect("object").remove("model");
    let body = nameless.to_string();
    assert_eq!(
        parse_chat_request(body.as_bytes(), &any, "r")
            .expect("no name")
            .model,
        "m",
        "a request naming no model, as llama.cpp's clients send"
    );
    assert_eq!(
        parse_chat_request(body.as_bytes(), &limits(), "r")
            .expect("one served model")
            .model,
        "m",
        "one served model needs no name, as vLLM and llama-server serve one"
    );
    let mut two = limits();
    let mut other = two.models[0].clone();
    other.id = "n".into();
    two.models.push(other);
    assert_eq!(
        param_of(parse_chat_request(body.as_bytes(), &two, "r")),
        ("invalid_value".into(), "model".into()),
        "required where several models are served"
    );
}

#[test]
fn logit_bias_is_taken_by_token_id_within_its_range() {
    let request =
        parse(chat_body(json!({"logit_bias": {"50256": -100, "7": 2.5}}))).expect("valid");
    assert_eq!(
        request.generation.sampling.logit_bias,
        [(7, 2.5), (50256, -100.0)]
    );
    let plain = parse(chat_body(json!({}))).expect("valid");
    assert_ne!(
        request.input_hash, plain.input_hash,
        "a bias changes the answer"
    );
    for bad in [
        json!({"hello": 1}),
        json!({"7": 101}),
        json!({"-1": 1}),
        json!([1]),
    ] {
        let (kind, param) = param_of(parse(chat_body(json!({"logit_bias": bad}))));
        assert_eq!(
            (kind.as_str(), param.as_str()),
            ("invalid_value", "logit_bias"),
            "{bad}"
        );
    }
}

#[test]
fn llama_cpp_n_predict_is_max_tokens() {
    let request = parse(chat_body(json!({"n_predict": 7}))).expect("valid");
    assert_eq!(request.generation.budget.tokens(), 7);
    let unset = parse(chat_body(json!({"n_predict": -1}))).expect("valid");
    assert_eq!(
        unset.generation.budget,
        parse(chat_body(json!({})))
            .expect("valid")
            .generation
            .budget,
        "-1: as a request that sets none"
    );
    for bad in [
        json!({"n_predict": 0}),
        json!({"n_predict": "8"}),
        json!({"n_predict": 8, "max_tokens": 8}),
    ] {
        let (_, param) = param_of(parse(chat_body(bad.clone())));
        assert_eq!(param, "n_predict", "{bad}");
    }
}

#[test]
fn the_input_hash_covers_tools_and_the_reasoning_effort() {
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let plain = parse(chat_body(json!({}))).expect("valid");
    let with_tools = parse(chat_body(json!({"tools": tools}))).expect("valid");
    let with_effort = parse(chat_body(json!({"reasoning_effort": "low"}))).expect("valid");
    let with_format = parse(chat_body(json!({"reasoning_format": "none"}))).expect("valid");
    let with_kwargs = parse(chat_body(
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
    ))
    .expect("valid");
    for request in [&with_tools, &with_effort, &with_format, &with_kwargs] {
        assert_ne!(request.input_hash, plain.input_hash);
        assert_eq!(
            request.input_hash,
            input_hash(&request.model, &request.generation),
            "the hash is the request's"
        );
    }
}

#[test]
fn reasoning_format_and_template_kwargs_are_read_and_checked_by_name() {
    use crate::engine::reasoning::ReasoningFormat;
    let request = parse(chat_body(json!({
        "reasoning_format": "deepseek",
        "chat_template_kwargs": {"enable_thinking": true},
    })))
    .expect("valid");
    assert_eq!(
        request.generation.reasoning_format,
        Some(ReasoningFormat::Deepseek)
    );
    assert_eq!(
        request.generation.template_kwargs,
        json!({"enable_thinking": true}).as_object().cloned()
    );
    for (body, param) in [
        (json!({"reasoning_format": "think"}), "reasoning_format"),
        (json!({"reasoning_format": 1}), "reasoning_format"),
        (json!({"chat_template_kwargs": "x"}), "chat_template_kwargs"),
    ] {
        let error = parse(chat_body(body)).expect_err("refused");
        assert_eq!(error.param(), Some(param), "{error:?}");
    }
}

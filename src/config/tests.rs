use super::*;
use crate::engine::config::Weights;
use crate::secret::Secret;

/// What the gateway says of a configuration it must refuse.
fn error_text(args: &ServeArgs, toml: &str) -> String {
    Config::from_toml(args, toml).expect_err(toml).to_string()
}

#[test]
fn defaults_are_valid() {
    let config = Config::from_toml(&ServeArgs::default(), "").expect("defaults");
    assert_eq!(
        config.server.listen,
        "127.0.0.1:8080".parse().expect("addr")
    );
    assert_eq!(config.engine.model_path, PathBuf::from(DEFAULT_MODEL_PATH));
    assert_eq!(config.server.keepalive, Duration::from_secs(15));
}

#[test]
fn flags_win_over_file() {
    let args = ServeArgs {
        server: ServerTable {
            max_in_flight: Some(3),
            ..ServerTable::default()
        },
        ..ServeArgs::default()
    };
    let toml = "[server]\nmax_in_flight = 9\nlisten = \"0.0.0.0:9000\"\n";
    let config = Config::from_toml(&args, toml).expect("config");
    assert_eq!(config.server.max_in_flight, 3);
    assert_eq!(config.server.listen.port(), 9000);
    assert!(config.server.also_listen.is_empty());
}

#[test]
fn listen_takes_several_addresses() {
    let toml = "[server]\nlisten = \"127.0.0.1:9000, [::1]:9000\"\n";
    let config = Config::from_toml(&ServeArgs::default(), toml).expect("config");
    assert_eq!(
        config.server.listen,
        "127.0.0.1:9000".parse().expect("address")
    );
    assert_eq!(
        config.server.also_listen,
        ["[::1]:9000".parse().expect("address")]
    );
    for (listen, named) in [
        ("127.0.0.1:9000,::1", "'::1'"),
        ("127.0.0.1:9000,127.0.0.1:9000", "twice"),
        ("127.0.0.1:9000,", "''"),
    ] {
        let toml = format!("[server]\nlisten = \"{listen}\"\n");
        let text = error_text(&ServeArgs::default(), &toml);
        assert!(
            text.contains("server.listen") && text.contains(named),
            "{text}"
        );
    }
}

#[test]
fn errors_name_the_setting() {
    let toml = "[engine]\nmax_tokens_cap = 100\ndefault_max_tokens = 200\n";
    let text = error_text(&ServeArgs::default(), toml);
    assert!(text.contains("engine.default_max_tokens"), "{text}");
    assert!(text.contains("--default-max-tokens"), "{text}");
    assert!(text.contains("LLMGATE_DEFAULT_MAX_TOKENS"), "{text}");

    let args = ServeArgs {
        server: ServerTable {
            listen: Some("localhost".into()),
            ..ServerTable::default()
        },
        ..ServeArgs::default()
    };
    let text = error_text(&args, "");
    assert!(
        text.contains("server.listen") && text.contains("'localhost'"),
        "{text}"
    );
}

#[test]
fn telemetry_and_semlog_settings_and_their_errors() {
    let toml = "[telemetry]\ntrace_sample_ratio = 0.25\n[semlog]\nes_url = \"http://es:9200\"\nes_api_key = \"abc\"\nnamespace = \"prod\"\n";
    let config = Config::from_toml(&ServeArgs::default(), toml).expect("valid");
    assert_eq!(config.telemetry.trace_sample_ratio, 0.25);
    let es = config.semlog.elasticsearch.expect("elasticsearch");
    assert_eq!(
        es.auth,
        crate::semlog::config::EsAuth::ApiKey(Secret::new("abc"))
    );
    // A config dump shows no credential.
    assert!(!format!("{:?}", es).contains("abc\""), "{es:?}");
    assert_eq!(config.semlog.namespace, "prod");

    let cases = [
        (
            "[telemetry]\ntrace_sample_ratio = 1.5\n",
            "telemetry.trace_sample_ratio",
            "--trace-sample-ratio",
        ),
        (
            "[telemetry]\ntrace_export_queue = 3\n",
            "telemetry.trace_export_queue",
            "--trace-export-queue",
        ),
        (
            "[semlog]\nnamespace = \"my-ns\"\n",
            "semlog.namespace",
            "--semlog-namespace",
        ),
        (
            "[semlog]\nes_url = \"http://es\"\nes_username = \"u\"\n",
            "semlog.es_username",
            "--es-username",
        ),
        (
            "[semlog]\nes_username = \"u\"\nes_password = \"p\"\n",
            "semlog.es_url",
            "--es-url",
        ),
        (
            "[semlog]\nredaction_key = \"short\"\n",
            "semlog.redaction_key",
            "LLMGATE_REDACTION_KEY",
        ),
        (
            "[semlog]\nbatch_docs = 0\n",
            "semlog.batch_docs",
            "flag -, env -",
        ),
        (
            "[semlog]\nfsync_ms = 60001\n",
            "semlog.fsync_ms",
            "--semlog-fsync-ms",
        ),
    ];
    for (toml, setting, named) in cases {
        let text = error_text(&ServeArgs::default(), toml);
        assert!(
            text.contains(setting) && text.contains(named),
            "{toml}: {text}"
        );
    }
}

#[test]
fn semlog_secrets_come_from_files_as_mounted_secrets_give_them() {
    let dir = tempfile::tempdir().expect("dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let password = write("password", "s3cret-pass\n");
    let key = write("redaction", "  a-redaction-key-of-32-characters\n");
    let toml = format!(
        "[semlog]\nes_url = \"http://es:9200\"\nes_username = \"llmgate\"\nes_password_file = \"{password}\"\nredaction_key_file = \"{key}\"\n"
    );
    let config = Config::from_toml(&ServeArgs::default(), &toml).expect("valid");
    let es = config.semlog.elasticsearch.expect("elasticsearch");
    assert_eq!(
        es.auth,
        crate::semlog::config::EsAuth::Basic {
            username: "llmgate".into(),
            password: Secret::new("s3cret-pass")
        }
    );
    assert_eq!(
        config.semlog.redaction_key.as_ref().map(Secret::expose),
        Some("a-redaction-key-of-32-characters")
    );

    let api_key = write("api-key", "encoded-key");
    let config = Config::from_toml(
        &ServeArgs::default(),
        &format!("[semlog]\nes_url = \"http://es\"\nes_api_key_file = \"{api_key}\"\n"),
    )
    .expect("valid");
    let es = config.semlog.elasticsearch.expect("elasticsearch");
    assert_eq!(
        es.auth,
        crate::semlog::config::EsAuth::ApiKey(Secret::new("encoded-key"))
    );

    // Both ways at once, an empty file and a missing one are refused, naming the setting
    // (and the file, never its contents).
    let empty = write("empty", "\n");
    let cases = [
        (
            format!("es_password = \"p\"\nes_password_file = \"{password}\""),
            "set semlog.es_password or semlog.es_password_file, not both",
        ),
        (format!("redaction_key_file = \"{empty}\""), "is empty"),
        (
            "es_api_key_file = \"/nonexistent/key\"".to_owned(),
            "/nonexistent/key",
        ),
    ];
    for (table, expected) in cases {
        let toml = format!("[semlog]\nes_url = \"http://es\"\nes_username = \"u\"\n{table}\n");
        let text = error_text(&ServeArgs::default(), &toml);
        assert!(
            text.contains("semlog.") && text.contains(expected),
            "{toml}: {text}"
        );
    }
    // A secret read and then refused with its setting: the error never quotes it.
    let toml = format!("[semlog]\nes_username = \"u\"\nes_password_file = \"{password}\"\n");
    let text = error_text(&ServeArgs::default(), &toml);
    assert!(text.contains("semlog.es_url"), "{text}");
    assert!(!text.contains("s3cret-pass"), "{text}");
}

#[test]
fn quality_settings_and_their_errors() {
    let toml =
        "[engine]\nmodel_path = \"models/other.gguf\"\n[quality]\ndegeneration_guard = true\nguard_window = 32\nrefusal_phrases = [\"nope\"]\n";
    let config = Config::from_toml(&ServeArgs::default(), toml).expect("valid");
    let guard = config.quality.settings.guard;
    assert_eq!((guard.window, guard.threshold), (32, 0.6));
    assert!(config.models[0].degeneration_guard);
    assert!(config.quality.settings.refusal.is_refusal("Nope."));

    let bad = "[quality]\ndegeneration_guard = true\nguard_threshold = 1.5\n";
    let text = error_text(&ServeArgs::default(), bad);
    assert!(
        text.contains("quality.guard_threshold") && text.contains("--guard-threshold"),
        "{text}"
    );

    let args = ServeArgs {
        quality: QualityTable {
            intent_rules: Some(PathBuf::from("/nonexistent/intents.toml")),
            ..QualityTable::default()
        },
        ..ServeArgs::default()
    };
    let text = error_text(&args, "");
    assert!(text.contains("quality.intent_rules"), "{text}");
}

#[test]
fn unknown_file_keys_are_rejected() {
    let text = error_text(&ServeArgs::default(), "[server]\nlisten_addr = \"x\"\n");
    assert!(text.contains("listen_addr"), "{text}");
}

#[test]
fn engine_settings_and_their_errors() {
    let toml = "[engine]\nweights = \"f16\"\nthreads = 2\nreplicas = 2\n";
    let config = Config::from_toml(&ServeArgs::default(), toml).expect("valid");
    assert_eq!(config.engine.weights, Weights::F16);
    assert_eq!((config.engine.threads, config.engine.replicas), (2, 2));
    let defaults = Config::from_toml(&ServeArgs::default(), "").expect("defaults");
    assert_eq!(defaults.engine.weights, Weights::Quantized);
    assert_eq!((defaults.engine.threads, defaults.engine.replicas), (0, 1));

    let text = error_text(&ServeArgs::default(), "[engine]\nreplicas = 0\n");
    assert!(
        text.contains("engine.replicas")
            && text.contains("--replicas")
            && text.contains("LLMGATE_REPLICAS"),
        "{text}"
    );
    let text = error_text(&ServeArgs::default(), "[engine]\nweights = \"q4\"\n");
    assert!(text.contains("weights"), "{text}");
}

#[test]
fn access_settings_and_their_errors() {
    let toml = "[server]\napi_keys_file = \"keys\"\nrate_limit_rpm = 60\nmetrics_listen = \"127.0.0.1:9464\"\ncors_origins = [\"https://a.example\", \"http://localhost:3000\"]\n";
    let config = Config::from_toml(&ServeArgs::default(), toml).expect("valid");
    let s = &config.server;
    assert_eq!(s.rate_limits.requests_per_minute.map(|n| n.get()), Some(60));
    assert_eq!(s.rate_limits.tokens_per_minute, None);
    assert_eq!(s.metrics_listen.map(|a| a.port()), Some(9464));
    assert_eq!(s.cors_origins.len(), 2);
    let zoned = "[server]\napi_keys_file = \"keys\"\nquota_monthly_tokens = 5000\nquota_time_zone = \"Asia/Shanghai\"\n";
    let config = Config::from_toml(&ServeArgs::default(), zoned).expect("valid");
    assert_eq!(config.server.quota_time_zone, chrono_tz::Asia::Shanghai);
    assert_eq!(
        config.server.quotas.tokens_per_month.map(|n| n.get()),
        Some(5000)
    );

    let cases = [
        (
            "[server]\nrate_limit_tpm = 1000\n",
            "server.rate_limit_tpm",
            "api_keys_file",
        ),
        (
            "[server]\nmetrics_listen = \"127.0.0.1:8080\"\n",
            "server.metrics_listen",
            "must differ",
        ),
        ("[server]\ncors_origins = [\"*\"]\n", "--cors-origin", "'*'"),
        (
            "[server]\nquota_daily_tokens = 1000\n",
            "server.quota_daily_tokens",
            "api_keys_file",
        ),
        (
            "[server]\nquota_time_zone = \"Mars/Olympus\"\n",
            "server.quota_time_zone",
            "IANA",
        ),
        (
            "[server]\ncors_origins = [\"https://a.example/app\"]\n",
            "LLMGATE_CORS_ORIGINS",
            "no path",
        ),
    ];
    for (toml, setting, why) in cases {
        let text = error_text(&ServeArgs::default(), toml);
        assert!(text.contains(setting) && text.contains(why), "{text}");
    }
}

#[test]
fn without_a_models_list_engine_names_the_one_model() {
    let config = Config::from_toml(&ServeArgs::default(), "").expect("defaults");
    assert_eq!(config.models.len(), 1);
    assert_eq!(config.models[0].id, DEFAULT_MODEL_ID);
    // engine = "auto": the test build has both engines and no CUDA, so llama.cpp.
    if cfg!(all(
        feature = "mistral",
        feature = "llamacpp",
        not(feature = "cuda")
    )) {
        assert_eq!(
            config.models[0].engine,
            ModelEngine::Llamacpp {
                model_path: PathBuf::from(DEFAULT_MODEL_PATH)
            }
        );
        assert_eq!(config.models[0].auto_reason, Some("on CPU"));
    }
    // Named, it is kept, on CPU too.
    let config = Config::from_toml(&ServeArgs::default(), "[engine]\nengine = \"mistral\"\n")
        .expect("mistral by name");
    assert_eq!(
        config.models[0].engine,
        ModelEngine::Mistral {
            model_path: PathBuf::from(DEFAULT_MODEL_PATH)
        }
    );
    assert_eq!(config.models[0].auto_reason, None);
    // A chat template by name is llama.cpp's to render.
    let named = "[engine]\nengine = \"llamacpp\"\nchat_template = \"chatml\"\n";
    let config = Config::from_toml(&ServeArgs::default(), named).expect("llama.cpp's");
    assert_eq!(config.engine.chat_template.as_deref(), Some("chatml"));
    let text = error_text(
        &ServeArgs::default(),
        "[engine]\nengine = \"mistral\"\nchat_template = \"chatml\"\n",
    );
    assert!(
        text.contains("engine.chat_template") && text.contains("mistral"),
        "{text}"
    );
    // A template from a file, likewise; and one template, not two.
    let file = "[engine]\nengine = \"llamacpp\"\nchat_template_file = \"t.jinja\"\n";
    let config = Config::from_toml(&ServeArgs::default(), file).expect("llama.cpp's");
    assert_eq!(
        config.engine.chat_template_file.as_deref(),
        Some(std::path::Path::new("t.jinja"))
    );
    let text = error_text(
        &ServeArgs::default(),
        "[engine]\nengine = \"mistral\"\nchat_template_file = \"t.jinja\"\n",
    );
    assert!(
        text.contains("engine.chat_template_file") && text.contains("mistral"),
        "{text}"
    );
    let text = error_text(
        &ServeArgs::default(),
        "[engine]\nengine = \"llamacpp\"\nchat_template = \"chatml\"\nchat_template_file = \"t.jinja\"\n",
    );
    assert!(text.contains("set one of them"), "{text}");
    // The reasoning switch is llama.cpp's too.
    let file = "[engine]\nengine = \"llamacpp\"\nreasoning = \"off\"\n";
    let config = Config::from_toml(&ServeArgs::default(), file).expect("llama.cpp's");
    assert_eq!(
        config.engine.reasoning,
        crate::engine::config::ReasoningSwitch::Off
    );
    let text = error_text(
        &ServeArgs::default(),
        "[engine]\nengine = \"mistral\"\nreasoning = \"off\"\n",
    );
    assert!(
        text.contains("engine.reasoning") && text.contains("mistral"),
        "{text}"
    );
    let args = ServeArgs {
        engine: EngineTable {
            model_id: Some("vllm-llama".into()),
            upstream_url: Some("http://127.0.0.1:8000/v1/".into()),
            ..EngineTable::default()
        },
        ..ServeArgs::default()
    };
    let config = Config::from_toml(&args, "").expect("upstream flags");
    let ModelEngine::Upstream(upstream) = &config.models[0].engine else {
        panic!("an upstream: {:?}", config.models[0]);
    };
    assert_eq!(upstream.urls, ["http://127.0.0.1:8000/v1"]);
    assert_eq!(upstream.model, "vllm-llama", "the served id by default");
    assert!(upstream.logprobs && upstream.check_model);
    assert!(!config.has_local_model());

    let bad = ServeArgs {
        engine: EngineTable {
            upstream_url: Some("127.0.0.1:8000".into()),
            ..EngineTable::default()
        },
        ..ServeArgs::default()
    };
    let text = error_text(&bad, "");
    assert!(
        text.contains("engine.upstream_url") && text.contains("--upstream-url"),
        "{text}"
    );
}

#[test]
fn a_models_list_serves_each_entry_and_refuses_what_does_not_fit() {
    std::env::set_var("LLMGATE_TEST_UPSTREAM_KEY", "sk-from-env");
    let toml = r#"
[engine]
max_tokens_cap = 1024
[[models]]
id = "local"
engine = "mistral"
model_path = "models/x.gguf"
[[models]]
id = "remote"
engine = "upstream"
url = "https://api.example.com/v1"
upstream_model = "gpt-4o"
api_key_env = "LLMGATE_TEST_UPSTREAM_KEY"
logprobs = false
first_byte_timeout_secs = 5
default_max_tokens = 256
"#;
    let config = Config::from_toml(&ServeArgs::default(), toml).expect("models");
    let ids: Vec<&str> = config.models.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["local", "remote"]);
    assert_eq!(config.models[0].max_tokens_cap, 1024, "from [engine]");
    let ModelEngine::Upstream(remote) = &config.models[1].engine else {
        panic!("upstream");
    };
    assert_eq!(remote.model, "gpt-4o");
    assert_eq!(
        remote.api_key.as_ref().map(Secret::expose),
        Some("sk-from-env")
    );
    assert!(
        !format!("{config:?}").contains("sk-from-env"),
        "never printed"
    );
    assert_eq!(remote.first_byte_timeout, Duration::from_secs(5));
    assert!(!remote.logprobs);
    assert_eq!(config.models[1].default_max_tokens, Some(256));

    let refused = |toml: &str| error_text(&ServeArgs::default(), toml);
    let text = refused("[[models]]\nid = \"a\"\nengine = \"mistral\"\nurl = \"http://x/v1\"\n");
    assert!(text.contains("entry 1") && text.contains("url"), "{text}");
    let text = refused("[[models]]\nid = \"a\"\nengine = \"upstream\"\n");
    assert!(text.contains("needs the base URL"), "{text}");
    let text = refused("[[models]]\nid = \"a\"\n");
    assert!(text.contains("engine"), "{text}");
    let text = refused(
        "[[models]]\nid = \"a\"\nengine = \"mistral\"\n[[models]]\nid = \"a\"\nengine = \"mistral\"\n",
    );
    assert!(text.contains("served twice"), "{text}");
    let text =
        refused("[engine]\nmodel_id = \"x\"\n[[models]]\nid = \"a\"\nengine = \"mistral\"\n");
    assert!(text.contains("engine.model_id"), "{text}");
    let text = refused("[[models]]\nid = \"a\"\nengine = \"upstream\"\nurl = \"http://x/v1\"\napi_key_env = \"LLMGATE_NO_SUCH_VARIABLE\"\n");
    assert!(text.contains("LLMGATE_NO_SUCH_VARIABLE"), "{text}");
    let text = refused("[[models]]\nid = \"a\"\nengine = \"upstream\"\nurl = \"http://x/v1\"\nmodel_pth = \"typo\"\n");
    assert!(text.contains("model_pth"), "{text}");
}

/// (temperature, top_p, max_tokens, guard) of the first served model.
fn sampling_defaults(
    args: &ServeArgs,
    toml: &str,
) -> (Option<f64>, Option<f64>, Option<u32>, bool) {
    let config = Config::from_toml(args, toml).expect("valid");
    let m = &config.models[0];
    (
        m.default_temperature,
        m.default_top_p,
        m.default_max_tokens,
        m.degeneration_guard,
    )
}

#[test]
fn the_default_model_gets_its_cards_sampling_and_settings_win() {
    let none = ServeArgs::default();
    assert_eq!(
        sampling_defaults(&none, ""),
        (Some(0.7), Some(0.9), Some(512), true),
        "the default model file is a known one"
    );
    assert_eq!(
        sampling_defaults(&none, "[engine]\nmax_tokens_cap = 100\n").2,
        Some(100),
        "the known budget never passes the cap"
    );
    let flags = ServeArgs {
        engine: EngineTable {
            default_temperature: Some(0.0),
            default_max_tokens: Some(64),
            ..EngineTable::default()
        },
        quality: QualityTable {
            degeneration_guard: Some(false),
            ..QualityTable::default()
        },
        ..ServeArgs::default()
    };
    assert_eq!(
        sampling_defaults(&flags, ""),
        (Some(0.0), Some(0.9), Some(64), false)
    );
    assert_eq!(
        sampling_defaults(&none, "[engine]\nmodel_path = \"models/other.gguf\"\n"),
        (None, None, None, false),
        "an unknown file has the API's defaults"
    );
    let listed = "[quality]\ndegeneration_guard = false\n\n[[models]]\nid = \"a\"\nengine = \"mistral\"\ndefault_top_p = 0.5\ndegeneration_guard = true\n\n[[models]]\nid = \"b\"\nengine = \"upstream\"\nurl = \"http://127.0.0.1:9/v1\"\n";
    let config = Config::from_toml(&none, listed).expect("valid");
    let (a, b) = (&config.models[0], &config.models[1]);
    assert_eq!(
        (a.default_temperature, a.default_top_p),
        (Some(0.7), Some(0.5))
    );
    assert!(a.degeneration_guard, "the entry wins over [quality]");
    assert_eq!(
        (
            b.default_temperature,
            b.default_max_tokens,
            b.degeneration_guard
        ),
        (None, None, false),
        "an upstream keeps its own model's defaults"
    );
}

#[test]
fn bad_sampling_defaults_name_the_setting() {
    for (toml, setting) in [
        (
            "[engine]\ndefault_temperature = 2.5\n",
            "--default-temperature",
        ),
        ("[engine]\ndefault_top_p = 0.0\n", "LLMGATE_DEFAULT_TOP_P"),
        (
            "[[models]]\nid = \"a\"\nengine = \"mistral\"\ndefault_top_p = 1.5\n",
            "default_top_p",
        ),
    ] {
        let text = error_text(&ServeArgs::default(), toml);
        assert!(text.contains(setting), "{toml}: {text}");
    }
}

#[test]
fn shadows_and_splits_name_served_models() {
    let two = "[[models]]\nid = \"a\"\nengine = \"upstream\"\nurl = \"http://a/v1\"\n\
               [[models]]\nid = \"b\"\nengine = \"upstream\"\nurl = \"http://b/v1\"\n";
    let config = Config::from_toml(
        &ServeArgs::default(),
        &format!(
            "{two}[[splits]]\nid = \"chat\"\nsticky = \"header:X-Session\"\nvariants = [{{ model = \"a\", weight = 3 }}, {{ model = \"b\" }}]\n"
        ),
    )
    .expect("a split");
    let split = &config.splits[0];
    assert_eq!(split.variants, [("a".to_owned(), 3), ("b".to_owned(), 1)]);
    assert_eq!(
        split.sticky,
        crate::shadow::split::Sticky::Header("x-session".into())
    );
    let refused = |toml: String| error_text(&ServeArgs::default(), &toml);
    let shadowed = |shadow: &str| {
        format!("[[models]]\nid = \"a\"\nengine = \"upstream\"\nurl = \"http://a/v1\"\nshadow = {shadow}\n[[models]]\nid = \"b\"\nengine = \"upstream\"\nurl = \"http://b/v1\"\n")
    };
    for (toml, expected) in [
        (shadowed("{ model = \"c\" }"), "'c' is not served here"),
        (shadowed("{ model = \"a\" }"), "cannot shadow itself"),
        (shadowed("{ model = \"b\", share = 1.5 }"), "shadow.share"),
        (shadowed("{ model = \"b\", max_in_flight = 0 }"), "shadow.max_in_flight"),
        (
            format!("{two}[[splits]]\nid = \"a\"\nvariants = [{{ model = \"b\" }}]\n"),
            "a served model's id",
        ),
        (
            format!("{two}[[splits]]\nid = \"chat\"\nvariants = [{{ model = \"c\" }}]\n"),
            "'c' is not a served model's id",
        ),
        (
            format!("{two}[[splits]]\nid = \"chat\"\nsticky = \"cookie\"\nvariants = [{{ model = \"a\" }}]\n"),
            "splits.sticky",
        ),
        (
            format!("{two}[[splits]]\nid = \"chat\"\nvariants = [{{ model = \"a\" }}]\n"),
            "no API keys are configured",
        ),
    ] {
        let text = refused(toml);
        assert!(text.contains(expected), "{expected}: {text}");
    }
}

#[test]
fn aliases_name_one_model_each_and_any_name_needs_one_model() {
    let two = |a: &str, b: &str| {
        format!("[[models]]\nid = \"a\"\nengine = \"upstream\"\nurl = \"http://a/v1\"\naliases = [{a}]\n\
                 [[models]]\nid = \"b\"\nengine = \"upstream\"\nurl = \"http://b/v1\"\naliases = [{b}]\n")
    };
    let config = Config::from_toml(&ServeArgs::default(), &two("\"gpt-4o\"", "\"claude\""))
        .expect("aliases");
    assert_eq!(config.models[0].aliases, ["gpt-4o"]);
    for toml in [two("\"b\"", ""), two("\"x\"", "\"x\""), two("\"\"", "")] {
        let text = error_text(&ServeArgs::default(), &toml);
        assert!(text.contains("aliases"), "{text}");
    }
    let text = error_text(
        &ServeArgs::default(),
        &format!("[server]\nserve_any_model = true\n{}", two("", "")),
    );
    assert!(text.contains("serve_any_model"), "{text}");
    let one = Config::from_toml(&ServeArgs::default(), "[server]\nserve_any_model = true\n")
        .expect("one model");
    assert!(one.server.serve_any_model);
}

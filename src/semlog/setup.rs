//! Setting up the cluster for the semantic log, in a way that fits it: the retention
//! API it has, mappings of types it knows, a data stream where it has them. Every call
//! is idempotent, so each start runs them all again.
//!
//! 1. `GET /`: what the cluster is ([`Target`]).
//! 2. The retention policy `semlog.lifecycle` asks for (`auto`: what the cluster offers):
//!    an ILM policy, or an ISM policy; the data stream lifecycle lives in the template.
//!    An API that is missing falls back (`auto`) or is reported (an explicit choice).
//! 3. The component template (mappings), then the index template.
//! 4. The data stream, created explicitly: a cluster that cannot is told apart here,
//!    not by refusing every document later, and gets plain indices instead.
//!
//! A call that no retry can fix (a missing API, a refused body, a missing privilege) is
//! a [`Problem`]: named once with what to change, counted, and never a reason to keep
//! documents from a cluster that would take them. Only what may pass later (the cluster
//! unreachable, 429, 5xx) makes the indexer try the whole set-up again.

use serde::Serialize;
use serde_json::{json, Value};

use super::document::DATASET;
use super::elasticsearch::Cluster;
use super::redact::Kind;
use super::target::{answer, IndexLifecycle, SetupAnswer, Target};

/// The names of what the set-up creates.
pub const POLICY: &str = "llmgate-requests";
pub const COMPONENT_TEMPLATE: &str = "llmgate-requests@mappings";
pub const INDEX_TEMPLATE: &str = "logs-llmgate.requests";
/// Above the built-in `logs` template (priority 100), so ours applies to our data stream.
pub const TEMPLATE_PRIORITY: u32 = 200;

/// The steps, as the `step` label of `llmgate_semlog_setup_problems_total`.
pub const STEPS: [&str; 5] = [
    "detect",
    "policy",
    "component_template",
    "index_template",
    "data_stream",
];

/// A set-up call no retry will fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub step: &'static str,
    /// What the cluster said.
    pub reason: String,
    /// What to change.
    pub fix: String,
}

/// What the set-up found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetupSummary {
    pub target: Target,
    /// The retention applied (never `auto`).
    pub lifecycle: IndexLifecycle,
    /// Documents go to a data stream; `false`: to a plain index of the same name.
    pub data_stream: bool,
    pub problems: Vec<Problem>,
}

impl SetupSummary {
    /// The sentence the log says once.
    pub fn describe(&self, data_stream: &str, retention_days: u32) -> String {
        let target = if self.data_stream {
            format!("data stream {data_stream}")
        } else {
            format!("index {data_stream} (no data streams here)")
        };
        let retention = match self.lifecycle {
            IndexLifecycle::Ilm => {
                format!("ILM policy {POLICY} deletes after {retention_days} days")
            }
            IndexLifecycle::DataStream => {
                format!("the data stream lifecycle keeps {retention_days} days")
            }
            IndexLifecycle::Ism => {
                format!("ISM policy {POLICY} deletes after {retention_days} days")
            }
            IndexLifecycle::None | IndexLifecycle::Auto => {
                "no retention policy: nothing is ever deleted".into()
            }
        };
        format!(
            "Semantic logs go to {} as {target}; {retention}.",
            self.target.describe()
        )
    }
}

/// Runs the set-up against `cluster`. `Err`: the cluster cannot be reached or asks to
/// wait (try again later); everything else is a [`SetupSummary`], problems included.
pub async fn run(
    cluster: &Cluster,
    wanted: IndexLifecycle,
    retention_days: u32,
) -> Result<SetupSummary, String> {
    let mut problems = Vec::new();
    let target = detect(cluster, &mut problems).await?;
    cluster.set_include_source_on_error(target.knows_include_source_on_error());
    let lifecycle = policy(cluster, &target, wanted, retention_days, &mut problems).await?;

    let plain = target.plain_mapping_types();
    put(
        cluster,
        "component_template",
        &format!("/_component_template/{COMPONENT_TEMPLATE}"),
        &component_template_body(plain),
        &mut problems,
        "grant the manage_index_templates cluster privilege, or create the template yourself (tests/golden/ has its body)",
    )
    .await?;
    let lifecycle = index_template(cluster, lifecycle, retention_days, &mut problems).await?;

    let data_stream = stream(cluster, lifecycle, retention_days, &mut problems).await?;
    // Without a data stream there is nothing to roll over: the policies' patterns and
    // the template's lifecycle name backing indices this cluster does not make.
    let lifecycle = if data_stream {
        lifecycle
    } else {
        IndexLifecycle::None
    };
    Ok(SetupSummary {
        target,
        lifecycle,
        data_stream,
        problems,
    })
}

/// What the cluster is, from `GET /`; unknown where it does not say (a problem noted).
async fn detect(cluster: &Cluster, problems: &mut Vec<Problem>) -> Result<Target, String> {
    let (status, body) = cluster.call("GET", "/", None).await?;
    let (reason, fix) = match answer(status, &body) {
        SetupAnswer::Done => {
            return Ok(Target::from_root(
                &serde_json::from_str(&body).unwrap_or_default(),
            ))
        }
        SetupAnswer::Transient(reason) => return Err(format!("GET /: {reason}")),
        SetupAnswer::Exists => return Ok(Target::unknown()),
        SetupAnswer::Denied(reason) => (reason, "grant the monitor cluster privilege so the gateway can tell the cluster's version (it goes on without)"),
        SetupAnswer::Missing(reason) | SetupAnswer::Refused(reason) => (reason, "point semlog.es_url at the cluster itself, not a proxy that answers GET / with something else"),
    };
    problems.push(Problem {
        step: "detect",
        reason,
        fix: fix.into(),
    });
    Ok(Target::unknown())
}

/// Puts the index template with `lifecycle`, or, where the cluster refuses that part of
/// it, without; returns the lifecycle the template has.
async fn index_template(
    cluster: &Cluster,
    mut lifecycle: IndexLifecycle,
    retention_days: u32,
    problems: &mut Vec<Problem>,
) -> Result<IndexLifecycle, String> {
    let template_path = format!("/_index_template/{INDEX_TEMPLATE}");
    let body = index_template_body(lifecycle, true, retention_days);
    let put_template = cluster.call("PUT", &template_path, Some(&body)).await?;
    match answer(put_template.0, &put_template.1) {
        SetupAnswer::Done | SetupAnswer::Exists => {}
        SetupAnswer::Transient(reason) => return Err(format!("PUT {template_path}: {reason}")),
        SetupAnswer::Missing(reason)
            if matches!(lifecycle, IndexLifecycle::Ilm | IndexLifecycle::DataStream) =>
        {
            // The template's lifecycle part is what this cluster does not know.
            problems.push(Problem {
                step: "index_template",
                reason,
                fix: format!(
                    "this cluster refuses the {} part of the index template; set semlog.lifecycle to what it has (or none)",
                    lifecycle.as_str()
                ),
            });
            lifecycle = IndexLifecycle::None;
            let body = index_template_body(lifecycle, true, retention_days);
            let (status, text) = cluster.call("PUT", &template_path, Some(&body)).await?;
            note(status, &text, "index_template", TEMPLATE_FIX, problems)?;
        }
        other => note_answer(other, "index_template", TEMPLATE_FIX, problems),
    }
    Ok(lifecycle)
}

const TEMPLATE_FIX: &str = "grant the manage_index_templates cluster privilege, or create the index template yourself (tests/golden/ has its body)";

/// Puts the retention policy, falling back (`auto`) where the cluster has no such API.
async fn policy(
    cluster: &Cluster,
    target: &Target,
    wanted: IndexLifecycle,
    retention_days: u32,
    problems: &mut Vec<Problem>,
) -> Result<IndexLifecycle, String> {
    let auto = wanted == IndexLifecycle::Auto;
    let mut lifecycle = if auto {
        target.auto_lifecycle()
    } else {
        wanted
    };
    loop {
        let (path, body, privilege) = match lifecycle {
            IndexLifecycle::Ilm => (
                format!("/_ilm/policy/{POLICY}"),
                policy_body(retention_days),
                "manage_ilm",
            ),
            IndexLifecycle::Ism => (
                format!("/_plugins/_ism/policies/{POLICY}"),
                ism_policy_body(retention_days),
                "the ISM plugin's policy management",
            ),
            IndexLifecycle::DataStream | IndexLifecycle::None | IndexLifecycle::Auto => {
                return Ok(lifecycle)
            }
        };
        let (status, text) = cluster.call("PUT", &path, Some(&body)).await?;
        match answer(status, &text) {
            SetupAnswer::Done | SetupAnswer::Exists => return Ok(lifecycle),
            SetupAnswer::Transient(reason) => return Err(format!("PUT {path}: {reason}")),
            SetupAnswer::Missing(_) if auto => {
                let next = lifecycle.fallback(target);
                tracing::info!(
                    tried = lifecycle.as_str(),
                    next = next.as_str(),
                    "The cluster has no API for this retention; trying the next one."
                );
                lifecycle = next;
            }
            SetupAnswer::Missing(reason) => {
                problems.push(Problem {
                    step: "policy",
                    reason,
                    fix: format!(
                        "this cluster has no {} API: set semlog.lifecycle = auto to use what it has",
                        lifecycle.as_str()
                    ),
                });
                return Ok(IndexLifecycle::None);
            }
            SetupAnswer::Denied(reason) => {
                problems.push(Problem {
                    step: "policy",
                    reason,
                    fix: format!("grant {privilege}, or set semlog.lifecycle = none and manage retention yourself"),
                });
                return Ok(IndexLifecycle::None);
            }
            SetupAnswer::Refused(reason) => {
                problems.push(Problem {
                    step: "policy",
                    reason,
                    fix: "the cluster refused the policy's body; set semlog.lifecycle = none and manage retention yourself".into(),
                });
                return Ok(IndexLifecycle::None);
            }
        }
    }
}

/// Creates the data stream; where the cluster has none, turns the template into one
/// for plain indices. Whether documents go to a data stream.
async fn stream(
    cluster: &Cluster,
    lifecycle: IndexLifecycle,
    retention_days: u32,
    problems: &mut Vec<Problem>,
) -> Result<bool, String> {
    let path = format!("/_data_stream/{}", cluster.data_stream());
    let (status, text) = cluster.call("PUT", &path, None).await?;
    match answer(status, &text) {
        SetupAnswer::Done | SetupAnswer::Exists => Ok(true),
        SetupAnswer::Transient(reason) => Err(format!("PUT {path}: {reason}")),
        SetupAnswer::Missing(reason) => {
            tracing::warn!(reason = %reason, "The cluster has no data streams; documents go to a plain index of the same name, without rollover.");
            let template_path = format!("/_index_template/{INDEX_TEMPLATE}");
            let body = index_template_body(lifecycle, false, retention_days);
            let (status, text) = cluster.call("PUT", &template_path, Some(&body)).await?;
            note(status, &text, "index_template", TEMPLATE_FIX, problems)?;
            Ok(false)
        }
        // The stream is then created by the first document, from the same template.
        other => {
            note_answer(
                other,
                "data_stream",
                "grant the create_index privilege on logs-llmgate.requests-*, or create the data stream yourself",
                problems,
            );
            Ok(true)
        }
    }
}

async fn put(
    cluster: &Cluster,
    step: &'static str,
    path: &str,
    body: &Value,
    problems: &mut Vec<Problem>,
    fix: &str,
) -> Result<(), String> {
    let (status, text) = cluster.call("PUT", path, Some(body)).await?;
    note(status, &text, step, fix, problems)
}

/// Records an answer's problem; `Err` for one worth trying again later.
fn note(
    status: u16,
    text: &str,
    step: &'static str,
    fix: &str,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    match answer(status, text) {
        SetupAnswer::Transient(reason) => Err(format!("{step}: {reason}")),
        other => {
            note_answer(other, step, fix, problems);
            Ok(())
        }
    }
}

fn note_answer(answer: SetupAnswer, step: &'static str, fix: &str, problems: &mut Vec<Problem>) {
    match answer {
        SetupAnswer::Done | SetupAnswer::Exists | SetupAnswer::Transient(_) => {}
        SetupAnswer::Missing(reason)
        | SetupAnswer::Denied(reason)
        | SetupAnswer::Refused(reason) => problems.push(Problem {
            step,
            reason,
            fix: fix.to_owned(),
        }),
    }
}

/// The ILM policy: roll over daily or at 50 GB per primary shard, delete after
/// `retention_days`.
pub fn policy_body(retention_days: u32) -> Value {
    json!({
        "policy": {
            "_meta": {"managed_by": "llmgate"},
            "phases": {
                "hot": {
                    "actions": {
                        "rollover": {"max_age": "1d", "max_primary_shard_size": "50gb"}
                    }
                },
                "delete": {
                    "min_age": format!("{retention_days}d"),
                    "actions": {"delete": {}}
                }
            }
        }
    })
}

/// Explicit mappings of every field the documents have (`dynamic: false`: a field added
/// by a newer gateway is kept in `_source` but not indexed until the template says so).
/// `plain`: only types every OpenSearch 2.x and 3.x knows (`keyword` for the seed and the
/// `data_stream.*` constants; `unsigned_long` and `constant_keyword` came in 2.8 and 2.14).
pub fn component_template_body(plain: bool) -> Value {
    let constant = || {
        if plain {
            keyword()
        } else {
            json!({"type": "constant_keyword"})
        }
    };
    let seed = if plain {
        keyword()
    } else {
        json!({"type": "unsigned_long"})
    };
    json!({
        "_meta": {"managed_by": "llmgate"},
        "template": {
            "mappings": {
                "dynamic": false,
                "properties": {
                    "@timestamp": {"type": "date"},
                    "event": {"properties": {
                        "id": keyword(), "kind": keyword(), "category": keyword(),
                        "type": keyword(), "dataset": keyword(), "outcome": keyword(),
                        "duration": {"type": "long"}
                    }},
                    "service": {"properties": {"name": keyword(), "version": keyword()}},
                    "trace": {"properties": {"id": keyword()}},
                    "user": {"properties": {"hash": keyword()}},
                    "span": {"properties": {"id": keyword()}},
                    "error": {"properties": {"type": keyword()}},
                    "gen_ai": {"properties": {
                        "operation": {"properties": {"name": keyword()}},
                        "provider": {"properties": {"name": keyword()}},
                        "request": {"properties": {
                            "model": keyword(), "max_tokens": {"type": "integer"},
                            "temperature": double(), "top_p": double(),
                            "seed": seed
                        }},
                        "response": {"properties": {
                            "id": keyword(), "model": keyword(), "finish_reasons": keyword()
                        }},
                        "usage": {"properties": {
                            "input_tokens": {"type": "long"}, "output_tokens": {"type": "long"}
                        }}
                    }},
                    "llm": {"properties": llm_properties()},
                    "data_stream": {"properties": {
                        "type": constant(),
                        "dataset": constant(),
                        "namespace": constant()
                    }}
                }
            }
        }
    })
}

/// The mappings of the `llm.*` fields. Built apart from the template: one `json!` this
/// deep would pass the macro's recursion limit.
fn llm_properties() -> Value {
    let redactions: serde_json::Map<String, Value> = Kind::ALL
        .iter()
        .map(|k| (k.as_str().to_owned(), json!({"type": "integer"})))
        .collect();
    let percentiles =
        || json!({"properties": {"p50_ms": double(), "p95_ms": double(), "max_ms": double()}});
    let mut properties = json!({
        "request_id": keyword(), "api_key_id": keyword(), "status": keyword(),
        "stream": {"type": "boolean"},
        "itl": percentiles(),
        "chunks": {"type": "integer"},
        "delivery": percentiles(),
        "tokens_per_second": double(), "repetition_rate": double(),
        "repetition_basis": keyword(),
        "mean_logprob": double(), "min_logprob": double(),
        "low_confidence_share": double(),
        "degenerated": {"type": "boolean"}, "refusal": {"type": "boolean"},
        "intent": keyword(), "language": keyword(), "answer_language": keyword(),
        "input_hash": keyword(), "output_hash": keyword(),
        "system_fingerprint": keyword(),
        "model": {"properties": {
            "sha256": keyword(), "quant": keyword(), "device": keyword(),
            "context_length": {"type": "integer"},
            "gpu": keyword(), "driver": keyword(), "cuda": keyword(),
            "upstream_url": keyword(), "upstream_model": keyword()
        }},
        "upstream": {"properties": {
            "model": keyword(), "system_fingerprint": keyword(),
            "usage_estimated": {"type": "boolean"},
            "endpoint": keyword(), "attempts": {"type": "short"},
            "failed_attempts": {"properties": {"endpoint": keyword(), "error_type": keyword()}}
        }},
        "shadow": {"properties": {
            "pair_id": keyword(), "side": keyword(), "primary": keyword(), "candidate": keyword()
        }},
        "split": {"properties": {"id": keyword(), "variant": keyword()}},
        "comparison": comparison_properties(),
        "build": {"properties": {"commit": keyword(), "target_features": keyword()}},
        "prompt_excerpt": {"type": "text"},
        "response_excerpt": {"type": "text"},
        "redactions": {"properties": redactions},
        "redactions_total": {"type": "integer"}
    });
    // The latencies, in milliseconds (a second literal: one would pass the macro's
    // recursion limit).
    for field in [
        "ttft_ms",
        "engine_ttft_ms",
        "tpot_ms",
        "upstream_ttft_ms",
        "e2e_ms",
        "overhead_ms",
        "queue_ms",
        "client_wait_ms",
    ] {
        properties[field] = double();
    }
    super::document::agent::mappings(&mut properties);
    properties
}

/// `llm.comparison`: a shadowed request's two sides (`crate::shadow::compare`).
fn comparison_properties() -> Value {
    let side = json!({"properties": {
        "model": keyword(), "request_id": keyword(), "status": keyword(), "error": keyword(),
        "ttft_ms": double(), "tpot_ms": double(), "itl_p95_ms": double(), "e2e_ms": double(),
        "completion_tokens": {"type": "integer"}, "finish_reason": keyword(),
        "repetition_rate": double(), "refusal": {"type": "boolean"}, "language": keyword(),
        "mean_logprob": double(), "system_fingerprint": keyword()
    }});
    json!({"properties": {
        "pair_id": keyword(),
        "primary": side.clone(),
        "candidate": side,
        "difference": {"properties": {
            "identical": {"type": "boolean"}, "edit_distance": double(),
            "word_overlap": double(), "first_difference_word": {"type": "integer"},
            "common_prefix_chars": {"type": "integer"}
        }}
    }})
}

/// A `keyword` field's mapping.
fn keyword() -> Value {
    json!({"type": "keyword"})
}

/// A `double` field's mapping.
fn double() -> Value {
    json!({"type": "double"})
}

/// The index template of `logs-llmgate.requests-*`: a data stream (or, where the cluster
/// has none, plain indices), its mappings from the component template, and the
/// retention `lifecycle` says: the ILM policy's name, or the data stream lifecycle's
/// `data_retention` (an ISM policy attaches itself by its own `ism_template`).
pub fn index_template_body(
    lifecycle: IndexLifecycle,
    data_stream: bool,
    retention_days: u32,
) -> Value {
    let mut body = json!({
        "_meta": {"managed_by": "llmgate"},
        "index_patterns": [format!("logs-{DATASET}-*")],
        "priority": TEMPLATE_PRIORITY,
        "composed_of": [COMPONENT_TEMPLATE],
    });
    if data_stream {
        body["data_stream"] = json!({});
    }
    match lifecycle {
        // Rolling over needs a data stream (or an alias, which plain mode has not).
        IndexLifecycle::Ilm if data_stream => {
            body["template"] = json!({"settings": {"index.lifecycle.name": POLICY}});
        }
        IndexLifecycle::DataStream if data_stream => {
            body["template"] =
                json!({"lifecycle": {"data_retention": format!("{retention_days}d")}});
        }
        _ => {}
    }
    body
}

/// OpenSearch's Index State Management policy: roll the data stream's backing index
/// over daily or at 50 GB, delete an index `retention_days` after its creation; it
/// attaches itself to the backing indices created from now on (`ism_template`).
pub fn ism_policy_body(retention_days: u32) -> Value {
    json!({
        "policy": {
            "description": "llmgate semantic logs: roll over daily, delete when old (managed by llmgate)",
            "default_state": "hot",
            "states": [
                {
                    "name": "hot",
                    "actions": [{"rollover": {"min_index_age": "1d", "min_primary_shard_size": "50gb"}}],
                    "transitions": [{"state_name": "delete", "conditions": {"min_index_age": format!("{retention_days}d")}}]
                },
                {"name": "delete", "actions": [{"delete": {}}], "transitions": []}
            ],
            "ism_template": [{"index_patterns": [format!(".ds-logs-{DATASET}-*")], "priority": 100}]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `UPDATE_GOLDEN=1 cargo test --lib golden` rewrites the files after a deliberate
    /// change; review the diff like code.
    #[test]
    fn set_up_bodies_match_the_golden_files() {
        let golden = |name: &str, body: Value| -> Value {
            let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                let text = serde_json::to_string_pretty(&body).expect("json") + "\n";
                std::fs::write(&path, text).expect("write golden file");
            }
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        assert_eq!(policy_body(30), golden("ilm_policy.json", policy_body(30)));
        assert_eq!(
            component_template_body(false),
            golden("component_template.json", component_template_body(false))
        );
        let template = index_template_body(IndexLifecycle::Ilm, true, 30);
        assert_eq!(template, golden("index_template.json", template.clone()));
        assert_eq!(
            ism_policy_body(30),
            golden("ism_policy.json", ism_policy_body(30))
        );
    }

    #[test]
    fn each_cluster_gets_bodies_it_knows() {
        let plain = component_template_body(true).to_string();
        assert!(!plain.contains("constant_keyword") && !plain.contains("unsigned_long"));
        let full = component_template_body(false).to_string();
        assert!(full.contains("constant_keyword") && full.contains("unsigned_long"));
        let dsl = index_template_body(IndexLifecycle::DataStream, true, 7);
        assert_eq!(
            dsl["template"],
            json!({"lifecycle": {"data_retention": "7d"}})
        );
        assert_eq!(dsl["data_stream"], json!({}));
        let plain_index = index_template_body(IndexLifecycle::Ilm, false, 7);
        assert!(plain_index.get("data_stream").is_none());
        assert!(
            plain_index.get("template").is_none(),
            "no rollover without a data stream"
        );
        assert!(index_template_body(IndexLifecycle::Ism, true, 7)
            .get("template")
            .is_none());
    }
}

//! Elasticsearch, through the official `elasticsearch` crate (rustls, gzip bodies):
//! the idempotent start-up set-up (lifecycle policy, component template with explicit
//! mappings, index template above the built-in `logs` one) and `_bulk` with `create`.
//!
//! [`parse_bulk`] turns a bulk answer into data, per item: indexed (2xx), duplicate (409:
//! already indexed, not retried), retry (429, 5xx), rejected (any other 4xx: dead
//! letter); or, for the whole request: retry it (429, 5xx, no answer), split it (413) or
//! reject it (400). The indexer acts on that data; it is unit-tested on canned answers.

use std::time::Duration;

use bytes::Bytes;
use elasticsearch::auth::Credentials;
use elasticsearch::cert::{Certificate, CertificateValidation};
use elasticsearch::http::transport::{
    CloudConnectionPool, SingleNodeConnectionPool, TransportBuilder,
};
use elasticsearch::http::Method;
use elasticsearch::{BulkParts, Elasticsearch};
use serde_json::{json, Value};

use super::config::{EsAuth, EsConfig};
use super::document::{Encoded, DATASET};
use super::redact::Kind;

/// The names of what the set-up creates.
pub const POLICY: &str = "llmgate-requests";
pub const COMPONENT_TEMPLATE: &str = "llmgate-requests@mappings";
pub const INDEX_TEMPLATE: &str = "logs-llmgate.requests";
/// Above the built-in `logs` template (priority 100), so ours applies to our data stream.
pub const TEMPLATE_PRIORITY: u32 = 200;

/// The answer to one bulk attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum BulkResult {
    /// One outcome per document sent, in order.
    Items(Vec<Item>),
    /// Nothing was indexed and trying again later may work: connection refused, timeout,
    /// 429 or 5xx for the whole request. `retry_after` from the `Retry-After` header.
    RetryAll {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// 413: the request was too large; send it in halves.
    Split,
    /// The whole request was refused in a way no retry fixes (400).
    RejectAll { status: u16, reason: String },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Indexed,
    /// 409: a document with this `_id` is already in the index.
    Duplicate,
    /// 429 or 5xx for this document alone.
    Retry,
    /// Any other 4xx: this document will never be accepted as it is.
    Rejected {
        status: u16,
        error_type: String,
        reason: String,
    },
}

/// Classifies a bulk response (status, `Retry-After`, body) for `sent` documents.
pub fn parse_bulk(status: u16, retry_after: Option<&str>, body: &[u8], sent: usize) -> BulkResult {
    let retry_after = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let error_reason = || {
        serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| {
                v["error"]["reason"]
                    .as_str()
                    .or(v["error"]["type"].as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| format!("status {status}"))
    };
    match status {
        200..=299 => {}
        413 => return BulkResult::Split,
        429 | 500..=599 => {
            return BulkResult::RetryAll {
                reason: error_reason(),
                retry_after,
            }
        }
        // Elasticsearch refusing the request body itself: no retry will change that.
        400 => {
            return BulkResult::RejectAll {
                status,
                reason: error_reason(),
            }
        }
        // Anything else (authentication, permissions, a proxy's 404 or 502) is fixed on
        // the operator's side, not in the documents: keep them and try again later.
        _ => {
            return BulkResult::RetryAll {
                reason: error_reason(),
                retry_after,
            }
        }
    }
    let Ok(answer) = serde_json::from_slice::<Value>(body) else {
        return BulkResult::RetryAll {
            reason: "the bulk answer is not JSON".into(),
            retry_after: None,
        };
    };
    let Some(items) = answer["items"].as_array().filter(|i| i.len() == sent) else {
        return BulkResult::RetryAll {
            reason: format!("the bulk answer does not have {sent} items"),
            retry_after: None,
        };
    };
    BulkResult::Items(items.iter().map(item).collect())
}

fn item(entry: &Value) -> Item {
    // Each item is {"<action>": {...}}; we only send `create`, but read any action.
    let result = entry
        .as_object()
        .and_then(|o| o.values().next())
        .cloned()
        .unwrap_or(Value::Null);
    let status = result["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(0);
    match status {
        200..=299 => Item::Indexed,
        409 => Item::Duplicate,
        429 | 500..=599 => Item::Retry,
        _ => Item::Rejected {
            status,
            error_type: result["error"]["type"]
                .as_str()
                .unwrap_or("unknown")
                .to_owned(),
            reason: result["error"]["reason"]
                .as_str()
                .unwrap_or("no reason given")
                .to_owned(),
        },
    }
}

/// The lifecycle policy: roll over daily or at 50 GB per primary shard, delete after
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
pub fn component_template_body() -> Value {
    let keyword = || json!({"type": "keyword"});
    let double = || json!({"type": "double"});
    let redactions: serde_json::Map<String, Value> = Kind::ALL
        .iter()
        .map(|k| (k.as_str().to_owned(), json!({"type": "integer"})))
        .collect();
    // Built apart: one json! this deep would pass the macro's recursion limit.
    let llm = json!({
                        "request_id": keyword(), "api_key_id": keyword(), "status": keyword(),
                        "stream": {"type": "boolean"},
                        "ttft_ms": double(), "engine_ttft_ms": double(), "tpot_ms": double(),
                        "upstream_ttft_ms": double(),
                        "e2e_ms": double(), "queue_ms": double(), "client_wait_ms": double(),
                        "itl": {"properties": {
                            "p50_ms": double(), "p95_ms": double(), "max_ms": double()
                        }},
                        "tokens_per_second": double(), "repetition_rate": double(),
                        "repetition_basis": keyword(),
                        "mean_logprob": double(), "min_logprob": double(),
                        "low_confidence_share": double(),
                        "degenerated": {"type": "boolean"}, "refusal": {"type": "boolean"},
                        "intent": keyword(), "language": keyword(), "input_hash": keyword(), "output_hash": keyword(),
                        "system_fingerprint": keyword(),
        "model": {"properties": {
            "sha256": keyword(), "quant": keyword(), "device": keyword(),
            "context_length": {"type": "integer"},
            "gpu": keyword(), "driver": keyword(), "cuda": keyword(),
            "upstream_url": keyword(), "upstream_model": keyword()
        }},
        "upstream": {"properties": {
            "model": keyword(), "system_fingerprint": keyword(),
            "usage_estimated": {"type": "boolean"}
        }},
        "build": {"properties": {"commit": keyword(), "target_features": keyword()}},
                        "prompt_excerpt": {"type": "text"},
                        "response_excerpt": {"type": "text"},
                        "redactions": {"properties": redactions},
                        "redactions_total": {"type": "integer"}

    });
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
                            "seed": {"type": "unsigned_long"}
                        }},
                        "response": {"properties": {
                            "id": keyword(), "model": keyword(), "finish_reasons": keyword()
                        }},
                        "usage": {"properties": {
                            "input_tokens": {"type": "long"}, "output_tokens": {"type": "long"}
                        }}
                    }},
                    "llm": {"properties": llm},
                    "data_stream": {"properties": {
                        "type": {"type": "constant_keyword"},
                        "dataset": {"type": "constant_keyword"},
                        "namespace": {"type": "constant_keyword"}
                    }}
                }
            }
        }
    })
}

/// The index template of the data stream `logs-llmgate.requests-*`.
pub fn index_template_body() -> Value {
    json!({
        "_meta": {"managed_by": "llmgate"},
        "index_patterns": [format!("logs-{DATASET}-*")],
        "data_stream": {},
        "priority": TEMPLATE_PRIORITY,
        "composed_of": [COMPONENT_TEMPLATE],
        "template": {
            "settings": {"index.lifecycle.name": POLICY}
        }
    })
}

/// `url` without the user and password it may carry, for log lines.
pub fn display_url(url: &str) -> String {
    match elasticsearch::http::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_password(None);
            let _ = parsed.set_username("");
            parsed.to_string()
        }
        Err(_) => "<not a valid URL>".to_owned(),
    }
}

/// A connection to the cluster.
pub struct Cluster {
    client: Elasticsearch,
    data_stream: String,
    retention_days: u32,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("data_stream", &self.data_stream)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Builds the client (no I/O): URL or Cloud id, credentials, custom CA, gzip.
    pub fn new(config: &EsConfig, data_stream: String) -> Result<Self, String> {
        let credentials = match &config.auth {
            EsAuth::None => None,
            EsAuth::Basic { username, password } => {
                Some(Credentials::Basic(username.clone(), password.clone()))
            }
            EsAuth::ApiKey(key) => Some(Credentials::EncodedApiKey(key.clone())),
        };
        // Every transport gets the same timeout, compression, credentials and CA: the
        // crate's `Transport::cloud` shortcut sets none but the credentials.
        let mut builder = match (&config.cloud_id, &config.url) {
            (Some(cloud_id), _) => {
                if credentials.is_none() {
                    return Err("an Elastic Cloud id needs credentials (API key or user)".into());
                }
                let pool = CloudConnectionPool::new(cloud_id).map_err(|e| e.to_string())?;
                TransportBuilder::new(pool)
            }
            (None, Some(url)) => {
                let url = url
                    .parse()
                    .map_err(|e| format!("the Elasticsearch URL is not valid: {e}"))?;
                TransportBuilder::new(SingleNodeConnectionPool::new(url))
            }
            (None, None) => return Err("no Elasticsearch URL or Cloud id".into()),
        }
        .request_body_compression(true)
        .timeout(config.timeout);
        if let Some(credentials) = credentials {
            builder = builder.auth(credentials);
        }
        if let Some(pem) = &config.ca_cert_pem {
            let cert = Certificate::from_pem(pem)
                .map_err(|e| format!("the CA certificate is not valid PEM: {e}"))?;
            builder = builder.cert_validation(CertificateValidation::Full(cert));
        }
        let transport = builder.build().map_err(|e| e.to_string())?;
        Ok(Self {
            client: Elasticsearch::new(transport),
            data_stream,
            retention_days: config.retention_days,
        })
    }

    /// Creates (or updates) the policy and both templates. Idempotent.
    pub async fn set_up(&self) -> Result<(), String> {
        let puts = [
            (
                format!("/_ilm/policy/{POLICY}"),
                policy_body(self.retention_days),
            ),
            (
                format!("/_component_template/{COMPONENT_TEMPLATE}"),
                component_template_body(),
            ),
            (
                format!("/_index_template/{INDEX_TEMPLATE}"),
                index_template_body(),
            ),
        ];
        for (path, body) in puts {
            let body = Bytes::from(body.to_string());
            let response = self
                .client
                .send(
                    Method::Put,
                    &path,
                    elasticsearch::http::headers::HeaderMap::new(),
                    Option::<&()>::None,
                    Some(body),
                    None,
                )
                .await
                .map_err(|e| format!("PUT {path}: {e}"))?;
            let status = response.status_code();
            if !status.is_success() {
                let text = response.text().await.unwrap_or_default();
                return Err(format!("PUT {path}: {status}: {text}"));
            }
        }
        Ok(())
    }

    /// One `_bulk` request with `create` for each document.
    pub async fn bulk(&self, docs: &[Encoded]) -> BulkResult {
        let body: Vec<Bytes> = docs.iter().map(|d| d.lines.clone()).collect();
        let response = self
            .client
            .bulk(BulkParts::Index(&self.data_stream))
            .include_source_on_error(false)
            .body(body)
            .send()
            .await;
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                return BulkResult::RetryAll {
                    reason: error.to_string(),
                    retry_after: None,
                }
            }
        };
        let status = response.status_code().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match response.bytes().await {
            Ok(body) => parse_bulk(status, retry_after.as_deref(), &body, docs.len()),
            Err(error) => BulkResult::RetryAll {
                reason: error.to_string(),
                retry_after: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_item_statuses_are_classified_one_by_one() {
        let body = br#"{"took":3,"errors":true,"items":[
            {"create":{"_index":".ds-logs-llmgate.requests-default-2026.11.30-000001","_id":"a","_version":1,"result":"created","status":201}},
            {"create":{"_index":".ds-x","_id":"b","status":409,"error":{"type":"version_conflict_engine_exception","reason":"[b]: version conflict, document already exists"}}},
            {"create":{"_index":".ds-x","_id":"c","status":429,"error":{"type":"es_rejected_execution_exception","reason":"rejected execution"}}},
            {"create":{"_index":".ds-x","_id":"d","status":400,"error":{"type":"document_parsing_exception","reason":"failed to parse field [llm.ttft_ms]"}}},
            {"create":{"_index":".ds-x","_id":"e","status":503,"error":{"type":"unavailable_shards_exception","reason":"primary shard is not active"}}}
        ]}"#;
        assert_eq!(
            parse_bulk(200, None, body, 5),
            BulkResult::Items(vec![
                Item::Indexed,
                Item::Duplicate,
                Item::Retry,
                Item::Rejected {
                    status: 400,
                    error_type: "document_parsing_exception".into(),
                    reason: "failed to parse field [llm.ttft_ms]".into(),
                },
                Item::Retry,
            ])
        );
    }

    #[test]
    fn urls_are_logged_without_credentials() {
        assert_eq!(
            display_url("https://llmgate:s3cret@es.internal:9200/"),
            "https://es.internal:9200/"
        );
        assert_eq!(display_url("not a url"), "<not a valid URL>");
    }

    #[test]
    fn whole_request_failures_retry_split_or_reject() {
        let err = br#"{"error":{"type":"circuit_breaking_exception","reason":"[parent] Data too large"},"status":429}"#;
        assert_eq!(
            parse_bulk(429, Some("7"), err, 2),
            BulkResult::RetryAll {
                reason: "[parent] Data too large".into(),
                retry_after: Some(Duration::from_secs(7)),
            }
        );
        assert!(matches!(
            parse_bulk(503, None, b"", 2),
            BulkResult::RetryAll {
                retry_after: None,
                ..
            }
        ));
        assert_eq!(parse_bulk(413, None, b"", 2), BulkResult::Split);
        assert!(matches!(
            parse_bulk(400, None, br#"{"error":{"type":"illegal_argument_exception","reason":"Malformed action/metadata line"}}"#, 2),
            BulkResult::RejectAll { status: 400, .. }
        ));
        // A proxy's answer is not the cluster refusing the documents.
        assert!(matches!(
            parse_bulk(404, None, b"<html>not found</html>", 2),
            BulkResult::RetryAll { .. }
        ));
        // An answer that does not account for every document is not trusted.
        assert!(matches!(
            parse_bulk(200, None, br#"{"errors":false,"items":[]}"#, 2),
            BulkResult::RetryAll { .. }
        ));
    }

    /// `UPDATE_GOLDEN=1 cargo test --lib golden` rewrites the files after a deliberate
    /// change; review the diff like code.
    #[test]
    fn set_up_bodies_match_the_golden_files() {
        let golden = |name: &str| -> Value {
            let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                let body = match name {
                    "ilm_policy.json" => policy_body(30),
                    "component_template.json" => component_template_body(),
                    _ => index_template_body(),
                };
                let text = serde_json::to_string_pretty(&body).expect("json") + "\n";
                std::fs::write(&path, text).expect("write golden file");
            }
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        assert_eq!(policy_body(30), golden("ilm_policy.json"));
        assert_eq!(component_template_body(), golden("component_template.json"));
        assert_eq!(index_template_body(), golden("index_template.json"));
    }
}

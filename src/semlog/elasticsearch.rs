//! Elasticsearch and OpenSearch, through the official `elasticsearch` crate (rustls, gzip
//! bodies, plain `application/json`, which both accept): the calls of the start-up
//! set-up (`setup`) and `_bulk` with `create`.
//!
//! [`parse_bulk`] turns a bulk answer into data, per item: indexed (2xx), duplicate (409:
//! already indexed, not retried), retry with its [`Trouble`] (a state of the cluster that
//! passes: a block, a closed index, 429, 5xx, credentials or an index the operator must
//! fix), or rejected (the document itself: a mapping or parsing error, too large; dead
//! letter); or, for the whole request: retry it, split it (413) or reject it (a 400 about
//! the request). [`decide`] is the one table of which is which. The indexer acts on that
//! data; it is unit-tested on canned answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use elasticsearch::auth::Credentials;
use elasticsearch::cert::{Certificate, CertificateValidation};
use elasticsearch::http::transport::{
    CloudConnectionPool, SingleNodeConnectionPool, TransportBuilder,
};
use elasticsearch::http::Method;
use elasticsearch::{BulkParts, Elasticsearch};
use serde_json::Value;

use super::config::{EsAuth, EsConfig};
use super::document::Encoded;
use super::health::Trouble;

/// The answer to one bulk attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum BulkResult {
    /// One outcome per document sent, in order.
    Items(Vec<Item>),
    /// Nothing was indexed and trying again later may work: connection refused, timeout,
    /// 429 or 5xx for the whole request. `retry_after` from the `Retry-After` header.
    RetryAll {
        trouble: Trouble,
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
    /// The cluster cannot take this document now (see [`decide`]).
    Retry {
        trouble: Trouble,
        reason: String,
    },
    /// The document itself is refused: it will never be accepted as it is.
    Rejected {
        status: u16,
        error_type: String,
        reason: String,
    },
}

/// What to do with a document (or a whole request) the cluster answered `status` and
/// `error_type` for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Indexed,
    Duplicate,
    /// Keep it and send it again later, however long that takes.
    Retry(Trouble),
    /// The document is refused for what it is: to the dead-letter file.
    DeadLetter,
}

/// The retry table. Everything that says the cluster is not taking writes now is a
/// state that passes (an operator lifts a block, opens an index, frees disk, fixes a
/// key), so the document waits in the spool; only a refusal of the document itself
/// (mapping, parsing, size) is final.
pub fn decide(status: u16, error_type: &str) -> Decision {
    match (status, error_type) {
        (200..=299, _) => Decision::Indexed,
        (409, _) => Decision::Duplicate,
        // 403 FORBIDDEN/8 (index.blocks.write), 429 TOO_MANY_REQUESTS/12 (the flood
        // stage's read_only_allow_delete), or a cluster-wide block.
        (_, "cluster_block_exception") => Decision::Retry(Trouble::Blocked),
        (_, "index_closed_exception") => Decision::Retry(Trouble::Closed),
        (429, _) => Decision::Retry(Trouble::Throttled),
        (408 | 500..=599, _) | (_, "unavailable_shards_exception") => {
            Decision::Retry(Trouble::Unavailable)
        }
        // The credentials, a privilege, or a missing index (auto-create off): fixed on
        // the operator's side, not in the document.
        (401 | 403 | 404, _) | (_, "security_exception" | "index_not_found_exception") => {
            Decision::Retry(Trouble::Refused)
        }
        // 400 mapper_parsing_exception, document_parsing_exception,
        // illegal_argument_exception; 413 for one document; anything else.
        _ => Decision::DeadLetter,
    }
}

/// Classifies a bulk response (status, `Retry-After`, body) for `sent` documents.
pub fn parse_bulk(status: u16, retry_after: Option<&str>, body: &[u8], sent: usize) -> BulkResult {
    let retry_after = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    // Parsed once: the error of a refused request, or the items of an answered one.
    let answer = serde_json::from_slice::<Value>(body).ok();
    let error = answer.as_ref().map_or(&Value::Null, |v| &v["error"]);
    let error_type = error["type"].as_str().unwrap_or_default();
    let reason = || {
        error["reason"]
            .as_str()
            .or(error["type"].as_str())
            .map(clipped)
            .unwrap_or_else(|| format!("status {status}"))
    };
    match status {
        200..=299 => {}
        413 => return BulkResult::Split,
        // A 400 about the request itself (a malformed line): no retry will change that.
        400 if decide(status, error_type) == Decision::DeadLetter => {
            return BulkResult::RejectAll {
                status,
                reason: reason(),
            }
        }
        // Anything else (a block, 429, 5xx, authentication, a proxy's 404 or 502) is
        // a state of the cluster or fixed on the operator's side: keep the documents.
        _ => {
            let trouble = match decide(status, error_type) {
                Decision::Retry(trouble) => trouble,
                _ => Trouble::Refused,
            };
            return BulkResult::RetryAll {
                trouble,
                reason: reason(),
                retry_after,
            };
        }
    }
    let Some(answer) = answer else {
        return BulkResult::RetryAll {
            trouble: Trouble::Unavailable,
            reason: "the bulk answer is not JSON".into(),
            retry_after: None,
        };
    };
    let Some(items) = answer["items"].as_array().filter(|i| i.len() == sent) else {
        return BulkResult::RetryAll {
            trouble: Trouble::Unavailable,
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
    let error_type = result["error"]["type"].as_str().unwrap_or("unknown");
    let reason = || {
        clipped(
            result["error"]["reason"]
                .as_str()
                .unwrap_or("no reason given"),
        )
    };
    match decide(status, error_type) {
        Decision::Indexed => Item::Indexed,
        Decision::Duplicate => Item::Duplicate,
        Decision::Retry(trouble) => Item::Retry {
            trouble,
            reason: reason(),
        },
        Decision::DeadLetter => Item::Rejected {
            status,
            error_type: clipped(error_type),
            reason: reason(),
        },
    }
}

/// The most characters of a cluster's reason kept: it goes into log lines, dead letters
/// and metric-adjacent logs, and a proxy may answer megabytes.
const MAX_REASON_CHARS: usize = 512;

fn clipped(reason: &str) -> String {
    match reason.char_indices().nth(MAX_REASON_CHARS - 1) {
        Some((at, _)) => format!("{}…", &reason[..at]),
        None => reason.to_owned(),
    }
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
    /// Send `include_source_on_error=false` with `_bulk` (set by the set-up).
    include_source_on_error: AtomicBool,
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
            EsAuth::Basic { username, password } => Some(Credentials::Basic(
                username.clone(),
                password.expose().to_owned(),
            )),
            EsAuth::ApiKey(key) => Some(Credentials::EncodedApiKey(key.expose().to_owned())),
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
            include_source_on_error: AtomicBool::new(false),
        })
    }

    /// The data stream (or index) the documents go to.
    pub fn data_stream(&self) -> &str {
        &self.data_stream
    }

    /// Whether `_bulk` sends `include_source_on_error=false` (only clusters that know it:
    /// any other parameter is refused by OpenSearch and older Elasticsearch).
    pub fn set_include_source_on_error(&self, on: bool) {
        self.include_source_on_error.store(on, Ordering::Relaxed);
    }

    /// One set-up call: the status and body of the answer, or why none came.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String), String> {
        let method = match method {
            "GET" => Method::Get,
            "POST" => Method::Post,
            _ => Method::Put,
        };
        let body = body.map(|b| Bytes::from(b.to_string()));
        let response = self
            .client
            .send(
                method,
                path,
                elasticsearch::http::headers::HeaderMap::new(),
                Option::<&()>::None,
                body,
                None,
            )
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        let status = response.status_code().as_u16();
        let text = response.text().await.unwrap_or_default();
        Ok((status, text))
    }

    /// One `_bulk` request with `create` for each document. A cluster that refuses
    /// `include_source_on_error` (it did not say its version) is asked once more without.
    pub async fn bulk(&self, docs: &[Encoded]) -> BulkResult {
        let result = self.bulk_once(docs).await;
        let refused_parameter = matches!(&result, BulkResult::RejectAll { reason, .. }
            if reason.contains("include_source_on_error"));
        if refused_parameter && self.include_source_on_error.swap(false, Ordering::Relaxed) {
            tracing::info!(
                "The cluster does not know include_source_on_error; bulk requests go without it."
            );
            return self.bulk_once(docs).await;
        }
        result
    }

    async fn bulk_once(&self, docs: &[Encoded]) -> BulkResult {
        let body: Vec<Bytes> = docs.iter().map(|d| d.lines.clone()).collect();
        let request = self.client.bulk(BulkParts::Index(&self.data_stream));
        let response = if self.include_source_on_error.load(Ordering::Relaxed) {
            request
                .include_source_on_error(false)
                .body(body)
                .send()
                .await
        } else {
            request.body(body).send().await
        };
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                return BulkResult::RetryAll {
                    trouble: Trouble::Unreachable,
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
                trouble: Trouble::Unreachable,
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
                Item::Retry {
                    trouble: Trouble::Throttled,
                    reason: "rejected execution".into()
                },
                Item::Rejected {
                    status: 400,
                    error_type: "document_parsing_exception".into(),
                    reason: "failed to parse field [llm.ttft_ms]".into(),
                },
                Item::Retry {
                    trouble: Trouble::Unavailable,
                    reason: "primary shard is not active".into()
                },
            ])
        );
    }

    #[test]
    fn a_block_or_a_closed_index_is_retried_and_only_the_document_itself_is_final() {
        // OpenSearch 2.19's answers to `index.blocks.write: true`, the flood stage and
        // a closed backing index.
        let body = br#"{"took":0,"errors":true,"items":[
            {"create":{"_index":".ds-logs-x-000001","_id":"a","status":403,"error":{"type":"cluster_block_exception","reason":"index [.ds-logs-x-000001] blocked by: [FORBIDDEN/8/index write (api)];"}}},
            {"create":{"_index":".ds-logs-x-000001","_id":"b","status":429,"error":{"type":"cluster_block_exception","reason":"index [.ds-logs-x-000001] blocked by: [TOO_MANY_REQUESTS/12/disk usage exceeded flood-stage watermark, index has read-only-allow-delete block];"}}},
            {"create":{"_index":".ds-logs-x-000001","_id":"c","status":400,"error":{"type":"index_closed_exception","reason":"closed"}}},
            {"create":{"_index":".ds-logs-x-000001","_id":"d","status":400,"error":{"type":"mapper_parsing_exception","reason":"failed to parse field [llm.ttft_ms] of type [float]"}}},
            {"create":{"_index":".ds-logs-x-000001","_id":"e","status":403,"error":{"type":"security_exception","reason":"action [indices:data/write/bulk[s]] is unauthorized"}}}
        ]}"#;
        let BulkResult::Items(items) = parse_bulk(200, None, body, 5) else {
            panic!("items");
        };
        let troubles: Vec<Option<Trouble>> = items
            .iter()
            .map(|item| match item {
                Item::Retry { trouble, .. } => Some(*trouble),
                _ => None,
            })
            .collect();
        assert_eq!(
            troubles,
            [
                Some(Trouble::Blocked),
                Some(Trouble::Blocked),
                Some(Trouble::Closed),
                None,
                Some(Trouble::Refused)
            ]
        );
        assert!(matches!(&items[3], Item::Rejected { status: 400, .. }));
        // A whole request against a closed index or a block is kept too.
        let closed =
            br#"{"error":{"type":"index_closed_exception","reason":"closed"},"status":400}"#;
        assert!(matches!(
            parse_bulk(400, None, closed, 1),
            BulkResult::RetryAll {
                trouble: Trouble::Closed,
                ..
            }
        ));
        let blocked = br#"{"error":{"type":"cluster_block_exception","reason":"blocked by: [FORBIDDEN/12/index read-only / allow delete (api)]"},"status":403}"#;
        assert!(matches!(
            parse_bulk(403, None, blocked, 1),
            BulkResult::RetryAll {
                trouble: Trouble::Blocked,
                ..
            }
        ));
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
                trouble: Trouble::Throttled,
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
}

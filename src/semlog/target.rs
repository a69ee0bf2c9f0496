//! What kind of cluster the semantic log goes to, read from its own answers: `GET /`
//! (`version.number`, `version.build_flavor` such as `serverless`,
//! `version.distribution: opensearch`), then what the set-up calls accept.
//!
//! The product decides which requests are valid there (Elasticsearch 8 and 9, Elastic
//! Cloud hosted and Serverless, OpenSearch 2 and 3): which retention API exists (ILM,
//! the data stream lifecycle, ISM), which mapping types (`constant_keyword` came to
//! OpenSearch only in 2.14, `unsigned_long` in 2.8), which `_bulk` parameters
//! (`include_source_on_error` is Elasticsearch 8.18's; OpenSearch refuses any parameter
//! it does not know). Everything here is pure: unit-tested on canned answers.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The search engine behind the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Product {
    Elasticsearch,
    OpenSearch,
    /// `GET /` did not say (a proxy, a key without the `monitor` privilege).
    Unknown,
}

impl Product {
    pub fn as_str(self) -> &'static str {
        match self {
            Product::Elasticsearch => "elasticsearch",
            Product::OpenSearch => "opensearch",
            Product::Unknown => "unknown",
        }
    }
}

/// The cluster as `GET /` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub product: Product,
    /// `version.number` as the cluster gives it; empty when unknown.
    pub version: String,
    /// Elastic Cloud Serverless (`build_flavor: serverless`): no ILM, no index-level
    /// lifecycle settings; retention is the data stream lifecycle.
    pub serverless: bool,
}

impl Target {
    /// What `GET /`'s body says.
    pub fn from_root(body: &Value) -> Self {
        let version = &body["version"];
        let number = version["number"].as_str().unwrap_or_default().to_owned();
        let opensearch = version["distribution"].as_str() == Some("opensearch")
            || body["tagline"]
                .as_str()
                .is_some_and(|t| t.contains("OpenSearch"));
        let product = if opensearch {
            Product::OpenSearch
        } else if version.is_object() || body["tagline"].as_str() == Some("You Know, for Search") {
            Product::Elasticsearch
        } else {
            Product::Unknown
        };
        Self {
            product,
            version: number,
            serverless: version["build_flavor"].as_str() == Some("serverless"),
        }
    }

    /// A cluster `GET /` could not describe.
    pub fn unknown() -> Self {
        Self {
            product: Product::Unknown,
            version: String::new(),
            serverless: false,
        }
    }

    /// `(major, minor)`, or `(0, 0)` when the version is unknown or not a number.
    pub fn major_minor(&self) -> (u32, u32) {
        let mut parts = self
            .version
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor),
            (Some(major), None) => (major, 0),
            _ => (0, 0),
        }
    }

    /// `_bulk?include_source_on_error=false` keeps a refused document's source out of
    /// the error (and so out of the gateway's logs): Elasticsearch 8.18 and later, and
    /// Serverless, know it; an older Elasticsearch and OpenSearch refuse the request.
    pub fn knows_include_source_on_error(&self) -> bool {
        match self.product {
            Product::Elasticsearch => self.serverless || self.major_minor() >= (8, 18),
            Product::OpenSearch | Product::Unknown => false,
        }
    }

    /// Mapping types this cluster may lack: `constant_keyword` (OpenSearch 2.14+) and
    /// `unsigned_long` (OpenSearch 2.8+) become `keyword` where unsure.
    pub fn plain_mapping_types(&self) -> bool {
        self.product != Product::Elasticsearch
    }

    /// The retention the cluster's kind offers, for `lifecycle = auto`.
    pub fn auto_lifecycle(&self) -> IndexLifecycle {
        match self.product {
            Product::Elasticsearch if self.serverless => IndexLifecycle::DataStream,
            Product::Elasticsearch => IndexLifecycle::Ilm,
            Product::OpenSearch => IndexLifecycle::Ism,
            // Try ILM: most clusters are Elasticsearch, and a refusal falls back.
            Product::Unknown => IndexLifecycle::Ilm,
        }
    }

    /// "Elasticsearch 8.15.3", "Elasticsearch Serverless", "OpenSearch 3.8.0".
    pub fn describe(&self) -> String {
        let name = match (self.product, self.serverless) {
            (Product::Elasticsearch, true) => return "Elasticsearch Serverless".to_owned(),
            (Product::Elasticsearch, false) => "Elasticsearch",
            (Product::OpenSearch, _) => "OpenSearch",
            (Product::Unknown, _) => "a cluster that did not say what it is",
        };
        if self.version.is_empty() {
            name.to_owned()
        } else {
            format!("{name} {}", self.version)
        }
    }
}

/// How old documents are deleted (`semlog.lifecycle`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum IndexLifecycle {
    /// What the cluster offers: ILM on Elasticsearch, the data stream lifecycle on
    /// Serverless, ISM on OpenSearch; falling back when the API is missing.
    #[default]
    Auto,
    /// An index lifecycle management policy (Elasticsearch self-managed and hosted).
    Ilm,
    /// The data stream lifecycle, `data_retention` in the index template
    /// (Elasticsearch 8.11+, the only one on Serverless).
    DataStream,
    /// An Index State Management policy (OpenSearch's plugin).
    Ism,
    /// None: documents are kept until someone deletes them.
    None,
}

impl IndexLifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            IndexLifecycle::Auto => "auto",
            IndexLifecycle::Ilm => "ilm",
            IndexLifecycle::DataStream => "data_stream",
            IndexLifecycle::Ism => "ism",
            IndexLifecycle::None => "none",
        }
    }

    /// What to try when this one's API is missing (`auto` only; an explicit choice that
    /// fails is an error, and the documents are indexed without retention).
    pub fn fallback(self, target: &Target) -> IndexLifecycle {
        match self {
            // The data stream lifecycle came with 8.11.
            IndexLifecycle::Ilm
                if target.product != Product::OpenSearch && target.major_minor() >= (8, 11) =>
            {
                IndexLifecycle::DataStream
            }
            IndexLifecycle::Ilm if target.product == Product::Unknown => IndexLifecycle::Ism,
            _ => IndexLifecycle::None,
        }
    }
}

/// How one set-up call went, from its status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupAnswer {
    /// 2xx.
    Done,
    /// It exists already (a data stream; an ISM policy: updating one needs its sequence
    /// number, and an existing one is the operator's to keep).
    Exists,
    /// The API or a part of the body is not there on this cluster: no handler for the
    /// route (400 or 404), 410 `api_not_available_exception` (Serverless), an unknown
    /// setting, field or mapping type.
    Missing(String),
    /// 401 or 403: the credentials lack a privilege.
    Denied(String),
    /// 429, 5xx: try again later.
    Transient(String),
    /// Another 4xx: this body is refused as it is.
    Refused(String),
}

/// Reads a set-up call's answer.
pub fn answer(status: u16, body: &str) -> SetupAnswer {
    let reason = || reason_of(body);
    let lower = body.to_ascii_lowercase();
    match status {
        200..=299 => SetupAnswer::Done,
        401 | 403 => SetupAnswer::Denied(reason()),
        // 501: the server does not do this at all (no retry changes that).
        501 => SetupAnswer::Missing(reason()),
        408 | 429 | 500..=599 => SetupAnswer::Transient(reason()),
        409 => SetupAnswer::Exists,
        400 if lower.contains("resource_already_exists_exception") => SetupAnswer::Exists,
        410 => SetupAnswer::Missing(reason()),
        400 | 404
            if lower.contains("no handler found")
                || lower.contains("api_not_available")
                || lower.contains("unknown setting")
                || lower.contains("unknown field")
                || lower.contains("no handler for type")
                || lower.contains("not supported")
                || lower.contains("unsupported_operation") =>
        {
            SetupAnswer::Missing(reason())
        }
        _ => SetupAnswer::Refused(reason()),
    }
}

/// An error body's reason, short: Elasticsearch's `error.reason` (or `root_cause`), a
/// plain `error` string, or the text itself.
fn reason_of(body: &str) -> String {
    let text = match serde_json::from_str::<Value>(body) {
        Ok(value) => {
            let error = &value["error"];
            error
                .as_str()
                .or_else(|| error["reason"].as_str())
                .or_else(|| error["root_cause"][0]["reason"].as_str())
                .map_or_else(|| body.to_owned(), str::to_owned)
        }
        Err(_) => body.to_owned(),
    };
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_clusters_root_names_its_kind() {
        let es8 = Target::from_root(
            &json!({"version": {"number": "8.15.3", "build_flavor": "default"}, "tagline": "You Know, for Search"}),
        );
        assert_eq!(
            (es8.product, es8.serverless),
            (Product::Elasticsearch, false)
        );
        assert_eq!(es8.major_minor(), (8, 15));
        assert!(!es8.knows_include_source_on_error(), "added in 8.18");
        assert_eq!(es8.auto_lifecycle(), IndexLifecycle::Ilm);
        assert_eq!(es8.describe(), "Elasticsearch 8.15.3");

        let es9 =
            Target::from_root(&json!({"version": {"number": "9.1.0", "build_flavor": "default"}}));
        assert!(es9.knows_include_source_on_error());

        let serverless = Target::from_root(
            &json!({"version": {"number": "8.11.0", "build_flavor": "serverless"}, "tagline": "You Know, for Search"}),
        );
        assert!(serverless.serverless && serverless.knows_include_source_on_error());
        assert_eq!(serverless.auto_lifecycle(), IndexLifecycle::DataStream);
        assert_eq!(serverless.describe(), "Elasticsearch Serverless");

        let opensearch = Target::from_root(
            &json!({"version": {"number": "2.11.1", "distribution": "opensearch"}, "tagline": "The OpenSearch Project: https://opensearch.org/"}),
        );
        assert_eq!(opensearch.product, Product::OpenSearch);
        assert!(!opensearch.knows_include_source_on_error() && opensearch.plain_mapping_types());
        assert_eq!(opensearch.auto_lifecycle(), IndexLifecycle::Ism);

        let proxy = Target::from_root(&json!({"message": "ok"}));
        assert_eq!(proxy.product, Product::Unknown);
        assert_eq!(proxy.major_minor(), (0, 0));
    }

    #[test]
    fn a_missing_lifecycle_api_falls_back_to_what_the_cluster_has() {
        let es = |v: &str| Target {
            product: Product::Elasticsearch,
            version: v.into(),
            serverless: false,
        };
        let cases = [
            (
                IndexLifecycle::Ilm,
                es("8.15.3"),
                IndexLifecycle::DataStream,
            ),
            (IndexLifecycle::Ilm, es("8.10.0"), IndexLifecycle::None),
            (
                IndexLifecycle::DataStream,
                es("8.15.3"),
                IndexLifecycle::None,
            ),
            (IndexLifecycle::Ism, es("2.11.0"), IndexLifecycle::None),
            (IndexLifecycle::Ilm, Target::unknown(), IndexLifecycle::Ism),
        ];
        for (wanted, target, fallback) in cases {
            assert_eq!(
                wanted.fallback(&target),
                fallback,
                "{wanted:?} on {target:?}"
            );
        }
    }

    #[test]
    fn set_up_answers_are_told_apart() {
        let no_handler =
            r#"{"error":"no handler found for uri [/_ilm/policy/x] and method [PUT]"}"#;
        assert!(matches!(answer(400, no_handler), SetupAnswer::Missing(_)));
        let serverless = r#"{"error":{"root_cause":[{"type":"api_not_available_exception","reason":"Request for uri [/_ilm/policy/x] with method [PUT] exists but is not available when running in serverless mode"}],"type":"api_not_available_exception","reason":"Request for uri [/_ilm/policy/x] with method [PUT] exists but is not available when running in serverless mode"},"status":410}"#;
        assert!(
            matches!(answer(410, serverless), SetupAnswer::Missing(r) if r.contains("serverless mode"))
        );
        let setting = r#"{"error":{"type":"settings_exception","reason":"unknown setting [index.lifecycle.name] please check that any required plugins are installed"},"status":400}"#;
        assert!(matches!(answer(400, setting), SetupAnswer::Missing(_)));
        let exists = r#"{"error":{"type":"resource_already_exists_exception","reason":"data_stream [logs-llmgate.requests-default] already exists"},"status":400}"#;
        assert_eq!(answer(400, exists), SetupAnswer::Exists);
        assert_eq!(answer(409, ""), SetupAnswer::Exists);
        let denied = r#"{"error":{"type":"security_exception","reason":"action [cluster:admin/ilm/put] is unauthorized for API key id [x]"},"status":403}"#;
        assert!(
            matches!(answer(403, denied), SetupAnswer::Denied(r) if r.contains("unauthorized"))
        );
        assert!(matches!(answer(503, "{}"), SetupAnswer::Transient(_)));
        let mapping = r#"{"error":{"type":"mapper_parsing_exception","reason":"Failed to parse mapping: unknown parameter [foo]"},"status":400}"#;
        assert!(matches!(answer(400, mapping), SetupAnswer::Refused(_)));
        assert_eq!(answer(201, ""), SetupAnswer::Done);
        assert!(
            matches!(
                answer(501, "Unsupported method ('GET')"),
                SetupAnswer::Missing(_)
            ),
            "not implemented is not worth waiting for"
        );
    }
}

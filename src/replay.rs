//! `llmgate replay`: re-sends recorded requests to a gateway and says whether each answer
//! is the one that was logged.
//!
//! A replay file is the request body plus two values from the request's log line:
//!
//! ```json
//! {"request": {"model": "...", "messages": [...], "seed": 7, "temperature": 0.8},
//!  "system_fingerprint": "fp_...", "output_hash": "<sha256 of the answer text>"}
//! ```
//!
//! The answer is reproducible when the request (same `input_hash`), the seed and the
//! `system_fingerprint` are the same; a fingerprint mismatch is reported separately, since
//! a different model file, engine or device is expected to answer differently. The
//! logged hashes are keyed (the semantic log's hash key), so the answer's is made with
//! the same key.

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
pub struct ReplayFile {
    pub request: Value,
    pub system_fingerprint: String,
    pub output_hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub output_matches: bool,
    pub fingerprint_matches: bool,
    pub output_hash: String,
    pub system_fingerprint: String,
}

impl Verdict {
    pub fn summary(&self) -> &'static str {
        match (self.output_matches, self.fingerprint_matches) {
            (true, true) => "match",
            (true, false) => "match (other system_fingerprint)",
            (false, true) => "MISMATCH",
            (false, false) => {
                "MISMATCH (other system_fingerprint: a different model, engine or device)"
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("the request could not be sent: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the gateway answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the answer has no message content: {0}")]
    Shape(String),
    #[error("the replay file's request is not a JSON object")]
    NotAnObject,
}

/// Sends `file.request` (non-streamed) to `base_url` and compares the answer.
pub async fn replay(
    client: &reqwest::Client,
    base_url: &str,
    file: &ReplayFile,
    key: &crate::redact::HashKey,
) -> Result<Verdict, ReplayError> {
    let mut body = file.request.clone();
    let object = body.as_object_mut().ok_or(ReplayError::NotAnObject)?;
    object.insert("stream".into(), Value::Bool(false));
    object.remove("stream_options");
    let url = format!("{}/v1/chat/completions", base_url.trim_end_matches('/'));
    let response = client.post(url).json(&body).send().await?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(ReplayError::Status {
            status: status.as_u16(),
            body,
        });
    }
    let answer: Value = response.json().await?;
    let content = answer["choices"][0]["message"]["content"]
        .as_str()
        .ok_or_else(|| ReplayError::Shape(answer.to_string()))?;
    let output_hash = key.hash(&crate::record::output_hash(content));
    let system_fingerprint = answer["system_fingerprint"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok(Verdict {
        output_matches: output_hash == file.output_hash,
        fingerprint_matches: system_fingerprint == file.system_fingerprint,
        output_hash,
        system_fingerprint,
    })
}

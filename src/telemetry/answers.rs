//! Each finished request's figures, kept a while for a client that cannot read them from
//! its answer: a proxy in front of the gateway may drop the `timings` object of streamed
//! answers (LiteLLM's proxy does; it keeps it on non-streamed ones). The response's
//! `x-request-id` header, or its `id`, finds them at `GET /stats/requests/{id}`, under
//! the keys the `timings` object has.
//!
//! The last [`KEPT`] requests are kept, each reachable by both of its ids, under the API
//! key that sent it (none without keys): another key cannot read it, nor hide it by
//! sending a request with the same `x-request-id`. One key's two requests under one id:
//! the later one wins.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::record::RequestRecord;

/// Requests whose figures are kept (about 1 KiB each).
pub const KEPT: usize = 4096;

/// One finished request's figures, as `GET /stats/requests/{id}` answers them.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[schema(as = Answer)]
pub struct RequestFigures {
    /// `llmgate.request`.
    pub object: &'static str,
    /// The request's id: its `x-request-id` (the client's, or the gateway's own).
    pub request_id: String,
    /// The response's `id` (`chatcmpl-…`, `cmpl-…`); absent for a request refused
    /// before it was answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub model: String,
    pub stream: bool,
    /// `ok`, `error` or `cancelled`.
    pub status: &'static str,
    /// A failed or cancelled request's error type, as its error body and the metrics
    /// name it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<&'static str>,
    #[schema(value_type = Object)]
    pub usage: Value,
    /// The response's `timings` object: the same keys and definitions, with e2e taken
    /// when its last frame was handed over (the answer's own is a moment earlier).
    #[schema(value_type = Object)]
    pub timings: Value,
    /// An upstream model's replica that served it, and the endpoints tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub upstream: Option<Value>,
    /// Whose it is: only that key may read it, when keys are on.
    #[serde(skip)]
    pub api_key_id: Option<String>,
}

impl RequestFigures {
    pub fn of(record: &RequestRecord) -> Self {
        let mut timings = serde_json::to_value(&record.timings).unwrap_or_default();
        if let (Some(quality), Some(object)) = (&record.quality, timings.as_object_mut()) {
            if let Ok(Value::Object(quality)) = serde_json::to_value(quality) {
                object.extend(quality);
            }
        }
        // The replica that answered, as the response's `timings.upstream` names it.
        if let (Some(upstream), Some(object)) = (&record.upstream, timings.as_object_mut()) {
            object.insert(
                "upstream".to_owned(),
                serde_json::json!({
                    "endpoint": upstream.endpoint,
                    "system_fingerprint": upstream.system_fingerprint,
                }),
            );
        }
        let usage = &record.usage;
        Self {
            object: "llmgate.request",
            request_id: record.request_id.clone(),
            id: record.response_id.clone().filter(|id| !id.is_empty()),
            model: record.model.clone(),
            stream: record.stream,
            status: record.status.as_str(),
            error_type: record.error_kind,
            finish_reason: record.finish_reason.map(|r| r.as_str()),
            usage: serde_json::json!({
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            }),
            timings,
            upstream: record.upstream.as_ref().map(|u| {
                serde_json::json!({
                    "endpoint": u.endpoint,
                    "attempts": u.attempts.iter().map(|a| serde_json::json!({
                        "endpoint": a.endpoint,
                        "error_type": a.error_type,
                    })).collect::<Vec<_>>(),
                })
            }),
            api_key_id: record.api_key_id.clone(),
        }
    }
}

/// The last [`KEPT`] answers, by either id.
#[derive(Debug, Default)]
pub struct Answers {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    order: VecDeque<Arc<RequestFigures>>,
    /// By (API key id, request or response id).
    by_id: HashMap<(Option<String>, String), Arc<RequestFigures>>,
}

impl Answers {
    pub fn observe(&self, record: &RequestRecord) {
        let answer = Arc::new(RequestFigures::of(record));
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids(&answer) {
            inner.by_id.insert(key(&answer, id), Arc::clone(&answer));
        }
        inner.order.push_back(answer);
        while inner.order.len() > KEPT {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            for id in ids(&old) {
                // Unless a later request took the id.
                let key = key(&old, id);
                if inner.by_id.get(&key).is_some_and(|a| Arc::ptr_eq(a, &old)) {
                    inner.by_id.remove(&key);
                }
            }
        }
    }

    /// The answer `id` names (a request id or a response id) among those `api_key_id`
    /// sent (`None`: without keys).
    pub fn get(&self, api_key_id: Option<&str>, id: &str) -> Option<Arc<RequestFigures>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .by_id
            .get(&(api_key_id.map(str::to_owned), id.to_owned()))
            .cloned()
    }
}

fn key(answer: &RequestFigures, id: &str) -> (Option<String>, String) {
    (answer.api_key_id.clone(), id.to_owned())
}

fn ids(answer: &RequestFigures) -> impl Iterator<Item = &str> {
    std::iter::once(answer.request_id.as_str()).chain(answer.id.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(request_id: &str, response_id: &str) -> RequestRecord {
        let mut r = crate::record::sample();
        r.request_id = request_id.into();
        r.response_id = Some(response_id.into());
        r.api_key_id = None;
        r
    }

    #[test]
    fn an_answer_is_found_by_either_id_with_the_timings_keys() {
        let answers = Answers::default();
        let r = record("req-1", "chatcmpl-1");
        answers.observe(&r);
        let by_request = answers.get(None, "req-1").expect("by the request id");
        assert!(Arc::ptr_eq(
            &by_request,
            &answers.get(None, "chatcmpl-1").unwrap()
        ));
        let json = serde_json::to_value(&*by_request).unwrap();
        assert_eq!(
            json["timings"]["ttft_ms"],
            serde_json::json!(r.timings.ttft_ms)
        );
        assert_eq!(
            json["timings"]["e2e_ms"],
            serde_json::json!(r.timings.e2e_ms)
        );
        if let Some(quality) = &r.quality {
            assert_eq!(
                json["timings"]["repetition_rate"],
                serde_json::json!(quality.repetition_rate)
            );
        }
        assert!(json.get("api_key_id").is_none(), "whose it is stays inside");
        assert!(answers.get(None, "req-2").is_none());
    }

    #[test]
    fn one_keys_answers_are_neither_read_nor_hidden_by_another() {
        let answers = Answers::default();
        let mut alice = record("shared-id", "chatcmpl-a");
        alice.api_key_id = Some("alice".into());
        let mut mallory = record("shared-id", "chatcmpl-m");
        mallory.api_key_id = Some("mallory".into());
        answers.observe(&alice);
        answers.observe(&mallory);
        let mine = answers
            .get(Some("alice"), "shared-id")
            .expect("alice's own");
        assert_eq!(mine.id.as_deref(), Some("chatcmpl-a"));
        assert!(answers.get(Some("mallory"), "chatcmpl-a").is_none());
        assert!(answers.get(None, "shared-id").is_none());
    }

    #[test]
    fn the_oldest_go_and_a_reused_id_names_the_later_request() {
        let answers = Answers::default();
        answers.observe(&record("same", "chatcmpl-a"));
        answers.observe(&record("same", "chatcmpl-b"));
        assert_eq!(
            answers.get(None, "same").unwrap().id.as_deref(),
            Some("chatcmpl-b")
        );
        for i in 0..KEPT - 1 {
            answers.observe(&record(&format!("r{i}"), &format!("c{i}")));
        }
        // chatcmpl-a was the oldest: gone, without taking "same" from the later one.
        assert!(answers.get(None, "chatcmpl-a").is_none());
        assert_eq!(
            answers.get(None, "same").unwrap().id.as_deref(),
            Some("chatcmpl-b")
        );
        answers.observe(&record("r-last", "c-last"));
        assert!(answers.get(None, "same").is_none() && answers.get(None, "chatcmpl-b").is_none());
        assert!(answers.get(None, "r0").is_some() && answers.get(None, "c-last").is_some());
    }
}

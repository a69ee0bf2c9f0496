//! `llm.*` fields of a request with tools or reasoning (docs/timings.md, "Reasoning and
//! tool calls"; docs/semantic-logs.md): the times of each kind of output, and the tools
//! offered and called, whose arguments are kept only as a redacted excerpt.

use serde::Serialize;

use crate::record::RequestRecord;
use crate::redact::Redacted;
use crate::timing::{TokensByKind, TpotByKind};

/// The times of each kind of output, flattened into `llm`; each left out where it does
/// not apply (a plain answer has none).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(super) struct KindFields {
    #[serde(skip_serializing_if = "Option::is_none")]
    answer_ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_tokens: Option<u32>,
    /// Characters of reasoning, beside its tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_chars: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls_done_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_tokens_by_kind: Option<TokensByKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tpot_ms_by_kind: Option<TpotByKind>,
}

impl KindFields {
    pub(super) fn of(r: &RequestRecord) -> Self {
        let k = &r.timings.kinds;
        Self {
            answer_ttft_ms: k.answer_ttft_ms,
            reasoning_ms: k.reasoning_ms,
            reasoning_tokens: k.reasoning_tokens,
            reasoning_chars: r
                .agent
                .as_ref()
                .map(|a| a.reasoning_chars)
                .filter(|&n| n > 0),
            tool_call_ttft_ms: k.tool_call_ttft_ms,
            tool_calls_done_ms: k.tool_calls_done_ms,
            output_tokens_by_kind: k.output_tokens_by_kind,
            tpot_ms_by_kind: k.tpot_ms_by_kind,
        }
    }
}

/// `llm.tools`: what the request offered and what the answer called.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Tools {
    /// The names of the tools offered.
    offered: Vec<String>,
    /// The names of the tools called, in order (one per call).
    called: Vec<String>,
    /// How many calls the answer made.
    calls: usize,
    /// Bytes of the calls' arguments, all together.
    argument_bytes: usize,
    /// The calls as `name(arguments)`, one per line, redacted like any text.
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments_excerpt: Option<Redacted>,
}

impl Tools {
    /// `None` for a request that offered no tools and called none.
    pub(super) fn of(r: &RequestRecord, arguments_excerpt: Option<Redacted>) -> Option<Self> {
        let agent = r.agent.as_ref()?;
        if agent.offered.is_empty() && agent.calls.is_empty() {
            return None;
        }
        Some(Self {
            offered: agent.offered.clone(),
            called: agent.calls.iter().map(|c| c.name.clone()).collect(),
            calls: agent.calls.len(),
            argument_bytes: agent.calls.iter().map(|c| c.arguments.len()).sum(),
            arguments_excerpt,
        })
    }
}

/// The calls of `r` as one text to redact (`name(arguments)` per line); `None` without
/// calls.
pub(super) fn calls_text(r: &RequestRecord) -> Option<String> {
    let calls = &r.agent.as_ref()?.calls;
    (!calls.is_empty()).then(|| {
        calls
            .iter()
            .map(|c| format!("{}({})", c.name, c.arguments))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// The mappings of the fields above, under `llm`.
pub(crate) fn mappings(properties: &mut serde_json::Value) {
    use serde_json::json;
    let double = || json!({"type": "double"});
    let integer = || json!({"type": "integer"});
    for field in [
        "answer_ttft_ms",
        "reasoning_ms",
        "tool_call_ttft_ms",
        "tool_calls_done_ms",
    ] {
        properties[field] = double();
    }
    properties["reasoning_tokens"] = integer();
    properties["reasoning_chars"] = integer();
    let kinds = || json!({"properties": {"reasoning": {}, "answer": {}, "tool_calls": {}}});
    let mut tokens = kinds();
    let mut tpot = kinds();
    for kind in ["reasoning", "answer", "tool_calls"] {
        tokens["properties"][kind] = integer();
        tpot["properties"][kind] = double();
    }
    properties["output_tokens_by_kind"] = tokens;
    properties["tpot_ms_by_kind"] = tpot;
    properties["tools"] = json!({"properties": {
        "offered": {"type": "keyword"}, "called": {"type": "keyword"},
        "calls": {"type": "short"}, "argument_bytes": {"type": "integer"},
        "arguments_excerpt": {"type": "text"}
    }});
}

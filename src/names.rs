//! Every metric name, label value and span attribute llmgate exports, in one place, so
//! the dashboards, alert rules and tests have one list to check against.

/// Prefix of every Prometheus metric (added by the registry).
pub const METRIC_PREFIX: &str = "llmgate";

// Histograms (seconds unless the name says otherwise).
pub const TIME_TO_FIRST_TOKEN: &str = "time_to_first_token_seconds";
pub const TIME_PER_OUTPUT_TOKEN: &str = "time_per_output_token_seconds";
pub const INTER_TOKEN_LATENCY: &str = "inter_token_latency_seconds";
pub const E2E_REQUEST_LATENCY: &str = "e2e_request_latency_seconds";
pub const REQUEST_QUEUE_TIME: &str = "request_queue_time_seconds";
/// Upstream models: request sent upstream -> its first content chunk (the upstream's
/// share of TTFT; the rest is the gateway's).
pub const UPSTREAM_TIME_TO_FIRST_TOKEN: &str = "upstream_time_to_first_token_seconds";
/// Reasoning models and tool calls (docs/timings.md): request received -> the first
/// answer content after any reasoning (`timings.answer_ttft_ms`).
pub const TIME_TO_FIRST_ANSWER_TOKEN: &str = "time_to_first_answer_token_seconds";
/// The first reasoning token -> the first token of another kind (`timings.reasoning_ms`).
pub const REASONING_TIME: &str = "reasoning_seconds";
/// Request received -> the first tool-call delta (`timings.tool_call_ttft_ms`).
pub const TIME_TO_TOOL_CALL: &str = "time_to_tool_call_seconds";
/// Request received -> the last tool call's arguments complete
/// (`timings.tool_calls_done_ms`).
pub const TOOL_CALL_ARGUMENTS_COMPLETE: &str = "tool_call_arguments_complete_seconds";
/// What the gateway added to the end of each request, less the model's and the client's
/// parts (`timings.overhead_ms`).
pub const GATEWAY_OVERHEAD: &str = "gateway_overhead_seconds";
pub const REPETITION_RATE: &str = "repetition_rate";
/// Per answer: the mean surprisal of its tokens (minus their mean log-probability, in
/// nats; positive, so rates of the histogram's `_sum` work), and the share of unlikely
/// tokens.
pub const MEAN_TOKEN_SURPRISAL: &str = "mean_token_surprisal_nats";
pub const LOW_CONFIDENCE_SHARE: &str = "low_confidence_share";

// Counters. prometheus-client appends `_total` to counter names when it encodes them.
pub const REQUESTS: &str = "requests";
pub const PROMPT_TOKENS: &str = "prompt_tokens";
pub const GENERATION_TOKENS: &str = "generation_tokens";
pub const REFUSALS: &str = "refusals";
pub const DEGENERATIONS: &str = "degenerations";
pub const TRACES_SAMPLED: &str = "traces_sampled";
pub const TRACES_DROPPED: &str = "traces_dropped";
pub const TRACE_SPANS_DROPPED: &str = "trace_spans_dropped";
pub const LOG_LINES_DROPPED: &str = "log_lines_dropped";
/// Answers by what their repetition rate was computed over (`basis`).
pub const REPETITION_BASIS: &str = "repetition_basis";

// The semantic-log pipeline.
pub const SEMLOG_QUEUED: &str = "semlog_queued";
pub const SEMLOG_INDEXED: &str = "semlog_indexed";
pub const SEMLOG_DUPLICATES: &str = "semlog_duplicates";
pub const SEMLOG_RETRIED: &str = "semlog_retried";
pub const SEMLOG_DEAD_LETTERED: &str = "semlog_dead_lettered";
pub const SEMLOG_DEFERRED: &str = "semlog_deferred";
pub const SEMLOG_DROPPED: &str = "semlog_dropped";
pub const SEMLOG_REDACTIONS: &str = "semlog_redactions";
pub const SEMLOG_FILES_DELETED: &str = "semlog_files_deleted";
pub const SEMLOG_BULK_LATENCY: &str = "semlog_bulk_latency_seconds";
pub const SEMLOG_QUEUE_DEPTH: &str = "semlog_queue_depth";
pub const SEMLOG_READY: &str = "semlog_ready";
/// Set-up steps the cluster refused for good, by `step` (the documents go anyway).
pub const SEMLOG_SETUP_PROBLEMS: &str = "semlog_setup_problems";
/// Info (value 1): the cluster's product and version, the retention applied
/// (`lifecycle`, `none` when there is none) and whether documents go to a data stream.
pub const SEMLOG_TARGET_INFO: &str = "semlog_target_info";
// Registered with the unit `bytes`, so exported as `..._bytes`.
pub const SEMLOG_SPOOLED_BYTES: &str = "semlog_spool";

// Shared state (`[state]`).
/// 1 while the shared state's Redis answers, 0 when it does not.
pub const STATE_UP: &str = "state_up";
/// Calls to the shared state that gave no answer, by `reason` (`timeout`, `error`).
pub const STATE_FAILURES: &str = "state_failures";
pub const QUOTA_TOKENS: &str = "quota_tokens";
pub const SHADOW_COMPARED: &str = "shadow_compared";
pub const SHADOW_DROPPED: &str = "shadow_dropped";
pub const SHADOW_TTFT_DELTA: &str = "shadow_ttft_delta_seconds";
pub const SHADOW_TPOT_DELTA: &str = "shadow_tpot_delta_seconds";
pub const SHADOW_E2E_DELTA: &str = "shadow_e2e_delta_seconds";
pub const SHADOW_EDIT_DISTANCE: &str = "shadow_edit_distance";

// Gauges, refreshed at each scrape.
pub const REQUESTS_RUNNING: &str = "requests_running";
pub const REQUESTS_WAITING: &str = "requests_waiting";
pub const REQUESTS_IN_FLIGHT: &str = "requests_in_flight";
/// Per model, 0..1: the KV-cache positions the running sequences hold over what the
/// engine can hold (`engine::KvCacheUse`); absent for an upstream model.
pub const KV_CACHE_USAGE: &str = "kv_cache_usage_ratio";
// Registered with the unit `bytes`, so exported as `..._bytes`.
pub const PROCESS_RESIDENT_MEMORY: &str = "process_resident_memory";
pub const GPU_MEMORY_USED: &str = "gpu_memory_used";
pub const GPU_MEMORY_TOTAL: &str = "gpu_memory_total";
/// 1 while an upstream model's server is reachable (last probe or request), else 0.
pub const UPSTREAM_UP: &str = "upstream_up";
/// Per upstream endpoint (replica): TTFT and TPOT of what it served, attempts by
/// outcome, its routing state and what this gateway has in flight there.
pub const ENDPOINT_TIME_TO_FIRST_TOKEN: &str = "endpoint_time_to_first_token_seconds";
pub const ENDPOINT_TIME_PER_OUTPUT_TOKEN: &str = "endpoint_time_per_output_token_seconds";
pub const ENDPOINT_ATTEMPTS: &str = "endpoint_attempts";
pub const ENDPOINT_STATE: &str = "endpoint_state";
pub const ENDPOINT_DRIFTING: &str = "endpoint_drifting";
pub const ENDPOINT_OUTSTANDING: &str = "endpoint_outstanding_requests";
/// Scrapes of an endpoint's own `/metrics` that failed or named no queue.
pub const ENDPOINT_SCRAPE_FAILURES: &str = "endpoint_scrape_failures";
/// Info gauges (value 1): the binary and the served model.
pub const BUILD_INFO: &str = "build_info";
pub const MODEL_INFO: &str = "model_info";

/// `model` label of requests that never named the served model (refused before parsing,
/// or asking for another model): the label takes configured values only.
pub const MODEL_NONE: &str = "none";
/// `finish_reason` / `error_type` label of requests that have none.
pub const LABEL_NONE: &str = "none";
/// `traffic` label of `requests_total`: a client's request, or a shadow copy of one that
/// no client waited for.
pub const TRAFFIC_CLIENT: &str = "client";
pub const TRAFFIC_SHADOW: &str = "shadow";
/// `error_type` of a request the client abandoned.
pub const CANCELLED: &str = "cancelled";
/// `error_type` of a failed request whose record names no kind: the engine failed (the
/// kind of `ApiError::Engine`).
pub const ENGINE_ERROR: &str = "engine_error";
/// `error.type` of a stream cut off because its client accepted no bytes for the stream
/// write timeout.
pub const CLIENT_STALLED: &str = "client_stalled";

// Span names.
/// Handed to the engine -> its prompt rendered with the chat template, counted, and its
/// grammar compiled.
pub const SPAN_TOKENIZE: &str = "tokenize";
/// Prompt ready -> the engine starts it (its slot acquired; the rate-limit charge too).
pub const SPAN_QUEUE: &str = "queue";
/// The engine starts it -> its first token.
pub const SPAN_PREFILL: &str = "prefill";
pub const SPAN_DECODE: &str = "decode";
pub const SPAN_SEMLOG_HANDOFF: &str = "semlog.handoff";

/// `gen_ai.operation.name` of a request span: chat completions, or the legacy text
/// completions (the GenAI conventions' names); and `gen_ai.provider.name`.
pub const OPERATION_CHAT: &str = "chat";
pub const OPERATION_TEXT_COMPLETION: &str = "text_completion";
pub const PROVIDER: &str = "llmgate";

// Span attributes that no semantic convention defines.
pub const ATTR_TTFT_MS: &str = "llm.ttft_ms";
/// Request sent to an upstream -> its first content chunk (upstream models only).
pub const ATTR_UPSTREAM_TTFT_MS: &str = "llm.upstream_ttft_ms";
pub const ATTR_ANSWER_TTFT_MS: &str = "llm.answer_ttft_ms";
pub const ATTR_REASONING_MS: &str = "llm.reasoning_ms";
pub const ATTR_REASONING_TOKENS: &str = "llm.reasoning_tokens";
pub const ATTR_TOOL_CALL_TTFT_MS: &str = "llm.tool_call_ttft_ms";
pub const ATTR_TOOL_CALLS_DONE_MS: &str = "llm.tool_calls_done_ms";
pub const ATTR_TOOL_CALLS: &str = "llm.tool_calls";
pub const ATTR_TOOLS_CALLED: &str = "llm.tools.called";
/// What the gateway added to the end of the request (`timings.overhead_ms`).
pub const ATTR_OVERHEAD_MS: &str = "llm.overhead_ms";
/// An upstream model: the endpoint (replica) that served the request, or failed last.
pub const ATTR_UPSTREAM_ENDPOINT: &str = "llm.upstream.endpoint";
/// An upstream model: endpoints tried (more than 1: it failed over).
pub const ATTR_UPSTREAM_ATTEMPTS: &str = "llm.upstream.attempts";
/// What the repetition rate's token ids are (`tokens::RepetitionBasis`).
pub const ATTR_REPETITION_BASIS: &str = "llm.repetition_basis";
pub const ATTR_TPOT_MS: &str = "llm.tpot_ms";
pub const ATTR_E2E_MS: &str = "llm.e2e_ms";
pub const ATTR_QUEUE_MS: &str = "llm.queue_ms";
pub const ATTR_REPETITION_RATE: &str = "llm.repetition_rate";
pub const ATTR_MEAN_LOGPROB: &str = "llm.mean_logprob";
pub const ATTR_LANGUAGE: &str = "llm.language";
pub const ATTR_ANSWER_LANGUAGE: &str = "llm.answer_language";
pub const ATTR_MIN_LOGPROB: &str = "llm.min_logprob";
pub const ATTR_LOW_CONFIDENCE_SHARE: &str = "llm.low_confidence_share";
pub const ATTR_DEGENERATED: &str = "llm.degenerated";
pub const ATTR_REFUSAL: &str = "llm.refusal";
pub const ATTR_INTENT: &str = "llm.intent";
pub const ATTR_REQUEST_ID: &str = "llm.request_id";
/// The id of the API key a request presented (never the key; never a metric label).
pub const ATTR_API_KEY_ID: &str = "llm.api_key_id";
pub const ATTR_STREAM: &str = "llm.stream";
pub const ATTR_STATUS: &str = "llm.status";

// OpenTelemetry GenAI semantic conventions. Spelled out here: the
// opentelemetry-semantic-conventions crate deprecates them since they moved to the
// separate GenAI conventions repository, which publishes no Rust crate.
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
pub const GEN_AI_REQUEST_SEED: &str = "gen_ai.request.seed";
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const GEN_AI_REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
pub const GEN_AI_REQUEST_TOP_P: &str = "gen_ai.request.top_p";
pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// General semantic conventions: the class of error a failed operation ended with.
pub const ERROR_TYPE: &str = "error.type";

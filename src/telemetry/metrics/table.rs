//! Every metric family of the registry but the per-endpoint ones (`endpoints`), declared
//! once: the field that holds it, how it is made, its name and help text, its unit. The
//! order of the rows is the order of the exposition.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::families::*;
use crate::names;

declare_families! {
    /// The families of `Metrics` but the per-endpoint ones, one field each.
    pub(super) struct Families {
        ttft: ExemplarHistograms = exemplar_family(TTFT_BUCKETS),
            names::TIME_TO_FIRST_TOKEN,
            "Time from receiving a request to handing its first content frame to the transport";
        upstream_ttft: Histograms = histogram_family(TTFT_BUCKETS),
            names::UPSTREAM_TIME_TO_FIRST_TOKEN,
            "Upstream models: time from sending a request upstream to its first content chunk arriving (the upstream's share of TTFT)";
        answer_ttft: Histograms = histogram_family(TTFT_BUCKETS),
            names::TIME_TO_FIRST_ANSWER_TOKEN,
            "Reasoning models and tool calls: time from receiving a request to handing its first answer content (after any reasoning) to the transport";
        reasoning: Histograms = histogram_family(REQUEST_BUCKETS),
            names::REASONING_TIME,
            "Reasoning models: time from the first reasoning token to the first token of another kind";
        tool_call_ttft: Histograms = histogram_family(TTFT_BUCKETS),
            names::TIME_TO_TOOL_CALL,
            "Tool calls: time from receiving a request to handing its first tool-call delta to the transport";
        tool_calls_done: Histograms = histogram_family(REQUEST_BUCKETS),
            names::TOOL_CALL_ARGUMENTS_COMPLETE,
            "Tool calls: time from receiving a request to the last tool call's arguments being complete (when an agent can run its tools)";
        tpot: ExemplarHistograms = exemplar_family(TOKEN_BUCKETS),
            names::TIME_PER_OUTPUT_TOKEN,
            "Mean time per output token after the first, per request";
        itl: Histograms = histogram_family(TOKEN_BUCKETS),
            names::INTER_TOKEN_LATENCY,
            "Every gap between consecutive content frames";
        e2e: ExemplarHistograms = exemplar_family(REQUEST_BUCKETS),
            names::E2E_REQUEST_LATENCY,
            "Time from receiving a request to handing its final frame to the transport";
        queue: Histograms = histogram_family(REQUEST_BUCKETS),
            names::REQUEST_QUEUE_TIME,
            "Time from receiving a request to the engine starting it";
        overhead: Histograms = histogram_family(OVERHEAD_BUCKETS),
            names::GATEWAY_OVERHEAD,
            "What the gateway added to the end of each request: its time before the engine starts it and after the last token, less the client's";
        repetition: Histograms = histogram_family(RATE_BUCKETS),
            names::REPETITION_RATE,
            "seq-rep-n repetition rate of each answer (0 = no repeated n-gram)";
        mean_logprob: Histograms = histogram_family(SURPRISAL_BUCKETS),
            names::MEAN_TOKEN_SURPRISAL,
            "Mean surprisal of each answer's tokens: minus their mean log-probability, in nats (0 = certain)";
        low_confidence: Histograms = histogram_family(RATE_BUCKETS),
            names::LOW_CONFIDENCE_SHARE,
            "Share of each answer's tokens less likely than quality.low_confidence_prob";
        requests: Family<RequestLabels, Counter> = Family::default(),
            names::REQUESTS,
            "Requests by outcome: status, finish reason and error type";
        prompt_tokens: Counters = Family::default(),
            names::PROMPT_TOKENS,
            "Prompt tokens processed (tokens in)";
        generation_tokens: Counters = Family::default(),
            names::GENERATION_TOKENS,
            "Completion tokens generated (tokens out)";
        refusals: Counters = Family::default(),
            names::REFUSALS,
            "Answers that declined the request";
        degenerations: Counters = Family::default(),
            names::DEGENERATIONS,
            "Answers stopped by the degeneration guard";
        repetition_basis: Family<BasisLabels, Counter> = Family::default(),
            names::REPETITION_BASIS,
            "Answers by what their repetition rate was computed over: token_ids (the engine's), logprob_tokens, tokenizer or words (an upstream's stand-ins)";
        upstream_up: Family<ModelLabel, Gauge> = Family::default(),
            names::UPSTREAM_UP,
            "1 while an upstream model's server answers (its last probe or request), 0 when it cannot be reached";
        state_up: Family<BackendLabel, Gauge> = Family::default(),
            names::STATE_UP,
            "1 while the shared state's backend answers (a request's call or the watcher's ping each second), 0 when it does not; absent without one";
        state_failures: Family<ReasonLabel, Counter> = Family::default(),
            names::STATE_FAILURES,
            "Calls to the shared state's backend (for requests, answers' counts, fleets' routing state and /stats; not the watcher's pings) that gave no answer within the deadline (timeout), failed (error), or were not tried because the watcher's pings went unanswered (down); each request among them met state.on_failure";
        quota_tokens: Family<KeyLabel, Counter> = Family::default(),
            names::QUOTA_TOKENS,
            "Tokens counted against API keys' quotas by this gateway (prompt and completion of each answer), by key id; summed over gateways, what the keys used";
        shadow_compared: Family<PairOutcomeLabels, Counter> = Family::default(),
            names::SHADOW_COMPARED,
            "Shadowed requests whose two sides both ended, by how the answers compare: identical, different, or failed (one side gave none)";
        shadow_dropped: Family<PairReasonLabels, Counter> = Family::default(),
            names::SHADOW_DROPPED,
            "Requests picked for shadowing whose copy was not sent: busy (shadow.max_in_flight copies in flight) or load (the gateway crowded: over half full, or a client waiting behind copies in the candidate's engine); or stopped while it ran, to make way for clients (shed)";
        shadow_ttft_delta: PairHistograms = pair_family(DELTA_BUCKETS),
            names::SHADOW_TTFT_DELTA,
            "Shadowed requests: the candidate's TTFT minus the primary's";
        shadow_tpot_delta: PairHistograms = pair_family(DELTA_BUCKETS),
            names::SHADOW_TPOT_DELTA,
            "Shadowed requests: the candidate's TPOT minus the primary's";
        shadow_e2e_delta: PairHistograms = pair_family(DELTA_BUCKETS),
            names::SHADOW_E2E_DELTA,
            "Shadowed requests: the candidate's end-to-end time minus the primary's";
        shadow_edit_distance: PairHistograms = pair_family(SHARE_BUCKETS),
            names::SHADOW_EDIT_DISTANCE,
            "Shadowed requests both sides answered: word-level edit distance of the answers (0 identical, 1 nothing in common)";
        traces_sampled: Family<ReasonLabel, Counter> = Family::default(),
            names::TRACES_SAMPLED,
            "Request traces kept by the tail sampler, by reason";
        traces_dropped: Family<ReasonLabel, Counter> = Family::default(),
            names::TRACES_DROPPED,
            "Request traces not exported, by reason";
        trace_spans_dropped: Family<ReasonLabel, Counter> = Family::default(),
            names::TRACE_SPANS_DROPPED,
            "Spans dropped before their trace was decided, by reason";
        log_lines_dropped: Counter = Counter::default(),
            names::LOG_LINES_DROPPED,
            "Log lines dropped because the log writer's queue was full";
        semlog_queued: Counter = Counter::default(),
            names::SEMLOG_QUEUED,
            "Semantic-log documents written to the spool for the indexer";
        semlog_indexed: Counter = Counter::default(),
            names::SEMLOG_INDEXED,
            "Semantic-log documents accepted by the sink";
        semlog_duplicates: Counter = Counter::default(),
            names::SEMLOG_DUPLICATES,
            "Semantic-log documents Elasticsearch already had (409, or found in the data stream before a re-send)";
        semlog_retried: Counter = Counter::default(),
            names::SEMLOG_RETRIED,
            "Semantic-log documents that could not go out and wait to be sent again (429, 5xx, a block, no answer)";
        semlog_dead_lettered: Counter = Counter::default(),
            names::SEMLOG_DEAD_LETTERED,
            "Semantic-log documents refused for good, in the dead-letter file";
        semlog_deferred: Counter = Counter::default(),
            names::SEMLOG_DEFERRED,
            "Semantic-log deliveries put off because the cluster was unavailable (per try)";
        semlog_dropped: Family<ReasonLabel, Counter> = Family::default(),
            names::SEMLOG_DROPPED,
            "Semantic-log documents lost, by reason (queue and spool both full, I/O error)";
        semlog_redactions: Family<KindLabel, Counter> = Family::default(),
            names::SEMLOG_REDACTIONS,
            "Values redacted from semantic logs, by kind";
        semlog_files_deleted: Family<KindLabel, Counter> = Family::default(),
            names::SEMLOG_FILES_DELETED,
            "NDJSON files deleted, oldest first, to keep semlog.files_max_bytes (kind: requests, dead_letter)";
        semlog_bulk_latency: Histogram = Histogram::new(REQUEST_BUCKETS.iter().copied()),
            names::SEMLOG_BULK_LATENCY,
            "Duration of each Elasticsearch bulk request";
        semlog_queue_depth: Gauge = Gauge::default(),
            names::SEMLOG_QUEUE_DEPTH,
            "Semantic-log documents in the spool not yet delivered";
        semlog_ready: Gauge = Gauge::default(),
            names::SEMLOG_READY,
            "1 while the semantic-log sink is set up and taking documents; 0 before its set-up and while it is degraded (/ready names the problem; documents wait in the spool)";
        semlog_setup_problems: Family<StepLabel, Counter> = Family::default(),
            names::SEMLOG_SETUP_PROBLEMS,
            "Semantic-log set-up steps the cluster refused for good, by step (documents are indexed anyway; the log says what to change)";
        semlog_target: Family<TargetLabels, Gauge> = Family::default(),
            names::SEMLOG_TARGET_INFO,
            "The semantic log's cluster: product, version, the retention applied (none: nothing is deleted) and whether it is a data stream (value 1)";
        semlog_spooled_bytes: Gauge = Gauge::default(),
            names::SEMLOG_SPOOLED_BYTES,
            "Bytes of semantic-log documents waiting in the disk spool", unit Bytes;
        running: Gauge = Gauge::default(),
            names::REQUESTS_RUNNING,
            "Sequences the engine is working on";
        waiting: Gauge = Gauge::default(),
            names::REQUESTS_WAITING,
            "Admitted requests waiting for an engine slot";
        in_flight: Gauge = Gauge::default(),
            names::REQUESTS_IN_FLIGHT,
            "Admitted requests not yet finished";
        kv_cache_usage: Family<ModelLabel, Gauge<f64, AtomicU64>> = Family::default(),
            names::KV_CACHE_USAGE,
            "Share (0-1) of the engine's KV-cache positions the running sequences hold: prompt and output tokens over sequence slots times context length";
        resident_memory: Gauge = Gauge::default(),
            names::PROCESS_RESIDENT_MEMORY,
            "Resident memory of the gateway process", unit Bytes;
        gpu_memory: Family<GpuLabel, Gauge> = Family::default(),
            names::GPU_MEMORY_USED,
            "GPU memory in use, per device (NVML)", unit Bytes, if cfg!(feature = "gpu-metrics");
        gpu_memory_total: Family<GpuLabel, Gauge> = Family::default(),
            names::GPU_MEMORY_TOTAL,
            "GPU memory in all, per device (NVML)", unit Bytes, if cfg!(feature = "gpu-metrics");
        build_info: Family<BuildLabels, Gauge> = Family::default(),
            names::BUILD_INFO,
            "This binary: version, commit, compiler, profile and CPU features (value 1)";
        model_info: Family<ModelLabels, Gauge> = Family::default(),
            names::MODEL_INFO,
            "The served model: file hash, quantization, device and system_fingerprint (value 1)";
    }
}

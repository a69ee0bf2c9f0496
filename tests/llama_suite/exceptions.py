"""The tests of llama.cpp's server suite that llama-server passes on our model and llmgate
does not, each with why. scripts/llama-suite fails when a test is missing here, or when a
listed one names no test llama-server passes: the list is exactly what a client moving
from llama.cpp's server meets.

A name without brackets covers all its parametrizations. Two kinds of reason:
- LLAMA_ONLY: llama.cpp's own internals, or a choice where llmgate follows OpenAI (or a
  safer default) on purpose;
- NOT_BUILT: a gap, to close (issue 51).
"""

LLAMA_ONLY = "llama.cpp only"
NOT_BUILT = "not built yet"

EXCEPTIONS = {
    # test_basic.py
    "test_basic.py::test_server_model_aliases_and_tags":
        f"{LLAMA_ONLY}: model tags, and an id picked as the alphabetically first alias",
    "test_basic.py::test_server_props":
        f"{LLAMA_ONLY}: /props shows no model_path: the gateway does not show clients its "
        "file system (build_info, the system fingerprint, names the file by its sha256)",
    "test_basic.py::test_server_slots":
        f"{LLAMA_ONLY}: /slots is always served (read-only, behind the key); llama-server "
        "answers 501 unless started with --slots",
    # test_chat_completion.py
    "test_chat_completion.py::test_chat_completion_with_timings_per_token":
        f"{LLAMA_ONLY}: the first chunk carries content \"\" with the role, as OpenAI's "
        "does; the test asserts llama-server's null (timings_per_token itself is served)",
    "test_chat_completion.py::test_chat_completions_multiple_choices":
        f"{LLAMA_ONLY}: id_slot 0 (pinning a llama.cpp slot) is refused: the gateway places "
        "each request itself (n > 1 is served)",
    "test_chat_completion.py::test_chat_completions_token_count":
        f"{LLAMA_ONLY}: POST /chat/completions/input_tokens (POST /tokenize with messages "
        "counts the same)",
    "test_chat_completion.py::test_completion_with_response_format":
        f"{LLAMA_ONLY}: a json_object with a schema, and a json_schema without the name "
        "OpenAI requires; OpenAI's response_format is served as OpenAI defines it",
    "test_chat_completion.py::test_context_size_exceeded":
        f"{LLAMA_ONLY}: the error's type is OpenAI's (invalid_request_error, "
        "context_length_exceeded), not llama.cpp's exceed_context_size_error",
    "test_chat_completion.py::test_context_size_exceeded_stream":
        f"{LLAMA_ONLY}: as test_context_size_exceeded",
    "test_chat_completion.py::test_invalid_chat_completion_req[messages7]":
        f"{LLAMA_ONLY}: two assistant turns in a row are rendered as the model's template "
        "renders them (OpenAI accepts them too); llama.cpp's legacy templates refuse them",
    "test_chat_completion.py::test_logprobs_stream":
        f"{LLAMA_ONLY}: the first chunk carries content \"\" with the role, as OpenAI's "
        "does; the test asserts llama-server's null",
    "test_chat_completion.py::test_return_progress":
        f"{LLAMA_ONLY}: return_progress is served, but the suite seeds every request (its "
        "--seed 42, llmgate's --default-seed 42), and a seeded request reads its whole "
        "prompt itself, reusing no prefix another request left, so that a replay gives the "
        "same text: the second request's first report has cache 0, not the reuse the test "
        "wants (tests/llamacpp.rs shows the reuse for unseeded requests)",
    "test_chat_completion.py::test_verbose_debug":
        f"{LLAMA_ONLY}: verbose (llama.cpp's debug dump of the prompt and tokens)",
    "test_chat_completion.py::test_chat_template_assistant_prefill":
        f"{NOT_BUILT}: an assistant message last is rendered as a finished turn, not "
        "continued (llama-server's prefill, vLLM's continue_final_message); the test also "
        "reads the prompt from llama.cpp's __verbose dump",
    "test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat":
        f"{NOT_BUILT}: as test_chat_template_assistant_prefill",
    # test_completion.py
    "test_completion.py::test_completion_parallel_slots":
        f"{LLAMA_ONLY}: seeded sampling is the gateway's own, not llama.cpp's RNG: with seed "
        "42 at temperature 1, 'Write a very long book.' draws the end of text first; the "
        "test wants more than 10 characters (greedy answers match llama-server's)",
    "test_completion.py::test_completion_unified":
        f"{LLAMA_ONLY}: --kv-unified (one cache shared by all slots); each llmgate sequence "
        "has its own context, and a request that cannot fit is refused",
    # test_ctx_shift.py
    "test_ctx_shift.py::test_ctx_shift_disabled_stream":
        f"{LLAMA_ONLY}: a budget past what the context leaves (n_predict 256 in a 256-token "
        "context) is refused, as OpenAI refuses it, where llama-server generates until the "
        "context is full",
    # test_ignore_eos.py
    # test_security.py
    "test_security.py::test_correct_api_key":
        f"{LLAMA_ONLY}: /completions (no /v1) answers in OpenAI's shape, as the OpenAI SDK "
        "with a base URL without /v1 expects; llama.cpp's shape is at /completion",
    "test_security.py::test_correct_api_key_anthropic_header":
        f"{LLAMA_ONLY}: as test_correct_api_key (X-Api-Key itself is accepted)",
    "test_security.py::test_incorrect_api_key":
        f"{LLAMA_ONLY}: a 401 is OpenAI's (invalid_request_error, invalid_api_key), not "
        "llama.cpp's authentication_error",
    "test_security.py::test_cors_options":
        f"{LLAMA_ONLY}: no origin may call from a browser unless --cors-origin names it; "
        "llama-server allows every origin, with credentials, by default",
    "test_security.py::test_cors_origins_localhost_reflects":
        f"{LLAMA_ONLY}: the header is sent and right, but named in lowercase "
        "(access-control-allow-origin), as OpenAI's API sends header names; the test looks "
        "up llama-server's capitalised spelling in a case-sensitive dict",
    "test_security.py::test_cors_origins_localhost_rejects":
        f"{LLAMA_ONLY}: a preflight from an origin not allowed gets 400 (actix-cors); "
        "llama-server answers 200 without Access-Control-Allow-Origin: a browser refuses "
        "both",
    "test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled":
        f"{LLAMA_ONLY}: llama-server's built-in tools (--tools)",
    "test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers":
        f"{LLAMA_ONLY}: llama-server's web UI proxy (/cors-proxy)",
    # test_tool_call.py
    "test_tool_call.py::test_completion_without_tool_call_fast[meta-llama-Llama-3.3-70B-Instruct-128-tools0-None-CompletionMode.STREAMED]":
        f"{LLAMA_ONLY}: without tools, the first chunk carries content \"\" with the role, "
        "as OpenAI's does; the suite's stream reader refuses an empty content delta (as "
        "test_chat_completion_with_timings_per_token)",
    # test_template.py
    "test_template.py::test_date_inside_prompt[fireworks-ai-llama-3-firefunction-v2-%b %d %Y-None]":
        f"{NOT_BUILT}: FireFunction v2's template reads `functions`, a variable llama.cpp's "
        "server makes for that template alone (the tools as indented JSON); without it the "
        "template does not render, and the model does not load",
    "test_template.py::test_date_inside_prompt[fireworks-ai-llama-3-firefunction-v2-%b %d %Y-tools1]":
        f"{NOT_BUILT}: as the test above",
    "test_template.py::test_date_inside_prompt[fireworks-ai-llama-3-firefunction-v2-%b %d %Y-tools2]":
        f"{NOT_BUILT}: as the test above",
}

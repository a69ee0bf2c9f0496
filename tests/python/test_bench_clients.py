"""The requests the ecosystem's benchmark clients send, byte for byte as recorded from
them (AIPerf 0.13.0 and GuideLLM 0.8.1 against a recording server; the model name
swapped for the served one), answered correctly by the real binary on the default model.

GuideLLM sends `ignore_eos: true` on every request (8 of 8 failed with 400 before it
was honoured), user content as text parts, `max_completion_tokens`, and vLLM's
`stream_options.continuous_usage_stats`; it checks `GET /health` first. AIPerf sends
`X-Request-ID` and `X-Correlation-ID` UUIDs and counts tokens itself. The tools
themselves run in scripts/external-bench (their installs are 1.2 and 5.9 GB).
"""

import json
import urllib.request

from conftest import MODEL_ID

GUIDELLM_PROMPT = (
    "1 0 m0 Finish medical want almost away until. Its culture song reveal return finally"
    " affect.\nPush page seem quickly actually memory than. Them business subject"
)
AIPERF_PROMPT = (
    " tell me true But tell me then tis so for look thy cheeks Confess it tone to thother"
    " and thine eyes See it so grossly shown in"
)
AIPERF_HEADERS = {
    "User-Agent": "aiperf/0.13.0",
    "X-Request-ID": "ca09f3b9-d139-40cd-9f90-e1d76cc7d09b",
    "X-Correlation-ID": "5accd37f-a542-433c-8669-7f0ea6002331",
    "X-Session-Affinity": "5accd37f-a542-433c-8669-7f0ea6002331",
    "Content-Type": "application/json",
}
GUIDELLM_HEADERS = {
    "User-Agent": "python-httpx/0.28.1",
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "Content-Type": "application/json",
}


def send(base: str, path: str, body: str, headers: dict, accept: str = None):
    headers = dict(headers)
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(f"{base}{path}", data=body.encode(), headers=headers)
    answer = urllib.request.urlopen(request, timeout=120)
    return answer.status, dict(answer.headers), answer.read().decode()


def guidellm(base: str, path: str, template: str):
    """Sends GuideLLM's recorded body `template`, its model and prompt filled in, with
    GuideLLM's headers."""
    body = template % {"model": MODEL_ID, "prompt": json.dumps(GUIDELLM_PROMPT)}
    return send(base, path, body, GUIDELLM_HEADERS)


def aiperf(base: str, path: str, template: str, accept: str):
    """Sends AIPerf's recorded body `template`, its model and prompt filled in, with
    AIPerf's headers and `accept`."""
    body = template % {"model": MODEL_ID, "prompt": json.dumps(AIPERF_PROMPT)}
    return send(base, path, body, AIPERF_HEADERS, accept=accept)


def events(text: str) -> list:
    data = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", text
    return [json.loads(d) for d in data[:-1]]


def test_guidellm_checks_health_first(gateway):
    with urllib.request.urlopen(f"{gateway}/health", timeout=5) as answer:
        assert answer.status == 200


def test_guidellm_chat_stream_runs_to_its_output_length_with_usage_in_every_chunk(gateway):
    status, _, text = guidellm(
        gateway,
        "/v1/chat/completions",
        '{"model":"%(model)s","stream":true,"stream_options":{"include_usage":true,'
        '"continuous_usage_stats":true},"max_completion_tokens":16,"ignore_eos":true,'
        '"messages":[{"role":"user","content":[{"type":"text","text":%(prompt)s}]}]}',
    )
    assert status == 200
    chunks = events(text)
    assert all(c["usage"] is not None for c in chunks), "continuous usage stats"
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts), "the count only grows"
    last = chunks[-1]
    assert last["usage"]["completion_tokens"] == 16, "ignore_eos: exactly the output length"
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "length"
    assert last["timings"]["output_tokens"] == 16


def test_guidellm_chat_without_stream_and_completions_stream(gateway):
    status, _, text = guidellm(
        gateway,
        "/v1/chat/completions",
        '{"model":"%(model)s","max_completion_tokens":16,"ignore_eos":true,'
        '"messages":[{"role":"user","content":[{"type":"text","text":%(prompt)s}]}]}',
    )
    answer = json.loads(text)
    assert status == 200 and answer["usage"]["completion_tokens"] == 16
    assert answer["choices"][0]["finish_reason"] == "length"
    status, _, text = guidellm(
        gateway,
        "/v1/completions",
        '{"model":"%(model)s","stream":true,"stream_options":{"include_usage":true,'
        '"continuous_usage_stats":true},"max_tokens":16,"ignore_eos":true,"prompt":%(prompt)s}',
    )
    chunks = events(text)
    assert status == 200 and chunks[-1]["usage"]["completion_tokens"] == 16
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def test_aiperf_chat_stream_and_its_request_id(gateway):
    status, headers, text = aiperf(
        gateway,
        "/v1/chat/completions",
        '{"messages":[{"role":"user","content":%(prompt)s}],"model":"%(model)s","stream":true,'
        '"max_completion_tokens":16,"stream_options":{"include_usage":true}}',
        "text/event-stream",
    )
    assert status == 200
    assert headers["x-request-id"] == AIPERF_HEADERS["X-Request-ID"], "its id is ours too"
    chunks = events(text)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content
    assert 0 < chunks[-1]["usage"]["completion_tokens"] <= 16


def test_aiperf_non_streamed_chat_and_streamed_completions(gateway):
    status, _, text = aiperf(
        gateway,
        "/v1/chat/completions",
        '{"messages":[{"role":"user","content":%(prompt)s}],"model":"%(model)s","stream":false,'
        '"max_completion_tokens":16}',
        "application/json",
    )
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"]
    status, _, text = aiperf(
        gateway,
        "/v1/completions",
        '{"prompt":%(prompt)s,"model":"%(model)s","stream":true,"max_tokens":16,'
        '"stream_options":{"include_usage":true}}',
        "text/event-stream",
    )
    assert status == 200 and events(text)[-1]["usage"]["completion_tokens"] > 0

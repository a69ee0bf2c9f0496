"""LiteLLM's proxy in front of llmgate, as users put it there (scripts/peers installs it).

LiteLLM drops the `timings` object from streamed answers (it keeps it on non-streamed
ones). What it keeps are the chunks' `id` and the gateway's `x-request-id` (as
`llm_provider-x-request-id`), and either finds the answer's figures at the gateway's
`GET /stats/requests/{id}`, under the keys `timings` has.
"""

import json
import urllib.error
import os
import subprocess
import tempfile
import time
import urllib.request

import openai
import pytest

from conftest import BINARY, ROOT, free_port, launch

LITELLM = ROOT / ".peers" / "litellm" / "bin" / "litellm"
MASTER_KEY = "sk-litellm-test-master"


def wait_for(url, headers=None, seconds=60):
    deadline = time.monotonic() + seconds
    while True:
        try:
            request = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(request, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A scripted upstream, the gateway in front of it, and LiteLLM in front of that."""
    if not LITELLM.exists():
        pytest.fail("scripts/peers installs LiteLLM's proxy into .peers/litellm")
    data = tmp_path_factory.mktemp("litellm")
    up_port = free_port()
    upstream = subprocess.Popen(
        [str(BINARY), "scripted-upstream", "--listen", f"127.0.0.1:{up_port}", "--tokens", "6",
         "--tokens-per-second", "200"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_for(f"http://127.0.0.1:{up_port}/v1/models")
    gateway = launch(data / "gateway", "--model-id", "fleet", "--upstream-model", "scripted",
                     "--upstream-url", f"http://127.0.0.1:{up_port}/v1")
    config = data / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fleet\n"
        "    litellm_params:\n"
        "      model: openai/fleet\n"
        f"      api_base: {gateway.base}/v1\n"
        "      api_key: unused\n"
    )
    port = free_port()
    log = tempfile.TemporaryFile()
    proxy = subprocess.Popen(
        [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
         "--num_workers", "1"],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY_DISABLED": "true",
             "LITELLM_MODE": "PRODUCTION", "LITELLM_MASTER_KEY": MASTER_KEY},
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/health/liveliness",
                 {"Authorization": f"Bearer {MASTER_KEY}"}, seconds=120)
    except AssertionError:
        log.seek(0)
        pytest.fail(f"LiteLLM did not start: {log.read().decode(errors='replace')[-2000:]}")
    yield gateway, f"http://127.0.0.1:{port}"
    for proc in (proxy, gateway.proc, upstream):
        proc.terminate()
        proc.wait(timeout=30)


def figures(gateway, request_id):
    """The gateway's figures of one request; they are kept as it ends, just after [DONE]."""
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"{gateway.base}/stats/requests/{request_id}", timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            assert e.code == 404 and time.monotonic() < deadline, e.read()
            time.sleep(0.1)


def test_figures_a_proxy_drops_from_a_stream_are_found_by_its_ids(stack):
    gateway, proxy = stack
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key=MASTER_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="fleet", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
    )
    request_id = raw.headers["llm_provider-x-request-id"]
    chunks = list(raw.parse())
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "tok0 tok1 tok2 tok3 tok4 tok5"
    last = chunks[-1]
    # What the client behind LiteLLM has of the figures in the stream (LiteLLM
    # 1.108.7: none; were it to keep them, they would have to agree below).
    carried = (last.model_extra or {}).get("timings")
    by_header = figures(gateway, request_id)
    by_id = figures(gateway, chunks[0].id)
    assert by_header == by_id, "the header and the chunks' id name one request"
    assert by_id["id"] == chunks[0].id and by_id["request_id"] == request_id
    assert by_id["usage"]["completion_tokens"] == last.usage.completion_tokens == 6
    assert by_id["stream"] is True and by_id["status"] == "ok"
    timings = by_id["timings"]
    assert timings["ttft_ms"] > 0 and timings["output_tokens"] == 6
    assert timings["upstream_ttft_ms"] <= timings["ttft_ms"]
    if carried is not None:
        assert carried["ttft_ms"] == timings["ttft_ms"]
    # The same keys a non-streamed answer carries (LiteLLM keeps those).
    whole = client.chat.completions.create(model="fleet", messages=[{"role": "user", "content": "hi"}])
    assert set(whole.model_extra["timings"]) == set(timings)
    assert by_id["upstream"]["endpoint"].endswith("/v1")

"""llmgate in front of a real, independently written OpenAI-compatible server:
llama.cpp's own C++ server (`llama-server`, built by scripts/peers from the llama.cpp tree
of the pinned llama-cpp-python sdist) on the default model file, with the official OpenAI
client on the outside.

One gateway serves four models from a [[models]] config: the upstream with the right
key, the same upstream with a wrong key, and the default GGUF in this process on each
engine (mistral.rs, and llama.cpp, whose greedy answers match llama-server's). What is
checked: streamed and non-streamed answers, usage (llama-server's own), timings with
the upstream's share, log-probabilities, the repetition basis, the semantic log, /ready and /metrics, and an upstream refusing the gateway's key.
"""

import json
import os
import subprocess
import tempfile
import time
import urllib.request

import openai
import pytest

from conftest import ROOT, free_port, launch

PEER_KEY = "sk-peer-test-key"
UPSTREAM_ALIAS = "smollm2-llamacpp"
MODEL_FILE = ROOT / "models" / "SmolLM2-135M-Instruct.Q8_0.gguf"
ASK = [{"role": "user", "content": "What is the capital of France?"}]


def llama_server() -> str:
    binary = ROOT / ".peers" / "llama-server" / "llama-server"
    assert binary.exists(), f"{binary} is missing: run scripts/peers (it builds llama-server)"
    return str(binary)


@pytest.fixture(scope="module")
def llamacpp():
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [
            llama_server(), "-m", str(MODEL_FILE), "--alias", UPSTREAM_ALIAS,
            "-t", "1", "-c", "4096", "-np", "2", "--api-key", PEER_KEY,
            "--host", "127.0.0.1", "--port", str(port),
        ],
        stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, f"llama-server exited: {log.seek(0) or log.read()!r}"
        try:
            request = urllib.request.Request(f"{base}/models", headers={"authorization": f"Bearer {PEER_KEY}"})
            with urllib.request.urlopen(request, timeout=2):
                break
        except OSError:
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.3)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fronted(llamacpp, tmp_path_factory):
    data = tmp_path_factory.mktemp("upstream-data")
    config = data / "llmgate.toml"
    # No degeneration guard: the engines' answers are compared as they are, and the guard
    # (on by default for the default model) would end a looping one with "stop" where
    # llama-server's, read through another path, may not loop the same way.
    config.write_text(f"""
[quality]
degeneration_guard = false

[[models]]
id = "via-llamacpp"
engine = "upstream"
url = "{llamacpp}"
upstream_model = "{UPSTREAM_ALIAS}"
api_key_env = "LLMGATE_TEST_PEER_KEY"
tokenizer = "{MODEL_FILE}"

[[models]]
id = "wrong-key"
engine = "upstream"
url = "{llamacpp}"
upstream_model = "{UPSTREAM_ALIAS}"
api_key_env = "LLMGATE_TEST_WRONG_KEY"

[[models]]
id = "local"
engine = "mistral"

[[models]]
id = "local-llamacpp"
engine = "llamacpp"
""")
    os.environ["LLMGATE_TEST_PEER_KEY"] = PEER_KEY
    os.environ["LLMGATE_TEST_WRONG_KEY"] = "sk-not-the-key"
    gateway = launch(data, "--config", str(config))
    # /ready says 200 once any model serves; the in-process one may still be loading.
    deadline = time.monotonic() + 180
    while True:
        with urllib.request.urlopen(f"{gateway.base}/ready", timeout=5) as r:
            states = {m["id"]: m["status"] for m in json.loads(r.read())["models"]}
        if (states["local"] == states["local-llamacpp"] == "ready"
                and states["wrong-key"] == "unreachable"):
            break
        assert time.monotonic() < deadline, f"not all models came up: {states}"
        time.sleep(0.3)
    yield gateway
    gateway.proc.terminate()
    gateway.proc.wait(timeout=60)


@pytest.fixture()
def client(fronted):
    return openai.OpenAI(base_url=f"{fronted.base}/v1", api_key="unused", max_retries=0)


def semlog_documents(data_dir) -> list:
    docs = []
    for path in sorted((data_dir / "semlog").glob("*.ndjson")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            if "@timestamp" in doc:
                docs.append(doc)
    return docs


def test_a_stream_through_the_gateway_is_timed_and_counted(client, fronted):
    stream = client.chat.completions.create(
        model="via-llamacpp", messages=ASK, stream=True, stream_options={"include_usage": True},
        max_tokens=24, temperature=0, seed=1,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.model == "via-llamacpp" for c in chunks), "the served id"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip(), "llama.cpp's answer came through"
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices), "none asked for"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens > 0
    timings = last.model_extra["timings"]
    assert timings["output_tokens"] == last.usage.completion_tokens
    assert 0 < timings["upstream_ttft_ms"] <= timings["ttft_ms"]
    assert timings["repetition_basis"] == "logprob_tokens"
    assert timings["mean_logprob"] < 0, "confidence from llama.cpp's logprobs"


def test_non_streamed_logprobs_and_legacy_completions(client):
    answer = client.chat.completions.create(
        model="via-llamacpp", messages=ASK, max_tokens=12, temperature=0,
        logprobs=True, top_logprobs=2,
    )
    choice = answer.choices[0]
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    tokens = choice.logprobs.content
    # An answer that stopped on the end token counts it, and does not list it.
    assert len(tokens) + (choice.finish_reason == "stop") == answer.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in tokens)
    assert "".join(t.token for t in tokens) == choice.message.content
    legacy = client.completions.create(
        model="via-llamacpp", prompt="The capital of France is", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert legacy.choices[0].text and legacy.choices[0].finish_reason == "length"
    assert legacy.usage.completion_tokens == 6


def test_greedy_answers_match_llama_servers_token_for_token(client):
    """The same file in llama-server and in the gateway's llama.cpp engine: at temperature
    0 the chat answers (the model's Jinja template rendered alike, its default system
    prompt included) and the raw completions are the same tokens, and end the same way,
    whether `max_tokens` cuts the answer or the model ends it first.

    Where a greedy answer ends can move with the machine's floating-point path, so the
    two budgets are read from llama-server's own answer on this machine: one below its
    length (both cut, `length`) and one above it (both end, `stop`; the end token is in
    neither's logprobs and counted once in both usages: docs/api.md, "The end token")."""
    def answer(model, budget, **body):
        if "messages" in body:
            got = client.chat.completions.create(model=model, max_tokens=budget, temperature=0,
                                                 logprobs=True, **body)
            tokens = [t.token for t in got.choices[0].logprobs.content]
        else:
            got = client.completions.create(model=model, max_tokens=budget, temperature=0,
                                            logprobs=0, **body)
            tokens = got.choices[0].logprobs.tokens
        finish = got.choices[0].finish_reason
        end_token = 1 if finish == "stop" else 0
        assert len(tokens) + end_token == got.usage.completion_tokens, (model, finish, tokens)
        return tokens, finish, got.usage.completion_tokens

    asks = [dict(messages=[{"role": "user", "content": q}])
            for q in ["What is LLM?", "Write a haiku about the sea."]]
    asks.append(dict(prompt="What is LLM?"))
    ended = 0
    for ask in asks:
        natural, finish, _ = answer("via-llamacpp", 160, **ask)
        budgets = [max(1, len(natural) // 2)]
        if finish == "stop":
            ended += 1
            budgets.append(len(natural) + 8)
        for budget in budgets:
            theirs, ours = answer("via-llamacpp", budget, **ask), answer("local-llamacpp", budget, **ask)
            assert ours == theirs, (ask, budget, theirs, ours)
            assert ours[1] == ("length" if budget < len(natural) else "stop"), (ask, budget, ours)
    assert ended, "a haiku ends within 160 tokens: the budget above the end was tried"


def test_an_upstream_refusing_the_key_is_a_502_without_its_words(client):
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(model="wrong-key", messages=ASK, max_tokens=4)
    assert refused.value.status_code == 502
    body = refused.value.body
    assert body["code"] == "upstream_auth_failed"
    assert "sk-not-the-key" not in json.dumps(body)


def test_one_gateway_serves_the_upstream_and_the_in_process_model(client, fronted, llamacpp):
    local = client.chat.completions.create(model="local", messages=ASK, max_tokens=8, temperature=0)
    assert local.choices[0].message.content
    assert local.model_extra["timings"].get("upstream_ttft_ms") is None
    listed = client.models.list().data
    assert [m.id for m in listed] == ["via-llamacpp", "wrong-key", "local", "local-llamacpp"]
    assert all(m.created > 0 for m in listed), [m.created for m in listed]
    with urllib.request.urlopen(f"{fronted.base}/ready", timeout=5) as r:
        ready = json.loads(r.read())
    states = {m["id"]: m["status"] for m in ready["models"]}
    assert states["via-llamacpp"] == "ready" and states["local"] == "ready"
    assert states["wrong-key"] == "unreachable", "the probe found the key refused"
    with urllib.request.urlopen(f"{fronted.base}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'llmgate_upstream_up{model="via-llamacpp"} 1' in metrics
    assert 'llmgate_upstream_up{model="wrong-key"} 0' in metrics
    assert 'llmgate_upstream_time_to_first_token_seconds_count{model="via-llamacpp"}' in metrics
    # Its one replica, measured on its own (the series the fleet alerts read).
    endpoint = llamacpp
    for series in (
        f'llmgate_endpoint_time_to_first_token_seconds_count{{model="via-llamacpp",endpoint="{endpoint}"}}',
        f'llmgate_endpoint_time_to_first_token_seconds_bucket{{model="via-llamacpp",endpoint="{endpoint}",le="0.25"}}',
        f'llmgate_endpoint_state{{model="via-llamacpp",endpoint="{endpoint}",state="up"}} 1',
    ):
        assert series in metrics, series


def test_the_semantic_log_names_the_upstream_and_what_it_could_not_say(client, fronted):
    client.chat.completions.create(model="via-llamacpp", messages=ASK, max_tokens=6)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="wrong-key", messages=ASK, max_tokens=4)
    deadline = time.monotonic() + 10
    while True:
        docs = [d for d in semlog_documents(fronted.data_dir)
                if d["gen_ai"]["request"]["model"] == "via-llamacpp"]
        refused = [d for d in semlog_documents(fronted.data_dir)
                   if d["gen_ai"]["request"]["model"] == "wrong-key"]
        if (docs and refused) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert docs, "the requests were logged"
    doc = docs[-1]
    assert doc["gen_ai"]["response"]["model"] == UPSTREAM_ALIAS, "what the upstream said"
    assert "usage_estimated" not in doc["llm"]["upstream"], "llama-server reports its usage"
    assert doc["llm"]["model"]["upstream_model"] == UPSTREAM_ALIAS
    assert doc["llm"]["upstream_ttft_ms"] > 0
    assert doc["llm"]["repetition_basis"] == "logprob_tokens"
    assert refused and refused[-1]["error"]["type"] == "upstream_auth_failed"

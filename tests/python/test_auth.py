"""API keys with the real binary and the official OpenAI client: `llmgate keys add`
makes a key, the gateway started with `--api-keys-file` takes it, refuses a wrong one
and none the way the SDK understands (AuthenticationError), and never logs the key.
"""

import json
import math
import subprocess
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import BINARY, MODEL_ID, launch

HI = [{"role": "user", "content": "Say hi."}]


def add_key(keys_file, key_id: str) -> str:
    done = subprocess.run(
        [str(BINARY), "keys", "add", key_id, "--file", str(keys_file)],
        capture_output=True, text=True, check=True,
    )
    return done.stdout.strip()


def test_the_openai_client_with_a_right_key_a_wrong_one_and_none(tmp_path):
    keys_file = tmp_path / "api-keys"
    key = add_key(keys_file, "sdk-test")
    assert key.startswith("llmgate-") and key not in keys_file.read_text()
    gateway = launch(tmp_path / "data", "--api-keys-file", str(keys_file))
    try:
        right = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key=key, max_retries=0)
        answer = right.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
        assert answer.choices[0].message.content
        assert [m.id for m in right.models.list()] == [MODEL_ID]

        wrong = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key="llmgate-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
        assert refused.value.code == "invalid_api_key"

        # No Authorization header at all (the SDK always sends one).
        request = urllib.request.Request(
            f"{gateway.base}/v1/chat/completions",
            data=json.dumps({"model": MODEL_ID, "messages": HI}).encode(),
            headers={"content-type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(request, timeout=30)
        assert missing.value.code == 401
        assert json.loads(missing.value.read())["error"]["code"] == "invalid_api_key"

        with urllib.request.urlopen(f"{gateway.base}/health", timeout=10) as r:
            assert r.status == 200
    finally:
        gateway.proc.terminate()
        assert gateway.proc.wait(timeout=60) == 0
    log = gateway.log_text()
    assert key not in log, "the key reached the gateway's log"
    assert '"api_key_id":"sdk-test"' in log


def test_a_key_over_its_token_limit_gets_rate_limit_error_and_recovers(tmp_path):
    """tpm=1200 (20 tokens a second), counted as the prompt's tokens plus max_tokens.

    The real binary runs on the real clock, so nothing here depends on how fast the
    machine is: the refused request costs nearly the whole limit, which only a minute
    between two requests would refill, and the wait for recovery is worked out from what
    the refusal says is left (which only grows).
    """
    keys_file = tmp_path / "api-keys"
    key = add_key(keys_file, "limited")
    keys_file.write_text(keys_file.read_text().rstrip("\n") + " tpm=1200\n")
    gateway = launch(tmp_path / "data", "--api-keys-file", str(keys_file))
    try:
        client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key=key, max_retries=0)

        def ask(max_tokens: int):
            return client.chat.completions.with_raw_response.create(
                model=MODEL_ID, messages=HI, max_tokens=max_tokens, temperature=0,
            )

        first = ask(1)
        assert first.headers["x-ratelimit-limit-tokens"] == "1200"
        prompt_tokens = first.parse().usage.prompt_tokens
        left = int(first.headers["x-ratelimit-remaining-tokens"])
        # Exact: nothing refills before the first charge.
        assert left == 1200 - (prompt_tokens + 1)
        # Reserve all but 10 tokens: the short greeting leaves the rest of max_tokens
        # unused, but it was counted, as OpenAI counts it.
        ask(left - prompt_tokens - 10)
        costly = 1200 - 1  # within the limit, so not "too large": refused for now
        with pytest.raises(openai.RateLimitError) as limited:
            ask(costly - prompt_tokens)
        assert limited.value.code == "rate_limit_exceeded"
        assert limited.value.body["type"] == "tokens"
        headers = limited.value.response.headers
        remaining = int(headers["x-ratelimit-remaining-tokens"])
        assert remaining < costly
        # Retry-After is when the refused request would pass, in whole seconds rounded up.
        expected = math.ceil((costly - remaining) / 20)
        assert abs(int(headers["retry-after"]) - expected) <= 1, (headers, expected)
        # A small request passes once the tokens it lacks have come back.
        small = prompt_tokens + 5
        time.sleep(max(0, small - remaining) / 20 + 0.05)
        again = ask(5)
        assert again.parse().choices[0].message.content
    finally:
        gateway.proc.terminate()
        assert gateway.proc.wait(timeout=60) == 0

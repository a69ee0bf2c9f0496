"""API keys with the real binary and the official OpenAI client: `llmgate keys add`
makes a key, the gateway started with `--api-keys-file` takes it, refuses a wrong one
and none the way the SDK understands (AuthenticationError), and never logs the key.
"""

import json
import subprocess
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

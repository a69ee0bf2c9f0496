"""The drain on SIGTERM, with the real binary and model and the official OpenAI client.

Each test starts its own gateway, opens streams, sends SIGTERM while they run, and then
reads what the gateway left: one semantic-log document per request, in the (in-test)
cluster, the NDJSON files or the spool, nothing missing and nothing twice; after a
restart, the cluster has them all.
"""

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import openai

from conftest import MODEL_ID, launch
from fake_es import FakeEs

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


class Stream(threading.Thread):
    """One streamed answer read to its end; sets `started` at its first chunk."""

    def __init__(self, base: str, max_tokens: int, started: threading.Event):
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        self.max_tokens = max_tokens
        self.started = started
        self.finish_reason = None
        self.error = None
        self.text = ""

    def run(self):
        try:
            # ignore_eos: each stream runs to its max_tokens on any CPU (the model's end
            # token, or the degeneration guard, would end it where the floating point
            # has it), so a stream meant to outlast the drain does.
            stream = self.client.chat.completions.create(
                model=MODEL_ID, messages=PROMPT, max_tokens=self.max_tokens,
                temperature=0, stream=True, extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                self.started.set()
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
                    self.finish_reason = chunk.choices[0].finish_reason or self.finish_reason
        except openai.APIError as error:
            self.error = error


def in_flight(base: str) -> int:
    """The gateway's own count of admitted requests, read from /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("llmgate_requests_in_flight "):
                return int(float(line.split()[1]))
    raise AssertionError("no llmgate_requests_in_flight in /metrics")


def open_streams(base: str, count: int, max_tokens: int) -> list:
    """Starts `count` streams and returns once one of them is answering and the gateway
    has admitted all of them. On CPU the engine runs one sequence at a time, so the
    others wait in its queue: in flight, but not yet answering. (A client thread that
    has started is not yet a request the server has seen: wait for the server's count.)"""
    started = threading.Event()
    streams = [Stream(base, max_tokens, started) for _ in range(count)]
    for s in streams:
        s.start()
    assert started.wait(120), "no stream started"
    deadline = time.monotonic() + 30
    while in_flight(base) < count:
        assert time.monotonic() < deadline, f"only {in_flight(base)} of {count} admitted"
        time.sleep(0.02)
    return streams


def status_of(request) -> tuple:
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def documents(data_dir) -> list:
    """Every semantic-log document on disk: NDJSON files and spool segments."""
    docs = []
    for folder in ("semlog", "spool"):
        for path in sorted((data_dir / folder).glob("*.ndjson")):
            lines = path.read_text().splitlines()
            # Bulk pairs: an action line, then the document.
            docs += [json.loads(line) for line in lines[1::2]]
    return docs


def test_sigterm_lets_running_streams_finish_and_refuses_new_work(tmp_path):
    es = FakeEs()
    # A shutdown timeout long enough for a slow, shared machine to finish four streams
    # one after the other: this test is about finishing, the next about the timeout.
    gateway = launch(tmp_path, "--es-url", es.url, "--shutdown-timeout-secs", "120")
    streams = open_streams(gateway.base, 4, max_tokens=48)
    gateway.proc.send_signal(signal.SIGTERM)

    # At once (as soon as the signal is handled): not ready, and a new request is
    # refused with a reason and Retry-After.
    deadline = time.monotonic() + 10
    status, _, body = status_of(f"{gateway.base}/ready")
    while status == 200 and time.monotonic() < deadline:
        time.sleep(0.02)
        status, _, body = status_of(f"{gateway.base}/ready")
    assert status == 503, body
    assert json.loads(body)["status"] == "stopping"
    request = urllib.request.Request(
        f"{gateway.base}/v1/chat/completions",
        data=json.dumps({"model": MODEL_ID, "messages": PROMPT}).encode(),
        headers={"content-type": "application/json"},
    )
    status, headers, body = status_of(request)
    assert status == 503, body
    assert json.loads(body)["error"]["code"] == "server_shutting_down"
    assert headers.get("Retry-After") == "5"

    for s in streams:
        s.join(150)
        assert s.error is None, s.error
        assert s.finish_reason == "length", (s.finish_reason, s.text)
        assert s.text
    assert gateway.proc.wait(timeout=150) == 0, gateway.log_text()

    # Every request's document is in the cluster or in the spool...
    docs = {d["event"]["id"]: d for d in es.documents() + documents(tmp_path)}
    outcomes = sorted(
        (d["event"]["outcome"], (d.get("error") or {}).get("type")) for d in docs.values()
    )
    assert outcomes == [("failure", "server_shutting_down")] + [("success", None)] * 4, outcomes
    # ...and after a restart all of them are in the cluster, each once.
    gateway = launch(tmp_path, "--es-url", es.url)
    deadline = time.monotonic() + 30
    while len(es.documents()) < len(docs) and time.monotonic() < deadline:
        time.sleep(0.2)
    gateway.proc.terminate()
    assert gateway.proc.wait(timeout=60) == 0, gateway.log_text()
    assert sorted(d["event"]["id"] for d in es.documents()) == sorted(docs)
    es.stop()


def test_sigterm_ends_streams_that_outlast_the_shutdown_timeout(tmp_path):
    gateway = launch(tmp_path, "--shutdown-timeout-secs", "1")
    streams = open_streams(gateway.base, 2, max_tokens=1500)
    gateway.proc.send_signal(signal.SIGTERM)

    for s in streams:
        s.join(60)
        assert not s.is_alive(), "the stream did not end"
        # The running one ends with an error frame, the queued one with a 503.
        assert isinstance(s.error, openai.APIError), (s.finish_reason, s.text[-200:])
        assert "shutting down" in str(s.error), s.error
    assert gateway.proc.wait(timeout=60) == 0, gateway.log_text()

    docs = documents(tmp_path)
    kinds = sorted((d.get("error") or {}).get("type") for d in docs)
    assert kinds == ["server_shutting_down"] * 2, kinds

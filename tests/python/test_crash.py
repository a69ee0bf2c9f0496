"""Crash safety of the semantic log, with the real binary and model: `kill -9` at a
random moment under load, five times, restarting on the same data folder each time.

The bound the gateway states: a finished request's document is in the spool (written to
the OS) before the request is over, so a crash of the process loses none of them, and
a restart delivers them. Every request that completed more than one second before a
kill must be indexed exactly once (one document per request id in the cluster).
"""

import collections
import http.client
import json
import random
import signal
import threading
import time
import urllib.request

from conftest import MODEL_ID, launch
from fake_es import FakeEs

KILLS = 5


class Load(threading.Thread):
    """One client sending requests back to back, streamed and not, until the gateway
    goes away; records when each request completed."""

    def __init__(self, base: str, name: str, completed: dict):
        super().__init__(daemon=True)
        self.base, self.name, self.completed = base, name, completed

    def run(self):
        n = 0
        while True:
            request_id = f"{self.name}-{n}"
            stream = n % 2 == 1
            request = urllib.request.Request(
                f"{self.base}/v1/chat/completions",
                data=json.dumps({
                    "model": MODEL_ID, "max_tokens": 6, "stream": stream,
                    "messages": [{"role": "user", "content": f"Say something about {n}."}],
                }).encode(),
                headers={"content-type": "application/json", "x-request-id": request_id},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    body = r.read()
                if stream and not body.rstrip().endswith(b"data: [DONE]"):
                    return
            except (OSError, http.client.HTTPException):
                return  # the gateway was killed
            self.completed[request_id] = time.monotonic()
            n += 1


def indexed_request_ids(es: FakeEs) -> collections.Counter:
    return collections.Counter(d["llm"]["request_id"] for d in es.documents())


def test_kill_9_under_load_loses_no_document_of_a_finished_request(tmp_path):
    es = FakeEs()
    rng = random.Random(20261201)
    completed = {}
    expected = set()
    for round_ in range(KILLS):
        gateway = launch(tmp_path, "--es-url", es.url)
        clients = [Load(gateway.base, f"r{round_}-c{c}", completed) for c in range(3)]
        for c in clients:
            c.start()
        time.sleep(rng.uniform(3.0, 6.0))
        killed_at = time.monotonic()
        gateway.proc.send_signal(signal.SIGKILL)
        gateway.proc.wait(timeout=30)
        for c in clients:
            c.join(40)
        expected |= {rid for rid, at in completed.items() if at < killed_at - 1.0}
    assert len(expected) >= KILLS, f"too little load to test: {len(expected)} requests"

    # A last start replays what the killed runs left in the spool.
    gateway = launch(tmp_path, "--es-url", es.url)
    deadline = time.monotonic() + 60
    while not expected <= set(indexed_request_ids(es)) and time.monotonic() < deadline:
        time.sleep(0.5)
    gateway.proc.terminate()
    assert gateway.proc.wait(timeout=60) == 0, gateway.log_text()

    counts = indexed_request_ids(es)
    missing = sorted(expected - set(counts))
    assert not missing, f"{len(missing)} of {len(expected)} finished requests lost: {missing[:5]}"
    twice = {rid: n for rid, n in counts.items() if n > 1}
    assert not twice, f"indexed more than once: {twice}"
    print(f"{KILLS} kills, {len(expected)} requests finished >1 s before a kill, "
          f"all indexed once; {len(counts)} documents in all")
    es.stop()

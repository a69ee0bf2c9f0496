"""Semantic logs into two independently written servers from PyPI, as second opinions
beside the in-test stand-in (tests/semlog_flavors.rs): noida-db 0.2.3 (poses as
Elasticsearch 8.15; templates, `_bulk`; no ILM, no data stream API; keeps its data on
disk) and osmem-server 0.1.6 (poses as OpenSearch 3.8; templates, plain indices; no
ISM, no data streams; refuses parameters it does not know and `constant_keyword`
without a value; memory only). Both installed by scripts/peers.

For each: what the gateway detected and applied (`/ready`), and every request's document
indexed exactly once through an outage of the server, and through a restart of the
gateway with documents still in its spool.
"""

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import ROOT, MODEL_ID, eventually, free_port, launch_with_semlog, ready_semlog, stop_gateway

INDEX = "logs-llmgate.requests-default"
NOIDA = ROOT / ".peers" / "noida" / "lib" / "python3.11" / "site-packages" / "noida_db" / "noida-db"
OSMEM = ROOT / ".peers" / "osmem" / "lib" / "python3.11" / "site-packages" / "osmem_server" / "bin" / "osmem-server"


class Peer:
    """One of the two servers, started and stopped on the same port."""

    def __init__(self, kind, data_dir):
        self.kind, self.data_dir, self.port, self.proc = kind, data_dir, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self):
        binary = NOIDA if self.kind == "noida" else OSMEM
        assert binary.exists(), f"{binary} is missing: run scripts/peers"
        if self.kind == "noida":
            command = [str(binary), "start", "--data-dir", str(self.data_dir), "--host", "127.0.0.1",
                       "--only", "elasticsearch", "--elasticsearch-port", str(self.port)]
        else:
            command = [str(binary), "-addr", f"127.0.0.1:{self.port}", "-no-stdin-watch"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/", timeout=1):
                    return
            except OSError:
                assert time.monotonic() < deadline, f"{self.kind} did not start"
                time.sleep(0.1)

    def stop(self):
        # SIGINT: noida saves its data first (it flushes on a short delay otherwise).
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def event_ids(self) -> list:
        request = urllib.request.Request(
            f"{self.url}/{INDEX}/_search",
            data=json.dumps({"size": 1000, "query": {"match_all": {}}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                hits = json.loads(answer.read())["hits"]["hits"]
        except urllib.error.HTTPError:
            return []
        return [h["_source"]["event"]["id"] for h in hits]


def ask(base, n):
    for _ in range(n):
        request = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps({"model": MODEL_ID, "max_tokens": 2,
                             "messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200


@pytest.mark.parametrize("kind", ["noida", "osmem"])
def test_each_peer_is_detected_and_every_document_is_indexed_once(kind, tmp_path):
    peer = Peer(kind, tmp_path / "peer")
    peer.start()
    gw = launch_with_semlog(peer.url, tmp_path / "gw")
    try:
        eventually(lambda: ready_semlog(gw).get("set_up") is True)
        status = ready_semlog(gw)
        if kind == "noida":
            assert (status["sink"], status["version"]) == ("elasticsearch", "8.15.3"), status
        else:
            assert (status["sink"], status["version"]) == ("opensearch", "3.8.0"), status
        # Neither has a retention API nor data streams: plain index, no retention, and
        # that is said, not a set-up that never ends.
        assert status["data_stream"] is False and status["lifecycle"] == "none", status
        assert status["problems"] == [], status
        ask(gw.base, 4)
        eventually(lambda: len(peer.event_ids()) == 4)

        # The server goes away; documents wait in the spool; it comes back.
        if kind == "noida":
            peer.stop()
            ask(gw.base, 3)
            time.sleep(1)
            peer.start()
            eventually(lambda: len(peer.event_ids()) == 7)
            ids = peer.event_ids()
            assert len(set(ids)) == 7, "each once"
        else:
            # osmem keeps nothing over a restart: what matters is what comes after.
            peer.stop()
            ask(gw.base, 3)
            time.sleep(1)
            peer.start()
            eventually(lambda: len(peer.event_ids()) == 3)
            assert len(set(peer.event_ids())) == 3
        with urllib.request.urlopen(f"{gw.base}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        assert 'lifecycle="none"' in metrics and "llmgate_semlog_target_info{" in metrics
    finally:
        stop_gateway(gw)
        peer.stop()


def test_a_gateway_restart_replays_its_spool_into_a_server_that_was_down(tmp_path):
    peer = Peer("osmem", tmp_path / "peer")
    gw_dir = tmp_path / "gw"
    # The server is not up yet: documents wait in the spool across a gateway restart.
    gw = launch_with_semlog(peer.url, gw_dir)
    ask(gw.base, 5)
    stop_gateway(gw)
    peer.start()
    gw = launch_with_semlog(peer.url, gw_dir)
    try:
        eventually(lambda: len(peer.event_ids()) == 5)
        assert len(set(peer.event_ids())) == 5
    finally:
        stop_gateway(gw)
        peer.stop()

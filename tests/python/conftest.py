"""Shared fixtures: the debug binary on the default model, on a free loopback port."""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "debug" / "llmgate"
MODEL_ID = "smollm2-135m-instruct"


_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A loopback port free now, never one this run handed out before: the kernel may
    give a port back as soon as the probe closes, and two ports drawn before either was
    listened on were once the same (CI, issue 60)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


class Gateway:
    """A running gateway process: its base URL, data folder and log."""

    def __init__(self, proc, base, data_dir, log):
        self.proc, self.base, self.data_dir, self.log = proc, base, data_dir, log

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


def launch(data_dir: Path, *extra: str) -> Gateway:
    """Starts the debug binary on the default model and waits until /ready says 200."""
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [
            str(BINARY), "serve", "--listen", f"127.0.0.1:{port}", "--workers", "2",
            "--data-dir", str(data_dir), *extra,
        ],
        cwd=ROOT,
        # A pipe nobody reads would fill up and block the gateway's logging.
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "LLMGATE_LOG_FORMAT": "json"},
    )
    gateway = Gateway(proc, f"http://127.0.0.1:{port}", data_dir, log)
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the gateway exited: {gateway.log_text()}")
        try:
            with urllib.request.urlopen(f"{gateway.base}/ready", timeout=2) as r:
                if r.status == 200:
                    return gateway
        except OSError:
            pass
        assert time.monotonic() < deadline, "the gateway did not become ready"
        time.sleep(0.5)


def eventually(check, seconds=30):
    """Waits until `check()` is true; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.25)


def launch_with_semlog(es_url: str, data_dir: Path, *extra: str) -> Gateway:
    """A gateway whose semantic logs go to `es_url`, each document synced to the spool."""
    return launch(data_dir, "--es-url", es_url, "--semlog-fsync-ms", "0", *extra)


def stop_gateway(gw: Gateway):
    gw.proc.terminate()
    gw.proc.wait(timeout=60)


def ready_semlog(gw: Gateway) -> dict:
    """What /ready says of the semantic-log pipeline."""
    with urllib.request.urlopen(f"{gw.base}/ready", timeout=5) as answer:
        return json.loads(answer.read())["semlog"]


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    running = launch(tmp_path_factory.mktemp("data"))
    yield running.base
    running.proc.terminate()
    running.proc.wait(timeout=60)

"""Shared fixtures: the debug binary on the default model, on a free loopback port."""

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    port = free_port()
    log = tempfile.TemporaryFile()
    data_dir = tmp_path_factory.mktemp("data")
    proc = subprocess.Popen(
        [
            str(BINARY), "serve", "--listen", f"127.0.0.1:{port}", "--workers", "2",
            "--data-dir", str(data_dir),
        ],
        cwd=ROOT,
        # A pipe nobody reads would fill up and block the gateway's logging.
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "LLMGATE_LOG_FORMAT": "json"},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"the gateway exited: {log.read().decode(errors='replace')}")
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the gateway did not become ready"
        time.sleep(0.5)
    yield base
    proc.terminate()
    proc.wait(timeout=30)

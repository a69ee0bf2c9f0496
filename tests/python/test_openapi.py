"""Schema-driven fuzzing of the running gateway with schemathesis (pinned in scripts/peers),
from the gateway's own /openapi.json.

The gateway serves one upstream model (`llmgate scripted-upstream`, so answers take
milliseconds) with the default GGUF as its tokenizer, so /tokenize and /detokenize work
too. Schemathesis runs every check it has except `positive_data_acceptance` (rules that
span fields, such as `top_logprobs` needing `logprobs: true`, are 400s the schema does
not express): no 5xx, statuses, content types and bodies as described, schema-invalid
bodies refused. It runs three times; the gateway must stay alive, and its memory flat
over the third round. The first two fill the allocator's arenas: measured on a debug
build, resident memory climbs 7 to 9 MiB over the second round, then holds at about
130 MiB over sixteen, each round within 5 MiB of the last.
"""

import collections
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import BINARY, ROOT, free_port, launch

SCHEMATHESIS = ROOT / ".peers" / "schemathesis" / "bin" / "st"
TOKENIZER = ROOT / "models" / "SmolLM2-135M-Instruct.Q8_0.gguf"
# The same cases on every CI run; SCHEMATHESIS_SEED=random explores.
SEED = os.environ.get("SCHEMATHESIS_SEED", "20261202")
EXAMPLES = os.environ.get("SCHEMATHESIS_EXAMPLES", "60")
# What the third round may add to the gateway's resident memory: allocator slack. A round
# is about 1,700 cases, so this catches a leak of 5 KiB a request or more, not a smaller
# one.
RSS_GROWTH_LIMIT_KIB = 8 * 1024


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    assert SCHEMATHESIS.exists(), f"{SCHEMATHESIS} is missing: run scripts/peers"
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [str(BINARY), "scripted-upstream", "--listen", f"127.0.0.1:{upstream_port}", "--tokens", "8",
         "--tokens-per-second", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    config = tmp_path_factory.mktemp("config") / "llmgate.toml"
    config.write_text(
        "[[models]]\n"
        'id = "scripted"\n'
        'engine = "upstream"\n'
        f'url = "http://127.0.0.1:{upstream_port}/v1"\n'
        f'tokenizer = "{TOKENIZER}"\n'
    )
    running = launch(tmp_path_factory.mktemp("data"), "--config", str(config))
    yield running
    running.proc.terminate()
    running.proc.wait(timeout=60)
    upstream.terminate()
    upstream.wait(timeout=10)


def schemathesis(base: str, report: Path) -> subprocess.CompletedProcess:
    run = schemathesis_once(base, report)
    # Hypothesis 6 on CPython 3.11 now and then fails inside itself while it builds a
    # strategy ("SystemError: AST constructor recursion depth mismatch": CPython keeps
    # the AST builder's depth per interpreter, not per thread, and does not undo it on
    # an error; python/cpython#106905). Nothing the gateway answered. Two schemathesis
    # workers made it likely (CI failed on it twice in a row at 2193 cases); one worker
    # costs 5 s a run here. A round that still meets it is run again, once.
    if run.returncode != 0 and "AST constructor recursion depth mismatch" in run.stdout:
        run = schemathesis_once(base, report)
    return run


def schemathesis_once(base: str, report: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(SCHEMATHESIS), "run", f"{base}/openapi.json",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--max-examples", EXAMPLES, "--seed", SEED, "--workers", "1",
            "--request-timeout", "30", "--report", "junit", "--report-dir", str(report),
        ],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_schemathesis_finds_nothing_and_memory_stays_flat(gateway, tmp_path):
    first = schemathesis(gateway.base, tmp_path / "first")
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    assert " passed" in first.stdout, first.stdout[-3000:]
    after_first = rss_kib(gateway.proc.pid)

    second = schemathesis(gateway.base, tmp_path / "second")
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-2000:]
    after_second = rss_kib(gateway.proc.pid)

    third = schemathesis(gateway.base, tmp_path / "third")
    assert third.returncode == 0, third.stdout[-6000:] + third.stderr[-2000:]
    after_third = rss_kib(gateway.proc.pid)

    assert gateway.proc.poll() is None, gateway.log_text()[-3000:]
    with urllib.request.urlopen(f"{gateway.base}/health", timeout=5) as r:
        assert r.status == 200
    growth = after_third - after_second
    print(f"gateway RSS: {after_first}, {after_second}, {after_third} KiB after rounds 1 to 3")
    assert growth < RSS_GROWTH_LIMIT_KIB, f"RSS grew {growth} KiB over a third round"
    assert "panicked" not in gateway.log_text()
    for round_ in (first, second, third):
        print(*(line.strip() for line in round_.stdout.splitlines() if "generated" in line))

    # The cases reached the engine, not only the validation: answers were streamed and
    # not, on both routes (each left a semantic-log record).
    # The files are still being written (the last round's records): a file's last line
    # may be cut where the writer is; every other line must be whole.
    outcomes = collections.Counter()
    for path in (gateway.data_dir / "semlog").glob("*.ndjson"):
        lines = path.read_text().split("\n")
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                assert i == len(lines) - 1, f"{path.name}: line {i + 1} of {len(lines)} is not whole"
                continue
            if "llm" in doc:
                outcomes[(doc["gen_ai"]["operation"]["name"], doc["llm"]["status"])] += 1
    print(dict(outcomes))
    assert outcomes[("chat", "ok")] > 0 and outcomes[("text_completion", "ok")] > 0, outcomes

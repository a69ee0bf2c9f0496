"""The container image, built and run with podman (no Docker engine, no registry here).

scripts/image builds docker/Dockerfile's runtime and fetch-model stages from a Debian base
made with debootstrap and the binary `cargo test` built. The runtime container runs as its
non-root user with a read-only root filesystem, the model mounted read-only and the
configuration the Helm chart renders by default: /ready, a streamed answer through the
OpenAI client, /metrics; then `podman stop` with the chart's grace period during a running
stream. The stream finishes, new requests get 503, the container exits 0 inside the
grace period, and the request's semantic-log document is on the data volume. The
fetch-model image, the chart's init container, keeps the verified model in place.
"""

import base64
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
import uuid

import openai
import pytest
import yaml

from conftest import MODEL_ID, ROOT, free_port
from fake_es import FakeEs
from test_chart import CHART, HELM, tools
from test_shutdown import PROMPT, Stream, documents, status_of

MODEL_FILE = "SmolLM2-135M-Instruct.Q8_0.gguf"
UID = 10001


def podman(*args, check=True, timeout=300):
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "target" / "image" / "containers.conf")}
    out = subprocess.run(["podman", *args], capture_output=True, text=True, env=env,
                         timeout=timeout, check=False)
    if check:
        assert out.returncode == 0, (args, out.stderr)
    return out


@pytest.fixture(scope="module")
def images():
    out = subprocess.run([str(ROOT / "scripts" / "image")], capture_output=True, text=True,
                         check=False, timeout=900)
    assert out.returncode == 0, out.stderr
    runtime = out.stdout.strip().splitlines()[-1]
    return runtime, runtime.replace("-cpu", "-fetch-model")


def chart_default(tmp_path):
    """The configuration file, environment and grace period of the chart's default
    values."""
    tools()
    rendered = subprocess.run([str(HELM), "template", "rel", str(CHART)], capture_output=True,
                              text=True, check=True).stdout
    objs = [o for o in yaml.safe_load_all(rendered) if o]
    config = next(o for o in objs if o["kind"] == "ConfigMap")["data"]["llmgate.toml"]
    pod = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    env = [f"{e['name']}={e['value']}" for e in pod["containers"][0]["env"] if "value" in e]
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "llmgate.toml").write_text(config)
    return folder, env, pod["terminationGracePeriodSeconds"]


def ready_status(base):
    """/ready's status, or None while nothing listens yet."""
    try:
        return status_of(f"{base}/ready")[0]
    except OSError:
        return None


def writable_by_the_image_user(path):
    path.mkdir(exist_ok=True)
    os.chown(path, UID, UID)
    return path


def test_the_fetch_model_image_keeps_a_verified_model(images, tmp_path):
    _, fetcher = images
    models = writable_by_the_image_user(tmp_path / "models")
    for name in (MODEL_FILE, "SmolLM2-135M-Instruct.Q4_1.gguf"):
        (models / name).write_bytes((ROOT / "models" / name).read_bytes())
    # No network: a verified file is kept, not fetched again.
    out = podman("run", "--rm", "--network=none", "--read-only", "--tmpfs", "/tmp",
                 "--user", f"{UID}:{UID}", "-v", f"{models}:/models", fetcher, "--print-path")
    assert out.stdout.strip().endswith(MODEL_FILE), out.stdout
    assert "present and verified" in out.stderr, out.stderr


def test_the_image_serves_and_drains_inside_its_grace_period(images, tmp_path):
    runtime, _ = images
    config, env, grace = chart_default(tmp_path)
    data = writable_by_the_image_user(tmp_path / "data")
    port = free_port()
    name = f"llmgate-test-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    podman(
        "run", "-d", "--name", name, "--read-only", "--tmpfs", "/tmp",
        "--user", f"{UID}:{UID}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "-v", f"{ROOT / 'models'}:/models:ro", "-v", f"{config}:/etc/llmgate:ro",
        "-v", f"{data}:/var/lib/llmgate/data", "-p", f"127.0.0.1:{port}:8080",
        *(arg for e in env for arg in ("-e", e)),
        runtime, "serve", "--config", "/etc/llmgate/llmgate.toml",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while ready_status(base) != 200:
            running = podman("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            assert running == "true", podman("logs", name, check=False).stderr
            assert time.monotonic() - started < 180, "not ready in 180 s"
            time.sleep(0.1)
        ready_s = time.monotonic() - started
        user = podman("exec", name, "id", "-u").stdout.strip()
        assert user == str(UID)
        denied = podman("exec", name, "touch", "/usr/local/bin/x", check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr

        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        text = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=16, temperature=0, stream=True,
            )
            if c.choices
        )
        assert text.strip()
        with urllib.request.urlopen(f"{base}/metrics") as r:
            metrics = r.read().decode()
        for family in ("llmgate_requests_total", "llmgate_requests_waiting",
                       "llmgate_requests_running", "llmgate_kv_cache_usage_ratio"):
            assert f"\n{family}" in metrics, family

        # The drain: a stream runs when `podman stop` sends SIGTERM. It runs its 80 tokens
        # (ignore_eos, test_shutdown's Stream): about a second here idle, long enough to be
        # running when the drain begins, and far inside the 25 s drain on a machine whose
        # cores another build shares (160 tokens once took 37 s there).
        first = threading.Event()
        stream = Stream(base, max_tokens=80, started=first)
        stream.start()
        assert first.wait(60), "the stream did not start"
        stopped = {}

        def stop():
            t = time.monotonic()
            podman("stop", "-t", str(grace), name, timeout=grace + 30)
            stopped["s"] = time.monotonic() - t

        stopper = threading.Thread(target=stop)
        stopper.start()
        deadline = time.monotonic() + 5
        while ready_status(base) == 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stream.is_alive(), "the stream was still running when the drain began"
        request = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps({"model": MODEL_ID, "messages": PROMPT}).encode(),
            headers={"content-type": "application/json"},
        )
        status, _, body = status_of(request)
        assert status == 503 and json.loads(body)["error"]["code"] == "server_shutting_down", body
        stream.join(grace)
        stopper.join(grace + 30)
        assert stream.error is None, stream.error
        assert stream.finish_reason == "length", (stream.finish_reason, stream.text[-100:])
        assert stopped["s"] < grace, stopped
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, podman("logs", name, check=False).stderr

        docs = documents(data)
        outcomes = sorted((d["event"]["outcome"], (d.get("error") or {}).get("type")) for d in docs)
        assert outcomes == [("failure", "server_shutting_down")] + [("success", None)] * 2, outcomes
        size = int(podman("image", "inspect", "-f", "{{.Size}}", runtime).stdout)
        print(f"\nimage {runtime}: {size / 1e6:.0f} MB; start to ready {ready_s:.1f} s; "
              f"stop with a stream running {stopped['s']:.1f} s (grace {grace} s)")
    finally:
        podman("rm", "-f", name, check=False)


class CredentialsEs(FakeEs):
    """FakeEs that also keeps the basic-auth user and password of every request."""

    def __init__(self):
        self.credentials = set()
        super().__init__()

    def _handler(self):
        outer = self

        class Handler(super()._handler()):
            def parse_request(self):
                ok = super().parse_request()
                auth = self.headers.get("authorization") if ok else None
                if auth:
                    outer.credentials.add(base64.b64decode(auth.split()[1]).decode())
                return ok

        return Handler


def test_the_image_runs_as_the_compose_file_runs_it(images, tmp_path):
    # docker/compose.yaml's gateway service as podman flags: its read-only root, tmpfs,
    # capabilities, no-new-privileges, secrets as files at /run/secrets and environment;
    # only the cluster's address and the port are this test's (host network: the fake
    # cluster listens on loopback).
    runtime, _ = images
    service = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]["llmgate"]
    secrets = tmp_path / "secrets"
    subprocess.run([str(ROOT / "docker" / "make-secrets"), str(secrets)], check=True, capture_output=True)
    data = writable_by_the_image_user(tmp_path / "data")
    es = CredentialsEs()
    port = free_port()
    env = {k: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(v)) for k, v in service["environment"].items()}
    env.update(LLMGATE_ES_URL=es.url, LLMGATE_LISTEN=f"127.0.0.1:{port}")
    flags = ["--read-only"] if service["read_only"] else []
    flags += [f for t in service["tmpfs"] for f in ("--tmpfs", t)]
    flags += [f for c in service["cap_drop"] for f in ("--cap-drop", c)]
    flags += [f for o in service["security_opt"] for f in ("--security-opt", o)]
    flags += [f for n in service["secrets"] for f in ("-v", f"{secrets / n}:/run/secrets/{n}:ro")]
    name = f"llmgate-compose-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, "--network=host", *flags,
           "-v", f"{ROOT / 'models'}:/models:ro", "-v", f"{data}:{env['LLMGATE_DATA_DIR']}",
           *(arg for k, v in env.items() for arg in ("-e", f"{k}={v}")), runtime)
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while ready_status(base) != 200:
            running = podman("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            assert running == "true", podman("logs", name, check=False).stderr
            assert time.monotonic() - started < 180, "not ready in 180 s"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=4, temperature=0, user="alice@example.com")
        deadline = time.monotonic() + 30
        while not es.documents() and time.monotonic() < deadline:
            time.sleep(0.2)
        (doc,) = es.documents()
        # It logged in as its own user with the password from the secret file, and read
        # the redaction key from its file (user.hash needs it).
        password = (secrets / "llmgate_es_password").read_text()
        assert es.credentials == {f"{env['LLMGATE_ES_USERNAME']}:{password}"}, es.credentials
        assert doc["user"]["hash"], doc.get("user")
        # No secret in its environment; nothing writable but its data and /tmp; no
        # capability; no privilege to gain.
        inside = podman("exec", name, "sh", "-c",
                        "env; touch /var/lib/llmgate/x 2>&1; grep -E '^(CapEff|NoNewPrivs)' /proc/1/status",
                        check=False).stdout
        for secret in secrets.iterdir():
            assert secret.read_text() not in inside, secret.name
        assert "Read-only file system" in inside and "CapEff:\t0000000000000000" in inside, inside
        assert "NoNewPrivs:\t1" in inside, inside
    finally:
        podman("rm", "-f", name, check=False)
        es.stop()

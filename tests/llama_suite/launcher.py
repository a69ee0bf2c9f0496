"""A pytest plugin that runs llama.cpp's own server tests (tools/server/tests of the
llama.cpp tree in the pinned llama-cpp-python sdist, fetched by scripts/peers, never
copied here) against the server LLAMA_SUITE_SERVER names, on our model file:

- `llama-server`: llama.cpp's C++ server of scripts/peers, started as the suite starts it,
  with the suite's Hugging Face download replaced by the local GGUF;
- `llmgate`: the debug binary on the same GGUF with the llama.cpp engine, each of the
  suite's server options translated to the llmgate flag that means the same.

Only the launcher is replaced (`ServerProcess.start`, and `ServerPreset.load_all`, which
downloads the suite's models); every test runs as written. scripts/llama-suite runs it.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("LLAMA_SUITE_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q8_0.gguf"))
TARGET = os.environ.get("LLAMA_SUITE_SERVER", "llmgate")
LLAMA_SERVER = ROOT / ".peers" / "llama-server" / "llama-server"
LLMGATE = ROOT / "target" / "debug" / "llmgate"
# The chat templates of llama.cpp's tree (models/templates), which the suite loads by a
# path relative to that tree; scripts/peers keeps them here.
TEMPLATES = ROOT / ".peers" / "llama-suite" / "templates"
START_SECONDS = 120


def pytest_configure(config):
    import utils  # the suite's own module, on sys.path through its rootdir conftest

    utils.ServerPreset.load_all = staticmethod(lambda: None)
    original_start = utils.ServerProcess.start

    def start(server, timeout_seconds=START_SECONDS):
        if server.model_hf_repo is not None or server.model_file is not None or server.model_url:
            server.model_hf_repo = server.model_hf_file = server.model_url = None
            server.model_file = str(MODEL)
        if server.chat_template_file:
            server.chat_template_file = str(TEMPLATES / Path(server.chat_template_file).name)
        if TARGET == "llama-server":
            server.server_path = str(LLAMA_SERVER)
            server.offline = True
            return original_start(server, max(timeout_seconds, START_SECONDS))
        return start_llmgate(utils, server, max(timeout_seconds, START_SECONDS))

    utils.ServerProcess.start = start


def llmgate_args(server, data_dir: Path) -> list[str]:
    """The llmgate flags that mean what the suite's llama-server options mean."""
    # llama-server's --host lists its addresses; --listen takes them with the port each.
    hosts = [h.strip() for h in server.server_host.split(",")]
    listen = ",".join(f"[{h}]:{server.server_port}" if ":" in h else f"{h}:{server.server_port}"
                      for h in hosts)
    args = [
        "serve", "--listen", listen, "--data-dir", str(data_dir),
        "--engine", "llamacpp", "--serve-any-model", "true", "--workers", "2",
        "--default-temperature", str(server.temperature),
    ]
    if server.seed is not None and server.seed >= 0:
        # llama-server's --seed: the seed of every request that sets none.
        args += ["--default-seed", str(server.seed)]
    if server.model_file:
        args += ["--model-path", server.model_file]
    if server.model_alias:
        args += ["--model-id", server.model_alias.split(",")[0]]
    slots = server.n_slots or 1
    args += ["--max-batch-size", str(slots)]
    if server.n_ctx:
        # llama-server splits its context among its slots (unless --kv-unified shares
        # it); an llmgate sequence has its own.
        per_slot = server.n_ctx if server.kv_unified else server.n_ctx // slots
        args += ["--context-length", str(per_slot)]
    if server.n_predict and server.n_predict > 0:
        # llama-server's --n-predict is every request's most; one that asks for more is
        # cut to it there and refused here.
        args += ["--default-max-tokens", str(server.n_predict),
                 "--max-tokens-cap", str(server.n_predict)]
    if server.chat_template:
        args += ["--chat-template", server.chat_template]
    if server.chat_template_file:
        # llmgate renders Jinja always: llama-server's --jinja has no flag here.
        args += ["--chat-template-file", server.chat_template_file]
    if server.reasoning:
        args += ["--reasoning", server.reasoning]
    if server.cors_origins:
        args += ["--cors-origin", server.cors_origins]
    if server.no_ui:
        args += ["--page", "false"]
    if server.api_key:
        keys = data_dir / "keys"
        digest = hashlib.sha256(server.api_key.encode()).hexdigest()
        keys.write_text(f"suite {digest}\n")
        args += ["--api-keys-file", str(keys)]
    return args


def start_llmgate(utils, server, timeout_seconds: float) -> None:
    # Under scripts/llama-suite's folder, which it empties before each run.
    data_dir = Path(tempfile.mkdtemp(prefix="llmgate-", dir=os.environ.get("LLAMA_SUITE_DATA")))
    args = [str(LLMGATE), *llmgate_args(server, data_dir)]
    print(f"tests: starting llmgate with: {' '.join(args)}")
    server.process = subprocess.Popen(args, stdout=sys.stdout, stderr=sys.stdout, cwd=ROOT)
    utils.server_instances.add(server)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"llmgate exited with {server.process.returncode}")
        try:
            if server.make_request("GET", "/ready").status_code == 200:
                server.ready = True
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"llmgate did not start within {timeout_seconds} s")

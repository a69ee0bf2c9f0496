"""A model file that cannot be served stops start-up with the reason and a non-zero
exit, before the engine sees it: an architecture mistral.rs 0.8.1 does not load (its
loader thread panicked on Gemma 3, and the gateway answered model_not_ready for ever), a
truncated file, something that is not GGUF at all.
"""

import struct
import subprocess

from conftest import BINARY, ROOT, free_port


def gguf_header(architecture: str) -> bytes:
    """A GGUF v3 file with one metadata entry and no tensors."""
    key, value = b"general.architecture", architecture.encode()
    return (
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", len(key)) + key + struct.pack("<I", 8)
        + struct.pack("<Q", len(value)) + value
    )


def serve(model_path, engine="auto") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BINARY), "serve", "--listen", f"127.0.0.1:{free_port()}", "--engine", engine,
         "--model-path", str(model_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )


def test_an_architecture_the_engine_cannot_load_is_named_at_start_up(tmp_path):
    model = tmp_path / "gemma-3-270m.gguf"
    model.write_bytes(gguf_header("gemma3"))
    result = serve(model, engine="mistral")
    assert result.returncode == 2, result.stderr
    assert "'gemma3'" in result.stderr
    assert "llama, mistral3, phi2, phi3, qwen2, qwen3, qwen3moe, starcoder2" in result.stderr


def test_a_truncated_or_foreign_file_is_refused_with_what_is_wrong(tmp_path):
    truncated = tmp_path / "truncated.gguf"
    with open(ROOT / "models" / "SmolLM2-135M-Instruct.Q8_0.gguf", "rb") as source:
        truncated.write_bytes(source.read(2_000_000))
    result = serve(truncated)
    assert result.returncode == 2, result.stderr
    assert "past the end of the file" in result.stderr
    foreign = tmp_path / "model.bin"
    foreign.write_bytes(b"PK\x03\x04" + bytes(100))
    result = serve(foreign)
    assert result.returncode == 2 and "not a GGUF file" in result.stderr, result.stderr


def serve_llamacpp(model_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BINARY), "serve", "--listen", f"127.0.0.1:{free_port()}", "--engine", "llamacpp",
         "--model-path", str(model_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_a_file_llama_cpp_cannot_load_stops_its_start_with_llama_cpps_reason(tmp_path):
    # A sound GGUF header of an architecture llama.cpp has never heard of: the config
    # check passes it (llama.cpp knows more than mistral.rs), llama.cpp itself refuses it.
    unknown = tmp_path / "unknown.gguf"
    unknown.write_bytes(gguf_header("no-such-architecture"))
    result = serve_llamacpp(unknown)
    assert result.returncode == 1, result.stderr
    assert "llama.cpp could not load" in result.stderr, result.stderr
    assert "no-such-architecture" in result.stderr
    # A truncated file is refused before llama.cpp sees it, as for mistral.rs.
    truncated = tmp_path / "truncated.gguf"
    with open(ROOT / "models" / "SmolLM2-135M-Instruct.Q8_0.gguf", "rb") as source:
        truncated.write_bytes(source.read(2_000_000))
    result = serve_llamacpp(truncated)
    assert result.returncode == 2 and "past the end of the file" in result.stderr, result.stderr
    # Gemma 3, which mistral.rs 0.8.1 does not load, is not refused up front for llama.cpp.
    gemma = tmp_path / "gemma-3-270m.gguf"
    gemma.write_bytes(gguf_header("gemma3"))
    result = serve_llamacpp(gemma)
    assert "llama, mistral3, phi2" not in result.stderr, result.stderr

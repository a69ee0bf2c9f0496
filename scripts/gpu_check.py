"""Checks for scripts/gpu-check that need concurrent requests, and its report.

Standard library only: the GPU machine has no network and no llmgate Python packages.

  gpu_check.py seeded URL OUT.json    8 copies of one seeded, sampled request among 32
                                      concurrent requests: do all give the text it gives alone?
  gpu_check.py joining URL OUT.json   8 copies of one greedy request among 32 concurrent ones
                                      of different lengths, so that sequences join a running
                                      batch: do all give the text it gives alone?
  gpu_check.py report DIR             DIR/gpu-check.md from the JSON files in DIR
"""

import concurrent.futures
import json
import pathlib
import sys
import urllib.request

MODEL = "smollm2-135m-instruct"
PROMPTS = [
    json.loads(line)["messages"]
    for line in pathlib.Path("prompts/mixed.jsonl").read_text().splitlines()
    if line.strip()
]
PROBE = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]


def chat(url, messages, **params):
    body = json.dumps({"model": MODEL, "messages": messages, **params}).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.load(response)
        return {"text": answer["choices"][0]["message"]["content"],
                "finish_reason": answer["choices"][0]["finish_reason"]}
    except Exception as error:  # reported, never raised: the check goes on
        return {"error": f"{type(error).__name__}: {error}"}


def copies_among_others(url, probe_params, other_params):
    """The probe alone, then 32 concurrent requests of which 8 (spread out) are the probe."""
    alone = chat(url, PROBE, **probe_params)
    jobs = []
    for i in range(32):
        if i % 4 == 1:
            jobs.append((True, PROBE, probe_params))
        else:
            jobs.append((False, PROMPTS[i % len(PROMPTS)], other_params(i)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(lambda job: (job[0], chat(url, job[1], **job[2])), jobs))
    probes = [r for is_probe, r in results if is_probe]
    errors = [r["error"] for _, r in results if "error" in r]
    texts = [r.get("text") for r in probes]
    distinct = sorted(set(t for t in texts if t is not None))
    return {
        "alone": alone.get("text"),
        "alone_error": alone.get("error"),
        "copies": len(probes),
        "distinct_texts": len(distinct),
        "all_equal_alone": bool(texts) and all(t == alone.get("text") for t in texts),
        "errors": errors,
        "texts": distinct,
    }


def seeded(url):
    probe = {"temperature": 0.8, "seed": 1234, "max_tokens": 48}
    return copies_among_others(
        url, probe, lambda i: {"temperature": 0.8, "seed": 5000 + i, "max_tokens": 16 + 4 * i}
    )


def joining(url):
    probe = {"temperature": 0, "max_tokens": 64}
    return copies_among_others(url, probe, lambda i: {"temperature": 0, "max_tokens": 8 + 5 * i})


def load(directory, name):
    path = directory / name
    return json.loads(path.read_text()) if path.exists() else None


def bench(directory, streams, engine=""):
    """The one report `llmgate bench --json` writes (a list of reports) for a run;
    `engine` is the file names' prefix of a run on another engine ("llamacpp-")."""
    reports = load(directory, f"bench-{engine}c{streams}.json")
    return reports[0] if reports else None


def bench_table(directory, engine=""):
    """The rows of one engine's runs at 1, 8 and 32 streams, and how 32 compare to one."""
    lines = [
        "| streams | TTFT p50 / p95 ms | TPOT p50 / p95 ms | ITL p50 / p95 ms | output tok/s | errors |",
        "|---|---|---|---|---|---|",
    ]
    one_stream = None
    for c in (1, 8, 32):
        b = bench(directory, c, engine)
        if b is None:
            lines.append(f"| {c} | did not run | | | | |")
            continue
        if c == 1:
            one_stream = b["output_tokens_per_s"]

        def pair(key):
            p = b.get(key)
            return "n/a" if p is None else f"{fmt(p['p50'], 2)} / {fmt(p['p95'], 2)}"

        lines.append(
            f"| {c} | {pair('ttft_ms')} | {pair('tpot_ms')} | {pair('itl_ms')} | "
            f"{fmt(b['output_tokens_per_s'])} | {b['errors']} |"
        )
    b32 = bench(directory, 32, engine)
    if one_stream and b32:
        lines += ["", f"32 streams give {b32['output_tokens_per_s'] / one_stream:.1f}x the tokens/s of one."]
    return lines


def fmt(value, digits=1):
    return "n/a" if value is None else f"{value:.{digits}f}"


def report(directory):
    env = load(directory, "env.json") or {}
    lines = [
        "# llmgate on the GPU: scripts/gpu-check",
        "",
        f"GPU {env.get('gpu', '?')}, driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}; "
        f"llmgate commit {env.get('commit', '?')}; model {env.get('model', '?')} "
        f"(sha256 {env.get('model_sha256_ok', '?')}); "
        f"libraries resolved: {env.get('libraries_resolved', '?')}.",
        "",
        "Mixed prompts (prompts/mixed.jsonl), greedy, 64 tokens, default batch size "
        f"({env.get('max_batch_size', '?')}), `llmgate bench` against the gateway:",
        "",
    ]
    lines += bench_table(directory)
    canary = directory / "canary.txt"
    if canary.exists():
        lines += ["", f"Start-up batching check (server log): `{canary.read_text().strip()[:400]}`"]
    memory = load(directory, "gpu-memory.json")
    if memory:
        lines += [
            "",
            f"GPU memory: gauge `{memory.get('series', '?')}` {fmt(memory.get('gauge_mib'), 0)} MiB, "
            f"nvidia-smi {fmt(memory.get('nvidia_smi_mib'), 0)} MiB "
            f"(difference {fmt(memory.get('difference_mib'), 0)} MiB).",
        ]
    for name, title in (
        ("seeded.json", "Seeded (temperature 0.8, seed 1234) x8 among 32 concurrent, default batch"),
        ("joining-default.json", "Greedy x8 among 32 concurrent, default batch"),
        ("joining-16.json", "Greedy x8 among 32 concurrent, batch 16 (sequences join running batches)"),
    ):
        r = load(directory, name)
        if r is None:
            lines += ["", f"{title}: did not run."]
            continue
        verdict = "identical to the answer alone" if r["all_equal_alone"] else "DIFFERENT"
        lines += ["", f"{title}: {r['copies']} copies, {r['distinct_texts']} distinct text(s), "
                      f"{verdict}; {len(r['errors'])} error(s)."]
    lines += [
        "",
        "The llama.cpp engine (`--engine llamacpp`, every layer on the GPU, its default of 4 "
        "sequences decoded together), the same runs:",
        "",
    ]
    lines += bench_table(directory, "llamacpp-")
    offload = directory / "llamacpp-offload.txt"
    if offload.exists() and offload.read_text().strip():
        lines += ["", "llama.cpp's own log of the load:", "", "```", offload.read_text().strip()[:1200], "```"]
    r = load(directory, "seeded-llamacpp.json")
    title = "llama.cpp engine, seeded (temperature 0.8, seed 1234) x8 among 32 concurrent"
    if r is None:
        lines += ["", f"{title}: did not run."]
    else:
        verdict = "identical to the answer alone" if r["all_equal_alone"] else "DIFFERENT"
        lines += ["", f"{title}: {r['copies']} copies, {r['distinct_texts']} distinct text(s), "
                      f"{verdict}; {len(r['errors'])} error(s)."]
    (directory / "gpu-check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    command = sys.argv[1]
    if command == "report":
        report(pathlib.Path(sys.argv[2]))
        return
    url, out = sys.argv[2], pathlib.Path(sys.argv[3])
    result = {"seeded": seeded, "joining": joining}[command](url)
    out.write_text(json.dumps(result, indent=2))
    print(f"{command}: {result['copies']} copies, {result['distinct_texts']} distinct, "
          f"equal alone: {result['all_equal_alone']}, errors: {len(result['errors'])}")


if __name__ == "__main__":
    main()

"""The deployment artifacts, checked against the code (no Docker needed).

- Every PromQL expression (Grafana dashboard, alert rules, README and docs/) parses with
  promtool, and every llmgate_* metric it names is exported by a live gateway's /metrics.
- Every field a KQL query (saved searches, README and docs/) or a Kibana object uses exists
  in the semantic-log index mapping (tests/golden/component_template.json, which a Rust test
  keeps equal to what the gateway installs); references resolve; the NDJSON parses.
- The two images build the same gateway (the CUDA one with CUDA), each carrying its
  version. The compose stack has its own file, test_compose.py.
"""

import json
import re
import subprocess
import tempfile
import urllib.request

import yaml

from conftest import ROOT

DOCKER = ROOT / "docker"
# scripts/setup test puts promtool in the checkout; elsewhere, whatever PATH has.
PROMTOOL = str(ROOT / ".tools" / "bin" / "promtool") if (ROOT / ".tools" / "bin" / "promtool").is_file() else "promtool"
GRAFANA = ROOT / "grafana"
KIBANA = ROOT / "kibana"
# Exported only by builds with the gpu-metrics (or cuda) feature; the CI build has neither.
GPU_ONLY = {"llmgate_gpu_memory_used_bytes", "llmgate_gpu_memory_total_bytes"}
# Series only a gateway with an upstream model has (test_upstream_llamacpp.py scrapes
# them), or with a cluster for its semantic log (test_semlog_peers.py).
UPSTREAM_ONLY = {
    "llmgate_upstream_up",
    "llmgate_semlog_target_info",
    "llmgate_endpoint_time_to_first_token_seconds_bucket",
    "llmgate_endpoint_time_to_first_token_seconds_count",
    "llmgate_endpoint_state",
    "llmgate_endpoint_drifting",
    "llmgate_endpoint_attempts_total",
}


def dashboard_exprs():
    dashboard = json.loads((GRAFANA / "dashboards" / "llmgate.json").read_text())
    panels = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    annotations = [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    return panels + annotations


def alert_exprs():
    rules = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def readme_blocks(language):
    """The code blocks in `language` of the README and of every page in docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in pages)
    return [b.strip() for b in re.findall(rf"```{language}\n(.*?)```", text, re.S)]


def all_promql():
    return dashboard_exprs() + alert_exprs() + readme_blocks("promql")


def grafana_to_promql(expr):
    """Grafana's variables, replaced by what they expand to at query time."""
    return (
        expr.replace("$__rate_interval", "1m")
        .replace('"$model"', '".*"')
        .replace("$model", ".*")
    )


def test_every_promql_expression_parses():
    exprs = all_promql()
    assert len(exprs) >= 20
    rules = {
        "groups": [
            {
                "name": "parse-check",
                "rules": [
                    {"record": f"check:expr_{i}", "expr": grafana_to_promql(e)}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump(rules, f)
        f.flush()
        checked = subprocess.run(
            [PROMTOOL, "check", "rules", f.name], capture_output=True, text=True
        )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = subprocess.run(
        [PROMTOOL, "check", "rules", str(DOCKER / "alerts.yml")],
        capture_output=True,
        text=True,
    )
    assert alerts.returncode == 0, alerts.stdout + alerts.stderr


def test_every_alert_rule_fires_in_its_promtool_test():
    rules = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((DOCKER / "alerts.test.yml").read_text())
    fired = {
        case["alertname"]
        for t in tests["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == fired, f"rules without a firing test: {sorted(alerts - fired)}"
    # Each runbook annotation is `page#anchor`, relative to the repository root (the
    # runbooks live in docs/operations.md); the page must hold that anchor.
    for g in rules["groups"]:
        for r in g["rules"]:
            page, anchor = r["annotations"]["runbook"].split("#")
            assert (ROOT / page).is_file(), r["annotations"]["runbook"]
            assert f'<a id="{anchor}"></a>' in (ROOT / page).read_text(), r["annotations"]["runbook"]
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", str(DOCKER / "alerts.test.yml")],
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def scraped_names(gateway):
    # One refused request, so the per-outcome counter has a series too.
    request = urllib.request.Request(
        f"{gateway}/v1/chat/completions",
        data=b'{"model":"nope","messages":[{"role":"user","content":"x"}]}',
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(request)
    except urllib.error.HTTPError as e:
        assert e.code == 404
    with urllib.request.urlopen(f"{gateway}/metrics") as r:
        text = r.read().decode()
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_every_metric_named_is_exported(gateway):
    exported = scraped_names(gateway)
    named = set()
    for expr in all_promql():
        named |= set(re.findall(r"\bllmgate_[a-z0-9_]+", expr))
    assert named, "no llmgate metric named at all"
    missing = sorted(n for n in named - exported if n not in GPU_ONLY | UPSTREAM_ONLY)
    assert not missing, f"named but not exported: {missing}"


def mapping_types():
    template = json.loads((ROOT / "tests" / "golden" / "component_template.json").read_text())

    def walk(props, prefix=""):
        for name, spec in props.items():
            path = f"{prefix}{name}"
            if "properties" in spec:
                yield from walk(spec["properties"], path + ".")
            else:
                yield path, spec.get("type")

    return dict(walk(template["template"]["mappings"]["properties"]))


def mapping_fields():
    return set(mapping_types())


def test_visualisations_aggregate_only_aggregatable_fields():
    types = mapping_types()
    for o in saved_objects():
        if o["type"] != "visualization":
            continue
        for a in json.loads(o["attributes"]["visState"])["aggs"]:
            field = a["params"].get("field")
            if field:
                assert types.get(field) not in (None, "text"), f"{o['id']}: {field}"


def kql_fields(query):
    without_strings = re.sub(r'"[^"]*"', '""', query)
    return set(re.findall(r"([A-Za-z_@][\w.@]*)\s*(?::|<=|>=|<|>)", without_strings))


def saved_objects():
    lines = (KIBANA / "saved_objects.ndjson").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_kibana_objects_parse_and_references_resolve():
    objects = saved_objects()
    ids = {(o["type"], o["id"]) for o in objects}
    assert len(ids) == len(objects), "ids are unique"
    types = [o["type"] for o in objects]
    assert types.count("index-pattern") == 1 and types.count("dashboard") == 1
    assert types.count("search") == 4
    assert types.count("visualization") == 6
    for o in objects:
        for ref in o.get("references", []):
            assert (ref["type"], ref["id"]) in ids, f"{o['id']} -> {ref}"
        if o["type"] == "dashboard":
            panels = json.loads(o["attributes"]["panelsJSON"])
            names = {r["name"] for r in o["references"]}
            assert {p["panelRefName"] for p in panels} == names
    view = next(o for o in objects if o["type"] == "index-pattern")
    assert view["attributes"]["title"] == "logs-llmgate.requests-*"
    assert view["attributes"]["timeFieldName"] in mapping_fields()


def test_every_field_kql_and_kibana_use_is_mapped():
    fields = mapping_fields()
    used = {}
    for o in saved_objects():
        if o["type"] == "visualization":
            attributes = o["attributes"]
            state = json.loads(attributes["visState"])
            for a in state["aggs"]:
                if "field" in a["params"]:
                    used.setdefault(a["params"]["field"], o["id"])
            source = json.loads(attributes["kibanaSavedObjectMeta"]["searchSourceJSON"])
            assert source["query"]["language"] == "kuery"
            for f in kql_fields(source["query"]["query"]):
                used.setdefault(f, o["id"])
            continue
        if o["type"] != "search":
            continue
        attributes = o["attributes"]
        source = json.loads(attributes["kibanaSavedObjectMeta"]["searchSourceJSON"])
        assert source["query"]["language"] == "kuery"
        for f in kql_fields(source["query"]["query"]) | set(attributes["columns"]):
            used.setdefault(f, o["id"])
        for field, _ in attributes["sort"]:
            used.setdefault(field, o["id"])
    readme = readme_blocks("kql")
    assert len(readme) >= 5
    for query in readme:
        for f in kql_fields(query):
            used.setdefault(f, "README or docs/")
    assert len(used) > 10
    unmapped = {f: where for f, where in used.items() if f not in fields}
    assert not unmapped, f"fields not in the mapping: {unmapped}"


def dockerfile_stages(name):
    """docker/<name> as {stage: [(INSTRUCTION, arguments)]}, continuation lines joined and
    comments dropped; a stage without `AS` is named by its position."""
    stages, current = {}, None
    text = re.sub(r"\\\n", " ", (DOCKER / name).read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction, args = instruction.upper(), " ".join(args.split())
        if instruction == "FROM":
            stage = re.search(r"\bAS\s+(\S+)$", args, re.I)
            current = stage[1] if stage else f"#{len(stages)}"
            stages[current] = []
        if current is not None:
            stages[current].append((instruction, args))
    return stages


def gateway_image(name):
    """The stage that is the gateway's image: the last one (a `--target` picks the others)."""
    stages = dockerfile_stages(name)
    return list(stages.values())[-1]


def context_copies(instructions):
    """What a stage copies from the build context (not from another stage or image)."""
    return sorted(args for op, args in instructions if op == "COPY" and "--from=" not in args)


def test_the_cuda_image_is_the_cpu_image_with_cuda():
    cpu, cuda = dockerfile_stages("Dockerfile"), dockerfile_stages("Dockerfile.cuda")
    # The same sources compiled: the whole context (.dockerignore trims it) in the build
    # stage of each.
    assert context_copies(cpu["build"]) == context_copies(cuda["build"]) == [". ."]
    # The same files beside the binary (the prompt sets the quality report and `llmgate
    # compare` read), the same layout and start: one runtime contract, two engines.
    runtime_cpu, runtime_cuda = gateway_image("Dockerfile"), gateway_image("Dockerfile.cuda")
    assert context_copies(runtime_cpu) == context_copies(runtime_cuda), (
        context_copies(runtime_cpu), context_copies(runtime_cuda))
    assert any("prompts" in c for c in context_copies(runtime_cpu))
    for op in ("ENV", "USER", "WORKDIR", "EXPOSE", "VOLUME", "ENTRYPOINT", "CMD"):
        same = [[a for o, a in stage if o == op] for stage in (runtime_cpu, runtime_cuda)]
        assert same[0] == same[1], (op, same)
    binary = [[a for o, a in stage if o == "COPY" and "--from=" in a] for stage in (runtime_cpu, runtime_cuda)]
    assert [b[0].split()[-2:] for b in binary] == [["/usr/local/bin/llmgate"] * 2] * 2, binary
    # Rust the same way: the official Rust image at one pinned tag, never a script piped
    # from the network into a shell (nothing checks what it runs).
    rust = [sorted(set(re.findall(r"\brust:[\w.-]+", (DOCKER / f).read_text())))
            for f in ("Dockerfile", "Dockerfile.cuda")]
    assert rust[0] == rust[1] and len(rust[0]) == 1, rust
    for name in ("Dockerfile", "Dockerfile.cuda"):
        for stage in dockerfile_stages(name).values():
            for op, args in stage:
                if op == "RUN":
                    assert not re.search(r"\b(curl|wget)\b[^|;&]*\|\s*(sudo\s+)?(ba|da|z)?sh\b", args), (
                        name, args)


def test_images_carry_the_gateway_version():
    version = re.search(r'^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M)[1]
    env = (DOCKER / ".env.example").read_text()
    assert f"LLMGATE_VERSION={version}" in env
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    gateway = compose["services"]["llmgate"]
    assert gateway["image"] == "llmgate:${LLMGATE_VERSION:-%s}-cpu" % version
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        text = (DOCKER / dockerfile).read_text()
        assert f"ARG LLMGATE_VERSION={version}" in text, dockerfile
        assert "org.opencontainers.image.version" in text, dockerfile

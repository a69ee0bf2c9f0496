"""The compose stack (docker/compose.yaml and what it runs), checked against the gateway
and the chart without a container engine: the file parses; services, volumes, mounted
files, ports and LLMGATE_* names match `llmgate serve --help`; the grace period covers
the gateway's shutdown as the chart counts it; no secret travels in plain environment and
each service gets exactly the secrets it reads; the gateway runs as locked down as the
chart runs it; the Elasticsearch roles grant what the gateway and Grafana call and
nothing more; es-setup, make-secrets and kibana/import.sh do what they say against
recording fakes; Grafana's provisioning points at the files shipped.
"""

import base64
import contextlib
import fnmatch
import json
import os
import re
import shutil
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from conftest import BINARY, ROOT

DOCKER = ROOT / "docker"
GRAFANA = ROOT / "grafana"
KIBANA = ROOT / "kibana"


def compose():
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def serve_env_names():
    help_text = subprocess.run(
        [str(BINARY), "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"env: (LLMGATE_[A-Z0-9_]+)", help_text))


def made_secrets():
    """The secrets docker/make-secrets writes: {name: least length}."""
    text = (DOCKER / "make-secrets").read_text()
    block = re.search(r"^secrets=\(\n(.*?)^\)", text, re.M | re.S)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r'^\s+"(\w+) (\d+) ', block, re.M)}


def test_compose_matches_the_gateway_and_the_files_shipped():
    c = compose()
    services = c["services"]
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).resolve().exists(), f"{name} mounts missing {source}"
            else:
                assert source in c["volumes"], f"{name} uses undeclared volume {source}"
        for secret in service.get("secrets", []):
            assert secret in c["secrets"], f"{name} uses undeclared secret {secret}"
    # Each secret is a file docker/make-secrets writes into docker/secrets/ (ignored by git).
    written = made_secrets()
    for name, secret in c["secrets"].items():
        assert secret == {"file": f"./secrets/{name}"}, (name, secret)
        assert name in written, f"docker/make-secrets does not write {name}"
    assert set(written) == set(c["secrets"]), sorted(set(written) ^ set(c["secrets"]))
    assert (DOCKER / "secrets" / ".gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore"]

    gateway = services["llmgate"]
    env = gateway["environment"]
    known = serve_env_names()
    assert len(known) > 20
    unknown = sorted(k for k in env if k.startswith("LLMGATE_") and k not in known)
    assert not unknown, f"not gateway settings: {unknown}"
    # Nothing is published beyond loopback unless PUBLISH_ADDRESS says so.
    for name, service in services.items():
        for published in service.get("ports", []):
            assert published.startswith("${PUBLISH_ADDRESS:-127.0.0.1}:"), (name, published)
    port = env["LLMGATE_LISTEN"].rsplit(":", 1)[1]
    assert any(p.endswith(f":{port}") for p in gateway["ports"])
    assert f":{port}/ready" in " ".join(gateway["healthcheck"]["test"])
    # The gateway reaches the other services by their compose names.
    assert env["LLMGATE_ES_URL"].split("//")[1].split(":")[0] in services
    otlp_host, otlp_port = env["OTEL_EXPORTER_OTLP_ENDPOINT"].split("//")[1].split(":")
    assert otlp_host in services
    collector = yaml.safe_load((DOCKER / "otel-collector.yaml").read_text())
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(otlp_port)
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"

    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "llmgate")
    assert job["static_configs"][0]["targets"] == [f"llmgate:{port}"]
    assert "/etc/prometheus/alerts.yml" in prometheus["rule_files"]

    # Every ${VAR} the compose file uses is in .env.example.
    example = (DOCKER / ".env.example").read_text()
    defined = set(re.findall(r"^#?\s*([A-Z0-9_]+)=", example, re.M))
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", (DOCKER / "compose.yaml").read_text()))
    assert used <= defined, f"missing from .env.example: {sorted(used - defined)}"


def seconds(duration):
    """A compose duration ("48s", "1m30s", "1m") in seconds."""
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert match and duration, f"not a duration in minutes and seconds: {duration!r}"
    return int(match[1] or 0) * 60 + int(match[2] or 0)


def default_of(option):
    """The `[default: N]` that `llmgate serve --help` gives an option."""
    help_text = subprocess.run(
        [str(BINARY), "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return int(re.search(rf"--{option} <[A-Z_]+>\n\s+[^\[]*\[default: (\d+)\]", help_text)[1])


def test_compose_stop_grace_covers_the_drain_and_the_closing_as_the_chart_counts_it():
    # The chart's grace period is preStop sleep + drain + what the gateway does after the
    # drain + a margin (templates/_helpers.tpl, llmgate.graceSeconds). Compose sends
    # SIGTERM at once (no endpoints to update, so no preStop sleep); the rest is the same
    # binary's shutdown and is counted the same way, from the chart's own numbers.
    chart = ROOT / "deploy" / "helm" / "llmgate"
    helpers = (chart / "templates" / "_helpers.tpl").read_text()
    after_drain = int(re.search(r'define "llmgate.afterDrainSeconds" -\}\}(\d+)\{\{', helpers)[1])
    margin = yaml.safe_load((chart / "values.yaml").read_text())["terminationGraceMarginSeconds"]
    assert re.search(r"\(include \"llmgate.drainSeconds\" \. \| int\) "
                     r"\(include \"llmgate.afterDrainSeconds\" \. \| int\) "
                     r"\(int \.Values\.terminationGraceMarginSeconds\)", helpers), (
        "the chart counts its grace period differently now: count compose's the same way")

    gateway = compose()["services"]["llmgate"]
    env = gateway["environment"]
    drain = int(env.get("LLMGATE_SHUTDOWN_TIMEOUT_SECS", default_of("shutdown-timeout-secs")))
    assert seconds(gateway["stop_grace_period"]) == drain + after_drain + margin, (
        gateway["stop_grace_period"], drain, after_drain, margin)


# Names a secret goes by in an environment variable; `*_FILE` / `*__FILE` (a path to a
# mounted secret) and the user names are not secrets.
SECRET_NAME = re.compile(r"PASSWORD|API_KEY|REDACTION_KEY|SECRET|TOKEN")


def interpolated(value):
    """A compose value with each ${VAR:-default} as its default (or empty)."""
    return re.sub(r"\$\{[A-Z0-9_]+(?::?-([^}]*))?[^}]*\}", lambda m: m[1] or "", str(value))


def run_secrets(service, declared):
    """The secrets a service reads: /run/secrets/<name> in its environment, command,
    entrypoint and healthcheck, and the declared names a script it mounts reads."""
    text = json.dumps({k: service.get(k) for k in ("environment", "command", "entrypoint", "healthcheck")})
    names = set(re.findall(r"/run/secrets/(\w+)", text))
    for volume in service.get("volumes", []):
        source = DOCKER / volume.split(":")[0]
        if volume.startswith("./") and source.suffix == ".sh":
            names |= {n for n in declared if re.search(rf"\b{n}\b", source.read_text())}
    return names


def test_compose_passes_no_secret_in_plain_environment(tmp_path):
    c = compose()
    for name, service in c["services"].items():
        env = service.get("environment", {})
        for key, value in env.items():
            if key.endswith("_FILE"):
                # A path to a secret the service is granted.
                assert re.fullmatch(r"/run/secrets/\w+", value), (name, key, value)
            else:
                assert not SECRET_NAME.search(key), f"{name}: {key} holds a secret in plain environment"
            assert not re.search(r"\$\{\w*(PASSWORD|KEY|SECRET|TOKEN)", str(value)), (name, key, value)
        # Every secret file it reads is one it is granted, and it is granted none it does
        # not read.
        assert run_secrets(service, c["secrets"]) == set(service.get("secrets", [])), name
    # No password from docker/.env is left for compose to interpolate anywhere.
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", (DOCKER / "compose.yaml").read_text()))
    assert not {u for u in used if SECRET_NAME.search(u)}, used

    # The gateway: its own user and the redaction key from files, the _FILE settings it
    # has (serve --help), and a configuration it accepts with those files in place.
    gateway = c["services"]["llmgate"]
    env = gateway["environment"]
    assert env["LLMGATE_ES_USERNAME"] not in ("elastic", "kibana_system")
    assert env["LLMGATE_ES_PASSWORD_FILE"] == "/run/secrets/llmgate_es_password"
    assert env["LLMGATE_REDACTION_KEY_FILE"] == "/run/secrets/llmgate_redaction_key"
    assert {"LLMGATE_ES_PASSWORD_FILE", "LLMGATE_REDACTION_KEY_FILE"} <= serve_env_names()
    assert gateway["depends_on"]["es-setup"]["condition"] == "service_completed_successfully"
    secrets = tmp_path / "secrets"
    subprocess.run(["bash", str(DOCKER / "make-secrets"), str(secrets)], check=True, capture_output=True)
    resolved = {k: interpolated(v).replace("/run/secrets/", f"{secrets}/") for k, v in env.items()}
    resolved.update(LLMGATE_DATA_DIR=str(tmp_path / "data"),
                    LLMGATE_MODEL_PATH=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q8_0.gguf"))
    check = subprocess.run([str(BINARY), "serve", "--check-config"], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], **resolved})
    assert check.returncode == 0, check.stderr


def test_compose_runs_the_gateway_as_locked_down_as_the_chart():
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "llmgate" / "values.yaml").read_text())
    context = chart["securityContext"]
    c = compose()
    gateway = c["services"]["llmgate"]
    # The chart's securityContext, in compose's words.
    assert gateway["read_only"] is context["readOnlyRootFilesystem"] is True
    assert gateway["cap_drop"] == context["capabilities"]["drop"] == ["ALL"]
    assert context["allowPrivilegeEscalation"] is False
    assert "no-new-privileges:true" in gateway["security_opt"]
    assert not gateway.get("cap_add")
    # Every path it writes is a volume or a tmpfs: the data directory (spool, NDJSON and
    # dead-letter files) and /tmp, as the chart mounts them; the model is read-only.
    writable = {v.split(":")[1] for v in gateway["volumes"] if not v.endswith(":ro")}
    writable |= {t.split(":")[0] for t in gateway.get("tmpfs", [])}
    assert writable == {gateway["environment"]["LLMGATE_DATA_DIR"], "/tmp"}, writable
    assert "../models:/models:ro" in gateway["volumes"]
    # The same for every other service but the GPU exporter (which needs SYS_ADMIN).
    for name, service in c["services"].items():
        if name == "dcgm-exporter":
            assert service["cap_add"] == ["SYS_ADMIN"]
            continue
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name


# Every call the gateway makes to Elasticsearch and the privilege that allows it
# (Elasticsearch's cluster and index privileges; for ILM, the create-lifecycle-policy
# API's prerequisites). Keyed as the sources name them: src/semlog/setup.rs's paths,
# elasticsearch.rs's bulk.
ES_CALLS = {
    '"GET", "/"': ("cluster", "monitor"),  # what the cluster is (setup step detect)
    "/_ilm/policy/": ("cluster", "manage_ilm"),  # PUT the retention policy
    "/_component_template/": ("cluster", "manage_index_templates"),  # PUT the mappings
    "/_index_template/": ("cluster", "manage_index_templates"),  # PUT the index template
    "/_data_stream/": ("indices", "create_index"),  # PUT the data stream
    "BulkParts::Index": ("indices", "create_doc"),  # POST <data stream>/_bulk, `create` only
    # Before sending again documents whose fate is unknown: which of them the stream
    # holds in any backing index (src/semlog/held.rs; `manage` covers the refresh).
    "/_search": ("indices", "read"),
    "/_refresh": ("indices", "manage"),
    # Not a call: ILM rolls over and deletes the backing indices as the user who last put
    # the policy, which needs `manage` on them.
    "ILM's own actions": ("indices", "manage"),
}
OPENSEARCH_ONLY = {"/_plugins/_ism/policies/"}


def test_the_gateways_elasticsearch_role_grants_each_call_it_makes_and_nothing_more():
    semlog = ROOT / "src" / "semlog"
    sources = "\n".join(f.read_text() for f in sorted(semlog.rglob("*.rs")))
    called = set(re.findall(r'"(/_[a-z_/]+/)', sources))
    called |= {k for k in ('"GET", "/"', "BulkParts::Index", "/_search", "/_refresh") if k in sources}
    known = set(ES_CALLS) - {"ILM's own actions"}
    assert called - OPENSEARCH_ONLY == known, (
        f"the gateway's calls changed: {sorted(called ^ (known | OPENSEARCH_ONLY))}; "
        "give docker/llmgate-es-role.json what they need and update this table and docs/operations.md")
    methods = set(re.findall(r'\.call\(\s*"([A-Z]+)"', sources))
    assert methods <= {"GET", "PUT", "POST"}, methods

    role = json.loads((DOCKER / "llmgate-es-role.json").read_text())
    assert set(role) == {"cluster", "indices", "metadata"}
    assert sorted(role["cluster"]) == sorted({p for kind, p in ES_CALLS.values() if kind == "cluster"})
    (indices,) = role["indices"]
    assert set(indices) == {"names", "privileges"}
    assert sorted(indices["privileges"]) == sorted({p for kind, p in ES_CALLS.values() if kind == "indices"})
    # Only the semantic log's data streams: logs-<dataset>-<namespace>, any namespace.
    dataset = re.search(r'pub const DATASET: &str = "([^"]+)"', (semlog / "document" / "mod.rs").read_text())[1]
    assert indices["names"] == [f"logs-{dataset}-*"]
    namespace = interpolated(compose()["services"]["llmgate"]["environment"]["LLMGATE_SEMLOG_NAMESPACE"])
    assert fnmatch.fnmatchcase(f"logs-{dataset}-{namespace}", indices["names"][0])
    # The names in the sources are the ones the role's pattern covers.
    assert f'INDEX_TEMPLATE: &str = "logs-{dataset}"' in sources


def recording_curl(tmp_path):
    """A folder to put first on PATH: its curl appends its command line to
    tmp_path/argv, then runs the real curl."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "curl").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{tmp_path}/argv"\nexec {shutil.which("curl")} "$@"\n')
    (shim / "curl").chmod(0o755)
    return shim


@contextlib.contextmanager
def serving(handler):
    """`handler` on a free loopback port, in a thread, for the block; yields the port."""
    handler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()


class FakeSecurityApi(BaseHTTPRequestHandler):
    """Elasticsearch's security API as es-setup sees it: records each request; answers
    503 to the first (the security index not ready yet), then 200."""

    seen = []

    def answer(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
        user, _, password = base64.b64decode(self.headers["authorization"].split()[1]).decode().partition(":")
        self.seen.append({"method": self.command, "path": self.path, "user": user,
                          "password": password, "body": body})
        status = 503 if len(self.seen) == 1 else 200
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_PUT = do_POST = answer

    def log_message(self, *args):
        pass


def test_es_setup_makes_the_gateways_user_from_the_secret_files(tmp_path):
    scripts = [DOCKER / "make-secrets", DOCKER / "es-setup.sh"]
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert os.access(script, os.X_OK), script
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
    secrets = tmp_path / "secrets"
    subprocess.run(["bash", str(DOCKER / "make-secrets"), str(secrets)], check=True, capture_output=True)
    values = {f.name: f.read_text() for f in secrets.iterdir()}

    # No secret may be on curl's command line (any user of the host can read a
    # process's command line).
    shim = recording_curl(tmp_path)
    with serving(FakeSecurityApi) as port:
        out = subprocess.run(
            ["bash", str(DOCKER / "es-setup.sh")], capture_output=True, text=True, timeout=60,
            env={"PATH": f"{shim}:{os.environ['PATH']}", "ES_URL": f"http://127.0.0.1:{port}",
                 "SECRETS": str(secrets), "ROLE_FILE": str(DOCKER / "llmgate-es-role.json"),
                 "READER_ROLE_FILE": str(DOCKER / "llmgate-es-reader-role.json"), "RETRY_SECONDS": "0"},
        )
    assert out.returncode == 0, out.stderr
    seen = FakeSecurityApi.seen
    assert all(r["user"] == "elastic" and r["password"] == values["elastic_password"] for r in seen)
    calls = [(r["method"], r["path"]) for r in seen]
    role, reader_role = "llmgate_semlog", "llmgate_semlog_reader"
    gateway = compose()["services"]["llmgate"]["environment"]["LLMGATE_ES_USERNAME"]
    reader = semantic_log_data_source()["basicAuthUser"]
    assert calls == [("POST", "/_security/user/kibana_system/_password")] * 2 + [
        ("PUT", f"/_security/role/{role}"), ("PUT", f"/_security/user/{gateway}"),
        ("PUT", f"/_security/role/{reader_role}"), ("PUT", f"/_security/user/{reader}")], calls
    assert json.loads(seen[1]["body"]) == {"password": values["kibana_system_password"]}
    assert json.loads(seen[2]["body"]) == json.loads((DOCKER / "llmgate-es-role.json").read_text())
    user = json.loads(seen[3]["body"])
    assert user["password"] == values["llmgate_es_password"] and user["roles"] == [role], user
    # Grafana's data source: its own read-only role and user, its own password.
    assert json.loads(seen[4]["body"]) == json.loads((DOCKER / "llmgate-es-reader-role.json").read_text())
    user = json.loads(seen[5]["body"])
    assert user["password"] == values["grafana_semlog_password"] and user["roles"] == [reader_role], user
    argv = (tmp_path / "argv").read_text()
    assert argv.count("\n") == len(seen)
    for name, value in values.items():
        assert value not in argv and value not in out.stdout + out.stderr, name

    # A refusal no retry fixes ends it at once, saying what was refused.
    (secrets / "llmgate_es_password").write_text("bad password with spaces")
    out = subprocess.run(["bash", str(DOCKER / "es-setup.sh")], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "ES_URL": "http://127.0.0.1:9", "SECRETS": str(secrets)})
    assert out.returncode == 1 and "llmgate_es_password" in out.stderr, out.stderr


def test_make_secrets_writes_each_secret_once(tmp_path):
    folder = tmp_path / "secrets"
    made = made_secrets()
    env = {"PATH": os.environ["PATH"], "ELASTIC_PASSWORD": "kept-from-an-old-env-file"}
    first = subprocess.run(["bash", str(DOCKER / "make-secrets"), str(folder)], env=env,
                           capture_output=True, text=True, check=True)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    values = {}
    for name, least in made.items():
        path = folder / name
        # Readable by the containers' users (not the owner's), inside a folder only the
        # owner may enter; no newline for a reader to keep.
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, name
        values[name] = path.read_text()
        assert re.fullmatch(r"[A-Za-z0-9._~+-]+", values[name]) and len(values[name]) >= least, name
    assert values["elastic_password"] == "kept-from-an-old-env-file"
    randoms = [v for n, v in values.items() if n != "elastic_password"]
    assert len(set(randoms)) == len(randoms) and all(len(v) == 32 for v in randoms)
    for value in values.values():
        assert value not in first.stdout + first.stderr
    # Again: nothing changes.
    subprocess.run(["bash", str(DOCKER / "make-secrets"), str(folder)], check=True, capture_output=True)
    assert {n: (folder / n).read_text() for n in made} == values
    # A value es-setup could not pass on as it is is refused.
    out = subprocess.run(["bash", str(DOCKER / "make-secrets"), str(tmp_path / "other")], capture_output=True,
                         text=True, env={"PATH": os.environ["PATH"], "KIBANA_SYSTEM_PASSWORD": 'with "quotes"'})
    assert out.returncode == 1 and "KIBANA_SYSTEM_PASSWORD" in out.stderr, out.stderr


def semantic_log_data_source():
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "datasources.yaml").read_text()
    )["datasources"]
    return next(d for d in datasources if d["type"] == "elasticsearch")


# What Grafana's Elasticsearch data source calls and the privilege that allows it, as
# Grafana's "Configure the Elasticsearch data source" lists them (monitor,
# view_index_metadata, read) and Elasticsearch's API pages grant them.
GRAFANA_ES_CALLS = {
    "GET /": ("cluster", "monitor"),  # the version
    "GET <index>/_mapping": ("indices", "view_index_metadata"),  # the field list
    "GET <index>/_field_caps": ("indices", "view_index_metadata"),  # the same, newer Grafanas
    "POST _msearch over <index>": ("indices", "read"),  # every query
}


def test_grafana_reads_the_semantic_log_as_a_read_only_user():
    writer = json.loads((DOCKER / "llmgate-es-role.json").read_text())
    reader = json.loads((DOCKER / "llmgate-es-reader-role.json").read_text())
    assert set(reader) == {"cluster", "indices", "metadata"}
    assert reader["cluster"] == sorted({p for kind, p in GRAFANA_ES_CALLS.values() if kind == "cluster"})
    (indices,) = reader["indices"]
    assert set(indices) == {"names", "privileges"}
    # Nothing that writes or manages, and only the semantic log's data streams: the same
    # pattern as the gateway's role.
    assert sorted(indices["privileges"]) == sorted(
        {p for kind, p in GRAFANA_ES_CALLS.values() if kind == "indices"}) == ["read", "view_index_metadata"]
    assert indices["names"] == writer["indices"][0]["names"]

    source = semantic_log_data_source()
    assert source["jsonData"]["index"] == indices["names"][0]
    assert source["basicAuth"] is True
    assert source["basicAuthUser"] not in ("elastic", "kibana_system", "llmgate")
    # The password is a variable the grafana service sets from its own secret, not
    # elastic's; nothing but what makes users or Kibana's objects gets elastic's.
    variable = re.fullmatch(r"\$\{?(\w+)\}?", source["secureJsonData"]["basicAuthPassword"])[1]
    services = compose()["services"]
    grafana = services["grafana"]
    assert sorted(grafana["secrets"]) == ["grafana_admin_password", "grafana_semlog_password"]
    assert f"{variable}=$$(cat /run/secrets/grafana_semlog_password)" in grafana["entrypoint"][-1]
    assert "elastic_password" not in json.dumps(grafana)
    assert grafana["depends_on"]["es-setup"]["condition"] == "service_completed_successfully"
    granted = {name for name, s in services.items() if "elastic_password" in s.get("secrets", [])}
    assert granted == {"elasticsearch", "es-setup", "kibana-import"}, granted
    # es-setup mounts the role where it reads it by default.
    mounts = dict(v.split(":")[:2] for v in services["es-setup"]["volumes"])
    default = re.search(r"READER_ROLE_FILE:-([^}]+)\}", (DOCKER / "es-setup.sh").read_text())[1]
    assert mounts["./llmgate-es-reader-role.json"] == default


class FakeKibana(BaseHTTPRequestHandler):
    """Kibana's saved-objects import as kibana/import.sh sees it: records each request;
    answers 503 to the first (Kibana not ready yet), then a success."""

    seen = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
        credentials = base64.b64decode(self.headers["authorization"].split()[1]).decode()
        self.seen.append({"path": self.path, "credentials": credentials, "body": body,
                          "xsrf": self.headers.get("kbn-xsrf")})
        status = 503 if len(self.seen) == 1 else 200
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"success":true,"successCount":7}' if status == 200 else b"{}")

    def log_message(self, *args):
        pass


def test_kibana_import_passes_the_password_on_standard_input(tmp_path):
    script = KIBANA / "import.sh"
    subprocess.run(["sh", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
    shim = recording_curl(tmp_path)
    objects = KIBANA / "saved_objects.ndjson"
    # A password curl's configuration must quote: a double quote and a backslash.
    password = 'pa"ss\\wo rd'
    secret = tmp_path / "elastic_password"
    secret.write_text("from-the-secret-file")

    def run(**env):
        with serving(FakeKibana) as port:
            out = subprocess.run(
                ["sh", str(script), str(objects)], capture_output=True, text=True, timeout=60,
                env={"PATH": f"{shim}:{os.environ['PATH']}", "RETRY_SECONDS": "0",
                     "KIBANA_URL": f"http://127.0.0.1:{port}", **env})
        assert out.returncode == 0, out.stderr
        assert "imported" in out.stdout
        # No password on curl's command line, which is run once per attempt, nor in the log.
        argv = (tmp_path / "argv").read_text()
        (tmp_path / "argv").unlink()
        assert argv.count("\n") == len(FakeKibana.seen) == 2
        for value in (env.get("KIBANA_PASSWORD") or secret.read_text()).split():
            assert value not in argv and value not in out.stdout + out.stderr, value
        return FakeKibana.seen

    # As its usage line has it: the password in the environment, elastic by default.
    seen = run(KIBANA_PASSWORD=password)
    for request in seen:
        assert request["path"] == "/api/saved_objects/_import?overwrite=true"
        assert request["credentials"] == f"elastic:{password}"
        assert request["xsrf"] == "true"
    assert objects.read_text().splitlines()[0] in seen[1]["body"]
    # As compose runs it: the password from the secret file.
    kibana_import = compose()["services"]["kibana-import"]
    env = kibana_import["environment"]
    assert env["KIBANA_PASSWORD_FILE"] == f"/run/secrets/{kibana_import['secrets'][0]}"
    assert kibana_import["entrypoint"] == ["/bin/sh", "/import/import.sh", "/import/saved_objects.ndjson"]
    seen = run(KIBANA_USER=env["KIBANA_USER"], KIBANA_PASSWORD_FILE=str(secret))
    assert [r["credentials"] for r in seen] == [f"{env['KIBANA_USER']}:from-the-secret-file"] * 2
    # Without a password it says which settings give one.
    out = subprocess.run(["sh", str(script), str(objects)], capture_output=True, text=True, timeout=10,
                         env={"PATH": os.environ["PATH"], "KIBANA_URL": "http://127.0.0.1:9"})
    assert out.returncode != 0 and "KIBANA_PASSWORD" in out.stderr, out.stderr


def test_grafana_provisioning_points_at_the_files_shipped():
    c = compose()
    mounts = dict(v.split(":")[:2] for v in c["services"]["grafana"]["volumes"])
    inverse = {target: source for source, target in mounts.items()}
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "dashboards.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    source = (DOCKER / inverse[path]).resolve()
    assert (source / "llmgate.json").is_file()
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "datasources.yaml").read_text()
    )["datasources"]
    uids = {d["uid"] for d in datasources}
    dashboard = json.loads((source / "llmgate.json").read_text())
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] in uids
    prometheus = next(d for d in datasources if d["type"] == "prometheus")
    assert prometheus["jsonData"]["exemplarTraceIdDestinations"][0]["datasourceUid"] in uids
    assert prometheus["url"].split("//")[1].split(":")[0] in c["services"]
    # Exemplars are switched on for the latency panels.
    latency = [p for p in dashboard["panels"] if "p50 / p95 / p99" in p["title"]]
    assert len(latency) == 3 and all(t["exemplar"] for p in latency for t in p["targets"])
    assert dashboard["templating"]["list"][0]["name"] == "model"

"""The Helm chart (deploy/helm/llmgate), proven without a cluster.

For the default values and every profile in ci/*-values.yaml:
- `helm lint --strict`, and `helm template` validated strictly by kubernetes-validate
  against two Kubernetes versions (its bundled upstream schemas; a profile that needs a
  newer one, against its oldest instead);
- the custom resources validated against their CRDs' own schemas, from registry packages
  (scripts/peers puts them in .peers/k8s): ServiceMonitor and PrometheusRule from
  prometheus-operator 0.89.0's CRDs, ScaledObject from KEDA's CRD as kubernetes-models
  generated it. No package ships the InferencePool CRD: its fields are checked here by hand
  against the v1 API (docs/kubernetes.md says so);
- what schemas miss: selectors match the pods; the Service, PDB, HPA, KEDA and
  ServiceMonitor target what exists; the PDB stays below the fewest pods; GPU limits equal
  requests; preStop + drain + flushes fit the grace period; probe ports and paths exist
  and a slow answer is no failure; the scrape reaches the port that serves /metrics;
  every metric the HPA, KEDA, the alerts and the endpoint picker's flags name is one a
  running gateway exports; the rendered configuration is one `llmgate serve` accepts;
  no secret reaches the ConfigMap or a literal in the Deployment.
"""

import json
import re
import subprocess
import functools
import tomllib
import urllib.error
import urllib.parse
import urllib.request

import jsonschema
import pytest
import yaml

from conftest import BINARY, ROOT, free_port, launch, stop_gateway
from test_deploy import GPU_ONLY, UPSTREAM_ONLY, scraped_names

CHART = ROOT / "deploy" / "helm" / "llmgate"
K8S = ROOT / ".peers" / "k8s"
HELM = K8S / "helm" / "helm"
KUBE_VALIDATE = K8S / "venv" / "bin" / "kubernetes-validate"
CRDS = K8S / "crds"
# A Kubernetes still widely run and the newest kubernetes-validate bundles.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
# Profiles that need a newer Kubernetes than the oldest above, validated against this one
# instead (the chart refuses them on older ones): the first with the image volume source.
OLDEST_KUBE = {"model-image": "1.31.0"}
PROFILES = ["default", *sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))]
# What the gateway does after its drain before it exits: 2 s for cut-off streams, 5 s for
# the HTTP server to stop, 1 s for the metrics listener, 5 s for the semantic-log queue,
# 5 s for traces (src/lifecycle.rs, src/lib.rs, src/main.rs).
AFTER_DRAIN_SECONDS = 18
# Groups of custom resources: kubernetes-validate knows none of them (it warns and passes).
CRD_GROUPS = ("monitoring.coreos.com", "keda.sh", "inference.networking.k8s.io")
DEFAULT_SHUTDOWN_TIMEOUT = 25


def tools():
    missing = [str(p) for p in (HELM, KUBE_VALIDATE, CRDS) if not p.exists()]
    if missing:
        pytest.fail(f"scripts/peers installs the Kubernetes tools; missing: {missing}")


def values_args(profile):
    return [] if profile == "default" else ["-f", str(CHART / "ci" / f"{profile}-values.yaml")]


def kube_version_of(profile, kube_version):
    """`kube_version`, or the oldest the profile can run on where that is newer."""
    oldest = OLDEST_KUBE.get(profile, kube_version)
    key = lambda v: tuple(map(int, v.split(".")))
    return max(kube_version, oldest, key=key)


@functools.cache
def render(profile, kube_version=KUBE_VERSIONS[0]):
    """The profile's manifests as helm renders them (once per profile and version)."""
    tools()
    kube_version = kube_version_of(profile, kube_version)
    out = subprocess.run(
        [str(HELM), "template", "rel", str(CHART), "--namespace", "llm",
         "--kube-version", kube_version, *values_args(profile)],
        capture_output=True, text=True, check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def objects(profile):
    return [o for o in yaml.safe_load_all(render(profile)) if o]


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def one(objs, kind):
    found = by_kind(objs, kind)
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def matches(selector, labels):
    return selector and all(labels.get(k) == v for k, v in selector.items())


def gateway_service(objs):
    """The gateway's own Service (not the headless ones over upstream pools)."""
    found = [o for o in by_kind(objs, "Service") if o["spec"].get("clusterIP") != "None"]
    assert len(found) == 1, f"{len(found)} gateway Services"
    return found[0]


@pytest.mark.parametrize("profile", PROFILES)
def test_lint_strict(profile):
    tools()
    out = subprocess.run([str(HELM), "lint", "--strict", str(CHART), *values_args(profile)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("profile", PROFILES)
def test_manifests_validate_strictly(profile, kube_version, tmp_path):
    rendered = tmp_path / f"{profile}.yaml"
    rendered.write_text(render(profile, kube_version))
    kube_version = kube_version_of(profile, kube_version)
    out = subprocess.run(
        [str(KUBE_VALIDATE), "--strict", "-k", kube_version, str(rendered)],
        capture_output=True, text=True, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    passed = re.findall(r"passed for resource (\S+)", out.stdout + out.stderr)
    builtin = [o for o in objects(profile) if o["apiVersion"].split("/")[0] not in CRD_GROUPS]
    assert len(passed) == len(builtin), (passed, [o["kind"] for o in builtin])


def crd_schema(file, version):
    crd = yaml.safe_load((CRDS / file).read_text())
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)


def keda_schema():
    """The JSON schema kubernetes-models generated from KEDA's ScaledObject CRD; its
    metadata property refers to another package and is checked by Kubernetes' own."""
    text = (CRDS / "keda-ScaledObject.js").read_text()
    schema = json.loads(re.search(r"const schema = (\{.*?\});\n", text, re.S)[1])
    schema["properties"].pop("metadata", None)
    return schema


def validator(kind):
    # Draft 7 without checking the schema itself: the CRDs carry Go regular expressions
    # (`^(?i)...`) that Python's `re` refuses, in fields the chart does not set.
    schemas = {
        "ServiceMonitor": lambda: crd_schema("servicemonitors.monitoring.coreos.com.yaml", "v1"),
        "PrometheusRule": lambda: crd_schema("prometheusrules.monitoring.coreos.com.yaml", "v1"),
        "ScaledObject": keda_schema,
    }
    return jsonschema.Draft7Validator(schemas[kind]())


def check_inference_pool(pool):
    """inference.networking.k8s.io/v1 InferencePool, by hand: no package in a reachable
    registry ships its CRD (docs/kubernetes.md)."""
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "endpointPickerRef"}, spec
    assert set(spec["selector"]) == {"matchLabels"} and spec["selector"]["matchLabels"]
    ports = spec["targetPorts"]
    assert 1 <= len(ports) <= 8 and all(set(p) == {"number"} and 1 <= p["number"] <= 65535 for p in ports)
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"} and ref["name"]
    assert set(ref["port"]) == {"number"} and 1 <= ref["port"]["number"] <= 65535
    assert ref["failureMode"] in ("FailOpen", "FailClose")


@pytest.mark.parametrize("profile", PROFILES)
def test_custom_resources_match_their_crds(profile):
    objs = objects(profile)
    for obj in objs:
        if obj["kind"] in ("ServiceMonitor", "PrometheusRule", "ScaledObject"):
            errors = [e.message for e in validator(obj["kind"]).iter_errors(obj)]
            assert not errors, (obj["kind"], errors)
        if obj["kind"] == "InferencePool":
            check_inference_pool(obj)


def test_the_crd_schemas_do_refuse_what_is_wrong():
    """The validators are not vacuous: each refuses a broken copy of a rendered object."""
    cpu, keda = objects("cpu"), objects("keda")
    monitor = json.loads(json.dumps(one(cpu, "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["scheme"] = "ftp"
    rule = json.loads(json.dumps(one(cpu, "PrometheusRule")))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    scaled = json.loads(json.dumps(one(keda, "ScaledObject")))
    del scaled["spec"]["triggers"]
    for obj in (monitor, rule, scaled):
        assert list(validator(obj["kind"]).iter_errors(obj)), obj["kind"]


@pytest.fixture(scope="module")
def exported(gateway):
    """The series names a running gateway on the default model exports (and, named by the
    alerts, those only a GPU build or an upstream model has: test_deploy.py's lists)."""
    return scraped_names(gateway)


def metric_names(promql):
    return set(re.findall(r"\bllmgate_[a-z0-9_]+", promql))


def pod_of(objs):
    deployment = one(objs, "Deployment")
    return deployment, deployment["spec"]["template"]


def container_ports(pod):
    return {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}


def config_of(objs):
    return tomllib.loads(one(objs, "ConfigMap")["data"]["llmgate.toml"])


@pytest.mark.parametrize("profile", PROFILES)
def test_what_schemas_miss(profile, exported, gateway):
    objs = objects(profile)
    deployment, pod = pod_of(objs)
    labels = pod["metadata"]["labels"]
    ports = container_ports(pod)
    name = deployment["metadata"]["name"]
    assert matches(deployment["spec"]["selector"]["matchLabels"], labels)

    service = gateway_service(objs)
    assert matches(service["spec"]["selector"], labels)
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports, port

    config = config_of(objs)
    drain = config.get("server", {}).get("shutdown_timeout_secs", DEFAULT_SHUTDOWN_TIMEOUT)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and security["capabilities"]["drop"] == ["ALL"]
        assert not security["allowPrivilegeEscalation"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts or {"name": "TMPDIR", "value": "/models"} in container["env"]
    for container in pod["spec"]["containers"]:
        sleep = container["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep[0] == "sleep"
        assert int(sleep[1]) + drain + AFTER_DRAIN_SECONDS < grace, (sleep, drain, grace)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] in ports, (probe, get)
            # A busy pod's answer may be late: not Kubernetes' 1 s default, and never
            # one late answer that counts as a failure.
            assert container[probe].get("timeoutSeconds", 1) >= 3, (probe, container[probe])
            assert container[probe].get("failureThreshold", 3) >= 3, (probe, container[probe])
            with urllib.request.urlopen(f"{gateway}{get['path']}") as r:
                assert r.status == 200, (probe, get)
        resources = container["resources"]
        gpus = {k for k in {**resources.get("limits", {}), **resources.get("requests", {})} if k.endswith("/gpu")}
        for gpu in gpus:
            assert resources["limits"].get(gpu) == resources["requests"].get(gpu), resources
    assert pod["spec"]["securityContext"]["runAsNonRoot"]
    assert pod["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    if profile == "gpu":
        assert gpus == {"nvidia.com/gpu"}
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.present"] == "true"

    autoscalers = by_kind(objs, "HorizontalPodAutoscaler") + by_kind(objs, "ScaledObject")
    assert len(autoscalers) <= 1
    fewest = deployment["spec"].get("replicas")
    for scaler in autoscalers:
        target = scaler["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", name)
        fewest = scaler["spec"].get("minReplicas", scaler["spec"].get("minReplicaCount"))
        assert "replicas" not in deployment["spec"], "an autoscaled Deployment sets no replicas"
    for hpa in by_kind(objs, "HorizontalPodAutoscaler"):
        for metric in hpa["spec"]["metrics"]:
            assert metric["pods"]["metric"]["name"] in exported, metric
    for scaled in by_kind(objs, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            names = metric_names(trigger["metadata"]["query"])
            assert names and names <= exported, names - exported
            assert f'service="{service["metadata"]["name"]}"' in trigger["metadata"]["query"]

    for pdb in by_kind(objs, "PodDisruptionBudget"):
        assert matches(pdb["spec"]["selector"]["matchLabels"], labels)
        assert pdb["spec"]["minAvailable"] < fewest, (pdb["spec"], fewest)
    if fewest == 1:
        assert not by_kind(objs, "PodDisruptionBudget"), "a PDB on one pod blocks every drain"

    for policy in by_kind(objs, "NetworkPolicy"):
        assert matches(policy["spec"]["podSelector"]["matchLabels"], labels)
        for rule in policy["spec"]["ingress"]:
            assert all(p["port"] in ports for p in rule["ports"]), rule

    # Where the gateway serves /metrics: its own listener when the pod's environment or
    # the file sets one, else the API port.
    container = pod["spec"]["containers"][0]
    listen = pod_env(container).get("LLMGATE_METRICS_LISTEN") or config.get("server", {}).get("metrics_listen")
    scraped = int(listen.rsplit(":", 1)[1]) if listen else ports["http"]
    scrape_ports = {name for name, number in ports.items() if number == scraped}
    assert scrape_ports, f"no container port for /metrics on {scraped}"
    for policy in by_kind(objs, "NetworkPolicy"):
        admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert admitted & scrape_ports, "the NetworkPolicy lets no scraper reach /metrics"

    jobs = set()
    for monitor in by_kind(objs, "ServiceMonitor"):
        assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        service_ports = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
            assert service_ports[endpoint["port"]] in scrape_ports, (endpoint, scraped)
            jobs |= {r["replacement"] for r in endpoint.get("relabelings", []) if r["targetLabel"] == "job"}
    for rule in by_kind(objs, "PrometheusRule"):
        exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
        assert exprs, "the alerts are carried"
        names = set().union(*map(metric_names, exprs)) - GPU_ONLY - UPSTREAM_ONLY
        assert names <= exported, names - exported
        # The rules' job matchers select what the ServiceMonitor's scrape is labelled.
        wanted = set().union(*(re.findall(r'job="([^"]+)"', e) for e in exprs))
        assert wanted and wanted <= jobs, (wanted, jobs)
    # A headless Service over an upstream's replicas: a model's url names it (with
    # dns_refresh_secs, or the gateway would see one address), it selects no gateway
    # pod, and where egress is ruled the engines' port is open to the pods it selects.
    pools = [o for o in by_kind(objs, "Service") if o["spec"].get("clusterIP") == "None"]
    hosts = {}
    for model in config.get("models", []):
        for url in [model.get("url")] + model.get("urls", []):
            if url:
                parsed = urllib.parse.urlsplit(url)
                hosts[parsed.hostname] = (parsed.port, model)
    for pool in pools:
        name, spec = pool["metadata"]["name"], pool["spec"]
        assert not matches(spec["selector"], labels), "a pool of the gateway itself"
        port, model = hosts.get(name, (None, None))
        assert model, f"no model's url names the pool {name}"
        assert port == spec["ports"][0]["port"] and model.get("dns_refresh_secs"), model
        if policy := next(iter(by_kind(objs, "NetworkPolicy")), None):
            if policy["spec"].get("egress"):
                assert any(
                    any(matches(peer.get("podSelector", {}).get("matchLabels"), spec["selector"])
                        for peer in rule.get("to", []))
                    and any(p["port"] == spec["ports"][0]["targetPort"] for p in rule.get("ports", []))
                    for rule in policy["spec"]["egress"]
                ), f"egress to the pool {name}'s pods is closed"
    if profile == "vllm-pool":
        assert [p["metadata"]["name"] for p in pools] == ["vllm-llama3-engines"]

    for pool in by_kind(objs, "InferencePool"):
        assert matches(pool["spec"]["selector"]["matchLabels"], labels)
        assert {p["number"] for p in pool["spec"]["targetPorts"]} <= set(ports.values())


def test_prometheus_rule_carries_alerts_yml_unchanged():
    rule = one(objects("cpu"), "PrometheusRule")
    source = yaml.safe_load((CHART / "files" / "alerts.yml").read_text())
    assert rule["spec"] == source
    assert (ROOT / "docker" / "alerts.yml").resolve() == (CHART / "files" / "alerts.yml").resolve()


def test_endpoint_picker_flags_name_exported_gauges(exported, gateway):
    """The flags docs/kubernetes.md gives the Gateway API Inference Extension's endpoint
    picker name gauges this gateway exports, and every other page that gives them (the
    README, docs/) gives the same."""
    pattern = r"--(total-queued-requests-metric|total-running-requests-metric|kv-cache-usage-percentage-metric)=([a-z_]+)"
    flags = dict(re.findall(pattern, (ROOT / "docs" / "kubernetes.md").read_text()))
    assert set(flags) == {"total-queued-requests-metric", "total-running-requests-metric", "kv-cache-usage-percentage-metric"}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        given = dict(re.findall(pattern, page.read_text()))
        assert not given or given == flags, f"{page.relative_to(ROOT)} and docs/kubernetes.md differ"
    with urllib.request.urlopen(f"{gateway}/metrics") as r:
        text = r.read().decode()
    for flag, metric in flags.items():
        assert metric in exported, flag
        assert f"# TYPE {metric} gauge" in text, metric
    kv = [float(v) for v in re.findall(r"^llmgate_kv_cache_usage_ratio\{[^}]*\} (\S+)$", text, re.M)]
    assert kv and all(0.0 <= v <= 1.0 for v in kv), kv


# What a Secret would hold, for the check: 16 characters at least (a redaction key's
# minimum), so that any secret the pod takes from a Secret passes.
SECRET_STAND_IN = "a-value-from-a-kubernetes-secret"


def pod_env(container):
    """The container's environment as the kubelet makes it: literal values, and a stand-in
    for each variable from a Secret that must exist (an optional one may be absent)."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif not e["valueFrom"].get("secretKeyRef", {}).get("optional", False):
            env[e["name"]] = SECRET_STAND_IN
    return env


@pytest.mark.parametrize("profile", PROFILES + ["port-9000"])
def test_the_gateway_accepts_the_rendered_configuration(profile, tmp_path):
    """The file and the environment the pod gives the gateway, as the gateway reads them:
    valid, and listening on the port the probes and the Service use."""
    objs = objects(profile) if profile != "port-9000" else [
        o for o in yaml.safe_load_all(subprocess.run(
            [str(HELM), "template", "rel", str(CHART), "--set", "port=9000"],
            capture_output=True, text=True, check=True).stdout) if o]
    config = tmp_path / "llmgate.toml"
    config.write_text(one(objs, "ConfigMap")["data"]["llmgate.toml"])
    _, pod = pod_of(objs)
    container = pod["spec"]["containers"][0]
    out = subprocess.run([str(BINARY), "serve", "--check-config", "--config", str(config)],
                         capture_output=True, text=True, check=False,
                         env={"PATH": "/usr/bin:/bin", **pod_env(container)})
    assert out.returncode == 0, out.stderr
    listen = re.search(r"listen: (\S+);", out.stdout)[1]
    assert int(listen.rsplit(":", 1)[1]) == container["ports"][0]["containerPort"], out.stdout


def test_a_broken_configuration_is_refused_by_the_check(tmp_path):
    config = tmp_path / "llmgate.toml"
    config.write_text("[server]\nshutdown_timeout_secs = 25.0\n")
    out = subprocess.run([str(BINARY), "serve", "--check-config", "--config", str(config)],
                         capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "shutdown_timeout_secs" in out.stderr, out.stderr


def test_inconsistent_values_fail_to_render():
    tools()
    cases = {
        "autoscaling.enabled=true,keda.enabled=true,serviceMonitor.enabled=true": "exclude each other",
        "replicaCount=3,podDisruptionBudget.minAvailable=3": "must be below the fewest pods",
        "replicaCount=3,podDisruptionBudget.minAvailable=100%": "between 1% and 99%",
        "inferencePool.enabled=true": "endpointPicker.name",
        "apiKeys.enabled=true": "apiKeys.existingSecret",
        "apiKeys.existingSecret=keys": "the API would stay open",
        "replicaCount=2,data.existingClaim=spool": "one pod only",
        "keda.enabled=true,serviceMonitor.enabled=true,keda.minReplicas=0": "at least 1",
        "keda.enabled=true": "needs serviceMonitor.enabled",
        "model.file=other.gguf": "needs model.existingClaim or model.image",
        "model.existingClaim=m,model.image.reference=m:1": "exclude each other",
        "config=[server]\nlisten = \"0.0.0.0:1\"": "config sets server.listen",
        "config=[server": "config is not TOML",
        "config=[server]\nmetrics_listen = \"0.0.0.0:9464\"": "config sets server.metrics_listen",
        "metricsPort=8080": "must differ from port",
        "extraEnv[0].name=LLMGATE_REDACTION_KEY,extraEnv[0].value=0123456789abcdef": "a secret, a literal value",
        # Secrets have Secret paths; in the ConfigMap anyone who may read it reads them.
        "config=[semlog]\nes_password = \"p\"": "config sets semlog.es_password, a secret",
        "config=[semlog]\nes_api_key = \"k\"": "config sets semlog.es_api_key, a secret",
        "config=[semlog]\nredaction_key = \"0123456789abcdef\"": "config sets semlog.redaction_key, a secret",
        "config=[semlog]\nes_url = \"https://elastic:p@es:9200\"": "semlog.es_url holds a password",
        "config=[engine]\nupstream_url = \"http://u:p@vllm/v1\"": "engine.upstream_url holds a password",
        "config=[engine]\nupstream_api_key = \"sk\"": "config sets engine.upstream_api_key, a secret",
        "config=[[models]]\nid = \"a\"\nengine = \"upstream\"\nurl = \"http://vllm/v1\"\napi_key = \"sk\"": "config sets models[0].api_key, a secret",
        "config=[[models]]\nid = \"a\"\nengine = \"upstream\"\nurl = \"http://u:p@vllm/v1\"": "models[0].url holds a password",
        "config=[[models]]\nid = \"a\"\nengine = \"upstream\"\nurls = [\"http://vllm-0/v1\"\\, \"http://u:p@vllm-1/v1\"]": "models[0].urls[1] holds a password",
        "upstreamPools[0].name=pool,upstreamPools[0].port=8000": "upstreamPools pool needs a selector",
        "config=[state]\nredis_password = \"p\"": "config sets state.redis_password, a secret",
        "redis.existingSecret=r": "gives a password to no Redis",
    }
    for values, message in cases.items():
        out = subprocess.run([str(HELM), "template", "rel", str(CHART), "--set-string" if values.startswith("config=") else "--set", values],
                             capture_output=True, text=True, check=False)
        assert out.returncode != 0 and message in out.stderr, (values, out.stderr)


def test_a_metrics_port_is_what_the_scrapers_and_probes_reach(tmp_path):
    """With metricsPort the gateway serves /metrics only on its own listener: the
    ServiceMonitor, the Service and the NetworkPolicy's scrapers (vllm-upstream's
    monitoring namespace) are on it, the API's callers and the probes are not, and a real
    gateway started with the pod's LLMGATE_METRICS_LISTEN answers each where the chart
    says."""
    objs = objects("vllm-upstream")
    _, pod = pod_of(objs)
    container = pod["spec"]["containers"][0]
    ports = container_ports(pod)
    assert pod_env(container)["LLMGATE_METRICS_LISTEN"] == f"0.0.0.0:{ports['metrics']}"
    service = {p["name"]: p["targetPort"] for p in gateway_service(objs)["spec"]["ports"]}
    assert service == {"http": "http", "metrics": "metrics"}
    assert [e["port"] for e in one(objs, "ServiceMonitor")["spec"]["endpoints"]] == ["metrics"]
    ingress = one(objs, "NetworkPolicy")["spec"]["ingress"]
    by_peer = {json.dumps(r.get("from"), sort_keys=True): {p["port"] for p in r["ports"]} for r in ingress}
    values = yaml.safe_load((CHART / "ci" / "vllm-upstream-values.yaml").read_text())["networkPolicy"]
    assert by_peer[json.dumps(values["ingressFrom"], sort_keys=True)] == {"http"}
    assert by_peer[json.dumps(values["metricsFrom"], sort_keys=True)] == {"metrics"}

    metrics = free_port()
    gw = launch(tmp_path, "--metrics-listen", f"127.0.0.1:{metrics}")
    try:
        on = {"http": gw.base, "metrics": f"http://127.0.0.1:{metrics}"}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            with urllib.request.urlopen(f"{on[get['port']]}{get['path']}") as r:
                assert r.status == 200, (probe, get)
        with urllib.request.urlopen(f"{on['metrics']}/metrics") as r:
            assert r.status == 200 and b"llmgate_requests_in_flight" in r.read()
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"{on['http']}/metrics")
        assert answer.value.code == 404
    finally:
        stop_gateway(gw)


def test_the_model_comes_from_an_image_or_a_claim_without_fetching(tmp_path):
    """An image volume or a claim holds the model: no init container, so nothing is
    downloaded or re-quantized at a pod's start; the gateway reads model.file from it,
    read-only. The image volume is refused where Kubernetes has no such source."""
    for objs, source in ((objects("model-image"), "image"), (objects("gpu"), "persistentVolumeClaim")):
        _, pod = pod_of(objs)
        assert "initContainers" not in pod["spec"], "the model would still be fetched"
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")
        assert set(volume) == {"name", source}, volume
        container = pod["spec"]["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "model")
        assert mount["readOnly"] and pod_env(container)["LLMGATE_MODEL_PATH"].startswith(mount["mountPath"] + "/")
    _, pod = pod_of(objects("model-image"))
    image = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")["image"]
    assert image == {"reference": "llmgate-model:smollm2-135m-instruct-q8_0", "pullPolicy": "IfNotPresent"}
    _, pod = pod_of(objects("default"))
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-model"]
    out = subprocess.run([str(HELM), "template", "rel", str(CHART), "--kube-version", "1.30.0", *values_args("model-image")],
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "model.image needs Kubernetes 1.31" in out.stderr, out.stderr


def test_secrets_reach_the_pod_from_secrets_only():
    """The redaction key comes from a Secret (and the pod waits for it rather than write
    unredacted documents); the vLLM profile's upstream key too, named by api_key_env; no
    profile's ConfigMap holds a secret-valued key."""
    tools()
    out = subprocess.run([str(HELM), "template", "rel", str(CHART), "--set", "redaction.existingSecret=red"],
                         capture_output=True, text=True, check=True)
    _, pod = pod_of([o for o in yaml.safe_load_all(out.stdout) if o])
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["LLMGATE_REDACTION_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "red", "key": "redaction_key"}
    for profile in PROFILES:
        objs = objects(profile)
        config = config_of(objs)
        assert not {"es_password", "es_api_key", "redaction_key"} & set(config.get("semlog", {})), profile
        _, pod = pod_of(objs)
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        for model in config.get("models", []):
            assert "api_key" not in model, profile
            if "api_key_env" in model:
                assert "secretKeyRef" in env[model["api_key_env"]]["valueFrom"], (profile, model)
    # The Redis password of the shared limits (the autoscaled profile), from its Secret.
    _, pod = pod_of(objects("hpa"))
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["LLMGATE_STATE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "llmgate-redis", "key": "password"}
    assert "redis_password" not in config_of(objects("hpa"))["state"]
    upstream = config_of(objects("vllm-upstream"))["models"][0]
    assert upstream["api_key_env"] == "VLLM_API_KEY"
    # The variable an api_key_env names, given a literal value, is refused too.
    out = subprocess.run([str(HELM), "template", "rel", str(CHART), *values_args("vllm-upstream"),
                          "--set", "extraEnv[0].name=VLLM_API_KEY,extraEnv[0].value=sk"],
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "extraEnv gives VLLM_API_KEY, a secret" in out.stderr, out.stderr


def test_values_that_must_render_as_meant():
    def rendered(*values):
        out = subprocess.run([str(HELM), "template", "rel", str(CHART), *sum((["--set", v] for v in values), [])],
                             capture_output=True, text=True, check=True)
        return [o for o in yaml.safe_load_all(out.stdout) if o]
    pdb = one(rendered("replicaCount=4", "podDisruptionBudget.minAvailable=50%"), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == "50%"
    _, pod = pod_of(rendered("gpu.enabled=true", "gpu.nodeSelector=null", "tolerations=null"))
    assert "nodeSelector" not in pod["spec"] and pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    deployment, pod = pod_of(rendered("podLabels.app\\.kubernetes\\.io/name=other", "podLabels.team=a"))
    assert matches(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert pod["metadata"]["labels"]["team"] == "a"
    deployment, _ = pod_of(rendered("gpu.enabled=true", "model.existingClaim=m"))
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}

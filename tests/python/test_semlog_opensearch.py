"""Semantic logs into a real OpenSearch 2.19 node (Lucene, real mappings, real
aggregations), started from Maven Central's artifacts by scripts/search-node: set-up and
its repetition, bulk indexing exactly once through a stopped node, a gateway restart and a
`kill -9`, a mapping conflict, redaction checked with real queries, and the queries the
docs give operators run as Query DSL on what the gateway stored.

The node has no ISM (the index-management plugin is not on Maven Central): `auto` finds no
retention API there, says so, and indexes anyway, which is checked too.
"""

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT, MODEL_ID, eventually, free_port, launch_with_semlog, ready_semlog, stop_gateway

STREAM = "logs-llmgate.requests-default"
SCRIPT = ROOT / "scripts" / "search-node"
EMAIL, CARD, PHONE = "alice.smith@example.com", "4111 1111 1111 1111", "+44 20 7946 0958"
SECRET_KEY = "sk-proj-" + "Q" * 40


class Node:
    """The OpenSearch node: started, stopped and started again on one data folder."""

    def __init__(self, folder):
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self):
        subprocess.run([str(SCRIPT), "start", str(self.folder), str(self.port)], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)

    def stop(self):
        subprocess.run([str(SCRIPT), "stop", str(self.folder)], check=True, timeout=60)

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def search(self, body):
        self.call("POST", f"/{STREAM}/_refresh")
        status, answer = self.call("POST", f"/{STREAM}/_search", body)
        assert status == 200, answer
        return answer

    def sources(self):
        hits = self.search({"size": 1000, "query": {"match_all": {}}})["hits"]["hits"]
        return [hit["_source"] for hit in hits]

    def count(self, query):
        return self.search({"size": 0, "track_total_hits": True, "query": query})["hits"]["total"]["value"]


@pytest.fixture
def node(tmp_path):
    running = Node(tmp_path / "node")
    running.start()
    yield running
    running.stop()


def chat(base, content, **extra):
    body = {"model": MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def metric(gw, name):
    with urllib.request.urlopen(f"{gw.base}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return sum(float(value) for value in found)


def test_set_up_is_what_the_node_reports_and_repeating_it_changes_nothing(node, tmp_path):
    gw = launch_with_semlog(node.url, tmp_path / "gw")
    try:
        eventually(lambda: ready_semlog(gw).get("set_up") is True)
        status = ready_semlog(gw)
        assert (status["sink"], status["version"], status["data_stream"]) == ("opensearch", "2.19.6", True), status
        # No ISM on this node: `auto` says there is no retention, and that is no problem
        # that would keep documents back.
        assert status["lifecycle"] == "none" and status["problems"] == [], status
        assert chat(gw.base, "hello") == 200
        eventually(lambda: node.count({"match_all": {}}) == 1)
    finally:
        stop_gateway(gw)
    _, template = node.call("GET", "/_index_template/logs-llmgate.requests")
    _, component = node.call("GET", "/_component_template/llmgate-requests@mappings")
    _, stream = node.call("GET", f"/_data_stream/{STREAM}")
    assert template["index_templates"][0]["index_template"]["priority"] == 200
    assert template["index_templates"][0]["index_template"]["data_stream"] is not None
    assert component["component_templates"][0]["component_template"]["template"]["mappings"]["dynamic"] in ("false", False)
    backing = stream["data_streams"][0]["indices"]
    assert len(backing) == 1

    # The same set-up again on a cluster that has it: nothing refused, nothing duplicated.
    gw = launch_with_semlog(node.url, tmp_path / "gw")
    try:
        eventually(lambda: ready_semlog(gw).get("set_up") is True)
        assert ready_semlog(gw)["problems"] == []
        assert chat(gw.base, "hello again") == 200
        eventually(lambda: node.count({"match_all": {}}) == 2)
    finally:
        stop_gateway(gw)
    _, again = node.call("GET", "/_index_template/logs-llmgate.requests")
    assert again == template
    _, stream = node.call("GET", f"/_data_stream/{STREAM}")
    assert stream["data_streams"][0]["indices"] == backing


def test_every_document_once_through_a_stopped_node_a_restart_and_a_kill(node, tmp_path):
    data_dir = tmp_path / "gw"
    gw = launch_with_semlog(node.url, data_dir)
    sent = 0
    try:
        for i in range(3):
            assert chat(gw.base, f"first {i}") == 200
        sent += 3
        eventually(lambda: node.count({"match_all": {}}) == sent)

        # The node goes away while requests complete: their documents wait in the spool.
        node.stop()
        for i in range(3):
            assert chat(gw.base, f"while the node is down {i}") == 200
        sent += 3
        node.start()
        eventually(lambda: node.count({"match_all": {}}) == sent, seconds=60)

        # Down again; the gateway is killed with documents in its spool.
        node.stop()
        for i in range(2):
            assert chat(gw.base, f"before the kill {i}") == 200
        sent += 2
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait(timeout=10)
        node.start()
        gw = launch_with_semlog(node.url, data_dir)
        for i in range(2):
            assert chat(gw.base, f"after the kill {i}") == 200
        sent += 2
        eventually(lambda: node.count({"match_all": {}}) == sent, seconds=60)
        # A clean restart re-reads the spool from its cursor: nothing comes twice.
        stop_gateway(gw)
        gw = launch_with_semlog(node.url, data_dir)
        time.sleep(2)
        ids = [source["event"]["id"] for source in node.sources()]
        assert len(ids) == sent and len(set(ids)) == sent
        assert metric(gw, "llmgate_semlog_dead_lettered_total") == 0
    finally:
        stop_gateway(gw)


def test_a_mapping_conflict_dead_letters_each_document_once_and_counts_it(node, tmp_path):
    # An operator's template above the gateway's (priority 300) maps `llm.intent`, a
    # keyword the gateway fills with words, as a number: every document clashes.
    status, answer = node.call("PUT", "/_index_template/operator-override", {
        "index_patterns": ["logs-llmgate.requests-*"], "priority": 300, "data_stream": {},
        "template": {"mappings": {"properties": {"llm": {"properties": {"intent": {"type": "long"}}}}}},
    })
    assert status == 200, answer
    gw = launch_with_semlog(node.url, tmp_path / "gw")
    try:
        eventually(lambda: ready_semlog(gw).get("set_up") is True)
        for i in range(3):
            assert chat(gw.base, f"conflict {i}") == 200
        eventually(lambda: metric(gw, "llmgate_semlog_dead_lettered_total") == 3)
        # Not retried: after a while still three, nothing queued, nothing indexed.
        time.sleep(3)
        assert metric(gw, "llmgate_semlog_dead_lettered_total") == 3
        assert metric(gw, "llmgate_semlog_queue_depth") == 0
        assert metric(gw, "llmgate_semlog_retried_total") == 0
        assert node.count({"match_all": {}}) == 0
        letters = [line for path in (tmp_path / "gw" / "dead-letter").iterdir()
                   for line in path.read_text().splitlines() if line.strip()]
        assert any("mapper_parsing_exception" in line or "document_parsing_exception" in line
                   for line in letters), letters[:2]
    finally:
        stop_gateway(gw)


def test_stored_documents_hold_no_planted_secret_and_answer_the_operators_queries(node, tmp_path):
    gw = launch_with_semlog(node.url, tmp_path / "gw")
    planted = [
        f"Mail me at {EMAIL} please",
        f"My card is {CARD}, is it valid?",
        f"Call {PHONE} tomorrow",
        f"Here is my key {SECRET_KEY}",
    ]
    try:
        for text in planted:
            assert chat(gw.base, text, user=EMAIL) == 200
        assert chat(gw.base, "Write a Python function that adds two numbers", max_tokens=1) == 200
        assert chat(gw.base, "What is the capital of France?") == 200
        # Refused by the gateway (a bad parameter): a document with an error type.
        assert chat(gw.base, "hi", temperature=-3) == 400
        total = len(planted) + 3
        eventually(lambda: node.count({"match_all": {}}) == total)
    finally:
        stop_gateway(gw)
    sources = node.sources()
    stored = json.dumps(sources)
    for secret in (EMAIL, CARD, "4111111111111111", PHONE, SECRET_KEY):
        assert secret not in stored
        # And no query finds them in any field.
        assert node.count({"query_string": {"query": f'"{secret}"', "default_field": "*"}}) == 0
    # The excerpts are searchable text: the redaction tokens are found, so the queries
    # above would have found the values had they been stored.
    assert node.count({"match_phrase": {"llm.prompt_excerpt": "EMAIL"}}) >= 1
    # Each planted prompt's document counts its redaction. Not "only those": an answer of
    # four sampled tokens may hold a value of its own (a made-up name) and is redacted too.
    for token in ("EMAIL", "CARD", "PHONE", "API_KEY"):
        counted = {"bool": {"filter": [
            {"range": {"llm.redactions_total": {"gt": 0}}},
            {"match_phrase": {"llm.prompt_excerpt": token}},
        ]}}
        assert node.count(counted) == 1, token
    assert node.count({"range": {"llm.redactions_total": {"gt": 0}}}) >= len(planted)
    assert node.count({"range": {"llm.redactions.card": {"gt": 0}}}) == 1

    # The docs' KQL as Query DSL, counted against the stored documents themselves.
    def where(check):
        return sum(1 for source in sources if check(source))

    llm = lambda s: s.get("llm", {})  # noqa: E731
    assert node.count({"exists": {"field": "error.type"}}) == where(lambda s: "type" in s.get("error", {})) == 1
    assert node.count({"bool": {"filter": [{"range": {"llm.ttft_ms": {"gt": 2000}}},
                                           {"range": {"gen_ai.usage.input_tokens": {"lt": 200}}}]}}) == where(
        lambda s: llm(s).get("ttft_ms", 0) > 2000 and s.get("gen_ai", {}).get("usage", {}).get("input_tokens", 1e9) < 200)
    assert node.count({"bool": {"filter": [{"term": {"llm.refusal": True}}],
                                "must_not": [{"term": {"llm.intent": "coding"}}]}}) == where(
        lambda s: llm(s).get("refusal") is True and llm(s).get("intent") != "coding")
    assert node.count({"term": {"llm.intent": "coding"}}) == where(lambda s: llm(s).get("intent") == "coding") >= 1

    aggregations = node.search({"size": 0, "aggs": {
        "models": {"terms": {"field": "gen_ai.request.model"}},
        "outcomes": {"terms": {"field": "event.outcome"}},
        "per_minute": {"date_histogram": {"field": "@timestamp", "fixed_interval": "1m"}},
        "ttft": {"percentiles": {"field": "llm.ttft_ms", "percents": [50, 95]}},
        "tpot": {"percentiles": {"field": "llm.tpot_ms", "percents": [50]}},
        "ttft_max": {"max": {"field": "llm.ttft_ms"}},
    }})["aggregations"]
    assert {b["key"]: b["doc_count"] for b in aggregations["models"]["buckets"]} == {MODEL_ID: total}
    outcomes = {b["key"]: b["doc_count"] for b in aggregations["outcomes"]["buckets"]}
    assert outcomes == {"success": total - 1, "failure": 1}, outcomes
    assert sum(b["doc_count"] for b in aggregations["per_minute"]["buckets"]) == total
    ttfts = sorted(llm(s)["ttft_ms"] for s in sources if "ttft_ms" in llm(s))
    assert len(ttfts) == total - 1
    assert aggregations["ttft_max"]["value"] == pytest.approx(ttfts[-1], rel=1e-6)
    # A t-digest over six values: the median lies between the two middle values.
    p50 = aggregations["ttft"]["values"]["50.0"]
    assert ttfts[(len(ttfts) - 1) // 2] - 1e-6 <= p50 <= ttfts[len(ttfts) // 2] + 1e-6
    tpots = sorted(llm(s)["tpot_ms"] for s in sources if llm(s).get("tpot_ms") is not None)
    assert tpots and tpots[0] <= aggregations["tpot"]["values"]["50.0"] <= tpots[-1]

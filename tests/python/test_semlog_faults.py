"""The real node's bad days, and what users write, against the OpenSearch 2.19 node of
scripts/search-node: a write block and the flood stage's read-only block while requests
run (every document indexed once the block is lifted, none dead-lettered), a node that is
down (the sink says so in /ready and in the gauge, without making the gateway unready),
documents refused for their mapping then replayed by `llmgate semlog replay` (exactly
once, however often it runs), and Chinese and English personal data and a client's
request id that is a card number, and an upstream replica that quotes the gateway's key
in its errors (found in no stored field, log line or answer).
"""

import base64
import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

from conftest import BINARY, ROOT, eventually, launch_with_semlog, ready_semlog, stop_gateway
from test_semlog_opensearch import STREAM, chat, metric, node  # noqa: F401  (the fixture)


def backing_index(node):
    _, stream = node.call("GET", f"/_data_stream/{STREAM}")
    return stream["data_streams"][0]["indices"][-1]["index_name"]


def event_ids(node):
    return [source["event"]["id"] for source in node.sources()]


def test_a_write_block_and_the_flood_stage_hold_documents_until_they_are_lifted(node, tmp_path):
    gw = launch_with_semlog(node.url, tmp_path / "gw")
    try:
        assert chat(gw.base, "before the block") == 200
        eventually(lambda: node.count({"match_all": {}}) == 1)
        index = backing_index(node)
        for setting, kind in (("index.blocks.write", "blocked"),
                              ("index.blocks.read_only_allow_delete", "blocked")):
            status, answer = node.call("PUT", f"/{index}/_settings", {setting: True})
            assert status == 200, answer
            before = node.count({"match_all": {}})
            for i in range(20):
                assert chat(gw.base, f"while {setting} is on {i}") == 200
            # The sink says what is wrong, the gateway stays ready, nothing is lost.
            eventually(lambda: ready_semlog(gw).get("state") == "degraded")
            state = ready_semlog(gw)
            assert state["problem"]["kind"] == kind, state
            assert "blocked" in state["problem"]["reason"], state
            assert state["queued"] >= 1 and state["oldest_queued_age_s"] is not None, state
            assert metric(gw, "llmgate_semlog_ready") == 0
            with urllib.request.urlopen(f"{gw.base}/ready", timeout=5) as ready:
                assert ready.status == 200
            time.sleep(5)
            assert metric(gw, "llmgate_semlog_dead_lettered_total") == 0
            status, answer = node.call("PUT", f"/{index}/_settings", {setting: None})
            assert status == 200, answer
            eventually(lambda: node.count({"match_all": {}}) == before + 20, seconds=90)
            eventually(lambda: ready_semlog(gw).get("state") == "ok")
            assert metric(gw, "llmgate_semlog_ready") == 1
        ids = event_ids(node)
        assert len(ids) == 41 and len(set(ids)) == 41
        assert metric(gw, "llmgate_semlog_dead_lettered_total") == 0
        log = gw.log_text()
        degraded = [json.loads(line) for line in log.splitlines()
                    if "The semantic-log sink is degraded" in line]
        # Said at once, then at most every 10 s: a handful of lines, not one per retry.
        assert 1 <= len(degraded) <= 20, len(degraded)
        assert any(line.get("trouble") == "blocked" for line in degraded), degraded[:2]
        assert "The semantic-log sink recovered." in log
    finally:
        stop_gateway(gw)


def test_a_node_that_is_down_degrades_the_sink_not_the_gateway(node, tmp_path):
    gw = launch_with_semlog(node.url, tmp_path / "gw")
    try:
        assert chat(gw.base, "hello") == 200
        eventually(lambda: node.count({"match_all": {}}) == 1)
        assert ready_semlog(gw)["state"] == "ok"
        node.stop()
        for i in range(5):
            assert chat(gw.base, f"while the node is down {i}") == 200
        eventually(lambda: ready_semlog(gw).get("state") == "degraded")
        state = ready_semlog(gw)
        assert state["problem"]["kind"] == "unreachable", state
        assert state["queued"] == 5, state
        assert metric(gw, "llmgate_semlog_ready") == 0
        node.start()
        eventually(lambda: node.count({"match_all": {}}) == 6, seconds=90)
        eventually(lambda: ready_semlog(gw).get("state") == "ok")
        assert ready_semlog(gw)["queued"] == 0
    finally:
        stop_gateway(gw)


def replay(node, data_dir):
    return subprocess.run(
        [str(BINARY), "semlog", "replay", "--es-url", node.url, "--data-dir", str(data_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_dead_letters_are_replayed_exactly_once(node, tmp_path):
    # An operator's template maps `llm.intent` as a number: every document is refused
    # for what it is, and dead-lettered.
    status, answer = node.call("PUT", "/_index_template/operator-override", {
        "index_patterns": ["logs-llmgate.requests-*"], "priority": 300, "data_stream": {},
        "template": {"mappings": {"properties": {"llm": {"properties": {"intent": {"type": "long"}}}}}},
    })
    assert status == 200, answer
    data_dir = tmp_path / "gw"
    gw = launch_with_semlog(node.url, data_dir)
    try:
        for i in range(3):
            assert chat(gw.base, f"conflict {i}") == 200
        eventually(lambda: metric(gw, "llmgate_semlog_dead_lettered_total") == 3)
        # Every document refused: the sink is degraded, not "ok" (issue 61).
        eventually(lambda: ready_semlog(gw).get("problem", {}).get("kind") == "rejected")
        state = ready_semlog(gw)
        assert state["dead_letters"] == 3 and state["state"] == "degraded", state
        assert metric(gw, "llmgate_semlog_ready") == 0
        # Each dead letter is in the log within the 10 s window, not at a later event.
        def logged():
            lines = [json.loads(line) for line in gw.log_text().splitlines() if "dead_lettered" in line]
            return sum(line.get("dead_lettered", 0) for line in lines)
        eventually(lambda: logged() == 3, seconds=15)
    finally:
        stop_gateway(gw)
    assert node.count({"match_all": {}}) == 0
    # The dead letters are the bulk pairs as sent; the reasons are beside them.
    letters = [line for path in sorted((data_dir / "dead-letter").glob("dead-letter-*.ndjson"))
               for line in path.read_text().splitlines() if line.strip()]
    assert len(letters) == 6 and all("create" in json.loads(a) for a in letters[::2]), letters[:2]
    reasons = "".join(p.read_text() for p in (data_dir / "dead-letter").glob("refusals-*.ndjson"))
    assert "mapper_parsing_exception" in reasons or "document_parsing_exception" in reasons, reasons

    # Still refused: replay says so and exits 1, and nothing is indexed.
    refused = replay(node, data_dir)
    assert refused.returncode == 1, refused.stderr
    assert "3 refused again" in refused.stdout, refused.stdout

    # The operator fixes the template (the data stream uses it: it cannot be deleted),
    # and the next backing index takes the fixed mapping.
    status, answer = node.call("PUT", "/_index_template/operator-override", {
        "index_patterns": ["logs-llmgate.requests-*"], "priority": 300, "data_stream": {},
        "composed_of": ["llmgate-requests@mappings"],
    })
    assert status == 200, answer
    status, answer = node.call("POST", f"/{STREAM}/_rollover")
    assert status == 200, answer
    first = replay(node, data_dir)
    assert first.returncode == 0, first.stderr
    assert "3 indexed, 0 already indexed" in first.stdout, first.stdout
    again = replay(node, data_dir)
    assert again.returncode == 0, again.stderr
    assert "0 indexed, 3 already indexed" in again.stdout, again.stdout
    # After a rollover the write index no longer has them, so `create` alone would
    # index them again (issue 61: 10 documents became 20, then 30): replay asks the
    # whole stream first.
    for _ in range(2):
        status, answer = node.call("POST", f"/{STREAM}/_rollover")
        assert status == 200, answer
        after = replay(node, data_dir)
        assert after.returncode == 0, after.stderr
        assert "0 indexed, 3 already indexed" in after.stdout, after.stdout
    ids = event_ids(node)
    assert len(ids) == 3 and len(set(ids)) == 3


class AnswerDropper:
    """A TCP relay in front of the node. While `dropping`, each request goes on to the
    node and the client's connection is closed as soon as the answer starts, the answer
    kept back: the node indexed what the gateway sent, and the gateway heard nothing (an
    answer lost, as behind a proxy that times out)."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.dropping = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self.pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self.pump, args=(upstream, client, True), daemon=True).start()

    def pump(self, source, sink, answers):
        try:
            while data := source.recv(65536):
                if answers and self.dropping:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()


def test_a_resend_after_a_lost_answer_and_a_rollover_stores_nothing_twice(node, tmp_path):
    """The spool's re-send across a rollover: documents the node indexed while their
    answers were lost are sent again after the stream rolled over, where `create` finds
    no duplicate in the new write index. The gateway looks them up in the whole stream
    first and sends none twice."""
    relay = AnswerDropper(node.port)
    gw = launch_with_semlog(relay.url, tmp_path / "gw")
    try:
        eventually(lambda: ready_semlog(gw).get("set_up") is True)
        assert chat(gw.base, "before") == 200
        eventually(lambda: node.count({"match_all": {}}) == 1)
        relay.dropping = True
        for i in range(5):
            assert chat(gw.base, f"answer lost {i}") == 200
        # The node has them; the gateway does not know and keeps them in its spool.
        eventually(lambda: node.count({"match_all": {}}) == 6)
        eventually(lambda: ready_semlog(gw).get("state") == "degraded")
        assert ready_semlog(gw)["queued"] == 5
        status, answer = node.call("POST", f"/{STREAM}/_rollover")
        assert status == 200, answer
        relay.dropping = False
        eventually(lambda: ready_semlog(gw).get("queued") == 0, seconds=90)
        eventually(lambda: ready_semlog(gw).get("state") == "ok")
        time.sleep(2)
        ids = event_ids(node)
        assert len(ids) == 6 and len(set(ids)) == 6, sorted(ids)
        assert metric(gw, "llmgate_semlog_duplicates_total") >= 5
    finally:
        stop_gateway(gw)


PLANTED = {
    "name": "Bartholomew Quigglesworth",
    "street": "742 Evergreen Terrace",
    "chinese name": "王小明",
    "mobile": "13812345678",
    "resident id": "11010519491231002X",
    "second id": "440305198309198550",
    "chinese address": "北京市海淀区中关村大街27号",
    "card id": "4539-1488-0343-6467",
}


def test_personal_data_in_english_and_chinese_and_a_card_as_request_id_are_stored_nowhere(node, tmp_path):
    gw = launch_with_semlog(node.url, tmp_path / "gw")
    prompts = [
        "My name is Bartholomew Quigglesworth and I live at 742 Evergreen Terrace, Springfield.",
        "我叫王小明，我的手机号码是13812345678，身份证号码是11010519491231002X，"
        "我太太的身份证号码是440305198309198550，我住在北京市海淀区中关村大街27号。",
        "Write a Python function that reverses a string.",
        "解释一下递归",
    ]
    answers = []
    try:
        for i, prompt in enumerate(prompts):
            body = {"model": "smollm2-135m-instruct", "max_tokens": 8,
                    "messages": [{"role": "user", "content": prompt}]}
            headers = {"Content-Type": "application/json"}
            if i == 0:
                headers["x-request-id"] = PLANTED["card id"]
            request = urllib.request.Request(f"{gw.base}/v1/chat/completions",
                                             data=json.dumps(body).encode(), headers=headers)
            with urllib.request.urlopen(request, timeout=120) as answer:
                answers.append(answer.headers.get("x-request-id", "") + answer.read().decode())
        eventually(lambda: node.count({"match_all": {}}) == len(prompts))
    finally:
        stop_gateway(gw)
    sources = node.sources()
    stored = json.dumps(sources, ensure_ascii=False)
    log = gw.log_text()
    for what, value in PLANTED.items():
        for place, text in (("stored", stored), ("log", log), ("answers", "".join(answers))):
            assert value not in text, f"{what} in {place}"
        assert node.count({"query_string": {"query": f'"{value}"', "default_field": "*"}}) == 0, what
    redactions = {}
    for source in sources:
        for kind, n in source["llm"].get("redactions", {}).items():
            redactions[kind] = redactions.get(kind, 0) + n
    assert redactions.get("name", 0) >= 2 and redactions.get("address", 0) >= 2, redactions
    assert redactions.get("resident_id") == 2 and redactions.get("phone") == 1, redactions
    # Short prompts get their language.
    languages = sorted(source["llm"]["language"] for source in sources)
    assert languages == ["cmn", "cmn", "eng", "eng"], languages


UPSTREAM_KEY = "upstream-key-Zq81vX0pLmN3bVc7"
URL_PASSWORD = "Pa55w0rd-in-url"


class CarelessReplica(http.server.BaseHTTPRequestHandler):
    """An upstream replica that quotes the key it was sent, and a user's card, in its
    errors: a 400, a 500, and an error event inside a stream; and, asked to echo, every
    credential it was sent (its key, and the Basic header made of a URL's user and
    password) in an answer."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.answer(200, "application/json", json.dumps({"object": "list", "data": [{"id": "careless"}]}))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        key = self.headers.get("authorization", "").removeprefix("Bearer ")
        said = f"rejected for key {key} and card 4111 1111 1111 1111"
        prompt = body["messages"][0]["content"]
        if prompt == "fault:400":
            self.answer(400, "application/json",
                        json.dumps({"error": {"message": said, "type": "invalid_request_error"}}))
        elif prompt == "fault:500":
            self.answer(500, "text/plain", f"panic: {said}")
        elif prompt == "echo":
            text = f"You sent {self.headers.get('authorization')} and {key}, base64 {base64.b64encode(key.encode()).decode()}"
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": body["model"],
                     "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}
            self.answer(200, "text/event-stream", f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n")
        else:
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": body["model"],
                     "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
            self.answer(200, "text/event-stream",
                        f"data: {json.dumps(chunk)}\n\nevent: error\ndata: {json.dumps({'message': said})}\n\n")

    def answer(self, status, kind, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_an_upstreams_error_text_carries_no_key_into_the_node_the_log_or_the_answer(node, tmp_path, monkeypatch):
    replica = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CarelessReplica)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    monkeypatch.setenv("CARELESS_KEY", UPSTREAM_KEY)
    upstream = f"127.0.0.1:{replica.server_address[1]}/v1"
    gw = launch_with_semlog(node.url, tmp_path / "gw", "--upstream-url", f"http://{upstream}",
                            "--upstream-api-key-env", "CARELESS_KEY")
    # Without an API key, a user and password in the URL go as a Basic header, which
    # the replica echoes in an answer.
    basic_gw = launch_with_semlog(node.url, tmp_path / "basic-gw",
                                  "--upstream-url", f"http://svcuser:{URL_PASSWORD}@{upstream}")
    answers = []
    try:
        eventually(lambda: ready_semlog(gw).get("set_up") is True)
        eventually(lambda: ready_semlog(basic_gw).get("set_up") is True)
        for base, prompt, stream in ((gw.base, "fault:400", False), (gw.base, "fault:500", False),
                                     (gw.base, "fault:event", True), (basic_gw.base, "echo", False)):
            body = {"model": "smollm2-135m-instruct", "max_tokens": 8, "stream": stream,
                    "messages": [{"role": "user", "content": prompt}]}
            request = urllib.request.Request(f"{base}/v1/chat/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    answers.append(answer.read().decode())
            except urllib.error.HTTPError as error:
                answers.append(error.read().decode())
        eventually(lambda: node.count({"match_all": {}}) == 4)
    finally:
        stop_gateway(gw)
        stop_gateway(basic_gw)
        replica.shutdown()
    assert "rejected for key <SECRET>" in answers[0], answers[0]
    stored = json.dumps(node.sources())
    basic = base64.b64encode(f"svcuser:{URL_PASSWORD}".encode()).decode()
    key_b64 = base64.b64encode(UPSTREAM_KEY.encode()).decode()
    # The echo reached the replica's answer (so there was something to scrub)...
    assert "You sent" in answers[3] and "Basic" in answers[3], answers[3]
    # ...and no form of a credential is stored or logged; errors reach no client with one.
    # (An answer's own text goes to the client as the upstream wrote it.)
    logs = gw.log_text() + basic_gw.log_text()
    for place, text, planted in (("stored", stored, (UPSTREAM_KEY, key_b64, basic, URL_PASSWORD)),
                                 ("log", logs, (UPSTREAM_KEY, key_b64, basic, URL_PASSWORD)),
                                 ("errors", "".join(answers[:3]), (UPSTREAM_KEY, basic, URL_PASSWORD))):
        for secret in (*planted, "4111 1111 1111 1111"):
            assert secret not in text, f"{secret} in {place}"
    assert "<SECRET>" in json.dumps([s["llm"].get("response_excerpt") for s in node.sources()])
    assert node.count({"query_string": {"query": f'"{UPSTREAM_KEY}"', "default_field": "*"}}) == 0

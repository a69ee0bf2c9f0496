"""An in-test Elasticsearch 9 for tests that run the real binary: `GET /`, the set-up
PUTs and `_bulk` with `create` actions, as the official API specification describes them. A
document is kept by `_id`; sending the same `_id` again is answered 409
`version_conflict_engine_exception`, so a test can count what was indexed exactly once.
It can go away (connections refused) and come back on the same port.
(The Rust tests have a fuller one with scripted failures: tests/common/es.rs.)
"""

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeEs:
    def __init__(self):
        self.docs = {}
        self.lock = threading.Lock()
        self.port = 0
        self.server = None
        self.come_back()
        self.url = f"http://127.0.0.1:{self.port}"

    def come_back(self):
        """Listens (again, on the same port), with the documents it had."""
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def go_away(self):
        """Stops listening: connections are refused until `come_back`."""
        self.server.shutdown()
        self.server.server_close()

    def stop(self):
        self.go_away()

    def documents(self) -> list:
        with self.lock:
            return list(self.docs.values())

    def _handler(self):
        es = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                return body

            def _answer(self, status: int, value: dict):
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("x-elastic-product", "Elasticsearch")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path != "/":
                    self._answer(404, {"error": {"type": "not_found"}, "status": 404})
                    return
                self._answer(200, {"version": {"number": "9.1.0", "build_flavor": "default"},
                                   "tagline": "You Know, for Search"})

            def do_PUT(self):
                body = self._body()
                if body:
                    json.loads(body)
                self._answer(200, {"acknowledged": True})

            def do_POST(self):
                if not self.path.split("?")[0].endswith("/_bulk"):
                    self._answer(404, {"error": {"type": "not_found"}, "status": 404})
                    return
                lines = [line for line in self._body().split(b"\n") if line]
                items, errors = [], False
                with es.lock:
                    for action, source in zip(lines[0::2], lines[1::2]):
                        doc_id = json.loads(action)["create"]["_id"]
                        if doc_id in es.docs:
                            errors = True
                            items.append({"create": {"_id": doc_id, "status": 409, "error": {
                                "type": "version_conflict_engine_exception",
                                "reason": f"[{doc_id}]: version conflict, document already exists",
                            }}})
                        else:
                            es.docs[doc_id] = json.loads(source)
                            items.append({"create": {
                                "_id": doc_id, "_version": 1, "result": "created", "status": 201,
                            }})
                self._answer(200, {"took": 1, "errors": errors, "items": items})

        return Handler

"""A loopback stand-in for a Kubernetes API server, for the controllers' tests: the official
``kubernetes`` client talks to it over HTTP as it would to a cluster (no cluster can run here).

It keeps what was applied (server-side apply: PATCH with ``application/apply-patch+yaml``) by its
path, answers GETs and DELETEs of those paths, and records every request. A Deployment's
``generation`` moves when its spec changes, and its rollout finishes when the test sets
``rolled_out``; a Pod's status is what the test puts in ``pod_status`` (``Pending`` until then).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeApiHandler)
        self.objects: dict[str, dict] = {}
        self.requests: list[dict] = []
        self.rolled_out = False
        self.pod_status: dict[str, dict] = {}  # pod path -> its status
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def status_of(self, path: str, obj: dict) -> dict | None:
        if obj["kind"] == "Pod":
            return self.pod_status.get(path, {"phase": "Pending"})
        if obj["kind"] != "Deployment":
            return None
        want = obj["spec"].get("replicas", 1)
        done = want if self.rolled_out else 0
        return {
            "observedGeneration": obj["metadata"]["generation"],
            "replicas": want,
            "updatedReplicas": done,
            "readyReplicas": done,
        }

    def paths(self, method: str) -> list[str]:
        return [r["path"] for r in self.requests if r["method"] == method]

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig naming this server, as ``*_KUBECONFIG`` settings take."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "test-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path


class FakeApiHandler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def log_message(self, *args: Any) -> None:  # quiet
        return

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        with self.server.lock:
            self.server.requests.append({"method": "GET", "path": path})
            obj = self.server.objects.get(path)
            if obj is None:
                self._not_found()
                return
            status = self.server.status_of(path, obj)
            if status is not None:
                obj = {**obj, "status": status}
        self._answer(200, obj)

    def do_DELETE(self) -> None:
        path = urlsplit(self.path).path
        with self.server.lock:
            self.server.requests.append({"method": "DELETE", "path": path})
            obj = self.server.objects.pop(path, None)
            self.server.pod_status.pop(path, None)
        if obj is None:
            self._not_found()
            return
        self._answer(200, {"kind": "Status", "status": "Success"})

    def do_PATCH(self) -> None:
        parts = urlsplit(self.path)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.requests.append(
                {
                    "method": "PATCH",
                    "path": parts.path,
                    "content_type": self.headers["Content-Type"],
                    "query": parse_qs(parts.query),
                    "body": body,
                }
            )
            old = self.server.objects.get(parts.path)
            generation = 1 if old is None else old["metadata"]["generation"]
            if old is not None and old.get("spec") != body.get("spec"):
                generation += 1
            stored = {**body, "metadata": {**body["metadata"], "generation": generation}}
            self.server.objects[parts.path] = stored
            answer = dict(stored)
            status = self.server.status_of(parts.path, stored)
            if status is not None:
                answer["status"] = status
        self._answer(200, answer)


@contextmanager
def fake_api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()

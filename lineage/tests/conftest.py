"""Fixtures of the lineage tests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Collector(BaseHTTPRequestHandler):
    received: list = []
    # Statuses to answer before the 201s (a lineage server that is failing for a while).
    failures: list = []

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        if type(self).failures:
            self.send_response(type(self).failures.pop(0))
            self.end_headers()
            return
        type(self).received.append((self.path, self.headers.get("Authorization"), body))
        self.send_response(201)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def collector():
    _Collector.received = []
    _Collector.failures = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", _Collector.received
    server.shutdown()
    server.server_close()

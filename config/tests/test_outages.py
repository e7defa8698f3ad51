"""Services down at the process level: the settings that keep a dead Redis from hanging a request,
and a database nobody answers on, in a fresh process (settings are read once per process)."""

from __future__ import annotations

import json
import socket

import pytest

from config.tests.test_settings import manage

pytestmark = pytest.mark.timeout(120)


def test_the_redis_cache_gives_up_within_half_a_second(tmp_path):
    result = manage(
        "shell",
        "-c",
        "import json; from django.conf import settings as s; "
        "print(json.dumps(s.CACHES['default'].get('OPTIONS', {})))",
        env={"REDIS_URL": "redis://cache.internal:6379/0"},
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    options = json.loads(result.stdout.splitlines()[-1])
    assert 0 < options["socket_connect_timeout"] <= 0.5
    assert 0 < options["socket_timeout"] <= 0.5
    assert "retry" not in options and not options.get("retry_on_timeout")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Requests through Django's full handler (every middleware), as a server would send them.
REQUESTS = """
import json
from django.test import Client
client = Client(raise_request_exception=False)
for path, headers in (
    ("/api/v1/workspaces/", {"HTTP_AUTHORIZATION": "Token some-key"}),
    ("/readyz", {}),
    ("/healthz", {}),
):
    r = client.get(path, **headers)
    body = r.json() if r["Content-Type"] == "application/json" else r.content.decode()[:200]
    print(json.dumps([path, r.status_code, r["Content-Type"], r.get("X-Request-ID"), body]))
"""


def test_database_down_answers_503_in_the_envelope_and_readyz_fails(tmp_path):
    env = {"DATABASE_URL": f"postgres://rankops@127.0.0.1:{_closed_port()}/rankops"}
    result = manage("shell", "-c", REQUESTS, env=env, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    answers = {
        path: (status, content_type, request_id, body)
        for path, status, content_type, request_id, body in map(
            json.loads, result.stdout.splitlines()[-3:]
        )
    }
    status, content_type, request_id, body = answers["/api/v1/workspaces/"]
    assert (status, content_type) == (503, "application/json")
    assert body == {
        "type": "service_unavailable",
        "code": "database_unavailable",
        "detail": "The database is unavailable; retry shortly.",
        "attr": None,
        "request_id": request_id,
    }
    status, _, _, readiness = answers["/readyz"]
    assert status == 503 and readiness["checks"]["database"].startswith("error")
    assert answers["/healthz"][0] == 200
    # The server's log line names the request.
    assert f"[{request_id}]" in result.stderr

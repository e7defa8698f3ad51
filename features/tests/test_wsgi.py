"""The online feature server's WSGI entry (``features.wsgi``) answers like ``config.wsgi``."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core import signals
from django.db import close_old_connections

from features import fastpath
from features.fastpath import OnlineLookupMiddleware
from features.tests.conftest import FEATURES
from workspaces.models import Role
from workspaces.testing.factories import make_member, token_for

REPO_ROOT = Path(__file__).resolve().parents[2]


def _environ(path, body, *, key=None, method="POST", content_length=None) -> dict:
    """The WSGI environ of a JSON request, as a server would pass it."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(data) if content_length is None else content_length),
        "wsgi.input": io.BytesIO(data),
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "HTTP_X_REQUEST_ID": "compare-1",
        "wsgi.url_scheme": "http",
        "HTTP_HOST": "testserver",
        **({"HTTP_AUTHORIZATION": f"Token {key}"} if key else {}),
    }


@pytest.fixture
def call():
    """Call a WSGI application as a server would; (status, headers, body)."""
    from config import wsgi as django_wsgi
    from features import wsgi as features_wsgi

    apps = {"features": features_wsgi.application, "django": django_wsgi.application}

    def run(which, path, body, *, key=None, method="POST", content_length=None):
        environ = _environ(path, body, key=key, method=method, content_length=content_length)
        seen = {}

        def start_response(status, headers):
            seen.update(status=status, headers=dict(headers))

        # As Django's test client does: the test's transaction keeps its connection.
        signals.request_started.disconnect(close_old_connections)
        signals.request_finished.disconnect(close_old_connections)
        try:
            content = b"".join(apps[which](environ, start_response))
        finally:
            signals.request_started.connect(close_old_connections)
            signals.request_finished.connect(close_old_connections)
        return seen["status"], seen["headers"], content

    return run


def url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/online-features/"


@pytest.fixture
def attempts(monkeypatch):
    """How many times the fast path looked at a request."""
    seen = []
    original = OnlineLookupMiddleware.answer

    def counting(self, request, slug):
        seen.append(slug)
        return original(self, request, slug)

    monkeypatch.setattr(OnlineLookupMiddleware, "answer", counting)
    return seen


def test_a_warm_lookup_is_answered_before_django_byte_for_byte(call, workspace, profile, attempts):
    key = token_for(make_member(workspace, Role.VIEWER))
    body = {"entities": ["u1", "nobody"], "features": FEATURES}
    call("django", url(workspace), body, key=key)  # warm: the first lookup loads and caches

    before = fastpath.served
    theirs = call("django", url(workspace), body, key=key)
    ours = call("features", url(workspace), body, key=key)

    assert fastpath.served - before == 2
    assert ours == theirs
    status, headers, content = ours
    assert status == "200 OK"
    assert headers["X-Content-Type-Options"] == "nosniff"  # SecurityMiddleware's headers
    assert json.loads(content)["rows"][1] == [None] * len(FEATURES)


@pytest.mark.parametrize(
    ("body", "answer", "attr"),
    [
        ({"entities": ["u1"], "features": "profile:age"}, "400", "features"),
        ({"entities": ["u1"], "features": ["profile:nope"]}, "404", "features.0"),
        ({"entities": "u1", "features": FEATURES}, "400", "entities"),
    ],
)
def test_a_request_the_fast_path_leaves_gets_djangos_answer_with_its_body(
    call, workspace, profile, attempts, body, answer, attr
):
    key = token_for(make_member(workspace, Role.VIEWER))
    call("features", url(workspace), {"entities": ["u1"], "features": FEATURES}, key=key)
    attempts.clear()

    status, _, content = call("features", url(workspace), body, key=key)

    assert status.startswith(answer)
    assert json.loads(content)["attr"] == attr  # Django read the body the fast path had read
    assert attempts == [workspace.slug]  # tried once, not again by the middleware


def test_other_callers_and_routes_go_to_django(call, workspace, other_workspace, profile):
    key = token_for(make_member(workspace, Role.VIEWER))
    body = {"entities": ["u1"], "features": FEATURES}
    call("features", url(workspace), body, key=key)

    for path, key_used, expected in [
        (url(other_workspace), key, "404"),
        (url(workspace), None, "401"),
        (url(workspace), "not-a-token", "401"),
    ]:
        ours = call("features", path, body, key=key_used)
        assert ours[0].startswith(expected)
        assert ours == call("django", path, body, key=key_used)
    assert call("features", "/healthz", b"", method="GET")[0] == "200 OK"


def test_a_body_over_the_limit_answers_413_without_being_read(call, workspace, profile, settings):
    key = token_for(make_member(workspace, Role.VIEWER))
    status, _, content = call(
        "features",
        url(workspace),
        {"entities": ["u1"], "features": FEATURES},
        key=key,
        content_length=settings.API_MAX_BODY_BYTES + 1,
    )
    assert status.startswith("413")
    assert json.loads(content)["type"] == "too_large"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_granian_serves_the_entry_point(tmp_path):
    """The command the compose service runs starts and answers (a real server, a real socket)."""
    port = _free_port()
    log = (tmp_path / "granian.log").open("wb")
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "granian", "--interface", "wsgi", "--http", "1"),
            *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            "features.wsgi:application",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "RANKOPS_VAR_DIR": str(tmp_path / "var")},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        answer = b""
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    while chunk := conn.recv(65536):
                        answer += chunk
                break
            except OSError:
                time.sleep(0.2)
        assert answer.startswith(b"HTTP/1.1 200"), (tmp_path / "granian.log").read_text()
    finally:
        server.terminate()
        server.wait(timeout=15)
        log.close()


@pytest.mark.django_db(transaction=True)
def test_a_lookup_that_opened_a_connection_ends_like_a_django_request(workspace, profile):
    """A first lookup reads the database; at its end the connection is handled as at the end of
    any Django request (here, with CONN_MAX_AGE 0: closed)."""
    from django.db import connection

    from features import wsgi

    key = token_for(make_member(workspace, Role.VIEWER))
    environ = _environ(url(workspace), {"entities": ["u1"], "features": FEATURES}, key=key)
    before = fastpath.served
    max_age = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = 0
    try:
        connection.ensure_connection()  # opened with a maximum age of 0
        content = b"".join(wsgi.application(environ, lambda status, headers: None))
        assert connection.connection is None
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = max_age
    assert fastpath.served == before + 1
    assert json.loads(content)["rows"] == [[21, "c1", [0.5, 1.5, 1.0], False]]

"""Prometheus under gunicorn: a real server with the project's config and two workers, predict
requests naming deployments that do not exist, and scrapes of /metrics answered by any worker
that all give one count, equal to the requests sent, under one bounded label value; /metrics
wants the bearer token the environment names."""

from __future__ import annotations

import http.client
import uuid

import orjson
import pytest
from django.conf import settings
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from config.tests.gunicorn_server import gunicorn_server, server_env
from serving.metrics import UNKNOWN_DEPLOYMENT
from workspaces.models import Role
from workspaces.testing.factories import make_member, make_workspace, token_for
from workspaces.testing.waiting import wait_until

METRICS_TOKEN = "scrape-" + uuid.uuid4().hex

pytestmark = pytest.mark.timeout(180)


def _database_url() -> str:
    """The test database, for the server's processes (the rows this test commits)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return (
        f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
        f"/{db['NAME']}"
    )


@pytest.fixture
def server(tmp_path):
    metrics_dir = tmp_path / "prometheus"
    env = server_env(
        {
            "RANKOPS_VAR_DIR": str(tmp_path / "var"),
            "DATABASE_URL": _database_url(),
            "CACHE_KEY_PREFIX": f"metrics-test-{uuid.uuid4().hex[:8]}",
            "WEB_CONCURRENCY": "2",
            "GUNICORN_THREADS": "2",
            "GUNICORN_GRACEFUL_TIMEOUT": "5",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "METRICS_TOKEN": METRICS_TOKEN,
            "SERVING_PREDLOG_FLUSH_THREAD": "0",
            "SERVING_MLFLOW_ASYNC": "0",
        },
        drop_prefixes=["PROMETHEUS_"],
    )
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"stale")  # a previous run's: emptied at start
    with gunicorn_server(env, tmp_path / "gunicorn.log") as port:
        yield port, metrics_dir


def _request(port: int, method: str, path: str, body=None, headers=None) -> tuple[int, bytes]:
    """One request on a connection of its own, so that successive ones reach either worker."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _unknown_count(text: str, workspace: str) -> tuple[float, set[str]]:
    """The invalid-request count under the unknown label, and every deployment label seen."""
    count, deployments = 0.0, set()
    for family in text_string_to_metric_families(text):
        if family.name != "rankops_serving_requests":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            deployments.add(sample.labels["deployment"])
            if sample.labels == {
                "workspace": workspace,
                "deployment": UNKNOWN_DEPLOYMENT,
                "version": "",
                "outcome": "invalid",
            }:
                count += sample.value
    return count, deployments


@pytest.mark.django_db(transaction=True)
def test_every_worker_scrapes_one_count_under_a_bounded_label(server):
    port, metrics_dir = server
    workspace = make_workspace(slug=f"metrics-{uuid.uuid4().hex[:6]}")
    token = token_for(make_member(workspace, Role.DEVELOPER), workspaces=[workspace])
    predict = f"/api/v1/workspaces/{workspace.slug}/predict/"
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    assert not (metrics_dir / "counter_1.db").exists()

    sent = 0

    def send_one() -> bool:
        nonlocal sent
        body = {"deployment": f"ghost-{uuid.uuid4().hex[:10]}", "user": "u1", "candidates": ["i"]}
        status, answer = _request(port, "POST", predict, orjson.dumps(body), headers)
        assert status == 404, answer[:500]
        sent += 1
        # Both workers counted some: each writes a file of its own.
        return sent >= 40 and len(list(metrics_dir.glob("counter_*.db"))) >= 2

    wait_until(send_one, timeout=60, interval=0, what="requests counted by both workers")

    auth = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    for _ in range(8):
        status, text = _request(port, "GET", "/metrics", headers=auth)
        assert status == 200
        count, deployments = _unknown_count(text.decode(), workspace.slug)
        assert count == sent
        assert deployments == {UNKNOWN_DEPLOYMENT}  # no series per made-up name

    assert _request(port, "GET", "/metrics")[0] == 401
    assert _request(port, "GET", "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401

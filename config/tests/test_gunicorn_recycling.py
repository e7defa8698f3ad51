"""Worker recycling under load drops nothing: a real gunicorn with the project's config, workers
recycled every few dozen requests (GUNICORN_MAX_REQUESTS), keep-alive clients that never stop."""

from __future__ import annotations

import http.client
import threading
from pathlib import Path

import pytest

from config.tests.gunicorn_server import gunicorn_server, server_env

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 8
REQUESTS_PER_CLIENT = 50

pytestmark = pytest.mark.timeout(420)  # a ceiling: ten worker boots on a loaded 2-core runner


@pytest.fixture
def gunicorn(tmp_path):
    env = server_env(
        {
            "RANKOPS_VAR_DIR": str(tmp_path / "var"),
            "WEB_CONCURRENCY": "2",
            "GUNICORN_THREADS": "4",
            "GUNICORN_MAX_REQUESTS": "40",
        }
    )
    with gunicorn_server(env, tmp_path / "gunicorn.log") as port:
        yield port, tmp_path / "gunicorn.log"


def _client(port: int, failures: list[str], served: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(REQUESTS_PER_CLIENT):
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures.append(f"status {response.status}")
            else:
                served.append(1)
            if response.will_close:
                conn.close()
        except (OSError, http.client.HTTPException) as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            conn.close()
    conn.close()


@pytest.mark.one_backend  # gunicorn serves /healthz on the embedded defaults in both passes
def test_recycled_workers_finish_every_request(gunicorn):
    port, log_path = gunicorn
    failures: list[str] = []
    served: list[int] = []
    clients = [
        threading.Thread(target=_client, args=(port, failures, served)) for _ in range(CLIENTS)
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    log = log_path.read_text(errors="replace")
    recycled = log.count("Autorestarting worker")
    assert recycled >= 3, log[-3000:]
    assert failures == [], (failures[:10], len(failures))
    assert len(served) == CLIENTS * REQUESTS_PER_CLIENT


def test_recycling_defaults_are_rare_jittered_and_graceful(monkeypatch):
    import runpy

    from gunicorn.workers.gthread import ThreadWorker

    for name in (
        "GUNICORN_MAX_REQUESTS",
        "GUNICORN_MAX_REQUESTS_JITTER",
        "GUNICORN_GRACEFUL_TIMEOUT",
    ):
        monkeypatch.delenv(name, raising=False)
    conf = runpy.run_path(str(ROOT / "platform" / "gunicorn.conf.py"))
    assert conf["max_requests"] >= 10_000
    assert conf["max_requests_jitter"] >= conf["max_requests"] // 10
    assert issubclass(conf["worker_class"], ThreadWorker)
    # The pod's termination grace period (45 s, 5 of them in preStop) leaves room for the drain.
    assert conf["timeout"] >= conf["graceful_timeout"] and conf["graceful_timeout"] <= 40

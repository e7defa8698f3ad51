"""Worker recycling under load drops nothing: a real gunicorn with the project's config, workers
recycled every few dozen requests (GUNICORN_MAX_REQUESTS), keep-alive clients that never stop."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 8
REQUESTS_PER_CLIENT = 50

pytestmark = pytest.mark.timeout(240)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_serving(port: int, server: subprocess.Popen, within: float = 90.0) -> None:
    deadline = time.monotonic() + within
    while True:
        if server.poll() is not None:
            raise RuntimeError("gunicorn exited while starting")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"gunicorn not serving within {within} s")
        time.sleep(0.1)  # polling a starting process, with a deadline


@pytest.fixture
def gunicorn(tmp_path):
    port = _free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "DJANGO_ENV", "PYTEST_CURRENT_TEST"}
    }
    env.update(
        {
            "RANKOPS_VAR_DIR": str(tmp_path / "var"),
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "WEB_CONCURRENCY": "2",
            "GUNICORN_THREADS": "4",
            "GUNICORN_MAX_REQUESTS": "40",
        }
    )
    log = open(tmp_path / "gunicorn.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--config",
            str(ROOT / "platform" / "gunicorn.conf.py"),
            "config.wsgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_serving(port, server)
        yield port, tmp_path / "gunicorn.log"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


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

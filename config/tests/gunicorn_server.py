"""A real gunicorn with the project's config for tests: on a free loopback port, with the
environment given, waited on until ``/healthz`` answers, stopped by SIGTERM (killed after 60 s)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The suite's own settings, which the server must not inherit: it runs on what the test gives.
DROPPED = {"DATABASE_URL", "REDIS_URL", "DJANGO_ENV", "PYTEST_CURRENT_TEST"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_env(extra: dict[str, str], *, drop_prefixes: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment less the suite's settings (and ``drop_prefixes``), plus
    ``extra``."""
    prefixes = tuple(drop_prefixes)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in DROPPED and not (prefixes and key.startswith(prefixes))
    }
    env.update(extra)
    return env


def wait_until_serving(port: int, server: subprocess.Popen, within: float = 90.0) -> None:
    deadline = time.monotonic() + within
    while True:
        if server.poll() is not None:
            raise RuntimeError("gunicorn exited while starting")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
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


@contextmanager
def gunicorn_server(env: dict[str, str], log_path: Path) -> Iterator[int]:
    """Start gunicorn with ``env`` (its HOST and PORT are set here), its output in
    ``log_path``; yields the port once it serves."""
    port = free_port()
    env = {**env, "HOST": "127.0.0.1", "PORT": str(port)}
    with open(log_path, "wb") as log:
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
            wait_until_serving(port, server)
            yield port
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

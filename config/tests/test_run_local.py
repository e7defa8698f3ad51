"""`make run`'s script (platform/run-local.sh) for real: web server and worker up, a SIGKILLed
worker replaced within 10 s and its claimed messages given back, Ctrl-C stops everything with
exit code 0 within 10 s.

The script runs on a temp RANKOPS_VAR_DIR and a free port, without the demo and on an unmigrated
database (the worker's ticks log errors; /healthz, the broker and the heartbeat need no tables):
about 20-40 s on a loaded 2-core machine, most of it the worker's and the server's imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "platform" / "run-local.sh"

pytestmark = [pytest.mark.celery_worker, pytest.mark.one_backend]  # make run is embedded


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, ValueError):
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a process of this group still runs (a zombie awaiting its reaper does not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_run_local_restarts_a_killed_worker_and_stops_cleanly_on_ctrl_c(tmp_path):
    var = tmp_path / "var"
    port = _free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DJANGO_ENV"}
        and not key.startswith("PYTEST")
    }
    env.update(
        RANKOPS_VAR_DIR=str(var),
        PORT=str(port),
        BIN=str(Path(sys.executable).parent),
        RUN_LOCAL_NO_DEMO="1",
    )
    # Its own session, like a terminal's foreground job: Ctrl-C is SIGINT to its process group.
    script = subprocess.Popen(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 120, "/healthz")
        pid_file = var / "run" / "worker.pid"
        first = int(pid_file.read_text())
        # The worker is up and consuming once it holds a claim folder (its first poll).
        _wait_for(
            lambda: any(f"-{first}-" in p.name for p in (var / "broker" / "unacked").iterdir()),
            90,
            "the first worker polls the broker",
        )

        os.kill(first, signal.SIGKILL)
        second = _wait_for(
            lambda: (pid := int(pid_file.read_text())) != first and _alive(pid) and pid,
            10,
            "a new worker pid",
        )
        # Its pool children and beat do not run on as orphans next to the new worker.
        _wait_for(lambda: not _group_alive(first), 10, "the killed worker's group gone")
        # The new worker takes over the dead one's claims (its folder is recovered and removed).
        _wait_for(
            lambda: not any(f"-{first}-" in p.name for p in (var / "broker" / "unacked").iterdir()),
            60,
            "the dead worker's claim folder recovered",
        )

        os.killpg(script.pid, signal.SIGINT)
        rc = script.wait(timeout=10)
        output = script.stdout.read()
    finally:
        if script.poll() is None:  # a failed assertion above: stop it and whatever it started
            script.terminate()
            try:
                script.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(script.pid, signal.SIGKILL)
                script.wait(timeout=10)
            for pid_file in (var / "run").glob("*.pid"):
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            # What the script and the worker said, in the failure's captured output.
            print("--- run-local.sh ---", script.stdout.read(), sep="\n")
            worker_log = var / "log" / "worker.log"
            if worker_log.exists():
                print("--- worker.log (tail) ---", worker_log.read_text()[-4000:], sep="\n")
    assert rc == 0, output
    assert f"The worker (pid {first}) exited with 137; restarting it" in output
    assert "Stopped." in output
    assert not _group_alive(first) and not _group_alive(second)
    assert not list((var / "run").glob("*.pid"))

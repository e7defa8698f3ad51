"""The `make run` soak (issue 17's acceptance, outside CI): the platform on embedded defaults
idles for hours with its worker alive, and a SIGKILLed worker is back within 10 s.

    python -m bench.soak --hours 2 --port 8765 --out bench/results/soak.json

It starts ``platform/run-local.sh`` (the script behind ``make run``; ``--no-demo`` leaves the
demo's training out, so the machine idles as an unattended ``make run`` does once its demo is
done) in the checkout it runs from, with its own ``var`` folder (``--var``). Every
``--probe-s`` seconds it reads ``/readyz`` and checks that the supervised worker's pid is alive
and unchanged. At the end it SIGKILLs the worker and measures the time until the restarted
worker's log says it is ready (``local@<host> ready.``) and until ``/readyz`` reports its
heartbeat, then stops the platform with TERM and checks the script's exit status (0).

Written to ``--out``: ``idle_s``, ``probes``, ``probes_failed``, ``worker_restarts_idle``
(restarts nobody asked for), ``worker_back_s`` (kill -> ready), ``readyz_back_s`` (kill ->
/readyz 200 with a newer heartbeat), ``stop_s`` and ``stop_rc``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readyz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError):
        return 0, {}


def worker_pid(var: Path) -> int:
    try:
        return int((var / "run" / "worker.pid").read_text().strip())
    except (OSError, ValueError):
        return 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def ready_lines(var: Path) -> int:
    try:
        text = (var / "log" / "worker.log").read_text(errors="replace")
    except OSError:
        return 0
    # Celery's "<hostname> ready." line (``run-local.sh`` names the worker ``local@<host>``).
    return sum(1 for line in text.splitlines() if line.rstrip().endswith(" ready."))


def heartbeat(body: dict) -> str:
    return str((body.get("details") or body).get("worker_last_heartbeat") or "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--probe-s", type=float, default=30.0)
    parser.add_argument("--var", default=str(REPO / "var" / "soak"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "soak.json"))
    parser.add_argument("--no-demo", action="store_true")
    args = parser.parse_args(argv)
    var = Path(args.var)
    var.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "RANKOPS_VAR_DIR": str(var),
        "PORT": str(args.port),
        "BIN": str(Path(sys.executable).parent),
    }
    if args.no_demo:
        env["RUN_LOCAL_NO_DEMO"] = "1"
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "--noinput"], cwd=REPO, env=env, check=True)
    subprocess.run([python, "manage.py", "demo_setup"], cwd=REPO, env=env, check=True)
    log = open(var / "soak-run-local.log", "ab")  # noqa: SIM115 - open for the run's life
    run = subprocess.Popen(
        ["bash", "platform/run-local.sh"], cwd=REPO, env=env, stdout=log, stderr=log,
        start_new_session=True,
    )  # fmt: skip
    result: dict = {"hours": args.hours, "demo": not args.no_demo, "port": args.port}
    try:
        deadline = time.monotonic() + 120
        while readyz(args.port)[0] != 200:
            if time.monotonic() > deadline or run.poll() is not None:
                raise SystemExit("the platform did not become ready within 120 s")
            time.sleep(1)
        first_pid = worker_pid(var)
        started = time.monotonic()
        probes = failed = 0
        restarts = 0
        pid = first_pid
        failures: list[dict] = []
        while time.monotonic() - started < args.hours * 3600:
            time.sleep(args.probe_s)
            status, body = readyz(args.port)
            probes += 1
            now = worker_pid(var)
            if status != 200 or not alive(now):
                failed += 1
                failures.append({"at_s": round(time.monotonic() - started), "status": status})
            if now != pid:
                restarts += 1
                pid = now
        result.update(
            idle_s=round(time.monotonic() - started),
            probes=probes,
            probes_failed=failed,
            failures=failures[:20],
            worker_restarts_idle=restarts,
        )
        # The kill: the worker's leader, as the OOM killer or `kill -9` would.
        before_ready = ready_lines(var)
        _, body = readyz(args.port)
        beat_before = heartbeat(body)
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        worker_back = readyz_back = None
        while time.monotonic() - killed_at < 120 and (worker_back is None or readyz_back is None):
            if worker_back is None and ready_lines(var) > before_ready:
                worker_back = time.monotonic() - killed_at
            status, body = readyz(args.port)
            if readyz_back is None and status == 200 and heartbeat(body) != beat_before:
                readyz_back = time.monotonic() - killed_at
            time.sleep(0.2)
        result.update(
            worker_back_s=None if worker_back is None else round(worker_back, 2),
            readyz_back_s=None if readyz_back is None else round(readyz_back, 2),
            new_worker_pid_alive=alive(worker_pid(var)) and worker_pid(var) != pid,
        )
    finally:
        stop_at = time.monotonic()
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
        try:
            rc = run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            rc = run.wait()
        result.update(stop_s=round(time.monotonic() - stop_at, 2), stop_rc=rc)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

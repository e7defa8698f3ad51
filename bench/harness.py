"""The benchmark harness: finds area modules, runs them on a throwaway database, records results.

An area is a module ``bench/areas/<area>.py`` with a docstring and ``run(ctx) -> dict[str, float]``.
Each run gets its own database, created and dropped the way Django's test runner does, so the
developer's database is never touched. Results go to ``bench/results/<area>.json`` together with
a description of the environment they were measured in, and are printed as a table.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import http.client
import importlib
import importlib.util
import json
import math
import os
import pkgutil
import platform
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
VENVS_DIR = BENCH_DIR / ".venvs"
AREAS_PACKAGE = "bench.areas"

# The areas the project names, in the order `make bench` runs them. Later issues add the modules.
KNOWN_AREAS: tuple[str, ...] = (
    "platform",
    "features",
    "training",
    "scheduler",
    "serving",
    "experiments",
    "lineage",
    "loop",
    "quality",
    "faults",
    "offline",
    "data",
    "quantization",
)

# Unit shown for a measure, read from the end of its name (longest suffix first).
UNIT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_per_s", "/s"),
    ("_ms", "ms"),
    ("_us", "us"),
    ("_s", "s"),
    ("_bytes", "B"),
    ("_mb", "MB"),
    ("_pct", "%"),
    ("_ratio", "x"),
)

_PEER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PINNED = re.compile(r"===?|\s@\s")


class BenchError(Exception):
    """A benchmark cannot run as asked (unknown area, no module yet, a bad result)."""


# --------------------------------------------------------------------------------------------
# Areas


def area_module_name(area: str, package: str = AREAS_PACKAGE) -> str:
    return f"{package}.{area}"


def area_exists(area: str, package: str = AREAS_PACKAGE) -> bool:
    """Whether ``<package>.<area>`` is a module, without importing it."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", area):
        return False
    return importlib.util.find_spec(area_module_name(area, package)) is not None


def discover_areas(package: str = AREAS_PACKAGE, known: Sequence[str] = KNOWN_AREAS) -> list[str]:
    """Areas with a module: the known ones in their order, then any others alphabetically."""
    pkg = importlib.import_module(package)
    modules = {
        info.name
        for info in pkgutil.iter_modules(pkg.__path__)
        if not info.ispkg and not info.name.startswith("_")
    }
    return [a for a in known if a in modules] + sorted(modules - set(known))


def load_area(area: str, package: str = AREAS_PACKAGE) -> ModuleType:
    module = importlib.import_module(area_module_name(area, package))
    if not callable(getattr(module, "run", None)):
        raise BenchError(f"bench area '{area}' has no run(ctx) function")
    if not (module.__doc__ or "").strip():
        raise BenchError(f"bench area '{area}' has no docstring saying what it measures")
    return module


# --------------------------------------------------------------------------------------------
# What an area gets


@dataclass
class Context:
    """What an area's ``run(ctx)`` gets.

    ``workdir`` is a private temporary folder, removed afterwards. ``database_env`` holds the
    environment variables that point a child process (a server, a worker) at the throwaway
    database the area runs on; ``child_env()`` is the full environment for such a process.
    An area may note the parameters it ran with in ``parameters``; they are saved with the result.
    """

    area: str
    workdir: Path
    database_env: dict[str, str] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    out: TextIO = field(default_factory=lambda: sys.stdout)

    def child_env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.database_env)
        env.update(extra)
        return env

    def log(self, message: str) -> None:
        print(f"  [{self.area}] {message}", file=self.out, flush=True)


# --------------------------------------------------------------------------------------------
# The throwaway database


def _database_url_for(url: str, name: str) -> str:
    """``url`` with its database name replaced by ``name``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


@contextlib.contextmanager
def throwaway_database(workdir: Path, *, verbosity: int = 0) -> Iterator[dict[str, str]]:
    """Create, migrate and finally drop a test database, like Django's test runner.

    PostgreSQL (``DATABASE_URL``): ``test_<name>`` on the same server. SQLite: a file in
    ``workdir`` (not in memory, so server processes can open it). Yields the environment that
    points a child process at it.
    """
    from django.conf import settings
    from django.db import connections

    connection = connections["default"]
    test_settings = connection.settings_dict.setdefault("TEST", {})
    saved_test_name = test_settings.get("NAME")
    env: dict[str, str] = {
        # Child processes keep their local state (cache files, broker folders) in workdir.
        "RANKOPS_VAR_DIR": str(workdir),
        "CACHE_KEY_PREFIX": f"rankops-bench-{os.getpid()}",
    }
    if connection.vendor == "sqlite":
        # Settings put the embedded database at $RANKOPS_VAR_DIR/db.sqlite3, with its options.
        test_settings["NAME"] = str(workdir / "db.sqlite3")
        env["DATABASE_URL"] = ""
    old_name = connection.settings_dict["NAME"]
    test_name = connection.creation._get_test_db_name()
    try:
        if str(test_name) == str(old_name):
            raise BenchError(f"the test database name {test_name!r} is the database's own name")
        connection.creation.create_test_db(
            verbosity=verbosity, autoclobber=True, keepdb=False, serialize=False
        )
        if connection.vendor != "sqlite":
            if not settings.DATABASE_URL:
                raise BenchError(f"no DATABASE_URL for the {connection.vendor} database")
            env["DATABASE_URL"] = _database_url_for(settings.DATABASE_URL, str(test_name))
        yield env
    finally:
        # Drop it only once the connection was switched to it (also when migrating it failed);
        # never when creating failed earlier, which leaves the connection on the real database.
        if str(connection.settings_dict["NAME"]) == str(test_name):
            connection.creation.destroy_test_db(old_name, verbosity=verbosity, keepdb=False)
        test_settings["NAME"] = saved_test_name


DatabaseFactory = Callable[[Path], contextlib.AbstractContextManager[dict[str, str]]]


# --------------------------------------------------------------------------------------------
# The environment a result was measured in


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def _total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _database_version(connection: Any) -> str | None:
    queries = {
        "postgresql": "SHOW server_version",
        "sqlite": "SELECT sqlite_version()",
        "mysql": "SELECT VERSION()",
    }
    query = queries.get(connection.vendor)
    if query is None:
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute(query)
            return str(cursor.fetchone()[0])
    except Exception:  # noqa: BLE001 - the version is a note, never a reason to fail a run
        return None


def _redis_version(url: str) -> str | None:
    try:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return str(client.info("server").get("redis_version"))
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - the version is a note, never a reason to fail a run
        return None


def collect_environment(command: Sequence[str]) -> dict[str, Any]:
    """Where and how the numbers were measured."""
    from django.conf import settings
    from django.db import connections

    connection = connections["default"]
    redis_url = os.environ.get("REDIS_URL", "")
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": _total_memory_bytes(),
        "database_vendor": connection.vendor,
        "database_version": _database_version(connection),
        "redis_url_set": bool(redis_url),
        "redis_version": _redis_version(redis_url) if redis_url else None,
        "broker_transport": settings.CELERY_BROKER_URL.split("://", 1)[0],
        "debug": bool(settings.DEBUG),
        "git_commit": _git_commit(),
        "timestamp_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(command),
    }


# --------------------------------------------------------------------------------------------
# Results


def unit_of(measure: str) -> str:
    for suffix, unit in UNIT_SUFFIXES:
        if measure.endswith(suffix):
            return unit
    return ""


def format_value(value: float) -> str:
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and value >= 1000):
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def check_measures(area: str, measures: Any) -> dict[str, float]:
    """An area's measures: a non-empty mapping of names to finite numbers."""
    if not isinstance(measures, Mapping) or not measures:
        raise BenchError(f"bench area '{area}' returned {measures!r}, not a dict of measures")
    checked: dict[str, float] = {}
    for name, value in measures.items():
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise BenchError(f"bench area '{area}': measure name {name!r} is not snake_case")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BenchError(f"bench area '{area}': measure '{name}' is {value!r}, not a number")
        if not math.isfinite(value):
            raise BenchError(f"bench area '{area}': measure '{name}' is {value}")
        checked[name] = value
    return checked


def render_table(area: str, measures: Mapping[str, float], title: str = "") -> str:
    rows = [(name, format_value(value), unit_of(name)) for name, value in measures.items()]
    headers = ("measure", "value", "unit")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    line = "-" * (sum(widths) + 4)
    heading = f"{area}: {title}" if title else area
    out = [heading, line, f"{headers[0]:<{widths[0]}}  {headers[1]:>{widths[1]}}  {headers[2]}"]
    out.append(line)
    out += [f"{n:<{widths[0]}}  {v:>{widths[1]}}  {u}".rstrip() for n, v, u in rows]
    out.append(line)
    return "\n".join(out)


def write_result(
    results_dir: Path, area: str, measures: Mapping[str, float], environment: Mapping[str, Any]
) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{area}.json"
    document = {"measures": dict(measures), "environment": dict(environment)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def run_area(
    area: str,
    *,
    package: str = AREAS_PACKAGE,
    results_dir: Path = RESULTS_DIR,
    database: DatabaseFactory = throwaway_database,
    command: Sequence[str] = (),
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Run one area on its own throwaway database; write and print its result."""
    out = out or sys.stdout
    module = load_area(area, package)
    title = (module.__doc__ or "").strip().splitlines()[0]
    print(f"== {area}: {title}", file=out, flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"rankops-bench-{area}-") as tmp:
        workdir = Path(tmp).resolve()
        with database(workdir) as database_env:
            ctx = Context(area=area, workdir=workdir, database_env=dict(database_env), out=out)
            measures = check_measures(area, module.run(ctx))
            # The environment is read while the throwaway database is still there to ask.
            environment = collect_environment(command)
    environment["area"] = area
    environment["parameters"] = ctx.parameters
    environment["duration_s"] = round(time.perf_counter() - started, 2)
    path = write_result(results_dir, area, measures, environment)
    print(render_table(area, measures, title), file=out)
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    print(f"({environment['duration_s']} s; written to {shown})\n", file=out, flush=True)
    return {"measures": measures, "environment": environment}


# --------------------------------------------------------------------------------------------
# Command line


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def main(
    argv: Sequence[str] | None = None,
    *,
    package: str = AREAS_PACKAGE,
    known: Sequence[str] = KNOWN_AREAS,
    results_dir: Path = RESULTS_DIR,
    database: DatabaseFactory = throwaway_database,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Run the platform's benchmarks (make bench)."
    )
    parser.add_argument("--only", metavar="AREA", help=f"one area: {', '.join(known)}")
    args = parser.parse_args(argv)
    command = [Path(sys.executable).name, "-m", "bench", *argv]

    if args.only is not None:
        area = args.only
        if not area_exists(area, package):
            if area in known:
                print(f"no benchmark for area '{area}' yet", file=err)
            else:
                print(f"unknown bench area '{area}'; known areas: {', '.join(known)}", file=err)
            return 2
        areas = [area]
    else:
        areas = discover_areas(package, known)
        missing = [a for a in known if a not in areas]
        if missing:
            print(f"no benchmark yet for: {', '.join(missing)}", file=out, flush=True)
        if not areas:
            print("no bench areas to run", file=err)
            return 2

    _setup_django()
    failed: list[str] = []
    for area in areas:
        try:
            run_area(
                area,
                package=package,
                results_dir=results_dir,
                database=database,
                command=command,
                out=out,
            )
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - one failing area must not hide the others
            failed.append(area)
            traceback.print_exc(file=err)
            print(f"bench area '{area}' failed: {type(exc).__name__}: {exc}", file=err, flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=err)
        return 1
    return 0


# --------------------------------------------------------------------------------------------
# Helpers for areas


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) of ``values``, interpolating between neighbours."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile {pct} is outside 0-100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalHttp:
    """A keep-alive HTTP/1.1 client for a server on 127.0.0.1, timing each request."""

    def __init__(self, port: int, *, headers: Mapping[str, str] | None = None, timeout=30.0):
        self.port = port
        self.headers = {"Accept": "application/json", **(headers or {})}
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        return self._conn

    # The server closed an idle keep-alive connection before reading: reconnect once.
    RECONNECT_ON: tuple[type[BaseException], ...] = (
        http.client.RemoteDisconnected,
        ConnectionResetError,
        BrokenPipeError,
    )

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        reconnect_on: tuple[type[BaseException], ...] | None = None,
    ) -> tuple[int, bytes]:
        """One request on the kept-alive connection; (status, body)."""
        retry = reconnect_on or self.RECONNECT_ON
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers={**self.headers, **(headers or {})})
                response = conn.getresponse()
                answer = response.read()
            except retry:
                self.close()
                if attempt == 2:
                    raise
                continue
            if response.will_close:
                self.close()
            return response.status, answer
        raise AssertionError("unreachable")

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        return self.request("GET", path, headers=headers)

    def timed_gets(
        self, path: str, *, count: int, warmup: int = 0, headers: Mapping[str, str] | None = None
    ) -> list[float]:
        """Latencies in milliseconds of ``count`` GETs after ``warmup`` untimed ones."""
        latencies: list[float] = []
        for i in range(warmup + count):
            started = time.perf_counter()
            status, body = self.get(path, headers)
            elapsed_ms = (time.perf_counter() - started) * 1000
            if status != 200:
                raise BenchError(f"GET {path} answered {status}: {body[:300]!r}")
            if i >= warmup:
                latencies.append(elapsed_ms)
        return latencies

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


@contextlib.contextmanager
def gunicorn_server(
    ctx: Context,
    *,
    app: str = "config.wsgi",
    workers: int = 2,
    threads: int = 4,
    ready_path: str = "/healthz",
    startup_timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[int]:
    """Start gunicorn (gthread workers) on a free port of 127.0.0.1 against the throwaway
    database; yield the port. The server is stopped (TERM, then KILL) when the block ends."""
    port = free_port()
    command = [
        *("-m", "gunicorn", app, "-b", f"127.0.0.1:{port}", "-w", str(workers)),
        *("-k", "gthread", "--threads", str(threads), "--keep-alive", "30"),
        *("--log-level", "warning"),
    ]
    with _served(ctx, "gunicorn", port, command, ready_path, startup_timeout, env):
        yield port


@contextlib.contextmanager
def granian_server(
    ctx: Context,
    *,
    app: str = "features.wsgi:application",
    workers: int = 2,
    threads: int = 1,
    ready_path: str = "/healthz",
    startup_timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[int]:
    """Start granian (WSGI interface, HTTP/1.1, ``threads`` blocking threads per worker) on a
    free port of 127.0.0.1 against the throwaway database; yield the port."""
    port = free_port()
    command = [
        *("-m", "granian", "--interface", "wsgi", "--http", "1", "--no-ws"),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)),
        *("--blocking-threads", str(threads), "--log-level", "warning", app),
    ]
    with _served(ctx, "granian", port, command, ready_path, startup_timeout, env):
        yield port


@contextlib.contextmanager
def _served(
    ctx: Context,
    name: str,
    port: int,
    arguments: Sequence[str],
    ready_path: str,
    startup_timeout: float,
    env: Mapping[str, str] | None,
) -> Iterator[None]:
    """Run ``python <arguments>`` from the repository root until ``ready_path`` answers 200;
    stop it (TERM, then KILL) when the block ends, however it ends."""
    log_path = ctx.workdir / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, *arguments],
            cwd=REPO_ROOT,
            env=ctx.child_env(**(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + startup_timeout
        probe = LocalHttp(port, timeout=2)
        while True:
            if process.poll() is not None:
                raise BenchError(
                    f"{name} exited with {process.returncode} at startup:\n{_tail(log_path)}"
                )
            try:
                status, _ = probe.get(ready_path)
                if status == 200:
                    break
            except OSError:
                pass
            finally:
                probe.close()
            if time.monotonic() > deadline:
                raise BenchError(f"{name} not ready after {startup_timeout}s:\n{_tail(log_path)}")
            time.sleep(0.1)
        yield
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


# --------------------------------------------------------------------------------------------
# Peers' virtualenvs


Runner = Callable[..., Any]
STAMP_NAME = ".bench-requirements"


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def peer_stamp(requirements: Sequence[str], python_version: str | None = None) -> str:
    """What a peer venv was built from: the Python version and the requirement list.

    The first line is a digest of the rest; the order of the requirements does not matter.
    """
    lines = [f"python=={python_version or platform.python_version()}", *sorted(set(requirements))]
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return f"{digest}\n" + "\n".join(lines) + "\n"


def peer_venv(
    name: str,
    requirements: list[str],
    *,
    root: Path | None = None,
    runner: Runner = subprocess.run,
) -> Path:
    """The python of ``bench/.venvs/<name>/`` with the pinned ``requirements`` installed.

    The venv is made with this interpreter when it is missing; the requirements are installed
    when the stamp file in it does not match them (the first time, or after they change) and the
    stamp is written only once pip succeeded. The check and the build hold an exclusive lock
    (``.<name>.lock`` beside the venv), so a second caller waits for a build under way instead of
    starting its own. Returns the venv's python. ``runner`` has
    ``subprocess.run``'s signature; tests pass a fake one.
    """
    if not _PEER_NAME.match(name):
        raise ValueError(f"peer name {name!r} must be letters, digits, '.', '_' or '-'")
    requirements = [req.strip() for req in requirements if req.strip()]
    if not requirements:
        raise ValueError(f"peer '{name}' needs at least one requirement")
    unpinned = [req for req in requirements if not _PINNED.search(req)]
    if unpinned:
        raise ValueError(f"peer '{name}': requirements must be pinned (==), got {unpinned}")
    venv = (root or VENVS_DIR) / name
    venv_python = _venv_python(venv)
    stamp_path = venv / STAMP_NAME
    stamp = peer_stamp(requirements)
    venv.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time, and a reader waits for it: CI starts the build before the suites
    # and the test that needs the venv blocks here until the build is done, then finds the stamp.
    with open(venv.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not venv_python.exists():
            runner([sys.executable, "-m", "venv", str(venv)], check=True)
        if not stamp_path.exists() or stamp_path.read_text() != stamp:
            stamp_path.unlink(missing_ok=True)
            runner(
                [
                    str(venv_python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    *requirements,
                ],
                check=True,
            )
            stamp_path.write_text(stamp)
    return venv_python

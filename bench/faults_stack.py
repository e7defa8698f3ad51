"""Real processes for fault runs: a private Redis (AOF on), gunicorn, Celery workers and node
agents, started on loopback against one database, each killable, freezable and restartable.

The ``faults`` bench area (``bench/areas/faults.py``) and the CI fault tests
(``bench/tests/test_faults.py``) both build on this: the bench with its throwaway database, the
tests with pytest-django's. ``pointed_at`` points this process (its cache, online store and
Celery producer) at the same Redis and folders as the processes it starts, so what it enqueues
or reads is what they see.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class FaultError(Exception):
    """A fault run could not be set up or its processes did not come up."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, what: str, every: float = 0.1
) -> Any:
    """Poll ``predicate`` until it is truthy (its value) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - a service still coming up answers with errors
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise FaultError(f"not within {timeout:.0f} s: {what}")
        time.sleep(every)


def tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------
# One supervised child process


class Child:
    """A child process in its own session (process group), so that a kill reaches the pool
    children, beat and training processes it started, as a supervisor's would."""

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str], log: Path):
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log = log
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> Child:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise FaultError(f"{self.name} was never started")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def group_alive(self) -> bool:
        """Whether any process of this child's group still runs (zombies excluded)."""
        if self.process is None:
            return False
        pgid = self.process.pid
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
        return False

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the leader only (what `kill -9 <pid>` does)."""
        if self.alive():
            os.kill(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def kill(self, *, orphans_grace_s: float = 0.0) -> None:
        """SIGKILL the leader; give its orphans ``orphans_grace_s`` to exit on their own, then
        SIGKILL what is left of the group (a supervisor does the same before restarting)."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)
        deadline = time.monotonic() + orphans_grace_s
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.signal_group(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, timeout: float = 20) -> None:
        """TERM (after CONT, should it be frozen), then KILL the group."""
        if self.process is None:
            return
        self.signal_group(signal.SIGCONT)
        if self.alive():
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)

    def restart(self) -> Child:
        return self.start()


# --------------------------------------------------------------------------------------------
# Redis with AOF


class RedisServer:
    """``redis-server`` on a free loopback port with ``--appendonly yes`` in a folder of its own:
    a SIGKILLed one restarted on the same folder has every acknowledged write (the AOF is written
    before a reply is sent; SIGKILL loses no page cache)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [
            REDIS_SERVER,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder)),
            *("--appendonly", "yes", "--appendfsync", "everysec", "--save", ""),
            *("--protected-mode", "yes", "--daemonize", "no", "--logfile", ""),
        ]
        self.child = Child("redis", argv, env=dict(os.environ), log=folder / "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        import redis

        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def start(self) -> RedisServer:
        if not Path(REDIS_SERVER).exists():
            raise FaultError("redis-server is not installed")
        self.child.start()
        wait_until(self.ping, timeout=20, what=f"redis-server on {self.port}")
        return self

    def kill(self) -> None:
        self.child.kill()

    def stop(self) -> None:
        self.child.stop()


# --------------------------------------------------------------------------------------------
# The stack

# gunicorn hooks: a worker writes every thread's stack to its log on SIGRTMIN+6 (to see where a
# request hangs while a fault is on).
GUNICORN_HOOKS = """
import faulthandler, signal, sys

faulthandler.register(signal.SIGRTMIN + 6, file=sys.stderr, all_threads=True)

def post_worker_init(worker):
    faulthandler.register(signal.SIGRTMIN + 6, file=sys.stderr, all_threads=True)
"""


@dataclass
class Stack:
    """The processes of one fault run: Redis, the web server and Celery workers, sharing one
    database (``env``'s ``DATABASE_URL`` or its SQLite file) and one Redis."""

    workdir: Path
    env: dict[str, str]
    log: Callable[[str], None] = print
    redis: RedisServer | None = None
    web: Child | None = None
    web_port: int = 0
    workers: dict[str, Child] = field(default_factory=dict)

    def child_env(self) -> dict[str, str]:
        env = {**self.env, "PYTHONUNBUFFERED": "1", "DEBUG": self.env.get("DEBUG", "0")}
        if self.redis is not None:
            env["REDIS_URL"] = self.redis.url
            env.pop("CELERY_BROKER_URL", None)
            env.pop("CELERY_RESULT_BACKEND", None)
        return env

    # -- Redis ------------------------------------------------------------------------------

    def start_redis(self) -> RedisServer:
        self.redis = RedisServer(self.workdir / "redis").start()
        return self.redis

    # -- web --------------------------------------------------------------------------------

    def start_web(self, *, workers: int = 2, threads: int = 4, wait: bool = True) -> Child:
        """gunicorn config.wsgi on a fixed port (the same after each restart)."""
        if not self.web_port:
            self.web_port = free_port()
        hooks = self.workdir / "gunicorn_hooks.py"
        hooks.write_text(GUNICORN_HOOKS)
        argv = [
            *(sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{self.web_port}"),
            *("-c", str(hooks)),
            *("-w", str(workers), "-k", "gthread", "--threads", str(threads)),
            *("--keep-alive", "5", "--graceful-timeout", "5", "--log-level", "warning"),
        ]
        self.web = Child("web", argv, env=self.child_env(), log=self.workdir / "web.log").start()
        if wait:
            self.wait_web()
        return self.web

    def web_ready(self) -> bool:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def wait_web(self, timeout: float = 240) -> None:
        web = self.web
        if web is None:
            raise FaultError("no web server started")

        def up() -> bool:
            if not web.alive():
                raise FaultError(f"gunicorn exited at startup:\n{tail(web.log)}")
            return self.web_ready()

        deadline = time.monotonic() + timeout
        while not up():
            if time.monotonic() > deadline:
                raise FaultError(f"gunicorn not ready after {timeout} s:\n{tail(web.log)}")
            time.sleep(0.1)

    # -- workers ----------------------------------------------------------------------------

    def start_worker(
        self,
        name: str,
        *,
        queues: Sequence[str],
        beat: bool = False,
        pool: str = "prefork",
        concurrency: int = 2,
    ) -> Child:
        """A Celery worker; a queue ``node.<x>`` makes it the node agent of node ``x``."""
        argv = [
            *(sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", pool),
            *("--queues", ",".join(queues), "--hostname", f"{name}-{uuid.uuid4().hex[:6]}@%h"),
            *("--without-mingle", "--without-gossip", "--loglevel", "INFO"),
        ]
        if pool != "solo":
            argv += ["--concurrency", str(concurrency)]
        if beat:
            argv += ["-B", "--schedule", str(self.workdir / f"beat-{name}")]
        child = Child(
            f"worker {name}", argv, env=self.child_env(), log=self.workdir / f"worker-{name}.log"
        )
        self.workers[name] = child.start()
        return child

    def stop(self) -> None:
        """Stop everything (frozen processes are woken first), Redis last."""
        for child in [*self.workers.values(), self.web]:
            if child is not None:
                child.stop()
        if self.redis is not None:
            self.redis.stop()


def database_env_of(connection: Any, workdir: Path) -> dict[str, str]:
    """The environment that points a child process at the database ``connection`` uses.

    PostgreSQL: its URL. SQLite: the settings' embedded database, ``$RANKOPS_VAR_DIR/db.sqlite3``
    (with its WAL and busy-timeout options), made a symlink to the file (SQLite resolves it,
    so the WAL is shared)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        var = workdir / "var"
        var.mkdir(parents=True, exist_ok=True)
        link = var / "db.sqlite3"
        target = Path(db["NAME"]).resolve()
        if link.resolve() != target:
            link.unlink(missing_ok=True)
            link.symlink_to(target)
        return {"DATABASE_URL": "", "RANKOPS_VAR_DIR": str(var)}
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return {"DATABASE_URL": f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"}


@contextlib.contextmanager
def pointed_at(stack: Stack) -> Iterator[None]:
    """Point this process at the stack's Redis (cache, online store, prediction log and the
    Celery producer) and folders, as its children see them; restored afterwards."""
    from django.test.utils import override_settings

    from config.celery import app

    if stack.redis is None:
        raise FaultError("start the stack's Redis first")
    url = stack.redis.url
    env = stack.child_env()
    prefix = env.get("CACHE_KEY_PREFIX", "rankops")
    overrides = {
        "REDIS_URL": url,
        "ONLINE_STORE_REDIS_URL": url,  # the stack's Redis holds the online store too
        "ONLINE_STORE_REDIS_CLUSTER": False,
        "CACHE_KEY_PREFIX": prefix,
        "CACHES": {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": url,
                "KEY_PREFIX": prefix,
                "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 2},
            }
        },
        "CELERY_BROKER_URL": url,
        "CELERY_RESULT_BACKEND": url,
        "ARTIFACT_ROOT": env["ARTIFACT_ROOT"],
        "MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"],
        "MLFLOW_ARTIFACT_ROOT": env["MLFLOW_ARTIFACT_ROOT"],
        "TRAINING_SANDBOX_ROOT": Path(env["TRAINING_SANDBOX_ROOT"]),
    }
    saved = {key: app.conf.get(key) for key in ("broker_url", "result_backend")}
    saved_transport = app.conf.get("broker_transport_options")
    drop_celery_pools(app)
    app.conf.broker_url = url
    app.conf.result_backend = url
    app.conf.broker_transport_options = {"visibility_timeout": 3600}
    try:
        with override_settings(**overrides):
            yield
    finally:
        drop_celery_pools(app)
        app.conf.broker_url = saved["broker_url"]
        app.conf.result_backend = saved["result_backend"]
        app.conf.broker_transport_options = saved_transport


def drop_celery_pools(app: Any) -> None:
    """Close the Celery app's connection and producer pools, so the next publish connects to
    the broker the app's configuration names now (Celery builds both once and keeps them).

    Celery's producer pool lives in kombu's process-wide registry, keyed by the connection's
    parameters: closed but left there, it came back, closed, as soon as the broker URL was put
    back ("Acquire on closed pool" in every later publish). ``kombu.pools.reset`` closes and
    forgets them all."""
    from kombu import pools

    for holder, attribute in ((app.amqp, "_producer_pool"), (app, "_pool")):
        pool = getattr(holder, attribute, None)
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.force_close_all()
            setattr(holder, attribute, None)
    pools.reset()


def stack_env(workdir: Path, *, database: Mapping[str, str], cache_prefix: str) -> dict[str, str]:
    """The environment of the stack's children: the database, and every local folder (artifacts,
    MLflow, sandbox, broker, cache) under ``workdir``."""
    # Training children run as their own uid in scratch folders under the sandbox root here: the
    # folders above it must be traversable (mkdtemp makes them 0700). The state folders in it
    # are closed to other users by the agent (training.sandbox.harden_state_dirs).
    workdir.chmod(0o711)
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {
            *("REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DJANGO_ENV"),
            *("ONLINE_STORE_REDIS_URL", "ONLINE_STORE_REDIS_CLUSTER"),
        }
        and not key.startswith("PYTEST")
    }
    mlflow = workdir / "mlflow"
    mlflow.mkdir(parents=True, exist_ok=True)
    env["RANKOPS_VAR_DIR"] = str(workdir / "var")
    env.update(database)
    env.update(
        CACHE_KEY_PREFIX=cache_prefix,
        ARTIFACT_ROOT=str(workdir / "artifacts"),
        MLFLOW_TRACKING_URI=f"sqlite:///{mlflow / 'mlflow.db'}",
        MLFLOW_ARTIFACT_ROOT=str(mlflow / "artifacts"),
        TRAINING_SANDBOX_ROOT=str(workdir / "sandbox"),
        READYZ_WORKER_MAX_AGE_S="0",
    )
    return env


# --------------------------------------------------------------------------------------------
# Load loops


@dataclass
class Answer:
    """One HTTP exchange of a load loop: when it ended, its status (0: no answer) and body."""

    at: float
    status: int
    body: bytes = b""
    took: float = 0.0


@dataclass
class LoadLoop:
    """A background client that sends one logical request after another, each retried with
    the same client-side id until it gets a 2xx or ``give_up_s`` passes (a careful producer).

    ``send(i, attempt) -> (status, body)`` sends request ``i``; exceptions count as no answer.
    """

    send: Callable[[int], tuple[int, bytes]]
    pause_s: float = 0.0
    give_up_s: float = 60.0
    retry_pause_s: float = 0.1
    answers: list[Answer] = field(default_factory=list)
    acknowledged: dict[int, bytes] = field(default_factory=dict)
    attempted: set[int] = field(default_factory=set)
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def start(self) -> LoadLoop:
        self.thread = threading.Thread(target=self._run, name="fault-load", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        i = 0
        try:
            while not self.stop_event.is_set():
                self._one(i)
                i += 1
                if self.pause_s:
                    self.stop_event.wait(self.pause_s)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def _one(self, i: int) -> None:
        self.attempted.add(i)
        deadline = time.monotonic() + self.give_up_s
        while True:
            sent = time.monotonic()
            try:
                status, body = self.send(i)
            except OSError as exc:
                status, body = 0, type(exc).__name__.encode()
            now = time.monotonic()
            self.answers.append(Answer(now, status, body, took=now - sent))
            if 200 <= status < 300:
                self.acknowledged[i] = body
                return
            if 400 <= status < 500 and status not in (408, 409, 429):
                # A client error is final: the request was refused, not lost.
                return
            if time.monotonic() > deadline:
                return
            time.sleep(self.retry_pause_s)

    def wait_acknowledged(self, count: int, timeout: float = 120) -> None:
        try:
            wait_until(
                lambda: len(self.acknowledged) >= count or self.error,
                timeout=timeout,
                what=f"{count} acknowledged requests",
            )
        except FaultError as exc:
            statuses: dict[int, int] = {}
            for answer in self.answers:
                statuses[answer.status] = statuses.get(answer.status, 0) + 1
            last = self.answers[-1].body[:300] if self.answers else b""
            raise FaultError(f"{exc}; answers by status {statuses}, the last: {last!r}") from exc
        if self.error:
            raise self.error

    def stop(self, timeout: float = 90) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                raise FaultError("the load loop did not finish its last request")
        if self.error:
            raise self.error

    def no_answers(self) -> dict[str, int]:
        """Exchanges that got no HTTP answer, by the client's exception."""
        found: dict[str, int] = {}
        for answer in self.answers:
            if answer.status == 0:
                found[answer.body.decode()] = found.get(answer.body.decode(), 0) + 1
        return found

    def slowest(self, count: int = 5) -> list[float]:
        """The longest exchanges, in seconds."""
        return sorted((round(a.took, 2) for a in self.answers), reverse=True)[:count]

    def server_errors(self) -> int:
        return sum(1 for a in self.answers if a.status >= 500)

    def first_success_after(
        self, moment: float, accept: Callable[[Answer], bool] | None = None
    ) -> float | None:
        """Seconds from ``moment`` to the first 2xx answer (that ``accept`` takes) after it."""
        for answer in self.answers:
            ok = answer.at >= moment and 200 <= answer.status < 300
            if ok and (accept is None or accept(answer)):
                return answer.at - moment
        return None


def http_call(
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 15,
) -> tuple[int, bytes]:
    """One request on a fresh connection (a client that reconnects after every fault)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def json_body(document: Any) -> bytes:
    return json.dumps(document).encode()

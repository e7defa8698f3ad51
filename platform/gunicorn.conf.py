"""Gunicorn configuration for the RankOps web process.

Loaded by path (``gunicorn --config /app/platform/gunicorn.conf.py``). This is
a config file, not a module of the project: ``platform/`` must never get an
``__init__.py`` (a package named ``platform`` would shadow the stdlib module).

Environment:
  PORT                  listen port (default 8000); HOST bind address (default 0.0.0.0)
  WEB_CONCURRENCY       worker processes (default 2 * CPUs + 1, capped by WEB_CONCURRENCY_MAX=8)
  GUNICORN_THREADS      threads per worker (default 4)
  GUNICORN_TIMEOUT      seconds before a silent worker is killed (default 60)
  GUNICORN_GRACEFUL_TIMEOUT  seconds a leaving worker (shutdown or recycling) has to finish the
                        requests it holds (default 30; below the pod's termination grace period)
  GUNICORN_KEEPALIVE    keep-alive seconds (default 5). Behind a proxy that pools connections to
                        gunicorn, keep it above the proxy's idle timeout for them (nginx's
                        upstream keepalive_timeout: 60 s), so the proxy closes idle connections,
                        never gunicorn under a request the proxy is sending.
  GUNICORN_MAX_REQUESTS recycle a worker after about N requests (default 10000, 0 disables)
  GUNICORN_MAX_REQUESTS_JITTER  up to this many more, per worker (default a fifth of N), so
                        workers do not recycle together
  GUNICORN_LOG_LEVEL    default info
  FORWARDED_ALLOW_IPS   proxies trusted for X-Forwarded-* (default 127.0.0.1,::1)
  PROMETHEUS_MULTIPROC_DIR  where the workers write their Prometheus values so that /metrics
                        sums them (default: a fresh folder under /dev/shm, removed on exit; a
                        given one is emptied at start)
"""

import contextlib
import os
import selectors
import shutil
import tempfile
import time
from concurrent import futures
from functools import partial

from gunicorn.workers.gthread import ThreadWorker


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc


def _available_cpus() -> int:
    """CPUs this container may use: affinity mask, then the cgroup v2/v1 quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = None
    try:  # cgroup v2: "max 100000" or "200000 100000"
        with open("/sys/fs/cgroup/cpu.max") as fh:
            limit, period = fh.read().split()[:2]
        if limit != "max":
            quota = int(limit) / int(period)
    except (OSError, ValueError):
        try:  # cgroup v1
            with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as fh:
                limit_us = int(fh.read())
            with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as fh:
                period_us = int(fh.read())
            if limit_us > 0 and period_us > 0:
                quota = limit_us / period_us
        except (OSError, ValueError):
            pass
    if quota is not None:
        cpus = min(cpus, max(1, int(quota + 0.999)))
    return max(1, cpus)


class DrainingThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, except that a leaving worker drops no request.

    The stock worker leaves (max_requests served, or SIGTERM) by closing at once every connection
    it holds: those accepted but not read from yet, the idle keep-alive ones, even one whose
    response has just told the client to keep it open. A request the client sends on one of them
    right then is lost (a reset, or a 502 from the proxy). This one, when it leaves, stops
    accepting (the master and the other workers keep the listening socket and its backlog), lets
    the requests in progress finish, keeps every connection it promised to keep open for the
    keep-alive period, answers what arrives on them with ``Connection: close``, and exits when it
    holds nothing more, within graceful_timeout in all.
    """

    def init_process(self) -> None:
        self._unfinished = 0  # requests submitted whose connection is not settled yet
        self._poller_closed = False
        super().init_process()

    def run(self) -> None:
        for listener in self.sockets:
            listener.setblocking(False)
            # Named once: during shutdown a closed listener could no longer say its name.
            acceptor = partial(self.accept, listener.getsockname())
            self.poller.register(listener, selectors.EVENT_READ, acceptor)
        while self.alive and self.is_parent_alive():
            self._turn(wait=1.0, poll=self.nr_conns < self.worker_connections)
        self._drain()

    def _wrap_future(self, fs, conn) -> None:
        with self._lock:
            self._unfinished += 1
        super()._wrap_future(fs, conn)

    def finish_request(self, fs) -> None:
        try:
            if not self.alive and self._keep_promise(fs):
                return
            super().finish_request(fs)
        finally:
            with self._lock:
                self._unfinished -= 1

    def _keep_promise(self, fs) -> bool:
        """While leaving: put back a connection whose response said keep-alive (decided before
        the worker started to leave), so that the client's next request on it is answered."""
        if fs.cancelled() or fs.exception() is not None:
            return False
        keepalive, conn = fs.result()
        if not keepalive:
            return False
        conn.sock.setblocking(False)
        conn.set_timeout()
        with self._lock:
            if self._poller_closed:
                return False
            self._keep.append(conn)
            self.poller.register(
                conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn)
            )
        return True

    def _turn(self, *, wait: float, poll: bool = True) -> None:
        """One pass of the event loop: new requests to the pool, finished ones reaped, idle
        keep-alive connections closed when their time is up."""
        self.notify()
        if poll:
            for key, _ in self.poller.select(wait):
                key.data(key.fileobj)
            done = futures.wait(self.futures, timeout=0, return_when=futures.FIRST_COMPLETED)
        else:
            done = futures.wait(self.futures, timeout=wait, return_when=futures.FIRST_COMPLETED)
        for finished in done.done:
            self.futures.remove(finished)
        self.murder_keepalived()

    def _held_connections(self) -> list:
        """Connections waiting in the poller for a request: accepted or kept alive."""
        with self._lock:
            return [
                key.data.args[0]
                for key in self.poller.get_map().values()
                if isinstance(key.data, partial) and key.data.func == self.on_client_socket_readable
            ]

    def _drain(self) -> None:
        for listener in self.sockets:
            with self._lock, contextlib.suppress(KeyError, ValueError):
                self.poller.unregister(listener)
            listener.close()
        started = time.monotonic()
        deadline = started + self.cfg.graceful_timeout
        # Keep-alive connections close when their keep-alive period is over (murder_keepalived);
        # an accepted connection that never sent a request gets as long from now.
        fresh_until = started + min(max(self.cfg.keepalive, 1), self.cfg.graceful_timeout)
        while time.monotonic() < deadline:
            held = self._held_connections()
            if time.monotonic() >= fresh_until and any(not c.initialized for c in held):
                self._turn(wait=0)  # a request that has just arrived is still served
                self._close_silent(c for c in self._held_connections() if not c.initialized)
                held = self._held_connections()
            with self._lock:
                unfinished = self._unfinished
            if not held and not unfinished:
                break
            self._turn(wait=0.05)
        with self._lock:
            self._poller_closed = True
        self.tpool.shutdown(wait=False)
        self.poller.close()

    def _close_silent(self, connections) -> None:
        for conn in connections:
            with self._lock:
                try:
                    self.poller.unregister(conn.sock)
                except (KeyError, ValueError, OSError):
                    continue  # a request arrived on it meanwhile: it is being served
            self.nr_conns -= 1
            conn.close()


bind = [f"{os.environ.get('HOST', '0.0.0.0')}:{_env_int('PORT', 8000)}"]

workers = _env_int("WEB_CONCURRENCY", 0) or min(
    2 * _available_cpus() + 1, _env_int("WEB_CONCURRENCY_MAX", 8)
)
# gthread (threads serve requests, keep-alive connections wait in an event loop), draining
# before it exits; a class, not a name: this file is loaded by path, not imported.
worker_class = DrainingThreadWorker
threads = _env_int("GUNICORN_THREADS", 4)

timeout = _env_int("GUNICORN_TIMEOUT", 60)
graceful_timeout = _env_int("GUNICORN_GRACEFUL_TIMEOUT", 30)
keepalive = _env_int("GUNICORN_KEEPALIVE", 5)

# Recycle workers now and then to bound memory growth: every 10000 requests or so (at 1000 a
# worker under load recycled about every 40 s), with a jitter of a fifth so that workers leave
# one at a time; a leaving worker finishes what it holds (DrainingThreadWorker).
max_requests = max(0, _env_int("GUNICORN_MAX_REQUESTS", 10000))
max_requests_jitter = max(0, _env_int("GUNICORN_MAX_REQUESTS_JITTER", max_requests // 5))

# Heartbeat files on tmpfs: an overlay/disk-backed /tmp can stall the
# heartbeat and get healthy workers killed.
if os.path.isdir("/dev/shm"):
    worker_tmp_dir = "/dev/shm"

# Only these peers may set X-Forwarded-Proto/For (TLS-terminating proxy).
# Comma-separated IP addresses (gunicorn 23 takes no CIDR ranges), or "*" when
# the port is reachable only through the proxy.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")

accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
# The response's X-Request-ID last: the id a client quotes finds the request's log lines.
access_log_format = (
    '%({x-forwarded-for}i)s %(h)s "%(r)s" %(s)s %(B)s %(M)sms "%(f)s" "%(a)s" %({x-request-id}o)s'
)

# Don't fork with an open database connection: the app is imported per worker.
preload_app = False
proc_name = "rankops-web"


# Prometheus multiprocess mode: every worker writes its counters to files in one folder and
# /metrics (serving.metrics.exposition) sums them, so a scrape answered by any worker gives the
# server's count. The folder is named in the environment before the first worker forks (never
# at load time: loading this file must not switch the loading process's metrics) and before
# prometheus_client is imported here, since it picks its value store at import.
_created_metrics_dir: list[str] = []
# The arbiter's prometheus_client.multiprocess, imported once in on_starting. Not in child_exit:
# gunicorn calls that from its SIGCHLD handler, and a second worker's exit arriving while the
# first call's import is half done re-enters the import and fails on the partly initialised
# package (seen in CI: ImportError on prometheus_client.metrics_core, the worker never reaped).
_multiprocess: list = []


def on_starting(server) -> None:
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    if given:
        os.makedirs(given, exist_ok=True)
        for name in os.listdir(given):  # the files of a previous run would be summed in
            if name.endswith(".db"):
                os.unlink(os.path.join(given, name))
    else:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        created = tempfile.mkdtemp(prefix="rankops-prometheus-", dir=base)
        _created_metrics_dir.append(created)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
    from prometheus_client import multiprocess  # after the folder is named: it picks its store

    _multiprocess.append(multiprocess)


def child_exit(server, worker) -> None:
    """A worker that left (recycled or killed): its live gauges go; its counters stay summed."""
    for multiprocess in _multiprocess:
        multiprocess.mark_process_dead(worker.pid)


def on_exit(server) -> None:
    for folder in _created_metrics_dir:
        shutil.rmtree(folder, ignore_errors=True)

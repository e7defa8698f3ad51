"""Gunicorn configuration for the RankOps web process.

Loaded by path (``gunicorn --config /app/platform/gunicorn.conf.py``). This is
a config file, not a module of the project: ``platform/`` must never get an
``__init__.py`` (a package named ``platform`` would shadow the stdlib module).

Environment:
  PORT                  listen port (default 8000); HOST bind address (default 0.0.0.0)
  WEB_CONCURRENCY       worker processes (default 2 * CPUs + 1, capped by WEB_CONCURRENCY_MAX=8)
  GUNICORN_THREADS      threads per worker (default 4)
  GUNICORN_TIMEOUT      seconds before a silent worker is killed (default 60)
  GUNICORN_GRACEFUL_TIMEOUT  seconds to finish requests on shutdown (default 30)
  GUNICORN_KEEPALIVE    keep-alive seconds (default 5; keep below the proxy's idle timeout)
  GUNICORN_MAX_REQUESTS recycle a worker after N requests (default 1000, 0 disables)
  GUNICORN_LOG_LEVEL    default info
  FORWARDED_ALLOW_IPS   proxies trusted for X-Forwarded-* (default 127.0.0.1,::1)
"""

import os


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


bind = [f"{os.environ.get('HOST', '0.0.0.0')}:{_env_int('PORT', 8000)}"]

workers = _env_int("WEB_CONCURRENCY", 0) or min(
    2 * _available_cpus() + 1, _env_int("WEB_CONCURRENCY_MAX", 8)
)
worker_class = "gthread"
threads = _env_int("GUNICORN_THREADS", 4)

timeout = _env_int("GUNICORN_TIMEOUT", 60)
graceful_timeout = _env_int("GUNICORN_GRACEFUL_TIMEOUT", 30)
keepalive = _env_int("GUNICORN_KEEPALIVE", 5)

# Recycle workers periodically to bound memory growth; jitter avoids all
# workers restarting at once.
max_requests = _env_int("GUNICORN_MAX_REQUESTS", 1000)
max_requests_jitter = max(0, max_requests // 10)

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
access_log_format = '%({x-forwarded-for}i)s %(h)s "%(r)s" %(s)s %(B)s %(M)sms "%(f)s" "%(a)s"'

# Don't fork with an open database connection: the app is imported per worker.
preload_app = False
proc_name = "rankops-web"

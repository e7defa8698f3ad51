"""Redis stopped under a running API: answers stay fast and honest, access fails closed, and
everything is back when Redis returns.

A real redis-server of this test's own (a free loopback port, no persistence) is the cache; the
test kills it and starts it again on the same port.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from django.core.cache import cache
from django.http import JsonResponse
from django.urls import include, path
from rest_framework.test import APIClient

from workspaces import access_cache
from workspaces.models import ApiToken, Role
from workspaces.tasks import worker_heartbeat
from workspaces.testing.factories import UserFactory, make_member

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]

REDIS_SERVER = shutil.which("redis-server")
TOKENS = "/api/v1/auth/tokens/"


def cache_reading_view(request):
    """A plain Django view under /api/ (no DRF exception handler) that needs the cache."""
    return JsonResponse({"value": cache.get("some-key")})


urlpatterns = [
    path("api/test/cache-read/", cache_reading_view),
    path("", include("config.urls")),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ThrowawayRedis:
    """A redis-server process on 127.0.0.1:``port`` that a test may kill and start again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, within: float = 15.0) -> None:
        self.process = subprocess.Popen(
            [
                *(REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--loglevel", "notice"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        # Ready when its log says so: read the log (unbuffered) until then, with a deadline.
        deadline = time.monotonic() + within
        seen = b""
        while b"Ready to accept connections" not in seen:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([self.process.stdout], [], [], max(left, 0))
            if not readable:
                raise RuntimeError(f"redis-server not ready within {within} s: {seen[-500:]!r}")
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"redis-server exited: {seen[-500:]!r}")
            seen += chunk

    def kill(self) -> None:
        """Stop it the hard way (a crash, not a shutdown) and wait until it is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    if REDIS_SERVER is None:
        pytest.fail("redis-server is not on PATH; these tests run a real one")
    server = ThrowawayRedis(_free_port())
    server.start()
    yield server
    server.kill()


@pytest.fixture
def cache_on(settings):
    """Point the default cache at a Redis URL with the production cache options."""

    def point(url: str) -> None:
        settings.CACHES = {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": url,
                "KEY_PREFIX": settings.CACHE_KEY_PREFIX,
                "OPTIONS": settings.REDIS_CACHE_OPTIONS,
            }
        }

    return point


def test_the_cache_client_gives_up_within_half_a_second(settings):
    options = settings.REDIS_CACHE_OPTIONS
    assert 0 < options["socket_connect_timeout"] <= 0.5
    assert 0 < options["socket_timeout"] <= 0.5
    # No retries with backoff: one attempt per call (redis-py's pool default).
    assert "retry" not in options and not options.get("retry_on_timeout")


def _assert_unavailable(response) -> None:
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "5"
    body = response.json()
    assert body == {
        "type": "service_unavailable",
        "code": "cache_unavailable",
        "detail": "The cache is unavailable; retry shortly.",
        "attr": None,
        "request_id": response["X-Request-ID"],
    }


def _names(response) -> set[str]:
    assert response.status_code == 200, response.content
    return {token["name"] for token in response.json()["results"]}


def test_redis_stopped_then_back(client_for, workspace, throwaway_redis, cache_on):
    cache_on(throwaway_redis.url)
    member = make_member(workspace, Role.VIEWER)
    client = client_for(member)
    outsider = client_for(UserFactory())
    detail = f"/api/v1/workspaces/{workspace.slug}/"
    assert client.post(TOKENS, {"name": "before"}, format="json").status_code == 201
    assert client.get(detail).status_code == 200
    assert outsider.get(detail).status_code == 404

    # A stale entry in this process that grants the outsider access (as if another process had
    # revoked it and the news had not arrived): served while the shared generation says so...
    with access_cache._lock:
        entries = access_cache._entries
        (granted,) = (v for k, v in entries.items() if k[:2] == ("workspace-access", member.pk))
        (denied,) = (k for k, v in entries.items() if k[0] == "workspace-access" and v is None)
        entries[denied] = granted
    assert outsider.get(detail).status_code == 200

    throwaway_redis.kill()

    # ...but never once the cache is down: every access answer comes from the database.
    assert outsider.get(detail).status_code == 404
    # Reads the database can answer still answer.
    assert client.get(detail).status_code == 200
    assert _names(client.get(TOKENS)) >= {"before", "test"}
    # A change of access that could not reach the other processes is refused, and not written.
    _assert_unavailable(client.post(TOKENS, {"name": "during"}, format="json"))
    assert not ApiToken.objects.filter(name="during").exists()
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["cache"].startswith("error")
    assert client.get("/healthz").status_code == 200

    throwaway_redis.start()

    worker_heartbeat()  # the restarted Redis is empty; a worker would write this within 15 s
    assert client.get("/readyz").status_code == 200
    assert client.post(TOKENS, {"name": "after"}, format="json").status_code == 201
    assert _names(client.get(TOKENS)) >= {"before", "after"}
    assert outsider.get(detail).status_code == 404
    assert client.get(detail).status_code == 200


def test_a_redis_that_accepts_but_never_answers_fails_the_request_not_hangs_it(
    client_for, workspace, cache_on
):
    # A listening socket nobody accepts from: connecting succeeds (the kernel's backlog), every
    # read waits forever. Without the socket timeout this test would hang until its timeout.
    client = client_for(make_member(workspace, Role.VIEWER))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        cache_on(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        _assert_unavailable(client.post(TOKENS, {"name": "during"}, format="json"))
        assert client.get(f"/api/v1/workspaces/{workspace.slug}/").status_code == 200
        assert client.get("/readyz").status_code == 503


@pytest.mark.urls(__name__)
def test_outside_drf_a_dead_cache_also_answers_the_503_envelope(throwaway_redis, cache_on):
    cache_on(throwaway_redis.url)
    client = APIClient(raise_request_exception=False)
    assert client.get("/api/test/cache-read/").json() == {"value": None}
    throwaway_redis.kill()
    _assert_unavailable(client.get("/api/test/cache-read/"))
    throwaway_redis.start()
    assert client.get("/api/test/cache-read/").status_code == 200


def test_the_write_throttle_lets_writes_through_while_the_cache_is_down(
    workspace, throwaway_redis, cache_on
):
    """A producer's push needs the database, not Redis: the rate limiter fails open instead of
    refusing every write with 503 for as long as Redis is down (it refused 15 pushes in 3 s of
    the faults bench's redis_kill)."""
    from rest_framework.test import APIRequestFactory, force_authenticate
    from rest_framework.views import APIView

    from workspaces.api.throttling import WorkspaceWriteThrottle

    cache_on(throwaway_redis.url)
    user = make_member(workspace, Role.DEVELOPER)
    view = APIView()
    view.kwargs = {"ws": workspace.slug}

    def allowed() -> bool:
        request = APIView().initialize_request(APIRequestFactory().post("/x/", {}))
        force_authenticate(request, user=user)
        request.user = user
        return WorkspaceWriteThrottle().allow_request(request, view)

    assert allowed()  # counted in Redis
    throwaway_redis.kill()
    assert allowed()
    throwaway_redis.start()
    assert allowed()

"""Process-local caches for the request hot path, invalidated at once across processes.

Token authentication, workspace access (the caller's guardian permissions) and the feature
registry lookups behind online serving are read on every request but change rarely. Each process
keeps them in memory, tagged with a *generation*: a random value in the shared cache (Redis in
production) that every write to tokens, users, memberships, permissions, workspaces or the feature
registry replaces after its transaction commits. A request reads the generation once; when it
differs from what the process saw, the process drops everything it cached. So a revoked token or
role stops working on the very next request, in every process.

When the shared cache cannot be reached, nothing is served from the process caches (a change
published meanwhile would go unseen): every lookup goes to the database, the source of truth, so
access is never granted because the cache is down. A write that changes access is refused
(``AccessCacheUnavailable``, 503) while the other processes could not be told about it. When the
cache answers again, a process that saw it down publishes a new generation before it caches
anything, so no process keeps an entry from before the outage.
"""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.core.cache import cache
from django.db import transaction

GENERATION_KEY = "access-generation"
MAX_ENTRIES = 20_000
# The generation of a request that could not read the shared one: nothing is cached under it.
UNKNOWN_GENERATION = ""

logger = logging.getLogger(__name__)

T = TypeVar("T")

_lock = threading.Lock()
_entries: dict[Hashable, Any] = {}
_seen_generation: str | None = None
# True from a failed read or publish of the shared generation until a new one is published.
_outage = False
_request = threading.local()


class AccessCacheUnavailable(Exception):
    """The shared cache cannot be reached, so a change of access could not reach every process."""


def current_generation() -> str:
    """The shared generation; read once per request inside ``generation_pinned`` (the
    middleware, and the gateway's entry point that skips the middleware).

    ``UNKNOWN_GENERATION`` when the shared cache cannot be reached (``cached`` then loads every
    value from the database)."""
    pinned = getattr(_request, "generation", None)
    if pinned is not None:
        return pinned
    try:
        if _outage:
            _publish_new_generation()
        value = cache.get(GENERATION_KEY)
        if value is None:
            cache.add(GENERATION_KEY, uuid.uuid4().hex, timeout=None)
            value = cache.get(GENERATION_KEY) or uuid.uuid4().hex
    except Exception as exc:  # noqa: BLE001 - any cache failure: fall back to the database
        _cache_failed(exc)
        return UNKNOWN_GENERATION
    return value


def _cache_failed(exc: Exception) -> None:
    """Forget everything cached: while the generation is unknown, changes may go unseen."""
    global _seen_generation, _outage
    with _lock:
        _entries.clear()
        _seen_generation = None
        first = not _outage
        _outage = True
    if first:
        logger.warning(
            "shared cache unreachable (%s: %s); access lookups go to the database",
            type(exc).__name__,
            exc,
        )


def _publish_new_generation() -> None:
    """Replace the shared generation; raises when the cache cannot be reached."""
    global _outage
    cache.set(GENERATION_KEY, uuid.uuid4().hex, timeout=None)
    if _outage:
        _outage = False
        logger.warning("shared cache reachable again; published a new access generation")


def _publish_after_commit() -> None:
    try:
        _publish_new_generation()
    except Exception as exc:  # noqa: BLE001 - the write has committed; publish on recovery
        _cache_failed(exc)


def invalidate() -> None:
    """Drop every process's cached access data once the current transaction commits.

    Raises ``AccessCacheUnavailable`` (and so rolls the write back) when the shared cache cannot
    be reached now: other processes would keep serving the old access."""
    with _lock:
        _entries.clear()
    refusal = "The shared cache is unavailable; access changes are refused until it is back."
    if getattr(_request, "generation", None) == UNKNOWN_GENERATION:
        raise AccessCacheUnavailable(refusal)  # this request found it down already: no new wait
    try:
        cache.get(GENERATION_KEY)
    except Exception as exc:
        _cache_failed(exc)
        raise AccessCacheUnavailable(refusal) from exc
    transaction.on_commit(_publish_after_commit)


def cached(key: Hashable, loader: Callable[[], T]) -> T:
    """The value for ``key`` from this process's cache, loading it when absent or stale.

    While the shared generation is unknown, the value is loaded every time and not kept."""
    global _seen_generation
    generation = current_generation()
    if generation == UNKNOWN_GENERATION:
        return loader()
    with _lock:
        if generation != _seen_generation:
            _entries.clear()
            _seen_generation = generation
        if key in _entries:
            return _entries[key]
    value = loader()
    with _lock:
        if generation == _seen_generation:
            if len(_entries) >= MAX_ENTRIES:
                _entries.clear()
            _entries[key] = value
    return value


def private_copy(instance: T) -> T:
    """A shallow copy of a cached model instance, so a request can never mutate the shared one."""
    return copy.copy(instance)


@contextmanager
def generation_pinned() -> Iterator[None]:
    """Read the shared generation once and use it for every lookup inside the block (one
    request): the middleware below, and the gateway's entry point that skips the middleware."""
    _request.generation = None
    _request.generation = current_generation()
    try:
        yield
    finally:
        _request.generation = None


class AccessGenerationMiddleware:
    """Read the access generation once per request instead of once per cached lookup."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        with generation_pinned():
            return self.get_response(request)


def peek(key: Hashable) -> tuple[str | None, Any]:
    """(generation, value) of a cached entry without reading the shared generation, for a hot
    path that checks the generation itself in the same round trip as its own read (the online
    lookup fast path does it inside its Redis script). The generation is read before the entry,
    so an entry is never paired with a newer generation than the one it was cached under."""
    generation = _seen_generation
    return generation, _entries.get(key)

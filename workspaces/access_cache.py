"""Process-local caches for the request hot path, invalidated at once across processes.

Token authentication, workspace access (the caller's guardian permissions) and the feature
registry lookups behind online serving are read on every request but change rarely. Each process
keeps them in memory, tagged with a *generation*: a random value in the shared cache (Redis in
production) that every write to tokens, users, memberships, permissions, workspaces or the feature
registry replaces after its transaction commits. A request reads the generation once; when it
differs from what the process saw, the process drops everything it cached. So a revoked token or
role stops working on the very next request, in every process.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from django.core.cache import cache
from django.db import transaction

GENERATION_KEY = "access-generation"
MAX_ENTRIES = 20_000

T = TypeVar("T")

_lock = threading.Lock()
_entries: dict[Hashable, Any] = {}
_seen_generation: str | None = None
_request = threading.local()


def current_generation() -> str:
    """The shared generation; read once per request when the middleware is installed."""
    pinned = getattr(_request, "generation", None)
    if pinned is not None:
        return pinned
    value = cache.get(GENERATION_KEY)
    if value is None:
        cache.add(GENERATION_KEY, uuid.uuid4().hex, timeout=None)
        value = cache.get(GENERATION_KEY) or uuid.uuid4().hex
    return value


def _publish_new_generation() -> None:
    cache.set(GENERATION_KEY, uuid.uuid4().hex, timeout=None)


def invalidate() -> None:
    """Drop every process's cached access data once the current transaction commits."""
    with _lock:
        _entries.clear()
    transaction.on_commit(_publish_new_generation)


def cached(key: Hashable, loader: Callable[[], T]) -> T:
    """The value for ``key`` from this process's cache, loading it when absent or stale."""
    global _seen_generation
    generation = current_generation()
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


class AccessGenerationMiddleware:
    """Read the access generation once per request instead of once per cached lookup."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        _request.generation = None
        _request.generation = current_generation()
        try:
            return self.get_response(request)
        finally:
            _request.generation = None


def peek(key: Hashable) -> tuple[str | None, Any]:
    """(generation, value) of a cached entry without reading the shared generation, for a hot
    path that checks the generation itself in the same round trip as its own read (the online
    lookup fast path does it inside its Redis script). The generation is read before the entry,
    so an entry is never paired with a newer generation than the one it was cached under."""
    generation = _seen_generation
    return generation, _entries.get(key)

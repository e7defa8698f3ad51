"""Waiting in tests for something another thread or process does: poll a condition with a
bounded deadline, never sleep a fixed time and hope (CONVENTIONS.md, point 8)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds
    pass (the test fails naming ``what``). Exceptions in ``retry_on`` (SQLite's "table locked"
    while a worker writes, a server not listening yet) count as not yet.

    The deadline only bounds a wait: how long the wait took is never asserted (timings are the
    benchmarks' business, in ``bench/``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except retry_on:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)

"""A real Celery worker for a test: Celery's own embedded worker (``celery.contrib.testing``'s
``start_worker``: a thread of the test process, the solo pool, the configured broker), with the
two things stock ``start_worker`` leaves to its caller done once for every test that needs one.

1. **Each worker drains its own connection** (``use_eventloop=False``, Celery's synchronous
   loop). With the Redis broker Celery runs its event loop on kombu's hub, which is one per
   process: two embedded workers of one test (two nodes, ``training.tests.workers``) shared it,
   the first one to stop closed the other's poller, and on CI's loaded PostgreSQL and Redis run
   the other worker's thread never exited (``test_tuning_worker``, 120 s). The filesystem broker
   (the embedded defaults) has no event loop: it always ran this way.
2. **The process-wide stop flag is reset even when a worker's thread does not exit.** Stock
   ``start_worker`` raises before it resets ``celery.worker.state.should_terminate``, so every
   later embedded worker of the session stopped before it was ready and its test hung in
   ``ensure_started`` until the test timeout: in that CI run one stuck worker cost six more
   failures and half an hour. The failure here names what the stuck thread was doing (its
   stack), so the next one says why."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class WorkerDidNotStop(RuntimeError):
    """An embedded worker's thread outlived its shutdown timeout; ``threads``: those still
    alive (they stop with the next embedded worker's stop, or the test process)."""

    threads: list[threading.Thread]


@contextmanager
def embedded_worker(
    queues: Sequence[str], *, shutdown_timeout: float = 120.0, **options: Any
) -> Iterator[Any]:
    """A started worker consuming ``queues`` (yields Celery's ``TestWorkController``); stopped
    on leaving, within ``shutdown_timeout`` seconds (the task it runs must end first: an agent
    stopping a cancelled child; Celery's 10 s default is missed on a loaded machine)."""
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state

    from config.celery import app

    before = set(threading.enumerate())
    started: set[threading.Thread] = set()
    try:
        with start_worker(
            app,
            pool="solo",
            perform_ping_check=False,
            shutdown_timeout=shutdown_timeout,
            queues=list(queues),
            use_eventloop=False,
            **options,
        ) as worker:
            started = set(threading.enumerate()) - before
            yield worker
    except RuntimeError as exc:
        stuck = [t for t in started if t.is_alive()]
        if not stuck or "failed to exit" not in str(exc):
            raise
        frames = sys._current_frames()
        stacks = "\n".join(
            f"thread {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
            for t in stuck
            if t.ident in frames
        )
        error = WorkerDidNotStop(
            f"the worker on {', '.join(queues)} did not stop within {shutdown_timeout:g} s; "
            f"what its threads were doing:\n{stacks}"
        )
        error.threads = stuck
        raise error from exc
    finally:
        state.should_terminate = None

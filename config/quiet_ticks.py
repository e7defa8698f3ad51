"""Keep an idle platform's worker log quiet.

Beat sends its frequent periodic tasks ("ticks": the prediction-log flush every 2 s, the
scheduler every 5 s, ...) all day. At INFO, Celery writes three lines for each one (beat's
"Sending due task", the worker's "received" and "succeeded"), about 180 lines a minute on a
platform that does nothing. ``QuietTicksFilter`` drops exactly those INFO lines for the ticks;
warnings, errors, retries and every other task's lines stay. ``log_tick_work`` (connected to
``task_postrun`` in ``config/celery.py``) then writes one line when a tick did something, so the
log still shows the work and never the idling.

Imported by the logging configuration in ``config/settings.py``: no Django import at module level.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from functools import cache
from typing import Any

# Beat entries that run at least this often are ticks; rarer ones (the hourly audit scan) keep
# their "Sending due task" line.
TICK_MAX_INTERVAL_SECONDS = 300.0
# Celery's own messages (celery.beat, celery.app.trace, celery.worker.strategy).
BEAT_SENDING = "Scheduler: Sending due task"
TASK_LINES = ("Task %(name)s[%(id)s] received", "Task %(name)s[%(id)s] succeeded in ")

logger = logging.getLogger("config.ticks")


def _interval_seconds(schedule: Any) -> float | None:
    if isinstance(schedule, bool):
        return None
    if isinstance(schedule, (int, float)):
        return float(schedule)
    if isinstance(schedule, timedelta):
        return schedule.total_seconds()
    run_every = getattr(schedule, "run_every", None)  # celery.schedules.schedule
    return run_every.total_seconds() if isinstance(run_every, timedelta) else None


@cache
def ticks() -> tuple[frozenset[str], frozenset[str]]:
    """(beat entry names, task names) of the periodic tasks that run at least every
    ``TICK_MAX_INTERVAL_SECONDS``; crontab entries are never ticks."""
    from django.conf import settings

    entries, tasks = set(), set()
    for name, entry in getattr(settings, "CELERY_BEAT_SCHEDULE", {}).items():
        seconds = _interval_seconds(entry.get("schedule"))
        if seconds is not None and seconds <= TICK_MAX_INTERVAL_SECONDS:
            entries.add(name)
            tasks.add(entry["task"])
    return frozenset(entries), frozenset(tasks)


class QuietTicksFilter(logging.Filter):
    """Drops Celery's INFO lines about ticks: beat sending one, a worker receiving one, a worker
    finishing one. Attached to the ``celery.beat``, ``celery.worker.strategy`` and
    ``celery.app.trace`` loggers by ``LOGGING``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not isinstance(record.msg, str):
            return True
        entries, tasks = ticks()
        if record.msg.startswith(BEAT_SENDING):
            args = record.args if isinstance(record.args, tuple) else ()
            return not (args and args[0] in entries)
        if record.msg.startswith(TASK_LINES) and isinstance(record.args, Mapping):
            return record.args.get("name") not in tasks
        return True


def did_work(value: Any) -> bool:
    """Whether a tick's return value reports work: a non-zero count somewhere in it. Strings
    (the heartbeat's timestamp), None, zeros, empty containers and ``skipped`` markers do not."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, Mapping):
        return any(did_work(v) for k, v in value.items() if k != "skipped")
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(did_work(v) for v in value)
    return False


def log_tick_work(sender: Any = None, retval: Any = None, state: str | None = None, **_: Any):
    """``task_postrun`` receiver: one INFO line for a tick that did something (its result)."""
    name = getattr(sender, "name", None)
    if state == "SUCCESS" and name in ticks()[1] and did_work(retval):
        logger.info("%s: %s", name, retval)

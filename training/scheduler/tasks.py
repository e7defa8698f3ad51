"""Celery tasks of the scheduler: the tick (beat every few seconds and on submit) and the
reconciler (lost nodes, cordons, lending windows, requeue of preempted jobs)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

logger = logging.getLogger(__name__)

SCHEDULER_QUEUE = getattr(settings, "SCHEDULER_QUEUE", "celery")


@shared_task(ignore_result=True)
def tick(limit: int = 100) -> dict:
    from django.db import OperationalError

    from training.scheduler.tick import schedule_tick

    try:
        return schedule_tick(limit=limit)
    except OperationalError as exc:
        # SQLite ("database is locked") when another process writes: the beat tick retries in
        # a few seconds; each step of a tick commits whole or not at all.
        logger.warning("scheduler tick skipped: %s", exc)
        return {"skipped": str(exc)}


@shared_task(ignore_result=True)
def reconcile() -> dict:
    from training.scheduler.failover import reconcile as run

    result = run()
    if result.get("requeued"):
        request_tick()
    return result


def request_tick() -> None:
    """Ask for a tick soon (called on job creation and after requeues); never raises, so that a
    broker hiccup does not fail a submission: the beat tick catches up within seconds."""
    try:
        tick.apply_async(queue=SCHEDULER_QUEUE)
    except Exception:
        logger.warning("could not enqueue a scheduler tick", exc_info=True)

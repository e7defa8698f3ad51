"""Celery tasks of data building: thin, by id, idempotent."""

from __future__ import annotations

from celery import shared_task

from curation import services


@shared_task(
    name="curation.tasks.pipeline_build",
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def pipeline_build_task(record_set_id: int) -> str | None:
    """Build one record set that is still ``building``; a redelivery of a finished one does
    nothing."""
    record_set = services.pipeline_build(int(record_set_id))
    return record_set.status if record_set is not None else None

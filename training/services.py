"""Training writes. ``job_transition`` is the only function that changes a job's ``state``."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from training.models import JOB_MOVES, TERMINAL_STATES, JobState, TrainingJob
from workspaces.events import Ref, event_record
from workspaces.exceptions import ConflictError


@transaction.atomic
def job_transition(
    *,
    job: TrainingJob,
    to: str,
    actor=None,
    reason: str = "",
    expect: str | set[str] | None = None,
    resources: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
    **fields: Any,
) -> TrainingJob:
    """Move ``job`` to state ``to`` (locking its row), set ``fields`` and record the event.

    ``expect`` guards against races: the move happens only if the locked row is still in that
    state (or one of those states); otherwise ``ConflictError``. Illegal moves raise too.
    The event verb is ``training.job.<to>`` with the job as subject and its dataset as input.
    """
    locked = TrainingJob.objects.unscoped().select_for_update().get(pk=job.pk)
    if expect is not None:
        allowed = {expect} if isinstance(expect, str) else set(expect)
        if locked.state not in allowed:
            raise ConflictError(
                f"job {locked.pk} is {locked.state}, not {'/'.join(sorted(allowed))}", attr="state"
            )
    if to not in JOB_MOVES[locked.state]:
        raise ConflictError(
            f"job {locked.pk} cannot move from {locked.state} to {to}", attr="state"
        )
    now = timezone.now()
    locked.state = to
    locked.state_reason = reason[:500]
    if to == JobState.RUNNING and locked.started_at is None:
        locked.started_at = now
    if to in TERMINAL_STATES:
        locked.finished_at = now
    for name, value in fields.items():
        setattr(locked, name, value)
    locked.save()
    refs = [Ref.to(locked)]
    if locked.dataset_id:
        refs.append(Ref.to(locked.dataset, role="input"))
    if locked.node_id:
        refs.append(Ref.to(locked.node, role="related"))
    event_record(
        actor=actor,
        workspace=locked.workspace,
        verb=f"training.job.{to}",
        refs=refs,
        resources=resources,
        payload={"reason": reason, **(payload or {})},
    )
    # Keep the caller's instance in step with the row.
    for field in locked._meta.concrete_fields:
        setattr(job, field.attname, getattr(locked, field.attname))
    return job

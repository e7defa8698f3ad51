"""Celery tasks of the experiments app: thin, idempotent, taking ids. Beat runs
``check_running`` every minute (experiments/conf.py): each running experiment gets a snapshot,
is stopped on an SRM or guardrail breach, and ramps when its next step is due."""

from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache

from experiments import services
from experiments.models import Experiment, ExperimentState

logger = logging.getLogger(__name__)

CHECK_LOCK_KEY = "experiments:check-running:running"
LOCK_SECONDS = 10 * 60


@shared_task(name="experiments.tasks.check_running", ignore_result=True)
def check_running() -> dict[str, int]:
    """Check every running experiment; overlapping runs skip themselves."""
    if not cache.add(CHECK_LOCK_KEY, "1", timeout=LOCK_SECONDS):
        return {"skipped": 1}
    try:
        counts: dict[str, int] = {}
        ids = list(
            Experiment.objects.unscoped()
            .filter(state=ExperimentState.RUNNING)
            .values_list("pk", flat=True)
        )
        for pk in ids:
            outcome = check_experiment(pk)
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts
    finally:
        cache.delete(CHECK_LOCK_KEY)


@shared_task(name="experiments.tasks.check_experiment", ignore_result=True)
def check_experiment(experiment_id: int) -> str:
    exp = (
        Experiment.objects.unscoped()
        .filter(pk=experiment_id)
        .select_related("workspace", "deployment", "layer", "owner")
        .first()
    )
    if exp is None:
        return "missing"
    try:
        return services.experiment_check(experiment=exp)
    except Exception:  # one broken experiment must not stop the others' guardrails
        logger.exception("experiment check failed: %s", exp.key)
        return "failed"

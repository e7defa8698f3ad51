"""Resource recommendation from recorded peaks, and its opt-in use at admission."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from training.models import JobState, PriorityClass, TrainingJob
from training.scheduler.recommend import HEADROOM, recommend
from training.scheduler.tests.factories import make_job, make_node
from training.scheduler.tick import schedule_tick

pytestmark = pytest.mark.django_db


def past_job(workspace, cpu_peak, mem_peak, *, cpu=8000, mem=16384, hours=2.0, **extra):
    now = timezone.now()
    return make_job(
        workspace,
        state=JobState.SUCCEEDED,
        cpu_milli=cpu,
        memory_mb=mem,
        usage={"cpu_peak_milli": cpu_peak, "memory_peak_mb": mem_peak},
        started_at=now - timedelta(hours=hours),
        finished_at=now,
        **extra,
    )


def test_recommendation_is_within_peak_plus_headroom(workspace):
    past_job(workspace, 1500, 2000)
    past_job(workspace, 1800, 2600)
    past_job(workspace, 9999, 99999, template="two_tower")  # another template: ignored
    rec = recommend(workspace=workspace, template="logreg", dataset=None)
    assert rec["based_on_jobs"] == 2
    assert 1800 <= rec["cpu_milli"] <= 1800 * (1 + HEADROOM) + 100
    assert 2600 <= rec["memory_mb"] <= 2600 * (1 + HEADROOM) + 64
    saved = rec["savings"]
    assert saved["cpu_core_hours_requested"] == pytest.approx(32, rel=0.01)
    assert saved["cpu_core_hours_saved"] == pytest.approx(32 - 2 * 2 * 2.3, rel=0.01)
    assert 0 < saved["memory_saved_share"] < 1


def test_no_history_says_so(workspace):
    rec = recommend(workspace=workspace, template="logreg", dataset=None)
    assert rec["based_on_jobs"] == 0


def test_opt_in_applies_it_to_exploration_jobs_at_admission(workspace):
    make_node(gpus=0, cpu_milli=64000, memory_mb=262144)
    past_job(workspace, 1500, 2000)
    opted = make_job(
        workspace,
        priority_class=PriorityClass.EXPLORATION,
        cpu_milli=8000,
        memory_mb=16384,
        params={"scheduler": {"auto_recommend": True}},
    )
    plain = make_job(workspace, priority_class=PriorityClass.EXPLORATION, cpu_milli=8000)
    schedule_tick()
    opted = TrainingJob.objects.unscoped().get(pk=opted.pk)
    assert opted.cpu_milli == 1900 and opted.memory_mb == 2560
    assert opted.scheduling.recommendation["applied"]
    assert TrainingJob.objects.unscoped().get(pk=plain.pk).cpu_milli == 8000

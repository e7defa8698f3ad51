"""An idle platform's worker log is quiet: beat's frequent periodic tasks ("ticks") leave no INFO
line unless they did something (config/quiet_ticks.py and the LOGGING filters)."""

from __future__ import annotations

import logging

import pytest
from celery import beat
from django.conf import settings

from config.celery import app as celery_app
from config.quiet_ticks import did_work, ticks
from features.tests.factories import make_group


def _info_lines(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.INFO]


def test_the_two_second_flush_and_the_scheduler_are_ticks_and_the_hourly_scan_is_not():
    entries, tasks = ticks()
    assert settings.CELERY_BEAT_SCHEDULE["serving-predlog-flush"]["schedule"] == 2.0
    assert {"serving-predlog-flush", "scheduler-tick", "worker-heartbeat"} <= entries
    assert {"serving.predlog_flush", "training.scheduler.tasks.tick"} <= tasks
    assert "lineage-audit-scan" not in entries


def test_beat_does_not_announce_frequent_ticks_at_info(caplog, monkeypatch):
    scheduler = beat.Scheduler(celery_app, lazy=True)
    sent = []
    monkeypatch.setattr(scheduler, "apply_async", lambda entry, **kwargs: sent.append(entry.name))
    with caplog.at_level(logging.INFO):
        for name in ("serving-predlog-flush", "scheduler-tick", "lineage-audit-scan"):
            spec = settings.CELERY_BEAT_SCHEDULE[name]
            entry = scheduler.Entry(
                name=name, task=spec["task"], schedule=spec["schedule"], app=celery_app
            )
            scheduler.apply_entry(entry)
    assert sent == ["serving-predlog-flush", "scheduler-tick", "lineage-audit-scan"]
    assert _info_lines(caplog) == [
        "celery.beat: Scheduler: Sending due task lineage-audit-scan (lineage.tasks.audit_scan)"
    ]


@pytest.mark.django_db
def test_every_tick_on_an_idle_platform_logs_nothing_at_info(workspace, caplog):
    _entries, tasks = ticks()
    celery_app.loader.import_default_modules()  # the worker's task autodiscovery
    # Run through Celery's tracer (eagerly), as a worker would: its "succeeded" line included.
    with caplog.at_level(logging.INFO):
        for name in sorted(tasks):
            result = celery_app.tasks[name].apply()
            assert result.successful(), (name, result.traceback)
    assert _info_lines(caplog) == []


@pytest.mark.django_db
def test_a_tick_that_did_something_says_so_in_one_line(workspace, caplog):
    make_group(workspace, name="checked_group", status="active")
    with caplog.at_level(logging.INFO):
        result = celery_app.tasks["features.tasks.health_check_all"].apply()
    assert result.get() == {"checked": 1, "broken": 0, "failed": 0}
    assert _info_lines(caplog) == [
        "config.ticks: features.tasks.health_check_all: {'checked': 1, 'broken': 0, 'failed': 0}"
    ]


@pytest.mark.parametrize(
    ("value", "worked"),
    [
        (None, False),
        (0, False),
        ("2026-12-01T12:00:00+00:00", False),
        ({"placed": 0, "preempted": 0}, False),
        ({"skipped": 1}, False),
        ([], False),
        (3, True),
        ({"placed": 0, "requeued": [7]}, True),
        ({"groups": 1, "rows_written": 0}, True),
    ],
)
def test_did_work_reads_a_non_zero_count_anywhere_in_the_result(value, worked):
    assert did_work(value) is worked

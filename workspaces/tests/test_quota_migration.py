"""The migration that folded the old, unenforced ``workspaces.Quota`` into the one quota."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from workspaces.quota import limits_from_units

migration = importlib.import_module("workspaces.migrations.0006_one_quota")


def test_limits_someone_set_are_carried_over_in_the_quotas_units():
    old = {"cpu_cores": "8.5", "memory_gb": "32", "gpus": "1.5", "storage_gb": "250"}
    assert migration.folded_limits(old, None) == {
        "cpu_milli": 8500,
        "memory_mb": 32768,
        "gpu_milli": 1500,
        "storage_gb": 250,
    }
    assert limits_from_units(cpu_cores=8.5, memory_gb=32, gpus=1.5, storage_gb=250) == (
        migration.folded_limits(old, None)
    )


def test_untouched_defaults_are_not_carried_and_enforced_limits_win():
    defaults = {"cpu_cores": 16, "memory_gb": 64, "gpus": 0, "storage_gb": 100}
    assert migration.folded_limits(defaults, None) is None  # nobody chose them: stay unlimited
    enforced = {"cpu_milli": 1000, "memory_mb": 2048, "gpu_milli": 500, "storage_gb": None}
    old = {"cpu_cores": 4, "memory_gb": 8, "gpus": 2, "storage_gb": 50}
    assert migration.folded_limits(old, enforced) == {**enforced, "storage_gb": 50}


@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_old_rows_into_the_one_quota():
    before = [("workspaces", "0005_task_slot")]
    after = [("workspaces", "0006_one_quota"), ("scheduler", "0004_workspacequota_moved")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old_apps = executor.loader.project_state(before).apps
        Workspace = old_apps.get_model("workspaces", "Workspace")
        Quota = old_apps.get_model("workspaces", "Quota")
        set_by_hand = Workspace.objects.create(
            slug="tuned", name="t", scene="tuned", prediction_type="pctr", template={}
        )
        untouched = Workspace.objects.create(
            slug="plain", name="p", scene="plain", prediction_type="pctr", template={}
        )
        Quota.objects.create(workspace=set_by_hand, cpu_cores=4, memory_gb=8, gpus=2)
        Quota.objects.create(workspace=untouched)  # the old defaults
        executor = MigrationExecutor(connection)
        executor.migrate(after)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    new_apps = executor.loader.project_state(after).apps
    WorkspaceQuota = new_apps.get_model("workspaces", "WorkspaceQuota")
    rows = list(
        WorkspaceQuota.objects.values_list(
            "workspace__slug", "gpu_type", "cpu_milli", "memory_mb", "gpu_milli", "storage_gb"
        )
    )
    assert rows == [("tuned", "", 4000, 8192, 2000, 100)]

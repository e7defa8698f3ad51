"""One quota: the scheduler's ``WorkspaceQuota`` moves into ``workspaces`` (same table), gains
``storage_gb``, takes over the limits someone set on the old ``workspaces.Quota``, and that
unenforced model (with its always-zero ``*_used`` columns) is dropped.

The table keeps its name (``scheduler_workspacequota``): only the state moves here
(``SeparateDatabaseAndState``; ``scheduler.0004`` drops it from the scheduler's state).

Carrying the old limits over: cores x 1000 -> ``cpu_milli``, GiB x 1024 -> ``memory_mb``,
GPUs x 1000 -> ``gpu_milli``, ``storage_gb`` as is, onto the all-types row. A row still at the
old defaults (16 cores, 64 GiB, 0 GPUs, 100 GB: what every workspace got at creation) was never
chosen by anyone and never enforced; carrying it over would suddenly flag every GPU job of that
workspace as over quota, so it is not copied (the workspace stays unlimited, as admission treated
it). Where an enforced all-types row already exists, its CPU, memory and GPU limits win (they are
what admission used) and only the storage limit is taken from the old row.
"""

from decimal import ROUND_HALF_UP, Decimal

import django.db.models.deletion
from django.db import migrations, models

OLD_DEFAULTS = {"cpu_cores": 16, "memory_gb": 64, "gpus": 0, "storage_gb": 100}


def _scaled(value, factor: int) -> int:
    return int((Decimal(str(value)) * factor).to_integral_value(rounding=ROUND_HALF_UP))


def folded_limits(old: dict, existing: dict | None) -> dict | None:
    """The all-types quota row's limits after folding in the old quota ``old`` (cpu_cores,
    memory_gb, gpus, storage_gb); ``existing``: the enforced row's limits, if any. ``None``:
    nothing to write."""
    if all(Decimal(str(old[k])) == Decimal(str(v)) for k, v in OLD_DEFAULTS.items()):
        return None
    carried = {
        "cpu_milli": _scaled(old["cpu_cores"], 1000),
        "memory_mb": _scaled(old["memory_gb"], 1024),
        "gpu_milli": _scaled(old["gpus"], 1000),
        "storage_gb": _scaled(old["storage_gb"], 1),
    }
    if existing is None:
        return carried
    return {**existing, "storage_gb": carried["storage_gb"]}


def carry_over(apps, schema_editor) -> None:
    Quota = apps.get_model("workspaces", "Quota")
    WorkspaceQuota = apps.get_model("workspaces", "WorkspaceQuota")
    manager = WorkspaceQuota._base_manager
    for old in Quota._base_manager.all().iterator():
        row = manager.filter(workspace_id=old.workspace_id, gpu_type="").first()
        existing = (
            None
            if row is None
            else {
                "cpu_milli": row.cpu_milli,
                "memory_mb": row.memory_mb,
                "gpu_milli": row.gpu_milli,
                "storage_gb": row.storage_gb,
            }
        )
        limits = folded_limits(
            {
                "cpu_cores": old.cpu_cores,
                "memory_gb": old.memory_gb,
                "gpus": old.gpus,
                "storage_gb": old.storage_gb,
            },
            existing,
        )
        if limits is None:
            continue
        if row is None:
            manager.create(workspace_id=old.workspace_id, gpu_type="", **limits)
        else:
            for name, value in limits.items():
                setattr(row, name, value)
            row.save()


class Migration(migrations.Migration):
    dependencies = [
        ("workspaces", "0005_task_slot"),
        ("scheduler", "0003_managednode"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="WorkspaceQuota",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "gpu_type",
                            models.CharField(
                                blank=True, help_text="Blank: all GPU types.", max_length=40
                            ),
                        ),
                        (
                            "cpu_milli",
                            models.PositiveIntegerField(
                                blank=True, help_text="Blank: unlimited.", null=True
                            ),
                        ),
                        (
                            "memory_mb",
                            models.PositiveIntegerField(
                                blank=True, help_text="Blank: unlimited.", null=True
                            ),
                        ),
                        (
                            "gpu_milli",
                            models.PositiveIntegerField(
                                blank=True,
                                help_text="Whole and fractional GPUs in milli-GPU; blank: unlimited.",
                                null=True,
                            ),
                        ),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        (
                            "workspace",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="workspaces.workspace",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "scheduler_workspacequota",
                        "ordering": ["workspace_id", "gpu_type"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("workspace", "gpu_type"), name="scheduler_quota_unique"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name="workspacequota",
            name="storage_gb",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Stored feature batches, in GB; all-types row only. Blank: unlimited.",
                null=True,
            ),
        ),
        migrations.RunPython(carry_over, migrations.RunPython.noop),
        migrations.DeleteModel(name="Quota"),
    ]

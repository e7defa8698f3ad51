# The desired state of a deployment (its generation) and what its controller observed.

import django.db.models.deletion
from django.db import migrations, models


def statuses_from_old_fields(apps, schema_editor):
    """One status row per existing deployment, Pending at generation 0 (the controller takes it
    up on its first resync), keeping what the old in-request apply had reported."""
    Deployment = apps.get_model("serving", "Deployment")
    DeploymentStatus = apps.get_model("serving", "DeploymentStatus")
    DeploymentStatus.objects.bulk_create(
        DeploymentStatus(
            workspace_id=dep.workspace_id,
            deployment_id=dep.pk,
            detail=dep.status_detail or {},
            manifest=dep.manifest or "",
        )
        for dep in Deployment.objects.all().iterator()
    )


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0002_loop_fields"),
        ("workspaces", "0006_one_quota"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="generation",
            field=models.PositiveBigIntegerField(
                default=1,
                help_text="Bumped by every change of the desired state (version, replicas, scaling, state); the controller reports which generation it last made so.",
            ),
        ),
        migrations.CreateModel(
            name="DeploymentStatus",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "observed_generation",
                    models.PositiveBigIntegerField(
                        default=0,
                        help_text="The desired-state generation the controller last acted on.",
                    ),
                ),
                (
                    "phase",
                    models.CharField(
                        choices=[
                            (
                                "Pending",
                                "Pending: the controller has not taken up this generation yet",
                            ),
                            ("Progressing", "Progressing: the backend is being made to match"),
                            ("Ready", "Ready: the backend serves the desired state"),
                            ("Failed", "Failed: the last attempt failed (retried by the resync)"),
                            ("Stopped", "Stopped: every replica is gone, as desired"),
                        ],
                        default="Pending",
                        max_length=12,
                    ),
                ),
                ("message", models.CharField(blank=True, max_length=500)),
                ("ready_replicas", models.PositiveIntegerField(default=0)),
                (
                    "failures",
                    models.PositiveIntegerField(
                        default=0,
                        help_text="Consecutive failed attempts (0 once an attempt succeeds).",
                    ),
                ),
                (
                    "detail",
                    models.JSONField(
                        blank=True, default=dict, help_text="The backend's own report."
                    ),
                ),
                (
                    "manifest",
                    models.TextField(blank=True, help_text="The Kubernetes objects last applied."),
                ),
                ("last_transition_at", models.DateTimeField(blank=True, null=True)),
                ("reconciled_at", models.DateTimeField(blank=True, null=True)),
                (
                    "deployment",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="observed",
                        to="serving.deployment",
                    ),
                ),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="workspaces.workspace",
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "deployment statuses",
            },
        ),
        migrations.RunPython(statuses_from_old_fields, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name="deployment",
            name="manifest",
        ),
        migrations.RemoveField(
            model_name="deployment",
            name="status_detail",
        ),
    ]

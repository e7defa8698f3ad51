"""The event log as the outbox: consumer cursors and their gaps, the webhook delivery log, and
e-mail retry fields on notifications.

The cursors of the consumers whose effects already happened for past events (notifications were
delivered at commit, OpenLineage was sent by the projection) start after the newest event, so
nothing is sent again; the online materialisation consumer starts at the beginning, which writes
any batch still waiting for the online store and passes the rest (already written) cheaply.
"""

import django.db.models.deletion
from django.db import migrations, models

START_AT_LATEST = ("notifications", "lineage.openlineage")


def place_cursors(apps, schema_editor):
    Event = apps.get_model("workspaces", "Event")
    ConsumerCursor = apps.get_model("workspaces", "ConsumerCursor")
    newest = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
    for name in START_AT_LATEST:
        ConsumerCursor.objects.get_or_create(name=name, defaults={"last_event_id": newest})


class Migration(migrations.Migration):
    dependencies = [
        ("workspaces", "0006_one_quota"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConsumerCursor",
            fields=[
                ("name", models.CharField(max_length=60, primary_key=True, serialize=False)),
                ("last_event_id", models.BigIntegerField(default=0)),
                ("has_gaps", models.BooleanField(default=False)),
                (
                    "failures",
                    models.PositiveIntegerField(
                        default=0,
                        help_text="Runs in a row whose handler failed on the event after the cursor.",
                    ),
                ),
                ("last_error", models.TextField(blank=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.AddField(
            model_name="notification",
            name="email_attempts",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="notification",
            name="email_error",
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name="notification",
            name="email_next_attempt_at",
            field=models.DateTimeField(blank=True, db_index=True, null=True),
        ),
        migrations.AlterField(
            model_name="notification",
            name="delivered_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When its e-mail was sent (or found not needed: the recipient has no address).",
                null=True,
            ),
        ),
        migrations.CreateModel(
            name="ConsumerGap",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("event_id", models.BigIntegerField()),
                ("seen_at", models.DateTimeField()),
                (
                    "cursor",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="gaps",
                        to="workspaces.consumercursor",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("cursor", "event_id"), name="consumergap_unique"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="WebhookDelivery",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("event_id", models.BigIntegerField(db_index=True)),
                ("attempt", models.PositiveSmallIntegerField(default=1)),
                ("payload", models.JSONField(default=dict, editable=False)),
                ("next_attempt_at", models.DateTimeField(help_text="When this attempt is due.")),
                ("claimed_until", models.DateTimeField(blank=True, editable=False, null=True)),
                ("attempted_at", models.DateTimeField(blank=True, null=True)),
                ("status_code", models.PositiveIntegerField(blank=True, null=True)),
                ("error", models.TextField(blank=True)),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                ("notification_id", models.BigIntegerField(blank=True, null=True)),
                (
                    "webhook",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries",
                        to="workspaces.webhookendpoint",
                    ),
                ),
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
                "verbose_name_plural": "webhook deliveries",
                "ordering": ["-id"],
                "indexes": [
                    models.Index(
                        fields=["attempted_at", "next_attempt_at"], name="webhookdelivery_due"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("webhook", "event_id", "notification_id", "attempt"),
                        name="webhookdelivery_one_attempt",
                    )
                ],
            },
        ),
        migrations.RunPython(place_cursors, migrations.RunPython.noop),
    ]

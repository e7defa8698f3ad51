"""``WorkspaceQuota`` now belongs to ``workspaces`` (``workspaces.0006_one_quota``): the model
leaves the scheduler's state; its table stays, owned by the new state."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0003_managednode"),
        ("workspaces", "0006_one_quota"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="WorkspaceQuota")],
            database_operations=[],
        ),
    ]

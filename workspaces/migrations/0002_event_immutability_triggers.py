"""Database-level guard: on PostgreSQL, UPDATE and DELETE on the event log raise.

The ORM already refuses; this catches raw SQL and other clients too. TRUNCATE (used by test
flushes and explicit maintenance) is not a row-level operation and stays possible for operators.
"""

from django.db import migrations

TABLES = ("workspaces_event", "workspaces_eventref")

CREATE_FUNCTION = """
CREATE OR REPLACE FUNCTION rankops_refuse_event_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the event log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(CREATE_FUNCTION, params=None)
    for table in TABLES:
        schema_editor.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION rankops_refuse_event_change();"
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};")
    schema_editor.execute("DROP FUNCTION IF EXISTS rankops_refuse_event_change();")


class Migration(migrations.Migration):
    dependencies = [("workspaces", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]

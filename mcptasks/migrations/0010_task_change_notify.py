"""A NOTIFY for every committed change of what a poll reads, for the tasks a
poll snapshot may keep (Postgres only).

The web processes' poll snapshots (``mcptasks.tasks.poll_snapshot``) drop a
task when its id arrives. The trigger fires only for a task marked
``snapshot_watched`` (a snapshot marks a task before it keeps it), and only
when a column of the poll's row changes (so lease renewals stay silent) or the
row is deleted: a commit that notifies waits for Postgres's notification lock,
so tasks nobody polls repeatedly cost nothing. Other databases get the column
only: they have no snapshot.
"""

from django.db import migrations, models

CHANNEL = "mcptasks_task"
FUNCTION = "mcptasks_task_changed"
WATCHED = "snapshot_watched"
# The columns of a poll's row, reads.LOOKUP_FIELDS (tests check that the two agree).
POLLED_COLUMNS = (
    "status",
    "status_message",
    "updated_at",
    "outcome_read_at",
    "result",
    "error",
    "owner",
    "tool_name",
    "era",
    "created_at",
    "ttl_ms",
    "poll_interval_ms",
    "id",
)


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    table = quote(apps.get_model("mcptasks", "Task")._meta.db_table)
    old = ", ".join(f"OLD.{quote(column)}" for column in POLLED_COLUMNS)
    new = ", ".join(f"NEW.{quote(column)}" for column in POLLED_COLUMNS)
    schema_editor.execute(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN PERFORM pg_notify('{CHANNEL}', OLD.id); RETURN NULL; END $$"
    )
    schema_editor.execute(
        f"CREATE TRIGGER {FUNCTION}_update AFTER UPDATE ON {table} FOR EACH ROW "
        f"WHEN (OLD.{WATCHED} AND ROW({old}) IS DISTINCT FROM ROW({new})) EXECUTE FUNCTION {FUNCTION}()"
    )
    schema_editor.execute(
        f"CREATE TRIGGER {FUNCTION}_delete AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN (OLD.{WATCHED}) EXECUTE FUNCTION {FUNCTION}()"
    )


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("mcptasks", "Task")._meta.db_table)
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION}_update ON {table}")
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION}_delete ON {table}")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0009_started_finished_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name=WATCHED,
            field=models.BooleanField(default=False, db_default=False, editable=False),
        ),
        migrations.RunPython(create_trigger, drop_trigger),
    ]

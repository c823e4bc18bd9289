"""Indexes that cost every write and serve no read.

Each task's run inserts and updates rows in these tables; on Postgres an
update that changes an indexed column writes a new entry into every index.

* The foreign keys from input requests and events to their task get no index
  of their own: the (task, key) constraint and ``mcptasks_event_task_at`` lead
  with the task and serve the same lookups and cascades.
* The ``varchar_pattern_ops`` copy Django adds beside a text primary key
  serves only ``LIKE 'prefix%'``; task ids are only ever matched exactly.
"""

from django.db import migrations, models

_TASK_TABLE = "mcptasks_task"


def _pattern_index_on_task_id(schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
            [_TASK_TABLE, "%(id varchar_pattern_ops)%"],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def drop_pattern_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    name = _pattern_index_on_task_id(schema_editor)
    if name:
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


def restore_pattern_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql" or _pattern_index_on_task_id(schema_editor):
        return
    schema_editor.execute(
        f"CREATE INDEX {schema_editor.quote_name('mcptasks_task_id_like')} "
        f"ON {schema_editor.quote_name(_TASK_TABLE)} (id varchar_pattern_ops)"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0006_outcome_read_at"),
    ]

    operations = [
        migrations.AlterField(
            model_name="inputrequest",
            name="task",
            field=models.ForeignKey(
                db_index=False,
                on_delete=models.deletion.CASCADE,
                related_name="input_requests",
                to="mcptasks.task",
            ),
        ),
        migrations.AlterField(
            model_name="taskevent",
            name="task",
            field=models.ForeignKey(
                db_index=False,
                on_delete=models.deletion.CASCADE,
                related_name="events",
                to="mcptasks.task",
            ),
        ),
        migrations.RunPython(drop_pattern_index, restore_pattern_index, elidable=True),
    ]

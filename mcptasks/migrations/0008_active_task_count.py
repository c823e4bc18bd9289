"""The per-owner count of active tasks, so that a creation checks the quota
without counting the owner's tasks (``mcptasks.tasks.quota``).

Backfilled from the tasks: one slot per owner with active tasks. Going back
drops the table; nothing else refers to it.
"""

from django.db import migrations, models
from django.db.models import Count

ACTIVE_STATUSES = ("working", "input_required")


def backfill(apps, schema_editor):
    Task = apps.get_model("mcptasks", "Task")
    ActiveTaskCount = apps.get_model("mcptasks", "ActiveTaskCount")
    db = schema_editor.connection.alias
    counts = (
        Task.objects.using(db)
        .filter(status__in=ACTIVE_STATUSES)
        .order_by()
        .values_list("owner")
        .annotate(active=Count("pk"))
    )
    ActiveTaskCount.objects.using(db).bulk_create(
        (ActiveTaskCount(owner=owner, slot=0, active=active) for owner, active in counts.iterator()),
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0007_fewer_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="ActiveTaskCount",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("owner", models.CharField(max_length=255)),
                ("slot", models.IntegerField(default=0)),
                ("active", models.IntegerField(default=0)),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("owner", "slot"), name="mcptasks_active_count_slot")],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]

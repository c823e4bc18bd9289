from django.db import migrations, models
from django.db.models import Min, OuterRef, Subquery


def mark_outcomes_already_read(apps, schema_editor):
    """Tasks whose outcome was read before this column existed keep their one
    ``result_retrieved`` event: carry its time over, so none gets a second."""
    Task = apps.get_model("mcptasks", "Task")
    TaskEvent = apps.get_model("mcptasks", "TaskEvent")
    first_read = (
        TaskEvent.objects.filter(task_id=OuterRef("pk"), kind="result_retrieved")
        .values("task_id")
        .annotate(first=Min("at"))
        .values("first")
    )
    read = TaskEvent.objects.filter(kind="result_retrieved").values("task_id")
    Task.objects.filter(pk__in=read).update(outcome_read_at=Subquery(first_read))


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0005_legacy_sessions"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="outcome_read_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(mark_outcomes_already_read, migrations.RunPython.noop),
    ]

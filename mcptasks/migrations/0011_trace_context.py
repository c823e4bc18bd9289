"""The creating request's trace context on the task row, so every run of the
task, a redelivered one too, joins its trace (``mcptasks.telemetry``)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0010_task_change_notify"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="trace_context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]

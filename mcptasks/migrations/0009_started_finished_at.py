"""When a task's first run started and when it finished, for the admin's
overview (queue wait, run time, finishes per minute), and the index that finds
the tasks finished in a recent window.

Both columns are null on existing rows: the overview counts from the upgrade
on. The index is partial (finished rows only), so at migration time it is
empty and built in one scan of the table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0008_active_task_count"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="started_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="finished_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)), fields=["finished_at"], name="mcptasks_finished"
            ),
        ),
    ]

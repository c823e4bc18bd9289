"""A task that ended with its tool's own error (``isError``) is marked, so
operators can tell it from a success (``Task.tool_error``), with an index for
the admin's filter; and the overview's entry on the admin index (a proxy
model, no table)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0012_legacy_progress_token"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskOverview",
            fields=[],
            options={
                "verbose_name": "overview",
                "verbose_name_plural": "overview",
                "default_permissions": (),
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("mcptasks.task",),
        ),
        migrations.AddField(
            model_name="task",
            name="tool_error",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("tool_error", True)),
                fields=["-created_at", "id"],
                name="mcptasks_tool_error_created",
            ),
        ),
    ]

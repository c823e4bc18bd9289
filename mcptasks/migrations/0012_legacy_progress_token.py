from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("mcptasks", "0011_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="legacytask",
            name="progress_token",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
    ]

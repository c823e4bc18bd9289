"""The example site's Celery app (``celery -A project worker -B``)."""

import os

from celery import Celery

from project import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
telemetry.configure()  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

"""The example site's Celery app (``celery -A project worker -B``)."""

import os
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_init, worker_process_init

from project import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set (project/telemetry.py).
# A prefork worker's pool processes each set up their own after the fork, so
# that no exporter connection is shared across it; other pools, in the worker.
@worker_init.connect
def _telemetry_in_worker(sender: Any = None, **kwargs: Any) -> None:
    pool = str(getattr(sender, "pool_cls", "") or "").lower()
    if "prefork" not in pool and "processes" not in pool:
        telemetry.configure()


@worker_process_init.connect
def _telemetry_in_pool_process(**kwargs: Any) -> None:
    telemetry.configure()


@beat_init.connect
def _telemetry_in_beat(**kwargs: Any) -> None:
    telemetry.configure()

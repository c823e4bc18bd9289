"""The test site's Celery app (``celery -A tests.testapp worker``)."""

import os
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_init, worker_process_init

# OTLP export when the environment names an endpoint (tests/test_live_telemetry.py).
from tests.testapp import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.testapp.settings")

app = Celery("tests.testapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


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

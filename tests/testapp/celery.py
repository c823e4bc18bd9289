"""The test site's Celery app (``celery -A tests.testapp worker``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.testapp.settings")

app = Celery("tests.testapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

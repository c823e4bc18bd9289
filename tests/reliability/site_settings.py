"""The test site's settings, with every server-side error logged to stderr.

The reliability stacks run with ``DJANGO_SETTINGS_MODULE`` pointing here so
that their logs show each unhandled exception with its traceback (Django logs
a 500 on ``django.request`` only through handlers it has; the test site
configures none for it), and ``MCPTASKS_TEST_THROTTLE_RATES`` (JSON) sets
``THROTTLE_RATES``. Nothing else differs from ``tests.testapp.settings``.
"""

import json
import os

from tests.testapp.settings import *  # noqa: F403
from tests.testapp.settings import LOGGING, MCPTASKS

# Rates the test site does not read from its environment (tests set them).
if os.environ.get("MCPTASKS_TEST_THROTTLE_RATES"):
    MCPTASKS = {**MCPTASKS, "THROTTLE_RATES": json.loads(os.environ["MCPTASKS_TEST_THROTTLE_RATES"])}

LOGGING = {
    **LOGGING,
    "loggers": {
        **LOGGING["loggers"],
        # 5xx responses, with the exception that caused them.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "django.server": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

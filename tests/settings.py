"""Settings for the test process: the test site's (tests/testapp/), on Postgres or SQLite.

``DATABASE_URL`` defaults to the local Postgres; set it in the environment to
use another server. pytest-django creates ``test_<name>_<pid>`` on it (one per
run, so two runs on one machine never share or drop each other's database)
and drops it at the end.

A ``sqlite://`` URL runs the suite on the embedded default's database (the
SQLite pass of bin/test). The test database is then a file,
``test_mcptasks_<pid>.sqlite3`` in the temporary directory, not an in-memory
one: the endpoint does its database work on its own threads, and an
in-memory database is private to the connection that opened it. The example
test site's SQLite options (WAL, busy timeout, IMMEDIATE transactions) apply.
Tests marked ``postgres_only`` are skipped there (tests/conftest.py).

Code under test that enqueues a run publishes it to
Celery's in-process ``memory://`` transport; the live stack
(tests/support/live.py) runs its own processes with a Redis broker.
"""

import os
import tempfile

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/mcptasks")

from tests.testapp.settings import *  # noqa: F403
from tests.testapp.settings import DATABASES, MCPTASKS

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("TEST", {})["NAME"] = os.path.join(
        tempfile.gettempdir(), f"test_mcptasks_{os.getpid()}.sqlite3"
    )
else:
    DATABASES["default"].setdefault("TEST", {})["NAME"] = f"test_{DATABASES['default']['NAME']}_{os.getpid()}"
# The endpoint's own threads hold no connection between requests here, so the
# test database can be dropped at the end of the run.
DATABASES["default"]["CONN_MAX_AGE"] = 0

CELERY_BROKER_URL = "memory://"
CELERY_BROKER_TRANSPORT_OPTIONS = {"polling_interval": 0.02}
# Throttle counters in this process's memory (tests clear them), even with REDIS_URL set.
MCPTASKS = {**MCPTASKS, "CELERY_QUEUE": None, "THROTTLE_CACHE": "default"}

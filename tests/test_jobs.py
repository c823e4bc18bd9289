"""The Celery jobs keep their database connections usable between tasks.

With ``CELERY_DB_REUSE_MAX`` Celery no longer closes a worker's connections
around each task, so a connection that a database restart killed must not
fail the jobs that come after it.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from mcptasks.models import Task, TaskStatus
from mcptasks.worker import jobs
from tests.support import postgres_only
from tests.support.factories import make_task

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only.SERVER_ENDED_CONNECTION]


def _kill_this_connection() -> None:
    """End this thread's backend from the server side, as a restart does, and
    wait until it is gone (a restart happens between jobs, not during one)."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "autocommit": True}) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


@pytest.mark.parametrize("job", ["sweep", "prune_expired"])
def test_a_maintenance_job_survives_a_connection_the_server_ended(job):
    _kill_this_connection()
    getattr(jobs, job).run()  # raises OperationalError without the upkeep


def test_a_run_survives_a_connection_the_server_ended():
    task = make_task(tool="greet", arguments={"name": "x"})
    _kill_this_connection()
    assert jobs.run_task.run(task.id) == "completed"
    assert Task.objects.get(pk=task.id).status == TaskStatus.COMPLETED


def test_a_healthy_connection_costs_no_round_trip_before_a_job():
    connection.ensure_connection()
    assert not jobs._maybe_broken(connection.connection)
    _kill_this_connection()
    assert jobs._maybe_broken(connection.connection)
    connection.close()

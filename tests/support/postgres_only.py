"""Why a test needs Postgres: one ``postgres_only`` mark per reason.

Tests carrying one of these run on Postgres and are skipped, with the
reason, in the SQLite pass (tests/conftest.py). docs/embedded-default.md
lists them by reason; keep the two in step.
"""

from __future__ import annotations

import pytest

#: uvicorn and separate Celery worker processes on Redis and Postgres.
LIVE_STACK = pytest.mark.postgres_only(
    reason="the live stack: uvicorn and separate Celery worker processes on Redis and Postgres"
)

#: Private Postgres and Redis servers, several processes, load, kills and restarts.
CHAOS = pytest.mark.postgres_only(
    reason="a multi-process stack on private Postgres and Redis servers (reliability, fuzzing, isolation)"
)

#: lifecycle's claim and finish as one data-modifying CTE each.
SINGLE_STATEMENT = pytest.mark.postgres_only(reason="lifecycle's single-statement transitions are raw Postgres SQL")

#: Statements prepared server-side, seen in pg_prepared_statements.
PREPARED = pytest.mark.postgres_only(reason="statements prepared server-side (pg_prepared_statements)")

#: A test that watches one transaction wait on another's row lock.
ROW_LOCKS = pytest.mark.postgres_only(
    reason="row locks (SELECT ... FOR UPDATE), with the waiter seen in pg_stat_activity"
)

#: Two transactions writing at the same time.
CONCURRENT_WRITERS = pytest.mark.postgres_only(reason="concurrent writers: SQLite lets one transaction write at a time")

#: A connection ended by the server (pg_terminate_backend), as a restart does.
SERVER_ENDED_CONNECTION = pytest.mark.postgres_only(reason="pg_terminate_backend ends the connection under the job")

#: Postgres's planner: EXPLAIN output, partial indexes, pg_class's row estimate.
PLANNER = pytest.mark.postgres_only(reason="Postgres's planner: EXPLAIN plans and pg_class row estimates")

#: A test that builds its own virtualenvs and runs both setups itself; the
#: suite's database plays no part in it, so a second pass would only repeat it.
BOTH_SETUPS_ALREADY = pytest.mark.postgres_only(
    reason="it builds its own venv and runs both setups itself (Postgres + Redis and the embedded default)"
)

#: Polls served on the event loop read with async psycopg: elsewhere every
#: poll takes the thread path (which the SQLite pass runs).
LOOP_POLLS_REASON = "polls are served on the event loop from Postgres only"
LOOP_POLLS = pytest.mark.postgres_only(reason=LOOP_POLLS_REASON)

#: The poll snapshot is kept true by Postgres LISTEN/NOTIFY: elsewhere there is none.
POLL_SNAPSHOT = pytest.mark.postgres_only(reason="the poll snapshot listens with Postgres LISTEN/NOTIFY")

#: Each UPDATE of a task's row counted by a trigger installed for the test.
ROW_UPDATE_TRIGGER = pytest.mark.postgres_only(reason="each UPDATE of a task's row counted by a Postgres trigger")
SESSIONS = pytest.mark.postgres_only(reason="the database's other sessions, read from pg_stat_activity")

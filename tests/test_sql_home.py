"""The raw statements' one home (``mcptasks/tasks/*.sql``, most in ``queries.sql``):
named, bound, prepared, and each beside an ORM twin that other databases take."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from mcptasks.models import InputRequest, Task, TaskEvent
from mcptasks.tasks import lifecycle, reads, sql, store
from tests.support import postgres_only
from tests.support.factories import WORKER, completed_task, elicit, make_task, running_task

pytestmark = pytest.mark.django_db

PACKAGE = Path(__file__).resolve().parent.parent / "mcptasks"


def test_every_statement_is_named_once_and_used_by_name():
    text = "\n".join(path.read_text() for path in (PACKAGE / "tasks").glob("*.sql"))
    names = re.findall(r"^-- name: (\w+)\s*$", text, re.MULTILINE)
    assert len(names) == len(set(names)) == len(sql.STATEMENTS)
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    unused = [name for name in names if f'"{name}"' not in source]
    assert unused == []


def test_statements_bind_every_value():
    for name, text in sql.STATEMENTS.items():
        assert "{" not in text, name  # nothing left to splice in
        placeholders = re.sub(r"%\(\w+\)s", "", text)
        assert "%" not in placeholders, name  # only named parameters
        for value in ("'working'", "'completed'", "'created'", "'transition'", "'answered'", "'run_started'"):
            assert value not in text, (name, value)  # statuses and kinds are bound


def test_statements_name_the_models_tables_and_columns():
    """The text is plain SQL: a renamed table or a new column must show up here."""
    tables = {model._meta.db_table for model in django_apps.get_app_config("mcptasks").get_models()}
    for name, text in sql.STATEMENTS.items():
        for table in re.findall(r"\bmcptasks_\w+", text):
            assert table in tables, (name, table)
    columns = [f.column for f in Task._meta.concrete_fields]
    inserted = re.search(r"INSERT INTO mcptasks_task \(([^)]*)\)", sql.STATEMENTS["task_create"]).group(1)
    assert [c.strip() for c in inserted.split(",")] == columns
    for name in ("run_claim", "run_finish", "task_end", "input_request", "input_answer"):
        text = sql.STATEMENTS[name]
        assert "*" not in text, name  # a prepared ``*`` breaks when a migration adds a column
        returned = re.search(r"RETURNING ([^)]*?)\n\)", text).group(1).replace("task.", "")
        assert [c.strip() for c in returned.split(",")][: len(columns)] == columns, name
    referrers = {rel.related_model._meta.db_table for rel in Task._meta.related_objects}
    assert {t for t in re.findall(r"DELETE FROM (mcptasks_\w+)", sql.STATEMENTS["prune_batch"])} == referrers | {
        Task._meta.db_table
    }
    assert list(reads.LOOKUP_FIELDS) == re.findall(r"(\w+)(?:,|\s+FROM)", sql.STATEMENTS["task_lookup"])[:13]


def _as_prepared(name: str) -> str:
    """A statement as Postgres lists it once prepared: ``$n`` for each name."""
    numbers: dict[str, str] = {}
    return re.sub(
        r"%\((\w+)\)s", lambda m: numbers.setdefault(m.group(1), f"${len(numbers) + 1}"), sql.STATEMENTS[name]
    )


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def kept_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections kept past their request, as a site's ``CONN_MAX_AGE`` keeps
    them (the tests' own setting, 0, closes them after each)."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 300)


@postgres_only.PREPARED
def test_the_workers_claim_and_finish_and_a_poll_are_prepared_on_the_connection(kept_connections):
    task = make_task()
    lifecycle.start_run(task.id, worker=WORKER)
    assert lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    reads.poll(task.id, "alice", actor="client:alice")
    prepared = _prepared()
    for name in ("task_create", "run_claim", "run_finish", "task_poll"):
        assert _as_prepared(name) in prepared, name


@postgres_only.SINGLE_STATEMENT
def test_an_end_is_stamped_no_earlier_than_the_change_it_waited_for():
    """A cancel takes its time before it waits for the row's lock, and a change committed meanwhile
    (an answer resuming the task) may be stamped later: the end is stamped no earlier than that
    change, so a task's events in time order still form its chain."""
    task = make_task(owner="alice")
    later = timezone.now() + timedelta(seconds=5)
    Task.objects.filter(pk=task.id).update(updated_at=later)  # as the change it waited for left the row
    assert lifecycle.cancel(task.id, actor="client:alice")
    ended = TaskEvent.objects.get(task_id=task.id, to_status="cancelled")
    assert ended.at == later == Task.objects.get(pk=task.id).updated_at


@postgres_only.SINGLE_STATEMENT
def test_each_statement_is_parsed_once_per_process():
    """psycopg keeps a statement's parsed text only while it is given at most 50 parameters
    (``MAX_CACHED_STATEMENT_PARAMS``); the store passes every status and kind besides each
    statement's own, so each statement is given the ones it names and no more."""
    from psycopg import _queries

    assert max(len(names) for names in sql._NAMED.values()) <= _queries.MAX_CACHED_STATEMENT_PARAMS
    make_task()  # task_create, the statement with the most parameters, parsed once
    parsed = _queries._query2pg.cache_info()
    make_task()
    again = _queries._query2pg.cache_info()
    assert again.misses == parsed.misses and again.hits > parsed.hits


@postgres_only.PREPARED
def test_statements_are_not_prepared_when_the_setting_says_so(settings, kept_connections):
    settings.MCPTASKS = {**settings.MCPTASKS, "PREPARE_STATEMENTS": False}
    task = make_task()
    reads.lookup(task.id, "alice")
    assert _as_prepared("task_lookup") not in _prepared()


@postgres_only.PREPARED
def test_a_connection_closed_after_its_request_prepares_nothing(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    task = make_task()
    reads.lookup(task.id, "alice")
    assert _as_prepared("task_lookup") not in _prepared()


@postgres_only.PREPARED
@pytest.mark.django_db(transaction=True)
def test_the_loops_connections_prepare_their_statements():
    task = completed_task(owner="alice")

    async def poll_twice() -> list[str]:
        sql._pool().max_age = None  # keep the connection (the tests' CONN_MAX_AGE is 0)
        for _ in range(2):
            polled = await reads.apoll(task.id, "alice", actor="client:alice")
            assert polled is not None and polled.status == "completed"
        (conn, _opened), *_ = sql._pool().idle
        async with conn.cursor() as cursor:
            await cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in await cursor.fetchall()]

    assert _as_prepared("task_poll") in asyncio.run(poll_twice())
    sql.close_pools()


@postgres_only.SINGLE_STATEMENT
def test_the_first_read_of_an_outcome_is_one_statement_with_its_event():
    task = completed_task(owner="alice")
    with CaptureQueriesContext(connection) as queries:
        polled = reads.poll(task.id, "alice", actor="client:alice")
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert polled.outcome_read_at is not None
    (event,) = TaskEvent.objects.filter(task_id=task.id, kind="result_retrieved")
    assert (event.actor, event.detail, event.at) == ("client:alice", {"status": "completed"}, polled.outcome_read_at)
    assert Task.objects.get(pk=task.id).outcome_read_at == polled.outcome_read_at


def test_poll_marks_the_first_outcome_read_once_on_both_paths(transition_paths):
    working = running_task(owner="alice")
    assert reads.poll(working.id, "alice", actor="client:alice").outcome_read_at is None
    done = completed_task(owner="alice")
    first = reads.poll(done.id, "alice", actor="client:alice")
    again = reads.poll(done.id, "alice", actor="client:bob")
    assert first.outcome_read_at is not None and again.outcome_read_at == first.outcome_read_at
    assert reads.poll(done.id, "mallory", actor="client:mallory") is None
    events = TaskEvent.objects.filter(kind="result_retrieved")
    assert [(e.task_id, e.actor) for e in events] == [(done.id, "client:alice")]
    assert reads.lookup(done.id, "alice").outcome_read_at == first.outcome_read_at


def test_other_databases_are_served_by_the_orm(monkeypatch):
    monkeypatch.setattr(store, "_chosen", store.Orm())  # as on any backend but Postgres
    task = completed_task(owner="alice")
    with CaptureQueriesContext(connection) as queries:
        reads.lookup(task.id, "alice")
    assert all(not q["sql"].startswith("-- ") for q in queries)  # no named statement ran


@postgres_only.SINGLE_STATEMENT
def test_a_creations_parameters_are_what_the_orm_would_save():
    """``column_params`` adapts only the JSON columns; every other value is
    already what ``get_db_prep_save`` would give the driver."""
    from django.db import connection

    from mcptasks.tasks import creation
    from mcptasks.tasks.store.postgres import column_params

    fields: creation.NewTask = {
        "owner": "alice",
        "tool_name": "slow_compute",
        "arguments": {"seconds": 1},
        "era": "2026-07-28",
        "client_capabilities": {"tasks": {}},
        "ttl_ms": 60_000,
        "poll_interval_ms": None,
    }
    task, _actor, _detail = creation._new_task(fields, enqueue=True)
    fast = column_params(task)
    for field in Task._meta.concrete_fields:
        expected = field.get_db_prep_save(field.pre_save(task, add=True), connection)
        got = fast[field.attname]
        if hasattr(expected, "obj"):  # psycopg's Jsonb wrapper
            assert (type(got), got.obj) == (type(expected), expected.obj), field.name
        else:
            assert (type(got), got) == (type(expected), expected), field.name


#: The tables a transition writes.
_WRITTEN = re.compile(
    r"\b(UPDATE|INSERT INTO|DELETE FROM)\s+\"?"
    r"(mcptasks_task|mcptasks_taskevent|mcptasks_inputrequest|mcptasks_activetaskcount)\b",
    re.IGNORECASE,
)


def _writes(queries: CaptureQueriesContext) -> tuple[list[str], list[str]]:
    """The named statements run, and any write that was not one (the ORM's)."""
    named = [q["sql"].split("\n", 1)[0][3:] for q in queries if q["sql"].startswith("-- ")]
    unnamed = [q["sql"] for q in queries if not q["sql"].startswith("-- ") and _WRITTEN.search(q["sql"])]
    return named, unnamed


@postgres_only.SINGLE_STATEMENT
@pytest.mark.parametrize("quota", [None, 1000, 3], ids=["no-quota", "far-below-quota", "near-quota"])
def test_on_postgres_each_transition_writes_through_its_named_statement_alone(settings, quota):
    """One writer per transition: on Postgres every write of creation, the
    lease, a run's end, questions, answers, cancel, fail, the first outcome
    read, the sweeper and expiry is its named statement (``tasks/*.sql``); the ORM
    never writes a task's rows. (``set_status_message`` is the run's
    progress, not a transition.)"""
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ACTIVE_TASKS_PER_OWNER": quota, "MAX_ATTEMPTS": 5}
    steps = {
        "create": lambda: make_task(owner="alice"),
        "create with answers": lambda: lifecycle.create_task(
            owner="alice",
            tool_name="slow_compute",
            arguments={},
            enqueue=False,
            answered={"k": lifecycle.Answer("elicitation/create", {"message": "?"}, {"action": "decline"})},
        ),
    }
    expected = {"create": ["task_create"], "create with answers": ["task_create"]}
    if quota == 3:  # near the quota: the owner's lock alone, then the same statement
        expected = {name: ["quota_lock_exclusive", "task_create"] for name in expected}
    created = []
    for name, step in steps.items():
        with CaptureQueriesContext(connection) as queries:
            task = step()
        assert _writes(queries) == (expected[name], []), name
        created.append(task)
    assert list(InputRequest.objects.filter(task_id=task.id).values_list("key", "state", "response")) == [
        ("k", "answered", {"action": "decline"})
    ]
    for task in created:  # room under the small quota, and no run for the sweeper below
        lifecycle.cancel(task.id, actor="client:alice")

    def written(step, *names):
        with CaptureQueriesContext(connection) as queries:
            step()
        assert _writes(queries) == (list(names), []), names

    task = make_task(owner="alice")
    written(lambda: lifecycle.claim(task.id, worker=WORKER), "run_claim")
    written(lambda: lifecycle.heartbeat(task.id, worker=WORKER), "lease_renew")
    written(lambda: lifecycle.renew_leases({WORKER: task.id}), "lease_renew")
    written(lambda: lifecycle.request_input(task.id, {"q": elicit()}, worker=WORKER), "input_request")
    answer = {"q": {"action": "accept", "content": {"confirm": True}}}
    written(
        lambda: lifecycle.submit_input(task.id, answer, actor="client:alice"),
        "task_lock",
        "input_pending",
        "input_answer",
    )
    written(lambda: lifecycle.claim(task.id, worker=WORKER), "run_claim")
    written(lambda: lifecycle.release(task.id, worker=WORKER), "lease_release")
    written(lambda: lifecycle.claim(task.id, worker=WORKER), "run_claim")
    written(lambda: lifecycle.complete(task.id, {"content": []}, worker=WORKER), "run_finish")
    written(lambda: lifecycle.note_result_retrieved(Task.objects.get(pk=task.id), actor="client:alice"), "task_poll")
    written(lambda: lifecycle.expire_now(task.id, actor="operator:root"), "task_expire")

    failed = running_task(owner="alice")
    written(lambda: lifecycle.fail(failed.id, {"code": -32603, "message": "x"}, actor="w", worker=WORKER), "run_finish")
    cancelled = make_task(owner="alice")
    written(lambda: lifecycle.cancel(cancelled.id, actor="client:alice"), "task_end")
    stuck = running_task(owner="alice")
    Task.objects.filter(pk=stuck.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    written(lambda: lifecycle.sweep(), "run_redispatch")
    lifecycle.claim(stuck.id, worker=WORKER)
    Task.objects.filter(pk=stuck.id).update(attempts=5, lease_expires_at=timezone.now() - timedelta(seconds=1))
    written(lambda: lifecycle.sweep(), "task_end")
    statuses = Task.objects.filter(pk__in=[task.id, failed.id, cancelled.id, stuck.id]).values_list("status", flat=True)
    assert sorted(statuses) == ["cancelled", "completed", "failed", "failed"]

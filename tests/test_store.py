"""The task store (``mcptasks/tasks/store``): one backend per process, every
write of an operation made by it, and its async forms on both backends."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from django.db import connection

from mcptasks.models import Task, TaskEvent
from mcptasks.tasks import lifecycle, reads, sql, store
from tests.support import postgres_only
from tests.support.factories import WORKER, elicit, make_task

pytestmark = pytest.mark.django_db

TASKS = Path(__file__).resolve().parent.parent / "mcptasks" / "tasks"

#: An ORM write of one of the tables a transition writes.
_ORM_WRITE = re.compile(
    r'^\s*(UPDATE|INSERT INTO|DELETE FROM)\s+"?(mcptasks_task|mcptasks_taskevent|mcptasks_inputrequest)"?\s',
    re.IGNORECASE,
)


def test_the_store_is_chosen_once_per_process_from_the_database():
    chosen = store.backend()
    assert store.backend() is chosen
    expected = "postgres" if connection.vendor == "postgresql" else "orm"
    assert chosen.name == expected
    assert store.on_postgres() == (expected == "postgres")


def test_the_operation_modules_hold_no_backend_of_their_own():
    """The rules and the sequence stay in the operation modules; every write
    of theirs is the store's, so no module holds a second writer."""
    for name in ("transitions", "runs", "retries", "creation", "reads", "slots", "maintenance"):
        text = (TASKS / f"{name}.py").read_text()
        for backend_code in ("sql.execute", "sql.aexecute", "connection.vendor", ".update(", ".bulk_create(", ".save("):
            assert backend_code not in text, (name, backend_code)


def _every_transition() -> list[str]:
    task = make_task(owner="alice")
    assert lifecycle.claim(task.id, worker=WORKER) is not None
    assert lifecycle.set_status_message(task.id, "half way", worker=WORKER)
    assert lifecycle.request_input(task.id, {"q": elicit()}, worker=WORKER)
    answer = {"q": {"action": "accept", "content": {"confirm": True}}}
    assert lifecycle.submit_input(task.id, answer, actor="client:alice") == ["q"]
    assert lifecycle.claim(task.id, worker=WORKER) is not None
    assert lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    assert reads.poll(task.id, "alice", actor="client:alice") is not None
    cancelled = make_task(owner="alice")
    assert lifecycle.cancel(cancelled.id, actor="client:alice")
    return [task.id, cancelled.id]


@postgres_only.SINGLE_STATEMENT
def test_on_postgres_no_transition_writes_through_the_orm(monkeypatch):
    """Django's cursor sees every ORM query; the named statements run on
    psycopg's own cursor. On Postgres the ORM writes none of a task's rows;
    the same steps on the ORM store do (so the spy sees them)."""
    orm_writes: list[str] = []

    def spy(execute, sql, params, many, context):
        if _ORM_WRITE.search(sql):
            orm_writes.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        ids = _every_transition()
    assert orm_writes == []
    assert sorted(Task.objects.filter(pk__in=ids).values_list("status", flat=True)) == ["cancelled", "completed"]

    monkeypatch.setattr(store, "_chosen", store.Orm())
    with connection.execute_wrapper(spy):
        _every_transition()
    assert any(re.match(r'UPDATE "mcptasks_task"', write) for write in orm_writes)


@pytest.fixture(params=["orm", "postgres-with-a-role"])
def thread_store(request, monkeypatch):
    """A store whose async forms await the thread's: the ORM's, and
    Postgres's where the loop's connections cannot assume the site's role.
    Neither opens a connection of the loop's own."""

    def no_pool():
        raise AssertionError("the event loop's own connections were used")

    monkeypatch.setattr(sql, "_pool", no_pool)
    if request.param == "orm":
        monkeypatch.setattr(store, "_chosen", store.Orm())
        return
    if connection.vendor != "postgresql":
        pytest.skip("Postgres only: a role to assume")
    options = {**connection.settings_dict.get("OPTIONS", {}), "assume_role": "postgres"}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    assert not sql.loop_available()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("thread_store")
def test_the_async_forms_are_served_on_a_thread_where_the_loop_cannot_be(published, settings):
    """Without Postgres (or with a role to assume) the loop's operations are
    the thread's, awaited: the same writes, events and run publishes."""

    async def steps() -> tuple[Task | None, ...]:
        created = await lifecycle.acreate_task(owner="alice", tool_name="slow_compute", arguments={"seconds": 1})
        assert created is not None
        looked = await reads.alookup(created.id, "alice")
        assert await reads.alookup(created.id, "mallory") is None
        cancelled = await lifecycle.acancel(created.id, actor="client:alice")
        polled = await reads.apoll(created.id, "alice", actor="client:alice")
        return created, looked, polled if cancelled else None

    created, looked, polled = asyncio.run(steps())
    assert looked is not None and looked.status == "working"
    assert polled is not None and polled.status == "cancelled" and polled.outcome_read_at is not None
    kinds = list(TaskEvent.objects.filter(task_id=created.id).order_by("id").values_list("kind", flat=True))
    assert kinds == ["created", "transition", "result_retrieved"]
    assert [m["args"][0] for m in published] == [created.id]

    waiting = make_task(owner="alice")
    lifecycle.claim(waiting.id, worker=WORKER)
    lifecycle.request_input(waiting.id, {"a": elicit(), "b": elicit()}, worker=WORKER)
    accept = {"action": "accept", "content": {"confirm": True}}
    assert asyncio.run(lifecycle.asubmit_input(waiting.id, {"a": accept}, actor="client:alice")) == ["a"]
    assert Task.objects.get(pk=waiting.id).status == "input_required"
    assert asyncio.run(lifecycle.asubmit_input(waiting.id, {"b": accept}, actor="client:alice")) == ["b"]
    assert Task.objects.get(pk=waiting.id).status == "working"
    assert [m["args"][0] for m in published] == [created.id, waiting.id]

    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ACTIVE_TASKS_PER_OWNER": 1}
    with pytest.raises(lifecycle.TooManyActiveTasks):  # refused once, on its thread, as there
        asyncio.run(lifecycle.acreate_task(owner="alice", tool_name="slow_compute", arguments={"seconds": 1}))
    assert Task.objects.filter(owner="alice").count() == 2

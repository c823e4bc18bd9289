"""The task methods, written once for both eras and both routes: a task's
creation, ``tasks/get`` (a poll: its first outcome read, audit line and
throttle), ``tasks/update`` (answers to its questions) and ``tasks/cancel``.

Each method here owns its owner lookup, throttle, validation and error
mapping; an era only shapes what it returns (``shape``). The steps that
touch the task store are a :class:`Route`'s: the thread route's are plain
calls, so its methods never suspend and :func:`now` runs them on the
request's thread; :data:`LOOP`'s are the statements of ``queries.sql`` on
the event loop's connections, and a step that cannot run on the loop (an
ORM read, a creation near the owner's quota) is awaited on a thread at that
step. Nothing is served twice.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from ..conf import settings
from ..errors import InvalidParams, TaskNotFound
from ..models import TERMINAL_STATUSES, Era, Task, TaskStatus
from ..tasks import lifecycle, poll_snapshot, reads, sql
from ..tasks.reads import log_outcome_read
from ..threads import on_a_thread
from ..tools.registry import Tool
from . import authorization, limits
from .caller import Caller

T = TypeVar("T")


def now(method: Coroutine[Any, Any, T]) -> T:
    """A method on the thread route, run here: its steps never suspend."""
    try:
        method.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    method.close()
    raise RuntimeError("a thread route's step suspended")


class Route:
    """The task store's steps on a request's thread (ORM, or the named
    statements on the thread's connection), each an ``async`` plain call."""

    async def lookup(self, task_id: str, owner: str) -> Task | None:
        return reads.lookup(task_id, owner)

    async def poll(self, task_id: str, owner: str, actor: str | None) -> Task | None:
        """The read of a ``tasks/get``; with ``actor``, it marks an outcome's first read."""
        return reads.lookup(task_id, owner) if actor is None else reads.poll(task_id, owner, actor=actor)

    async def mark_read(self, task: Task, actor: str) -> Task:
        reads.mark_outcome_read(task, actor=actor)
        return task

    async def throttle_poll(self, task: Task) -> None:
        limits.throttle_poll(task.owner, task.id, task.poll_interval_ms)

    async def throttle(self, scope: str, owner: str) -> None:
        limits.throttle(scope, owner)

    async def create(self, era: Era, answered: Mapping[str, lifecycle.Answer], **fields: Any) -> Task:
        return lifecycle.create_task(era=era, answered=answered, **fields)

    async def cancel(self, task_id: str, actor: str, reason: str) -> None:
        lifecycle.cancel(task_id, actor=actor, reason=reason)

    async def submit_input(self, task_id: str, responses: dict[str, Any], actor: str) -> None:
        lifecycle.submit_input(task_id, responses, actor=actor)

    async def on_thread(self, work: Callable[[], T]) -> T:
        return work()


class _Loop(Route):
    """The same steps on the event loop (Postgres, a loop sender installed)."""

    async def lookup(self, task_id: str, owner: str) -> Task | None:
        return await reads.alookup(task_id, owner)

    async def poll(self, task_id: str, owner: str, actor: str | None) -> Task | None:
        async def read(task_id: str, owner: str) -> Task | None:
            try:
                return await _loop_poll(task_id, owner, actor)
            except sql.NotOnLoop:
                # A pooled connection that died idle (a database restart)
                # fails its first statement, and the pool drops it. A read,
                # and the guarded mark of a first read, may be repeated: once,
                # on a new connection (a database still down answers 503).
                return await _loop_poll(task_id, owner, actor)

        # From the snapshot where that is sound: a row the poll's own
        # statement marked read may be kept (its outcome_read_at is set).
        return await poll_snapshot.lookup(task_id, owner, read)

    async def mark_read(self, task: Task, actor: str) -> Task:
        return await reads.apoll(task.id, task.owner, actor=actor) or task

    async def throttle_poll(self, task: Task) -> None:
        await limits.athrottle_poll(task.owner, task.id, task.poll_interval_ms)

    async def throttle(self, scope: str, owner: str) -> None:
        await limits.athrottle(scope, owner)

    async def create(self, era: Era, answered: Mapping[str, lifecycle.Answer], **fields: Any) -> Task:
        assert era == Era.MODERN and not answered, "the loop takes a modern task tool's plain creation only"
        task = await lifecycle.acreate_task(**fields)
        if task is None:  # near the owner's quota: its exclusive check, on a thread
            return await self.on_thread(lambda: lifecycle.create_task(era=era, answered=answered, **fields))
        return task

    async def cancel(self, task_id: str, actor: str, reason: str) -> None:
        await lifecycle.acancel(task_id, actor=actor, reason=reason)

    async def submit_input(self, task_id: str, responses: dict[str, Any], actor: str) -> None:
        await lifecycle.asubmit_input(task_id, responses, actor=actor)

    async def on_thread(self, work: Callable[[], T]) -> T:
        return await on_a_thread(work)


async def _loop_poll(task_id: str, owner: str, actor: str | None) -> Task | None:
    return await (reads.alookup(task_id, owner) if actor is None else reads.apoll(task_id, owner, actor=actor))


THREAD = Route()
LOOP: Route = _Loop()


# Validation and the owner check: both eras' -------------------------------------------------


def task_id_param(params: Mapping[str, Any]) -> str:
    """The task id a task method names (-32602)."""
    task_id = params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidParams('"taskId" (a string) is required')
    if not limits.storable_id(task_id, 64):
        raise TaskNotFound()  # no stored id is like it: the same answer as any unknown id
    return task_id


def owned_task(caller: Caller, task: Task | None) -> Task:
    """The looked-up task, if the caller may see it (-32602 otherwise)."""
    if task is None:
        raise TaskNotFound()
    authorization.require_task(caller, task)
    return task


async def task_for(route: Route, caller: Caller, params: Mapping[str, Any]) -> Task:
    """The caller's task that ``params`` names, or its error."""
    return owned_task(caller, await route.lookup(task_id_param(params), caller.owner))


def input_responses(params: Mapping[str, Any]) -> dict[str, Any]:
    """tasks/update's answers, checked for shape and size (-32602)."""
    responses = params.get("inputResponses")
    if not isinstance(responses, dict):
        raise InvalidParams('"inputResponses" (an object) is required')
    limits.check_size(responses, settings.MAX_INPUT_RESPONSES_BYTES, "inputResponses")
    return responses


# The methods ---------------------------------------------------------------------------------


async def create(
    route: Route,
    owner: str,
    tool: Tool,
    arguments: dict[str, Any],
    *,
    era: Era,
    capabilities: dict[str, Any],
    ttl_ms: int | None = None,
    answered: Mapping[str, lifecycle.Answer] | None = None,
) -> Task:
    """A new task of ``tool``, committed; the owner's quota refuses it as a rate limit."""
    try:
        return await route.create(
            era,
            answered or {},
            owner=owner,
            tool_name=tool.name,
            arguments=arguments,
            client_capabilities=capabilities,
            ttl_ms=tool.ttl_ms if ttl_ms is None else ttl_ms,
            poll_interval_ms=tool.poll_interval_ms,
        )
    except lifecycle.TooManyActiveTasks as exc:
        raise limits.RateLimited(str(exc), retry_after=1.0) from None


async def get(
    route: Route, caller: Caller, params: Mapping[str, Any], shape: Callable[[Task], T], *, outcome: bool = True
) -> T:
    """A poll: read, counted, then (``outcome``: the era shows the outcome)
    its first outcome read marked and each outcome read audited, then shaped
    (on a thread for a task waiting for input: its questions are an ORM read).

    A caller without scopes has the first read marked by the read itself; a
    scoped one only once its scopes allowed the task."""
    owner = caller.owner
    actor = lifecycle.client_actor(owner)
    marks = outcome and caller.scopes is None
    task = owned_task(caller, await route.poll(task_id_param(params), owner, actor if marks else None))
    await route.throttle_poll(task)
    if outcome:
        if task.status in TERMINAL_STATUSES and task.outcome_read_at is None:
            task = await route.mark_read(task, actor)
        log_outcome_read(task, actor=actor)
    if task.status == TaskStatus.INPUT_REQUIRED:
        waiting = task
        return await route.on_thread(lambda: shape(waiting))
    return shape(task)


async def update(route: Route, caller: Caller, params: Mapping[str, Any]) -> None:
    """Answers to a task's questions (``inputResponses``)."""
    task = await task_for(route, caller, params)
    await route.throttle("update", caller.owner)
    await route.submit_input(task.id, input_responses(params), lifecycle.client_actor(caller.owner))


async def cancel(route: Route, caller: Caller, params: Mapping[str, Any], *, reason: str = "") -> Task:
    """Cancel an active task; the task as read before (a finished one is left as it is)."""
    task = await task_for(route, caller, params)
    await route.throttle("update", caller.owner)
    if not task.is_terminal:
        await route.cancel(task.id, lifecycle.client_actor(caller.owner), reason)
    return task

"""A task's creation, ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` for both eras (an era only shapes
what it returns), with their owner check, throttle, validation and errors; a :class:`Route` takes their steps."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar, cast

from ..conf import settings
from ..errors import InvalidParams, TaskNotFound
from ..models import TERMINAL_STATUSES, Era, Task, TaskStatus
from ..tasks import lifecycle, poll_snapshot, reads, sql
from ..threads import on_a_thread
from ..tools.registry import Tool
from . import authorization, limits
from .caller import Caller

T = TypeVar("T")
P = ParamSpec("P")


def now(method: Coroutine[Any, Any, T]) -> T:
    """A method on the thread route, run here: its steps never suspend."""
    try:
        method.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    method.close()
    raise RuntimeError("a thread route's step suspended")


class Route:
    """The task store's steps on a request's thread: plain calls, never suspended."""

    async def step(self, plain: Callable[P, T], awaited: Callable[P, Awaitable[T]], *args: P.args, **kw: P.kwargs) -> T:
        """One step, in this route's form: ``plain`` here, ``awaited`` on the loop."""
        return plain(*args, **kw)

    async def lookup(self, task_id: str, owner: str) -> Task | None:
        return await self.step(reads.lookup, reads.alookup, task_id, owner)

    async def poll(self, task_id: str, owner: str, actor: str | None) -> Task | None:
        """The read of a ``tasks/get``; with ``actor``, it marks an outcome's first read."""
        if actor is None:
            return await self.lookup(task_id, owner)
        return await self.step(reads.poll, reads.apoll, task_id, owner, actor=actor)

    async def mark_read(self, task: Task, actor: str) -> Task:
        reads.mark_outcome_read(task, actor=actor)
        return task

    async def create(self, era: Era, answered: Mapping[str, lifecycle.Answer], **fields: Any) -> Task:
        return lifecycle.create_task(era=era, answered=answered, **fields)

    async def on_thread(self, work: Callable[[], T]) -> T:
        return await self.step(work, lambda: on_a_thread(work))


class _Loop(Route):
    """The same steps on the event loop (a step it cannot take, on a thread)."""

    async def step(self, plain: Callable[P, T], awaited: Callable[P, Awaitable[T]], *args: P.args, **kw: P.kwargs) -> T:
        return await awaited(*args, **kw)

    async def poll(self, task_id: str, owner: str, actor: str | None) -> Task | None:
        read_once = super().poll

        async def read(task_id: str, owner: str) -> Task | None:
            try:
                return await read_once(task_id, owner, actor)
            except sql.NotOnLoop:
                # A pooled connection that died idle (a database restart) fails its first statement and is
                # dropped: a read, and a first read's guarded mark, may be repeated once (still down: 503).
                return await read_once(task_id, owner, actor)

        # From the snapshot where that is sound: a row the poll's own
        # statement marked read may be kept (its outcome_read_at is set).
        return await poll_snapshot.lookup(task_id, owner, read)

    async def mark_read(self, task: Task, actor: str) -> Task:
        return await reads.apoll(task.id, task.owner, actor=actor) or task

    async def create(self, era: Era, answered: Mapping[str, lifecycle.Answer], **fields: Any) -> Task:
        assert era == Era.MODERN and not answered, "the loop takes a modern task tool's plain creation only"
        task = await lifecycle.acreate_task(**fields)
        if task is None:  # near the owner's quota: its exclusive check, on a thread
            return await self.on_thread(lambda: lifecycle.create_task(era=era, answered=answered, **fields))
        return task


THREAD = Route()
LOOP: Route = _Loop()


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
    return owned_task(caller, await route.lookup(task_id_param(params), caller.owner))


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
    ttl_ms = tool.ttl_ms if ttl_ms is None else ttl_ms
    fields = {"owner": owner, "tool_name": tool.name, "arguments": arguments, "client_capabilities": capabilities}
    try:
        return await route.create(era, answered or {}, ttl_ms=ttl_ms, poll_interval_ms=tool.poll_interval_ms, **fields)
    except lifecycle.TooManyActiveTasks as exc:
        raise limits.RateLimited(str(exc), retry_after=1.0) from None


async def get(
    route: Route, caller: Caller, params: Mapping[str, Any], shape: Callable[[Task], T], *, outcome: bool = True
) -> T:
    """A poll: read, counted, then (``outcome``: the era shows it) the outcome's first read
    marked (by the read itself, for a caller without scopes) and each read audited, then
    shaped (on a thread for a task waiting for input: its questions are an ORM read)."""
    actor = lifecycle.client_actor(caller.owner)
    marks = outcome and caller.scopes is None
    task = owned_task(caller, await route.poll(task_id_param(params), caller.owner, actor if marks else None))
    await route.step(limits.throttle_poll, limits.athrottle_poll, caller.owner, task.id, task.poll_interval_ms)
    if outcome:
        if task.status in TERMINAL_STATUSES and task.outcome_read_at is None:
            task = await route.mark_read(task, actor)
        reads.log_outcome_read(task, actor=actor)
    if task.status == TaskStatus.INPUT_REQUIRED:
        waiting = task
        return await route.on_thread(lambda: shape(waiting))
    return shape(task)


async def update(route: Route, caller: Caller, params: Mapping[str, Any]) -> None:
    """Answers to a task's questions (``inputResponses``, -32602 if malformed)."""
    task = await task_for(route, caller, params)
    await route.step(limits.throttle, limits.athrottle, "update", caller.owner)
    responses = params.get("inputResponses")
    if not isinstance(responses, dict):
        raise InvalidParams('"inputResponses" (an object) is required')
    limits.check_size(responses, settings.MAX_INPUT_RESPONSES_BYTES, "inputResponses")
    await route.step(
        lifecycle.submit_input, lifecycle.asubmit_input, task.id, responses, actor=lifecycle.client_actor(caller.owner)
    )


async def cancel(route: Route, caller: Caller, params: Mapping[str, Any], *, reason: str = "") -> Task:
    """Cancel an active task; the task as read before (a finished one is left as it is)."""
    task = await task_for(route, caller, params)
    await route.step(limits.throttle, limits.athrottle, "update", caller.owner)
    if not task.is_terminal:
        await route.step(
            lifecycle.cancel, lifecycle.acancel, task.id, actor=lifecycle.client_actor(caller.owner), reason=reason
        )
    return task

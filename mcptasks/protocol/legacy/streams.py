"""The SSE streams of the 2025-era wire, and how client answers reach them.

Three streams, all async generators on the server's event loop; none holds
a thread while it waits (ORM work goes to the endpoint's pool, ``db``):

* a plain ``tools/call`` (or ``prompts/get``) that needs the client: the tool
  runs in a thread; when it asks a question (``InputNeeded``) the run ends,
  the questions go out as JSON-RPC requests on the stream, and once every
  answer is back the tool runs again from the top with the answers replayed
  by key (the same replay a task run and MRTR use). While the client thinks,
  no thread waits: only the generator does.
* ``tasks/result``: waits for the task to finish, sending its pending input
  requests as JSON-RPC requests on the way; woken by the task's
  notifications on the Channels layer, with a database poll as fallback.
* the session's GET stream: ``notifications/tasks/status`` and list changes.

The client answers a request with a separate POST (any web process may get
it). Answers to a plain call's questions are routed to the stream through the
Channels layer, to the group of the call (``call_group``); within one
process they are handed over directly. Answers to a task's questions are
written into its ``InputRequest`` rows by the POST itself; the stream sees
the task resume like any other change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from enum import StrEnum
from typing import Any

from django.db import connection

from ...conf import settings
from ...errors import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, InputNeeded, ProtocolError, TaskCancelled
from ...models import LegacySession, Task
from ...notify import fabric as notify
from ...notify.shutdown import shutdown_event
from ...tasks.inputs import pending_inputs
from ...threads import on_a_thread
from .. import jsonrpc
from ..subscriptions import TaskOrder
from .sessions import call_group, call_token, related, session_group

logger = logging.getLogger("mcptasks.legacy")


class Signal(StrEnum):
    """The tag of each ``(tag, item)`` pair that travels on a stream's inbox
    queue and out of a call's run."""

    INBOX = "inbox"  # a message from the channel layer or a direct hand-over
    SHUTDOWN = "shutdown"  # the server is stopping
    MESSAGE = "message"  # a notification the running tool sent
    DONE = "done"  # the run ended; the item is one of the outcomes below
    RESULT = "result"
    ERROR = "error"
    QUESTIONS = "questions"  # the tool needs input: its requests
    CANCELLED = "cancelled"
    KEEPALIVE = "keepalive"  # nothing happened for a while
    ANSWER = "answer"  # one client answer: (key, result)


#: How long a plain call waits for the client's answers.
ANSWER_TIMEOUT_SECONDS = 15 * 60
#: ``tasks/result`` re-reads the task this often even when no notification came.
RESULT_POLL_SECONDS = 1.5

CALL_PREFIX = "call"
TASK_PREFIX = "task"

Notify = Callable[[str, dict[str, Any]], None]
#: ``run(answers, notify, cancel)``: the JSON-RPC result, or raises
#: ``InputNeeded`` / ``ProtocolError`` / ``TaskCancelled``. Run within the
#: request (no stream yet), it gets no ``notify`` and no ``cancel``.
Run = Callable[[dict[str, Any], Notify | None, threading.Event | None], dict[str, Any]]


# Request ids of the server's own requests ------------------------------------------------------


def call_request_id(session_id: str, request_id: Any, key: str) -> str:
    return f"{CALL_PREFIX}:{call_token(session_id, request_id)}:{key}"


def task_request_id(task_id: str, key: str) -> str:
    return f"{TASK_PREFIX}:{task_id}:{key}"


def parse_request_id(value: Any) -> tuple[str, str, str] | None:
    """``(kind, token or task id, key)`` for an id we issued, else ``None``."""
    if not isinstance(value, str):
        return None
    parts = value.split(":", 2)
    if len(parts) != 3 or parts[0] not in (CALL_PREFIX, TASK_PREFIX) or not parts[1] or not parts[2]:
        return None
    return parts[0], parts[1], parts[2]


# The inbox: what a stream waits for ---------------------------------------------------------------

_local_lock = threading.Lock()
_local: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[Signal, Any]]]] = {}


def deliver(group: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` to the stream listening on ``group`` (from sync code):
    directly when it is in this process, through the Channels layer otherwise."""
    with _local_lock:
        target = _local.get(group)
    if target is not None:
        loop, queue = target
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (Signal.INBOX, payload))
            return
        except RuntimeError:  # its loop is gone; fall back to the layer
            pass
    notify.publisher.publish(group, payload)


class Inbox:
    """One queue for everything a stream waits for: messages of its groups on
    the Channels layer, direct hand-overs (``deliver``), the shutdown of the
    server, and whatever the stream's own worker thread puts in."""

    def __init__(self, groups: list[str], *, local: str | None = None) -> None:
        self.groups = groups
        self.local = local
        self._tasks: list[asyncio.Task[Any]] = []

    async def __aenter__(self) -> Inbox:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[Signal, Any]] = asyncio.Queue()
        self.listener: notify.Listener | None = notify.Listener(self.groups)
        try:
            await self.listener.__aenter__()
        except Exception:  # the layer is down: direct hand-overs and polling still work
            logger.warning("could not listen on the channel layer", exc_info=True)
            self.listener = None
        if self.local is not None:
            with _local_lock:
                _local[self.local] = (self.loop, self.queue)
        self._tasks = [asyncio.ensure_future(self._pump()), asyncio.ensure_future(self._watch_shutdown())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        if self.local is not None:
            with _local_lock:
                if _local.get(self.local, (None,))[0] is self.loop:
                    _local.pop(self.local, None)
        if self.listener is not None:
            await self.listener.__aexit__(*exc)

    async def _pump(self) -> None:
        if self.listener is None:
            return
        while True:
            try:
                message = await self.listener.receive(settings.KEEPALIVE_SECONDS)
                if message is not None:
                    self.queue.put_nowait((Signal.INBOX, message))
            except Exception:  # a layer outage: keep trying, polling covers the gap
                logger.warning("channel layer receive failed", exc_info=True)
                await asyncio.sleep(1.0)

    async def _watch_shutdown(self) -> None:
        await shutdown_event().wait()
        self.queue.put_nowait((Signal.SHUTDOWN, None))

    def put_threadsafe(self, kind: Signal, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (the server stopped): nobody listens
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, item))

    async def get(self, timeout: float) -> tuple[Signal, Any] | None:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return None


async def db(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ORM code from a stream: on the endpoint's fixed pool of threads
    (none of its own per stream), on a connection checked before and after use."""

    return await on_a_thread(lambda: fn(*args))


def _request(request_id: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


# A plain call that needs the client ------------------------------------------------------------------


async def call_stream(
    *,
    request_id: jsonrpc.RequestId,
    session_id: str,
    run: Run,
    first_questions: dict[str, dict[str, Any]] | None,
    may_ask: bool,
) -> AsyncIterator[dict[str, Any] | None]:
    """Run a replayable call within the request's SSE stream.

    ``first_questions``: what an earlier run (in the view) already asked;
    the stream starts by sending them. ``may_ask``: whether the session may
    receive requests yet (after ``notifications/initialized``).
    """
    group = call_group(session_id, request_id)
    answers: dict[str, Any] = {}
    questions = first_questions
    async with Inbox([group], local=group) as inbox:
        while True:
            if questions is None:
                outcome = None
                async for kind, item in _run_once(inbox, run, answers, session_id):
                    if kind == Signal.KEEPALIVE:
                        yield None
                    elif kind == Signal.MESSAGE:
                        yield item
                    elif kind == Signal.CANCELLED:
                        return  # the client cancelled: no response
                    else:
                        outcome = (kind, item)
                assert outcome is not None
                kind, item = outcome
                if kind == Signal.RESULT:
                    yield jsonrpc.result(request_id, item)
                    return
                if kind == Signal.ERROR:
                    yield jsonrpc.error(request_id, item)
                    return
                questions = item  # kind == Signal.QUESTIONS
            if not may_ask:
                error = ProtocolError(
                    INVALID_REQUEST, "This call needs input from the client, but the session is not initialized yet"
                )
                yield jsonrpc.error(request_id, error)
                return
            waiting = {key: req for key, req in questions.items() if key not in answers}
            for key, req in waiting.items():
                yield _request(call_request_id(session_id, request_id, key), req["method"], req.get("params", {}))
            async for kind, item in _collect_answers(inbox, session_id, set(waiting)):
                if kind == Signal.KEEPALIVE:
                    yield None
                elif kind == Signal.ANSWER:
                    answers[item[0]] = item[1]
                elif kind == Signal.CANCELLED:
                    return
                else:  # Signal.ERROR
                    yield jsonrpc.error(request_id, item)
                    return
            questions = None


async def _run_once(
    inbox: Inbox, run: Run, answers: dict[str, Any], session_id: str
) -> AsyncIterator[tuple[Signal, Any]]:
    """One run of the call in a thread: yields ``("message", notification)``
    as it notifies, then one of ``("result", value)``, ``("error",
    ProtocolError)``, ``("questions", requests)`` or ``("cancelled", None)``."""
    cancel = threading.Event()

    def notify_client(method: str, params: dict[str, Any]) -> None:
        inbox.put_threadsafe(Signal.MESSAGE, {"jsonrpc": "2.0", "method": method, "params": params})

    def target() -> None:
        try:
            inbox.put_threadsafe(Signal.DONE, (Signal.RESULT, run(dict(answers), notify_client, cancel)))
        except InputNeeded as need:
            inbox.put_threadsafe(Signal.DONE, (Signal.QUESTIONS, need.requests))
        except TaskCancelled:
            inbox.put_threadsafe(Signal.DONE, (Signal.CANCELLED, None))
        except ProtocolError as exc:
            inbox.put_threadsafe(Signal.DONE, (Signal.ERROR, exc))
        except BaseException:
            logger.exception("legacy call failed")
            inbox.put_threadsafe(Signal.DONE, (Signal.ERROR, ProtocolError(INTERNAL_ERROR, "Internal error")))
        finally:
            connection.close()

    threading.Thread(target=target, name="mcptasks-legacy-call", daemon=True).start()
    try:
        while True:
            item = await inbox.get(settings.KEEPALIVE_SECONDS)
            if item is None:
                yield Signal.KEEPALIVE, None
                continue
            kind, value = item
            if kind == Signal.MESSAGE:
                yield Signal.MESSAGE, value
            elif kind == Signal.DONE:
                yield value
                return
            elif kind == Signal.SHUTDOWN:
                continue  # let the run finish: its response is on the way
            elif kind == Signal.INBOX and _is_cancel(value, session_id):
                cancel.set()
                yield Signal.CANCELLED, None
                return
    finally:
        cancel.set()  # the stream is over (done, cancelled or the client left)


def _is_cancel(payload: Any, session_id: str) -> bool:
    return isinstance(payload, dict) and payload.get("session") == session_id and payload.get("cancel") is True


async def _collect_answers(inbox: Inbox, session_id: str, keys: set[str]) -> AsyncIterator[tuple[Signal, Any]]:
    """Yields ``("answer", (key, result))`` until every key is answered;
    ``("keepalive", None)`` while idle; or ends with ``("error", exc)`` /
    ``("cancelled", None)``."""
    deadline = asyncio.get_running_loop().time() + ANSWER_TIMEOUT_SECONDS
    outstanding = set(keys)
    while outstanding:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            yield Signal.ERROR, ProtocolError(INTERNAL_ERROR, "The client did not answer the server's request in time")
            return
        item = await inbox.get(min(settings.KEEPALIVE_SECONDS, remaining))
        if item is None:
            yield Signal.KEEPALIVE, None
            continue
        kind, payload = item
        if kind == Signal.SHUTDOWN:
            yield Signal.ERROR, ProtocolError(INTERNAL_ERROR, "The server is restarting; call the tool again")
            return
        if kind != Signal.INBOX or not isinstance(payload, dict) or payload.get("session") != session_id:
            continue
        if payload.get("cancel") is True:
            yield Signal.CANCELLED, None
            return
        key = payload.get("key")
        if key not in outstanding:
            continue
        if "error" in payload:
            error = payload["error"] if isinstance(payload["error"], dict) else {}
            sent_code = error.get("code")
            code = sent_code if isinstance(sent_code, int) else INTERNAL_ERROR
            yield Signal.ERROR, ProtocolError(code, f"The client could not answer: {error.get('message', 'error')}")
            return
        outstanding.discard(key)
        yield Signal.ANSWER, (key, payload.get("result"))


# tasks/result ---------------------------------------------------------------------------------------------


def _task_state(task_id: str) -> tuple[Task, dict[str, Any]] | None:
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        return None
    return task, ({} if task.is_terminal else pending_inputs(task_id))


async def task_result_stream(
    *,
    request_id: jsonrpc.RequestId,
    session_id: str,
    task_id: str,
    final: Callable[[Task], dict[str, Any]],
    may_ask: bool,
) -> AsyncIterator[dict[str, Any] | None]:
    """Block (asynchronously) until the task is terminal, sending its input
    requests to the client on the way; then its outcome (``final(task)``:
    a JSON-RPC response for ``request_id``)."""
    group = call_group(session_id, request_id)
    sent: set[str] = set()
    loop = asyncio.get_running_loop()
    idle_since = loop.time()
    async with Inbox([notify.task_group(task_id), group], local=group) as inbox:
        while True:
            state = await db(_task_state, task_id)
            if state is None:
                yield jsonrpc.error(
                    request_id, ProtocolError(INVALID_PARAMS, "Failed to retrieve task: Task not found")
                )
                return
            task, pending = state
            if task.is_terminal:
                yield await db(final, task)
                return
            if pending and not may_ask:
                error = ProtocolError(
                    INVALID_REQUEST, "The task needs input from the client, but the session is not initialized yet"
                )
                yield jsonrpc.error(request_id, error)
                return
            if may_ask:
                for key, req in pending.items():
                    if key not in sent:
                        sent.add(key)
                        params = {**req["params"], "_meta": {**req["params"].get("_meta", {}), **related(task_id)}}
                        yield _request(task_request_id(task_id, key), req["method"], params)
                        idle_since = loop.time()
            item = await inbox.get(RESULT_POLL_SECONDS)
            if item is not None:
                kind, payload = item
                if kind == Signal.SHUTDOWN:
                    error = ProtocolError(INTERNAL_ERROR, "The server is restarting; call tasks/result again")
                    yield jsonrpc.error(request_id, error)
                    return
                if kind == Signal.INBOX and _is_cancel(payload, session_id):
                    return
            if loop.time() - idle_since >= settings.KEEPALIVE_SECONDS:
                idle_since = loop.time()
                yield None


# The session's GET stream -------------------------------------------------------------------------------------


def _session_open(session_id: str) -> bool:
    return LegacySession.objects.filter(pk=session_id, closed_at__isnull=True).exists()


async def session_stream(session_id: str) -> AsyncIterator[dict[str, Any] | None]:
    """Messages not tied to a request: ``notifications/tasks/status`` of the
    session's tasks, and tools or prompts list changes. Ends with the
    session (told by ``close_session``, or found out while idle)."""
    order = TaskOrder()
    async with Inbox([session_group(session_id), notify.TOOLS_GROUP, notify.PROMPTS_GROUP]) as inbox:
        while True:
            item = await inbox.get(settings.KEEPALIVE_SECONDS)
            if item is None:
                if not await db(_session_open, session_id):
                    return
                yield None
                continue
            kind, payload = item
            if kind == Signal.SHUTDOWN:
                return
            if kind != Signal.INBOX or not isinstance(payload, dict):
                continue
            if payload.get("closed"):
                return
            if "list_method" in payload:
                yield {"jsonrpc": "2.0", "method": payload["list_method"]}
            elif "notification" in payload and order.is_new(payload.get("task_id", ""), int(payload.get("at", 0))):
                yield payload["notification"]

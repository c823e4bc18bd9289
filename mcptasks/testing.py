"""Unit-testing a site's tools in-process, through mcptasks' own code.

``call_tool`` runs a tool as a task the way the endpoint and a worker do: the
tool comes from the registry, its arguments are validated as ``tools/call``
validates them, the task is a row created by the domain's ``create_task``, and
each run is the Celery job's own body (lease, replayed answers, outcome). Only
the trip through the broker is left out: the run is made in the calling
thread. ``TaskCall.answer`` records answers as ``tasks/update`` does and runs
the task again; ``TaskCall.poll`` is what ``tasks/get`` would answer::

    from mcptasks.testing import accept, call_tool

    @pytest.mark.django_db(transaction=True)
    def test_resize():
        call = call_tool("resize", {"url": "https://example.com/a.png"})
        assert call.status == "input_required" and set(call.questions) == {"overwrite"}
        call.answer(overwrite=accept(ok=True))
        assert call.status == "completed" and "resized" in call.text

The rows must be committed, as a worker's would be (its lease monitor reads
them on a connection of its own): mark the test
``pytest.mark.django_db(transaction=True)`` (or use ``TransactionTestCase``).
``run_inline`` calls a tool within the call instead, the way an inline
``tools/call`` does, with its questions asked in rounds (MRTR).

Nothing here goes through HTTP: no authentication, scopes or rate limits.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from django.db import connection

from .errors import HandOff, InputNeeded, InvalidParams, TaskCancelled
from .models import Task, TaskStatus
from .protocol.shapes import detailed_task
from .tasks import dispatch, lifecycle
from .tools.calls import tool_context
from .tools.invoke import invoke
from .tools.owners import owner_for
from .tools.registry import Tool, registry
from .worker import jobs, progress

__all__ = ["DEFAULT_CAPABILITIES", "InlineCall", "TaskCall", "accept", "call_tool", "decline", "run_inline"]

#: What a test's client declares unless told otherwise: every question a tool
#: may ask (elicitation, sampling, roots) and the tasks extension.
DEFAULT_CAPABILITIES: dict[str, Any] = {
    "elicitation": {},
    "sampling": {},
    "roots": {},
    "extensions": {"io.modelcontextprotocol/tasks": {}},
}

#: The owner of a test's tasks when no user is given.
DEFAULT_OWNER = "testing"


def accept(**content: Any) -> dict[str, Any]:
    """An elicitation's answer: the user accepted, with ``content``."""
    return {"action": "accept", "content": content}


def decline() -> dict[str, Any]:
    """An elicitation's answer: the user declined."""
    return {"action": "decline"}


class TaskCall:
    """A tool called as a task: read its state, answer it, cancel it.

    Every property reads the task's row afresh.
    """

    def __init__(self, task_id: str, owner: str) -> None:
        self.task_id = task_id
        self.owner = owner
        #: What each run of this call returned, in order: ``"completed"``,
        #: ``"input_required"``, ``"failed"``, ``"cancelled"`` or ``"skipped"``.
        self.runs: list[str] = []

    def __repr__(self) -> str:
        return f"<TaskCall {self.task_id} {self.status}>"

    @property
    def task(self) -> Task:
        """The task's row, read now."""
        return Task.objects.get(pk=self.task_id)

    @property
    def status(self) -> str:
        """``working``, ``input_required``, ``completed``, ``failed`` or ``cancelled``."""
        return str(self.task.status)

    @property
    def status_message(self) -> str | None:
        """The last ``ctx.report_status()`` of a running task, or the reason
        it failed or was cancelled."""
        return self.poll().get("statusMessage")

    def poll(self) -> dict[str, Any]:
        """The task as ``tasks/get`` answers its owner: its status, and its
        ``inputRequests``, ``result`` or ``error``."""
        return detailed_task(self.task)

    @property
    def questions(self) -> dict[str, dict[str, Any]]:
        """The questions waiting for an answer, by key (``{}`` unless
        ``input_required``): each ``{"method": ..., "params": ...}``."""
        return dict(self.poll().get("inputRequests") or {})

    @property
    def result(self) -> dict[str, Any]:
        """The tool's ``CallToolResult`` (``content``, ``isError``, ...).
        Raises ``AssertionError`` unless the task completed."""
        task = self.task
        if task.status != TaskStatus.COMPLETED:
            raise AssertionError(f"task {self.task_id} is {task.status}, not completed ({task.error or ''})")
        return dict(task.result or {})

    @property
    def is_error(self) -> bool:
        """Whether the tool ended with a tool error (``ToolError``, or an
        unexpected exception): a completed task whose result has ``isError``."""
        return bool(self.result.get("isError"))

    @property
    def text(self) -> str:
        """The result's text blocks, joined by newlines."""
        return "\n".join(str(block["text"]) for block in self.result.get("content", []) if block.get("type") == "text")

    @property
    def error(self) -> dict[str, Any] | None:
        """The JSON-RPC error of a ``failed`` task (a raised ``ProtocolError``)."""
        return self.poll().get("error")

    def run(self) -> TaskCall:
        """Make one run of the task now, as a worker would (nothing happens
        to a task that is not ``working``: the run is ``"skipped"``)."""
        if connection.in_atomic_block:
            raise RuntimeError(
                "mcptasks.testing runs tools as a worker does, and a worker sees only committed rows: "
                "mark the test pytest.mark.django_db(transaction=True), or use TransactionTestCase"
            )
        with dispatch.runs_here(self.task_id):  # a retry's next attempt is the test's next run()
            self.runs.append(str(jobs.run_task.run(self.task_id)))
        # The run's status writer holds a connection for a while; a test
        # database is dropped right after the tests.
        progress.writer.release()
        return self

    def answer(self, responses: Mapping[str, Any] | None = None, /, **by_key: Any) -> TaskCall:
        """Answer questions by key, as ``tasks/update`` does (``inputResponses``),
        then run the task again once nothing is left unanswered. Answers to
        unknown or already answered keys are ignored, as on the wire; an
        answer of the wrong shape raises ``ProtocolError`` (-32602)."""
        answers = {**(responses or {}), **by_key}
        with dispatch.runs_here(self.task_id):
            lifecycle.submit_input(self.task_id, answers, actor=lifecycle.client_actor(self.owner))
        if self.status == TaskStatus.WORKING:
            self.run()
        return self

    def cancel(self) -> bool:
        """Cancel the task as ``tasks/cancel`` does; whether it was active."""
        return lifecycle.cancel(self.task_id, actor=lifecycle.client_actor(self.owner))


def _tool(name: str, arguments: Mapping[str, Any] | None) -> tuple[Tool, dict[str, Any], dict[str, Any]]:
    tool = registry.get(name)
    if tool is None:
        raise InvalidParams(f"Unknown tool: {name}")
    given = dict(arguments or {})
    return tool, given, tool.validate_arguments(given)


def _owner(user: Any, owner: str | None) -> str:
    if owner is not None:
        return owner
    return owner_for(user) if user is not None else DEFAULT_OWNER


def call_tool(
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    user: Any = None,
    owner: str | None = None,
    capabilities: Mapping[str, Any] | None = None,
    run: bool = True,
) -> TaskCall:
    """Call the tool ``name`` as a task and make its first run now.

    ``user`` is the Django user calling (``ctx.user``; the task's owner is
    ``user:<pk>``), or give ``owner`` for another owner string.
    ``capabilities`` is what the client declares (``DEFAULT_CAPABILITIES``:
    everything); ``{}`` tests a client that declares nothing. With
    ``run=False`` the task is only created: ``TaskCall.run()`` runs it.
    Unknown tools and bad arguments raise ``ProtocolError`` (-32602), as
    ``tools/call`` answers them; a tool marked ``task="never"`` raises
    ``ValueError`` (use ``run_inline``).
    """
    tool, given, _ = _tool(name, arguments)
    if tool.task == "never":
        raise ValueError(f"tool {name!r} never runs as a task (task='never'): call it with run_inline()")
    task = lifecycle.create_task(
        owner=_owner(user, owner),
        tool_name=tool.name,
        arguments=given,
        client_capabilities=dict(DEFAULT_CAPABILITIES if capabilities is None else capabilities),
        ttl_ms=tool.ttl_ms,
        poll_interval_ms=tool.poll_interval_ms,
        enqueue=False,
    )
    call = TaskCall(task.id, task.owner)
    return call.run() if run else call


class InlineCall:
    """A tool called within its request: its result, or the questions of
    this round (answer them with ``answer``, which calls the tool again)."""

    def __init__(
        self,
        tool: Tool,
        kwargs: dict[str, Any],
        owner: str,
        user: Any,
        capabilities: dict[str, Any],
        answers: dict[str, Any],
    ) -> None:
        self._tool, self._kwargs = tool, kwargs
        self._owner, self._user, self._capabilities = owner, user, capabilities
        #: Every answer given so far, by key (what ``requestState`` carries).
        self.answers = answers
        #: ``"complete"`` or ``"input_required"``.
        self.result_type = "complete"
        #: This round's questions, by key (``{}`` once complete).
        self.questions: dict[str, dict[str, Any]] = {}
        self._result: dict[str, Any] = {}
        self._call()

    def _call(self) -> None:
        ctx = tool_context(
            owner=self._owner,
            user=self._user,
            capabilities=self._capabilities,
            answers=self.answers,
            cancel_event=threading.Event(),
        )
        try:
            self._result = invoke(self._tool, ctx, self._kwargs)
        except InputNeeded as need:
            self.result_type, self.questions = "input_required", need.requests
        except (HandOff, TaskCancelled) as exc:  # neither can reach here: no hand-off, no cancel
            raise AssertionError(f"unexpected {type(exc).__name__} in an inline call") from exc

    @property
    def result(self) -> dict[str, Any]:
        """The tool's ``CallToolResult``; raises ``AssertionError`` while questions are open."""
        if self.result_type != "complete":
            raise AssertionError(f"the call is waiting for answers to {sorted(self.questions)}")
        return self._result

    @property
    def is_error(self) -> bool:
        return bool(self.result.get("isError"))

    @property
    def text(self) -> str:
        """The result's text blocks, joined by newlines."""
        return "\n".join(str(block["text"]) for block in self.result.get("content", []) if block.get("type") == "text")

    def answer(self, responses: Mapping[str, Any] | None = None, /, **by_key: Any) -> InlineCall:
        """The next round: the tool called again from the top with every
        answer so far (as an MRTR ``tools/call`` with ``inputResponses``)."""
        answers = {**self.answers, **(responses or {}), **by_key}
        return InlineCall(self._tool, self._kwargs, self._owner, self._user, self._capabilities, answers)


def run_inline(
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    user: Any = None,
    owner: str | None = None,
    capabilities: Mapping[str, Any] | None = None,
    answers: Mapping[str, Any] | None = None,
) -> InlineCall:
    """Call the tool ``name`` within the call, as an inline ``tools/call``
    runs it (any tool, whatever its ``task`` mode). Arguments as for
    ``call_tool``; ``answers`` are the answers given in earlier rounds."""
    tool, _, kwargs = _tool(name, arguments)
    caps = dict(DEFAULT_CAPABILITIES if capabilities is None else capabilities)
    return InlineCall(tool, kwargs, _owner(user, owner), user, caps, dict(answers or {}))

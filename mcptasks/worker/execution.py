"""Running a tool: inline within a request, or as one run of a durable task.

A task run claims the task's lease, replays the answers recorded so far, calls
the tool, and records the outcome through ``lifecycle``. While the tool runs
the process's lease monitor (``leases``) renews the lease and watches for a
cancel, so the tool's context learns of a cancel within ``CANCEL_POLL_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Any

from ..errors import (
    INTERNAL_ERROR,
    HandOff,
    InputNeeded,
    InvalidParams,
    ProtocolError,
    SoftTimeLimitExceeded,
    TaskCancelled,
    ToolRetry,
)
from ..models import Task
from ..protocol import eras
from ..tasks import dispatch, lifecycle
from ..telemetry import metrics
from ..telemetry import runs as run_telemetry
from ..tools import effective
from ..tools.calls import tool_context
from ..tools.context import ToolContext
from ..tools.controls import ToolControls
from ..tools.effective import controls_for
from ..tools.invoke import invoke
from ..tools.registry import Tool, registry
from ..tools.results import error_result, is_tool_error
from . import leases, progress

logger = logging.getLogger("mcptasks.execution")


# Task runs -----------------------------------------------------------------------


def worker_name() -> str:
    """Unique per run: a lease names the run that holds it."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def run_task(task_id: str) -> str:
    """One run of a task. Returns what happened (for logs and tests).

    A tool with a ``concurrency`` limit runs only in a slot of its own
    (``tasks.slots``); with every slot held, the run does not claim the task
    but sends it again for a little later (``"waiting"``), leaving the
    worker process to other runs."""
    worker = worker_name()
    limited = effective.limited_tools()
    tool_name = lifecycle.tool_name_of(task_id) if limited else None
    if tool_name is None or tool_name not in limited:
        return _run_task(task_id, worker)
    limit = controls_for(tool_name).concurrency
    assert limit is not None
    if lifecycle.take_slot(tool_name, limit, task_id=task_id, worker=worker) is None:
        delay = random.uniform(*SLOT_WAIT_SECONDS)
        message = f"Waiting for a free slot: at most {limit} runs of {tool_name} at once."
        if not lifecycle.wait_for_slot(task_id, delay=delay, message=message):
            return "skipped"
        dispatch.enqueue_after_commit(task_id, tool_name, countdown=delay)
        return "waiting"
    leases.monitor.hold_slot(worker)
    try:
        return _run_task(task_id, worker)
    finally:
        lifecycle.free_slot(worker)


#: How long a run that found every slot of its tool held waits before it
#: tries again (a random draw in this range, so that waiters spread out).
SLOT_WAIT_SECONDS = (0.3, 1.0)


def _run_task(task_id: str, worker: str) -> str:
    run = lifecycle.start_run(task_id, worker=worker)
    if run is None:
        return "skipped"
    task = run.task
    controls = controls_for(task.tool_name)
    attempt = lifecycle.tool_retries(task_id) + 1 if controls.retries else 1
    run_telemetry.started(run.task, run.answers, queue=effective.queue_for(task.tool_name), tool_attempt=attempt)
    tool = registry.get(task.tool_name)
    if tool is None:
        unknown = InvalidParams(f"Unknown tool: {task.tool_name}").to_dict()
        lifecycle.fail(task_id, unknown, actor=lifecycle.worker_actor(worker))
        return "failed"
    cancel_event = threading.Event()
    status = progress.RunStatus(task_id, worker, cancel_event)
    ctx = tool_context(
        owner=task.owner,
        capabilities=task.client_capabilities,
        answers=run.answers,
        task_id=task_id,
        cancel_event=cancel_event,
        on_status=status.report,
        on_progress=status.report,
        soft_time_limit=controls.soft_time_limit,
        attempt=attempt,
    )
    hard_stop = None
    deadline = None
    if controls.time_limit:
        hard_stop = _HardStop(task_id, tool.name, controls.time_limit, task.era, worker, cancel_event)
        deadline = (time.monotonic() + controls.time_limit, hard_stop)
    leases.monitor.watch(task_id, worker, cancel_event, deadline)
    outcome = _call(task, tool, ctx, status, controls, worker, attempt)
    # A run its hard limit stopped ended its task as the tool's error (what
    # the task's counters say), whatever the tool did after: so does its span.
    if hard_stop is not None and hard_stop.ended():
        return "tool_error"
    return outcome


def _call(
    task: Task,
    tool: Tool,
    ctx: ToolContext,
    status: progress.RunStatus,
    controls: ToolControls,
    worker: str,
    attempt: int,
) -> str:
    """The tool's call in a claimed run, and the task's outcome from it."""
    task_id = task.id
    actor = lifecycle.worker_actor(worker)
    try:
        kwargs = tool.validate_arguments(task.arguments)
        result = _invoke_reporting(tool, ctx, kwargs, status, retry_on=controls.retry_on if controls.retries else ())
    except InputNeeded as need:
        run_telemetry.input_asked(need.requests)
        lifecycle.request_input(task_id, need.requests, worker=worker)
        return "input_required"
    except TaskCancelled:
        return "cancelled"
    except SoftTimeLimitExceeded as exc:
        result = error_result(f"Tool '{tool.name}' stopped at its soft time limit of {exc.limit:g} s.")
    except HandOff:  # cannot happen inside a task; treat as a bug in the tool
        result = error_result(f"Tool '{tool.name}' handed off twice.")
    except ProtocolError as exc:
        lifecycle.fail(task_id, exc.to_dict(), actor=actor, worker=worker)
        return "failed"
    except ToolRetry as retry:
        retried = _retry(task_id, tool.name, controls, retry.error, worker, attempt)
        if retried is not None:
            return retried
        result = error_result(f"Tool '{tool.name}' failed: {retry}")
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            lifecycle.release(task_id, worker=worker)
            raise
        logger.exception("run of task %s crashed", task_id)
        lifecycle.fail(task_id, {"code": INTERNAL_ERROR, "message": "Internal error"}, actor=actor, worker=worker)
        return "failed"
    finally:
        leases.monitor.forget(worker)
    lifecycle.finish_run(task_id, result, worker=worker, to=eras.status_after_result(task.era, result))
    # The run's outcome for its span and metrics: a tool error is no success.
    return "tool_error" if is_tool_error(result) else "completed"


def _invoke_reporting(
    tool: Tool,
    ctx: ToolContext,
    kwargs: dict[str, Any],
    status: progress.RunStatus,
    *,
    retry_on: tuple[type[BaseException], ...] = (),
) -> dict[str, Any]:
    """The tool's call. Its status reports end with it, so that none is
    written after the run's next durable write (input asked, outcome, or
    the cancel it saw)."""
    try:
        return invoke(tool, ctx, kwargs, retry_on=retry_on)
    finally:
        status.end()


def _retry(
    task_id: str, tool_name: str, controls: ToolControls, exc: Exception, worker: str, attempt: int
) -> str | None:
    """Schedule the attempt after ``attempt`` once the tool raised an
    exception it retries on: ``"retrying"`` (or ``"cancelled"``: the run lost
    its task meanwhile), or ``None`` when the retries are spent (the task
    then ends on the error)."""
    used = attempt - 1
    if used >= controls.retries:
        logger.warning("task %s: tool %s raised again after %d retries", task_id, tool_name, used)
        return None
    delay = controls.backoff(used + 1)
    next_attempt = attempt + 1
    logger.info(
        "task %s: tool %s raised %s; attempt %d in %.1f s", task_id, tool_name, type(exc).__name__, next_attempt, delay
    )
    if not lifecycle.schedule_retry(
        task_id, worker=worker, attempt=next_attempt, delay=delay, error=f"{type(exc).__name__}: {exc}"
    ):
        return "cancelled"
    metrics.tool_retry(tool_name, effective.queue_for(tool_name))
    dispatch.enqueue_after_commit(task_id, tool_name, countdown=delay)
    return "retrying"


class _HardStop:
    """What the lease monitor does at a run's hard time limit: end the task
    as the tool's error (the finishing path of a tool that raised), then
    stop the tool at its next check. A prefork pool kills the process
    shortly after (``HARD_KILL_MARGIN_SECONDS``); a thread pool cannot, and
    the tool's own ending, if it comes, is refused with the lease."""

    def __init__(
        self, task_id: str, tool_name: str, limit: float, era: str, worker: str, cancel_event: threading.Event
    ) -> None:
        self.task_id = task_id
        self.tool_name = tool_name
        self.limit = limit
        self.era = era
        self.worker = worker
        self.cancel_event = cancel_event
        # Held while the stop writes: the run asks ``ended`` after its own
        # write, and a stop under way decides what that write found.
        self._lock = threading.Lock()
        self._ended = False

    def __call__(self) -> None:
        with self._lock:
            result = error_result(f"Tool '{self.tool_name}' was stopped at its time limit of {self.limit:g} s.")
            to = eras.status_after_result(self.era, result)
            if lifecycle.finish_run(self.task_id, result, worker=self.worker, to=to):
                self._ended = True
                logger.warning("run of task %s stopped at its time limit of %g s", self.task_id, self.limit)
        lifecycle.free_slot(self.worker)  # before a prefork kill, which would leave it to lapse
        self.cancel_event.set()

    def ended(self) -> bool:
        """Whether the limit ended the task (rather than the run, a cancel
        or another run)."""
        with self._lock:
            return self._ended

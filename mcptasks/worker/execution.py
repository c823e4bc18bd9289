"""One run of a durable task: claim its lease, replay its answers, call the tool, record the outcome."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
import threading
import time
import uuid

from .. import errors
from ..models import Task
from ..protocol import eras
from ..tasks import dispatch, lifecycle
from ..telemetry import metrics
from ..telemetry import runs as run_telemetry
from ..tools import calls, effective
from ..tools.context import ToolContext
from ..tools.controls import ToolControls
from ..tools.invoke import invoke
from ..tools.registry import Tool, registry
from ..tools.results import error_result, is_tool_error
from . import leases, progress

logger = logging.getLogger("mcptasks.execution")


def worker_name() -> str:
    """Unique per run: a lease names the run that holds it."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def run_task(task_id: str) -> str:
    """One run of a task: what happened. A tool with a ``concurrency`` limit runs only in a free slot."""
    worker = worker_name()
    limited = effective.limited_tools()
    tool_name = lifecycle.tool_name_of(task_id) if limited else None
    if tool_name is None or tool_name not in limited:
        return _run_task(task_id, worker)
    limit = effective.controls_for(tool_name).concurrency
    assert limit is not None
    if lifecycle.take_slot(tool_name, limit, task_id=task_id, worker=worker) is None:
        delay = random.uniform(0.3, 1.0)  # every slot held: sent again after a random wait
        message = f"Waiting for a free slot: at most {limit} runs of {tool_name} at once."
        if not lifecycle.wait_for_slot(task_id, delay=delay, message=message):
            return "skipped"
        dispatch.enqueue_after_commit(task_id, tool_name, countdown=delay)
        return "waiting"
    try:
        return _run_task(task_id, worker, slotted=True)
    finally:
        lifecycle.free_slot(worker)


def _run_task(task_id: str, worker: str, slotted: bool = False) -> str:
    run = lifecycle.start_run(task_id, worker=worker)
    if run is None:
        return "skipped"
    task = run.task
    controls = effective.controls_for(task.tool_name)
    attempt = lifecycle.tool_retries(task_id) + 1 if controls.retries else 1
    run_telemetry.started(task, run.answers, queue=effective.queue_for(task.tool_name), tool_attempt=attempt)
    tool = registry.get(task.tool_name)
    if tool is None:
        unknown = errors.InvalidParams(f"Unknown tool: {task.tool_name}").to_dict()
        lifecycle.fail(task_id, unknown, actor=lifecycle.worker_actor(worker))
        return "failed"
    cancel_event = threading.Event()
    status = progress.RunStatus(task_id, worker, cancel_event)
    ctx = calls.tool_context(
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
    hard_stop = _HardStop(task, controls.time_limit, worker, cancel_event) if controls.time_limit else None
    deadline = (time.monotonic() + hard_stop.limit, hard_stop) if hard_stop else None
    leases.monitor.watch(task_id, worker, cancel_event, deadline, slot=slotted)
    outcome = _call(task, tool, ctx, status, controls)
    # Its hard limit ended the task as the tool's error, whatever the tool did after: so does its span.
    return "tool_error" if hard_stop is not None and hard_stop.ended() else outcome


def _call(task: Task, tool: Tool, ctx: ToolContext, status: progress.RunStatus, controls: ToolControls) -> str:
    """The tool's call in a claimed run, and the task's outcome from it."""
    worker, attempt = status.worker, ctx.attempt
    try:
        kwargs = tool.validate_arguments(task.arguments)
        try:
            result = invoke(tool, ctx, kwargs, retry_on=controls.retry_on if controls.retries else ())
        finally:
            status.end()  # no status write lands after the run's next durable write
    except errors.InputNeeded as need:
        run_telemetry.input_asked(need.requests)
        lifecycle.request_input(task.id, need.requests, worker=worker)
        return "input_required"
    except errors.TaskCancelled:
        return "cancelled"
    except errors.SoftTimeLimitExceeded as exc:
        result = error_result(f"Tool '{tool.name}' stopped at its soft time limit of {exc.limit:g} s.")
    except errors.HandOff:  # cannot happen inside a task; treat as a bug in the tool
        result = error_result(f"Tool '{tool.name}' handed off twice.")
    except errors.ToolRetry as retry:
        if attempt <= controls.retries:  # the next attempt, after a backoff
            delay, cause = controls.backoff(attempt), type(retry.error).__name__
            logger.info(
                "task %s: tool %s raised %s; attempt %d in %.1f s", task.id, tool.name, cause, attempt + 1, delay
            )
            error = f"{cause}: {retry.error}"
            if not lifecycle.schedule_retry(task.id, worker=worker, attempt=attempt + 1, delay=delay, error=error):
                return "cancelled"  # the run lost its task meanwhile
            metrics.tool_retry(tool.name, effective.queue_for(tool.name))
            dispatch.enqueue_after_commit(task.id, tool.name, countdown=delay)
            return "retrying"
        logger.warning("task %s: tool %s raised again after %d retries", task.id, tool.name, attempt - 1)
        result = error_result(f"Tool '{tool.name}' failed: {retry}")
    except (KeyboardInterrupt, SystemExit):
        lifecycle.release(task.id, worker=worker)
        raise
    except BaseException as exc:
        if not isinstance(exc, errors.ProtocolError):
            logger.exception("run of task %s crashed", task.id)
            exc = errors.ProtocolError(errors.INTERNAL_ERROR, "Internal error")
        lifecycle.fail(task.id, exc.to_dict(), actor=lifecycle.worker_actor(worker), worker=worker)
        return "failed"
    finally:
        leases.monitor.forget(worker)
    lifecycle.finish_run(task.id, result, worker=worker, to=eras.status_after_result(task.era, result))
    # The run's outcome for its span and metrics: a tool error is no success.
    return "tool_error" if is_tool_error(result) else "completed"


@dataclasses.dataclass
class _HardStop:
    """At a run's hard time limit (on the lease monitor's thread): end the task as the tool's error,
    then stop the tool. A prefork pool kills the process soon after; a thread pool's lease refuses its end."""

    task: Task
    limit: float
    worker: str
    cancel_event: threading.Event
    # Held while the stop writes: the run asks ``ended`` after its own write.
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    stopped: bool = False

    def __call__(self) -> None:
        with self.lock:
            result = error_result(f"Tool '{self.task.tool_name}' was stopped at its time limit of {self.limit:g} s.")
            to = eras.status_after_result(self.task.era, result)
            if lifecycle.finish_run(self.task.id, result, worker=self.worker, to=to):
                self.stopped = True
                logger.warning("run of task %s stopped at its time limit of %g s", self.task.id, self.limit)
        lifecycle.free_slot(self.worker)  # before a prefork kill, which would leave it to lapse
        self.cancel_event.set()

    def ended(self) -> bool:
        """Whether the limit ended the task (not the run, a cancel or another run)."""
        with self.lock:
            return self.stopped

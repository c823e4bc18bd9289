"""Commit stamps and delivery traces for the listen-stream bench (bench/listen.py).

With ``BENCH_COMMIT_LOG`` set, every process of the stack (web and worker)
appends one JSON line per event to that file, stamped with the wall clock:

* ``commit``: a committed task change, when its after-commit signal runs,
  before anything publishes it;
* ``sent``: the publisher's ``group_send`` of a task change began and ended
  (in the process that committed it);
* ``received``: a listen stream took the change off the channel layer (in the
  web process), just before it is written to the client;
* ``gc``: a full garbage collection (generation 2) and how long it took.

The bench joins these with what its streams receive. Each line is one short
``O_APPEND`` write (microseconds), on the measured path.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import time
from typing import Any

from mcptasks import signals
from mcptasks.models import Task
from mcptasks.notify import fabric as notify
from mcptasks.protocol.shapes import change_stamp, iso

_fd: dict[int, int] = {}


def _write(record: list[Any]) -> None:
    pid = os.getpid()
    fd = _fd.get(pid)
    if fd is None:  # per process: Celery forks its pool after Django is set up
        fd = _fd[pid] = os.open(os.environ["BENCH_COMMIT_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def stamp(*, task_id: str, task: Task | None = None, kind: str = "", **_: Any) -> None:
    now = time.time()
    if task is None:
        return
    at = change_stamp(task)  # what the published message carries as "at"
    _write(
        [
            "commit",
            task_id,
            kind,
            task.status,
            task.status_message,
            iso(task.updated_at),
            at,
            round(now, 6),
            os.getpid(),
        ]
    )


def _trace_sends(layer_class: type) -> None:
    original = layer_class.group_send

    @functools.wraps(original)
    async def group_send(self: Any, group: str, message: dict[str, Any]) -> None:
        t0 = time.time()
        try:
            await original(self, group, message)
        finally:
            if "task_id" in message:
                _write(
                    ["sent", message["task_id"], message.get("at"), round(t0, 6), round(time.time(), 6), os.getpid()]
                )

    layer_class.group_send = group_send


def _trace_receives() -> None:
    original = notify.Listener.receive

    @functools.wraps(original)
    async def receive(self: notify.Listener, timeout: float) -> dict[str, Any] | None:
        message = await original(self, timeout)
        if message is not None and "task_id" in message:
            _write(["received", message["task_id"], message.get("at"), round(time.time(), 6), os.getpid()])
        return message

    notify.Listener.receive = receive


def _trace_collections() -> None:
    """Full (generation 2) garbage collections: they stop the process."""
    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started["t"] = time.time()
        elif "t" in started:
            t0 = started.pop("t")
            _write(["gc", round(t0, 6), round(time.time() - t0, 6), info.get("collected", 0), os.getpid()])

    gc.callbacks.append(callback)


def install() -> None:
    """Connect :func:`stamp` as the *first* receiver of ``task_changed`` (the
    stamp is taken before the publisher runs), and trace sends and receives."""
    signal = signals.task_changed
    signal.connect(stamp, sender=Task, dispatch_uid="bench.commit_stamp", weak=False)
    with signal.lock:  # Django keeps receivers in call order: move ours to the front
        mine = [r for r in signal.receivers if r[0][0] == "bench.commit_stamp"]
        signal.receivers[:] = mine + [r for r in signal.receivers if r not in mine]
        signal.sender_receivers_cache.clear()
    from channels_redis.core import RedisChannelLayer

    _trace_sends(RedisChannelLayer)
    _trace_receives()
    _trace_collections()

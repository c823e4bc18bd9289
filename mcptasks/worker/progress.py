"""A run's status reports, coalesced: the tool's ``ctx.report_status`` and
``ctx.report_progress`` return at once, and the latest message of each run is
written at most once per ``STATUS_INTERVAL_SECONDS``.

A status message is a hint, not a record: a client needs the latest one,
soon, not every one. The first report of a run is written at once, by one
thread of the process (the writer) for all its runs; reports that follow
within the interval replace each other, and the last of them is written when
the interval is up. When the run ends (it asks for input, finishes, fails,
or sees a cancel) its pending message is dropped before the run's next
durable write, and a write already under way is waited for, so nothing of
the run's reports lands after that write. The UPDATE is guarded by the
run's lease as well (``runs.set_status_message``), so a late write could not
overwrite a finished task anyway. A worker killed mid-run loses the message
of at most one interval: its task is run again from its lease.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from typing import Any

from django.db import connection

from ..conf import settings
from ..tasks import lifecycle

logger = logging.getLogger("mcptasks.execution")

#: The writer keeps its database connection this long after its last write.
IDLE_SECONDS = 10.0
#: A run that ends waits at most this long for its write under way (the
#: lease guard keeps a later write harmless; this only keeps the order).
END_WAIT_SECONDS = 10.0


class RunStatus:
    """The status reports of one run: ``report`` from the tool's thread,
    ``end`` once the tool returned or raised."""

    def __init__(self, task_id: str, worker: str, cancelled: threading.Event) -> None:
        self.task_id = task_id
        self.worker = worker
        self._cancelled = cancelled
        self._interval = max(0.0, float(settings.STATUS_INTERVAL_SECONDS))
        self._state = threading.Lock()  # guards the fields below
        self._writing = threading.Lock()  # held by the writer for the whole of a write
        self._pending: tuple[str, dict[str, Any] | None] | None = None
        self._scheduled = False
        self._last_write = -float("inf")
        self._ended = False

    def report(self, message: str, progress: dict[str, Any] | None = None) -> None:
        """The run's newest status message (and its numbers, if any)."""
        with self._state:
            if self._ended:
                return
            self._pending = (message, progress)
            if self._scheduled:
                return
            self._scheduled = True
            due = max(time.monotonic(), self._last_write + self._interval)
        writer.schedule(self, due)

    def end(self) -> None:
        """Drop what is pending and wait for a write under way: after this,
        nothing of this run's reports is written."""
        with self._state:
            self._ended = True
            self._pending = None
        if self._writing.acquire(timeout=END_WAIT_SECONDS):
            self._writing.release()

    def write(self) -> None:
        """Write the pending message (the writer's thread)."""
        with self._writing:
            with self._state:
                self._scheduled = False
                pending, self._pending = self._pending, None
                if pending is None or self._ended or self._cancelled.is_set():
                    return
                self._last_write = time.monotonic()
            message, progress = pending
            lifecycle.set_status_message(self.task_id, message, worker=self.worker, progress=progress)


class StatusWriter:
    """The process's one thread that writes its runs' status messages, each
    when due; it sleeps while none is, and lets its connection go when idle."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._ready = threading.Condition()
        self._due: list[tuple[float, int, RunStatus]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._releases: list[threading.Event] = []

    def schedule(self, run: RunStatus, due: float) -> None:
        if self._pid != os.getpid():  # forked: the parent's thread did not come along
            self._reset()
        with self._ready:
            heapq.heappush(self._due, (due, next(self._order), run))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="mcptasks-status", daemon=True)
                self._thread.start()
            self._ready.notify()

    def release(self, timeout: float = END_WAIT_SECONDS) -> bool:
        """Let the writer's database connection go once nothing is due, and
        wait for it: before a database the runs wrote to is dropped (a test
        run's, which ``mcptasks.testing`` serves). Whether it was let go."""
        with self._ready:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                return True
            released = threading.Event()
            self._releases.append(released)
            self._ready.notify()
        return released.wait(timeout)

    def _next(self) -> RunStatus:
        """The next run whose write is due, once it is."""
        with self._ready:
            while True:
                if not self._due:
                    if self._releases:
                        connection.close()
                        for released in self._releases:
                            released.set()
                        self._releases.clear()
                    if not self._ready.wait(IDLE_SECONDS) and not self._due and connection.connection is not None:
                        connection.close()  # idle: hold no connection while nothing is reported
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait <= 0:
                    return heapq.heappop(self._due)[2]
                self._ready.wait(wait)

    def _loop(self) -> None:
        while True:
            run = self._next()
            try:
                run.write()
            except Exception:
                # A lost status message is a hint lost; the run goes on.
                logger.exception("status message of task %s not written", run.task_id)
                connection.close()


#: The process's writer.
writer = StatusWriter()

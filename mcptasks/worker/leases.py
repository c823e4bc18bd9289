"""One lease monitor per worker process, for all of its runs.

While a tool runs, its lease is renewed every ``HEARTBEAT_SECONDS`` and its
task is checked every ``CANCEL_POLL_SECONDS``: once the task stops being
``working`` under the run (cancelled, or the lease lapsed and someone else
took it) the run's cancel event is set, and its tool's context sees the
cancel. A single thread does this for every run of the process, with one
statement per tick whatever the number of runs, and sleeps while there are
none. A short run (most runs) ends before the first tick and costs the
monitor nothing but two dictionary updates.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from django.db import connection

from ..conf import settings
from ..tasks import lifecycle

logger = logging.getLogger("mcptasks.execution")


class LeaseMonitor:
    """The process's monitor: ``watch`` a run when it starts, ``forget`` it
    when it ends."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[str, threading.Event]] = {}  # worker -> (task id, cancel event)
        #: The runs holding a concurrency slot, renewed with their leases.
        self._slotted: set[str] = set()
        #: worker -> (monotonic deadline, what to do then): a run's hard time limit.
        self._deadlines: dict[str, tuple[float, Callable[[], object]]] = {}
        self._wake = threading.Event()  # set when a run arrives while the thread waits for one
        self._waiting = False
        self._thread: threading.Thread | None = None

    def watch(
        self,
        task_id: str,
        worker: str,
        cancel_event: threading.Event,
        deadline: tuple[float, Callable[[], object]] | None = None,
    ) -> None:
        """Watch a run; with a ``deadline`` (monotonic time, action), the
        action runs on this thread once that time has passed, if the run is
        still watched then (its hard time limit)."""
        if self._pid != os.getpid():  # forked: the parent's thread did not come along
            self._reset()
        with self._lock:
            self._runs[worker] = (task_id, cancel_event)
            if deadline is not None:
                self._deadlines[worker] = deadline
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="mcptasks-leases", daemon=True)
                self._thread.start()
            elif self._waiting:
                self._waiting = False
                self._wake.set()

    def hold_slot(self, worker: str) -> None:
        """The run ``worker`` (watched next) holds a concurrency slot."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            self._slotted.add(worker)

    def forget(self, worker: str) -> None:
        # No wake-up: the next tick finds the run gone (back-to-back short
        # runs would otherwise wake the thread twice each).
        with self._lock:
            self._runs.pop(worker, None)
            self._deadlines.pop(worker, None)
            self._slotted.discard(worker)

    def watched(self) -> int:
        with self._lock:
            return len(self._runs)

    def _loop(self) -> None:
        next_beat = time.monotonic() + settings.HEARTBEAT_SECONDS
        while True:
            with self._lock:
                idle = self._waiting = not self._runs
                if idle:
                    self._wake.clear()
            if idle:
                # Nothing to watch: hold no connection while waiting for a run.
                if connection.connection is not None:
                    connection.close()
                self._wake.wait()
                next_beat = time.monotonic() + settings.HEARTBEAT_SECONDS
                continue
            time.sleep(settings.CANCEL_POLL_SECONDS)
            self._run_deadlines()
            with self._lock:
                runs = {worker: task_id for worker, (task_id, _) in self._runs.items()}
            if not runs:
                continue
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + settings.HEARTBEAT_SECONDS
                    held = lifecycle.renew_leases(runs)
                    with self._lock:
                        slotted = [worker for worker in self._slotted if worker in held]
                    lifecycle.renew_slots(slotted)
                else:
                    held = lifecycle.held_leases(runs)
            except Exception:  # the database blipped: try again next tick
                logger.warning("lease check of %d runs failed", len(runs), exc_info=True)
                connection.close()
                continue
            self._stop_lost(set(runs) - held)

    def _run_deadlines(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [w for w, (at, _) in self._deadlines.items() if at <= now]
            actions = [(w, self._deadlines.pop(w)[1]) for w in due]
        for worker, action in actions:
            try:
                action()
            except Exception:  # the lease then lapses and the sweeper recovers the task
                logger.warning("the time limit of run %s could not be applied", worker, exc_info=True)
                connection.close()

    def _stop_lost(self, lost: set[str]) -> None:
        with self._lock:
            events = [self._runs.pop(worker)[1] for worker in lost if worker in self._runs]
        for event in events:
            event.set()


#: The monitor of this process.
monitor = LeaseMonitor()

"""One lease monitor per worker process, for all its runs (docs/architecture.md says how)."""

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

#: A run's hard time limit: when (monotonic time), and what to do then.
Deadline = tuple[float, Callable[[], object]]


class LeaseMonitor:
    """``watch`` a run when it starts, ``forget`` it when it ends."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Condition()  # notified when a run arrives while the thread waits for one
        self._runs: dict[str, tuple[str, threading.Event]] = {}  # worker -> (task id, cancel event)
        self._slotted: set[str] = set()
        self._deadlines: dict[str, Deadline] = {}
        self._thread: threading.Thread | None = None

    def watch(
        self, task_id: str, worker: str, cancel: threading.Event, deadline: Deadline | None = None, slot: bool = False
    ) -> None:
        """Watch a run (holding a concurrency ``slot``, renewed with its lease); at its
        ``deadline``, unless forgotten, run the deadline's action on this thread."""
        if self._pid != os.getpid():  # forked: the parent's thread did not come along
            self._reset()
        with self._lock:
            self._runs[worker] = (task_id, cancel)
            if deadline is not None:
                self._deadlines[worker] = deadline
            if slot:
                self._slotted.add(worker)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="mcptasks-leases", daemon=True)
                self._thread.start()
            else:  # a no-op unless the thread waits for a run
                self._lock.notify()

    def forget(self, worker: str) -> None:
        # No wake-up (a short run would cost two): the next tick finds the run gone.
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
            if not self._runs:  # hold no connection while waiting for a run
                connection.close()
                with self._lock:
                    self._lock.wait_for(lambda: self._runs)
                next_beat = time.monotonic() + settings.HEARTBEAT_SECONDS
            time.sleep(settings.CANCEL_POLL_SECONDS)
            now = time.monotonic()
            with self._lock:
                due = [(w, self._deadlines.pop(w)[1]) for w, (at, _) in list(self._deadlines.items()) if at <= now]
                runs = {worker: task_id for worker, (task_id, _) in self._runs.items()}
                slotted = set(self._slotted)
            for worker, action in due:
                try:
                    action()
                except Exception:  # the lease then lapses and the sweeper recovers the task
                    logger.warning("the time limit of run %s could not be applied", worker, exc_info=True)
                    connection.close()
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + settings.HEARTBEAT_SECONDS
                    held = lifecycle.renew_leases(runs)
                    lifecycle.renew_slots(slotted & held)
                else:
                    held = lifecycle.held_leases(runs)
            except Exception:  # the database blipped: try again next tick
                logger.warning("lease check of %d runs failed", len(runs), exc_info=True)
                connection.close()
                continue
            with self._lock:  # the lost runs: their task was cancelled or taken
                lost = [self._runs.pop(worker)[1] for worker in set(runs) - held if worker in self._runs]
            for event in lost:
                event.set()


monitor = LeaseMonitor()

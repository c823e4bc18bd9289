"""Throttle counters kept in memory, synced with a shared one every ``THROTTLE_SYNC_MS`` (docs/reliability.md)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

logger = logging.getLogger("mcptasks.limits")

#: A counter to push: its key, the admissions since the last push, its expiry (s). The pusher returns the totals.
Push = tuple[str, int, int]
Pusher = Callable[[Sequence[Push]], list[int]]


@dataclass
class _Counter:
    ends_at: float  # wall-clock end of the window: the counter is dropped after it
    timeout: int
    shared: int = 0  # the shared total at the last sync (ours included)
    pushing: int = 0  # ours, sent in the sync under way
    unsynced: int = 0  # ours, admitted since then

    def total(self) -> int:
        return self.shared + self.pushing + self.unsynced


class LocalCounts:
    """Fixed-window counters, pushed every ``interval`` seconds by a thread that runs while any counter lives."""

    def __init__(self, pusher: Pusher, interval: float, describe: str = "shared counter") -> None:
        self.pusher, self.interval, self.describe = pusher, interval, describe
        self._lock = threading.Lock()
        self._counters: dict[str, _Counter] = {}
        self._thread: threading.Thread | None = None
        self._thread_pid = 0
        self._failing = False

    def admit(self, key: str, limit: int, ends_at: float, timeout: int) -> bool:
        """Count one request in ``key``'s window; ``False`` (nothing counted) when ``limit`` is reached."""
        with self._lock:
            counter = self._counters.setdefault(key, _Counter(ends_at, timeout))
            if counter.total() >= limit:
                return False
            counter.unsynced += 1
            if self._thread is None or self._thread_pid != os.getpid():  # a forked child has no thread of its own
                self._thread_pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="mcptasks-throttle-sync", daemon=True)
                self._thread.start()
            return True

    def sync(self) -> bool:
        """Drop ended windows, push the new admissions, read back the totals; ``False`` if the push failed."""
        now = time.time()
        with self._lock:
            self._counters = {key: c for key, c in self._counters.items() if c.ends_at > now}
            batch = list(self._counters.items())
            for _, counter in batch:
                counter.pushing, counter.unsynced = counter.unsynced, 0
        if not batch:
            return True
        error: Exception | None = None
        try:
            totals = self.pusher([(key, c.pushing, c.timeout) for key, c in batch])
        except Exception as exc:
            totals, error = [0] * len(batch), exc
        with self._lock:
            for (_, counter), total in zip(batch, totals, strict=True):
                if error is None:  # another process may have pushed meanwhile: the total only grows
                    counter.shared = max(counter.shared + counter.pushing, total)
                else:  # kept for the next try
                    counter.unsynced += counter.pushing
                counter.pushing = 0
            if error is not None and not self._failing:
                logger.warning(
                    "%s unavailable, throttles count in this process alone until it is back: %r", self.describe, error
                )
            elif error is None and self._failing:
                logger.warning("%s reachable again, throttles synced", self.describe)
            self._failing = error is not None
        return error is None

    def close(self) -> None:
        """Drop every counter; the sync thread ends at its next turn."""
        with self._lock:
            self._counters.clear()
            self._thread = None

    def seen(self, key: str) -> int:
        with self._lock:
            counter = self._counters.get(key)
            return counter.total() if counter is not None else 0

    def live(self) -> int:
        with self._lock:
            return len(self._counters)

    def _run(self) -> None:
        while self._thread is threading.current_thread():  # until closed, replaced or idle
            time.sleep(self.interval)
            self.sync()
            with self._lock:
                if not self._counters and self._thread is threading.current_thread():
                    self._thread = None

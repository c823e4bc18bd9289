"""An inline run: work a request does within itself (a tool or prompt run,
an ``auto`` tool's wait for its result), on a thread of its own.

2026-07-28 says a client that closes its connection has cancelled its
request. The endpoint learns of that on the event loop while the run goes on
in a thread, so the run carries a ``threading.Event`` that the tool's context
watches (``ctx.check_cancelled()``, ``ctx.sleep()``): setting it is how a
hang-up reaches the tool. Each run also holds one of its caller's inline
slots (``claim_inline_run``) from the moment it is accepted until it
ends, or until it is dropped before it started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..conf import settings
from ..errors import INTERNAL_ERROR, ProtocolError
from ..models import Task
from ..tasks import lifecycle
from ..tasks.waiting import wait_for_terminal
from .limits import RateLimited

#: Whether the client of a run has hung up (``None``: nobody watches).
HungUp = Callable[[], bool] | None

HUNG_UP = "The client closed its connection before it was answered."

#: Inline runs in flight in this process, by owner (``MAX_INLINE_RUNS_PER_OWNER``).
_inline_runs: dict[str, int] = {}
_inline_runs_lock = threading.Lock()

#: What a caller refused for too many inline runs is told to wait: runs end
#: when their tool returns or notices a cancel, which the server cannot date.
INLINE_RUN_RETRY_SECONDS = 1.0


def claim_inline_run(owner: str) -> None:
    """Count one inline run of ``owner`` until :func:`release_inline_run`. Past ``MAX_INLINE_RUNS_PER_OWNER``
    runs of this process at once, -31000 with HTTP 429: the inline pool is shared, one caller must not fill it."""
    cap = settings.MAX_INLINE_RUNS_PER_OWNER
    with _inline_runs_lock:
        running = _inline_runs.get(owner, 0)
        if cap is not None and running >= cap:
            raise RateLimited(
                f"Too many inline runs at once (limit {cap}); retry when one has ended", INLINE_RUN_RETRY_SECONDS
            )
        _inline_runs[owner] = running + 1


def release_inline_run(owner: str) -> None:
    """One inline run of ``owner`` has ended (or will never start)."""
    with _inline_runs_lock:
        running = _inline_runs.get(owner, 0) - 1
        if running > 0:
            _inline_runs[owner] = running
        else:
            _inline_runs.pop(owner, None)


def inline_runs(owner: str) -> int:
    """Inline runs of ``owner`` in flight in this process."""
    with _inline_runs_lock:
        return _inline_runs.get(owner, 0)


def call_cancelled() -> ProtocolError:
    """The error of an inline call whose run was cancelled (nobody reads it
    after a hang-up, but the run still ends with an answer)."""
    return ProtocolError(INTERNAL_ERROR, "The call was cancelled")


def wait_for_auto_result(task_id: str, owner: str, hung_up: HungUp) -> Task | None:
    """An ``auto`` tool's task once terminal within ``AUTO_TASK_BUDGET_SECONDS``
    (``None`` past it). A client that hangs up within the budget never learnt
    of the task: it is cancelled, as the inline run it stands for would be."""
    done = wait_for_terminal(task_id, settings.AUTO_TASK_BUDGET_SECONDS, stop=hung_up)
    if done is None and hung_up is not None and hung_up():
        lifecycle.cancel(task_id, actor=lifecycle.client_actor(owner), reason=HUNG_UP)
        raise call_cancelled()
    return done


class InlineRun:
    """One run's cancel event and its caller's slot (claimed here: past the
    caller's cap this raises ``RateLimited``)."""

    def __init__(self, owner: str) -> None:
        claim_inline_run(owner)
        self.owner = owner
        #: Set when the client hangs up (or the stream that carries the run ends).
        self.cancel = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._ended = False

    def start(self) -> bool:
        """Mark the run started; ``False`` (and the run ended) when its client
        went away before it could start: there is nobody to run it for."""
        with self._lock:
            if self._ended:
                return False
            if self.cancel.is_set():
                self._end_locked()
                return False
            self._started = True
            return True

    def end(self) -> None:
        """The run is over: its slot is free (once, whoever calls)."""
        with self._lock:
            self._end_locked()

    def abandon(self) -> None:
        """The client hung up: the run is cancelled, and a run that has not
        started never will (its slot is freed now; a started one frees it
        when its thread is done)."""
        self.cancel.set()
        with self._lock:
            if not self._started:
                self._end_locked()

    def _end_locked(self) -> None:
        if not self._ended:
            self._ended = True
            release_inline_run(self.owner)

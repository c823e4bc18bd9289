"""An inline run: work a request does within itself (a tool or prompt run,
an ``auto`` tool's wait for its result), on a thread of its own.

2026-07-28 says a client that closes its connection has cancelled its
request. The endpoint learns of that on the event loop while the run goes on
in a thread, so the run carries a ``threading.Event`` that the tool's context
watches (``ctx.check_cancelled()``, ``ctx.sleep()``): setting it is how a
hang-up reaches the tool. Each run also holds one of its caller's inline
slots (``limits.claim_inline_run``) from the moment it is accepted until it
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
from . import limits

#: Whether the client of a run has hung up (``None``: nobody watches).
HungUp = Callable[[], bool] | None

HUNG_UP = "The client closed its connection before it was answered."


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
    caller's cap this raises ``limits.RateLimited``)."""

    def __init__(self, owner: str) -> None:
        limits.claim_inline_run(owner)
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
            limits.release_inline_run(self.owner)

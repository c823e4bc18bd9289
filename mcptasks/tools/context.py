"""What a running tool sees: who called, how to ask the client questions, how to
report status, and whether it has been cancelled.

A tool may run more than once for one call: a run that needs answers it does
not have ends (``InputNeeded``), and once the client answers, the tool runs
again from the top with the answers replayed by key. So questions must be
asked in a stable order, and **writes belong after the last question**.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import HandOff, InputNeeded, InvalidParams, MissingCapability, SoftTimeLimitExceeded, TaskCancelled

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


@dataclass(frozen=True)
class Question:
    """One server-to-client request: ``elicitation/create``,
    ``sampling/createMessage`` or ``roots/list``."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)

    def as_request(self) -> dict[str, Any]:
        return {"method": self.method, "params": self.params}


def elicitation(message: str, schema: Mapping[str, Any] | None = None) -> Question:
    requested = dict(schema) if schema is not None else {"type": "object", "properties": {}}
    return Question("elicitation/create", {"mode": "form", "message": message, "requestedSchema": requested})


def sampling(messages: list[dict[str, Any]] | str, *, max_tokens: int = 256, **params: Any) -> Question:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": {"type": "text", "text": messages}}]
    return Question("sampling/createMessage", {"messages": messages, "maxTokens": max_tokens, **params})


def roots() -> Question:
    return Question("roots/list", {})


_CAPABILITY_FOR_METHOD = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}
_KEY_PREFIX = {"elicitation/create": "elicit", "sampling/createMessage": "sample", "roots/list": "roots"}


def validate_input_response(method: str, key: str, response: Any) -> None:
    """Reject an answer that cannot be the result of the request it answers."""
    if not isinstance(response, dict):
        raise InvalidParams(f"inputResponses[{key!r}] must be an object")
    if method == "elicitation/create":
        if response.get("action") not in ("accept", "decline", "cancel"):
            raise InvalidParams(f"inputResponses[{key!r}] must be an ElicitResult with an action")
        if "content" in response and not isinstance(response["content"], dict):
            raise InvalidParams(f"inputResponses[{key!r}].content must be an object")
    elif method == "sampling/createMessage":
        if "content" not in response or "role" not in response:
            raise InvalidParams(f"inputResponses[{key!r}] must be a CreateMessageResult")
    elif method == "roots/list" and not isinstance(response.get("roots"), list):
        raise InvalidParams(f"inputResponses[{key!r}] must be a ListRootsResult")


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value!r}")


def _plain(number: float) -> str:
    """``3`` for 3.0, ``2.5`` for 2.5."""
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def progress_text(progress: float, total: float | None = None) -> str:
    """A status message that carries the numbers: "step 3 of 10"."""
    if total is None:
        return f"step {_plain(progress)}"
    return f"step {_plain(progress)} of {_plain(total)}"


class ToolContext:
    """Handed to a tool (or a prompt) as its first parameter when it declares
    one. Built by ``mcptasks.tools.calls.tool_context`` for every run."""

    def __init__(
        self,
        *,
        owner: str,
        user: Any = None,
        load_user: Callable[[], Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
        answers: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        cancel_event: threading.Event | None = None,
        on_status: Callable[[str], object] | None = None,
        on_progress: Callable[[str, dict[str, Any]], object] | None = None,
        on_notify: Callable[[str, dict[str, Any]], None] | None = None,
        progress_token: str | int | None = None,
        log_level: str | None = None,
        in_task: bool = False,
        can_hand_off: bool = False,
        soft_time_limit: float | None = None,
        attempt: int = 1,
    ) -> None:
        self.owner = owner
        self._user = user
        self._load_user = load_user
        self.capabilities = dict(capabilities or {})
        self.task_id = task_id
        self.in_task = in_task
        self._answers = dict(answers or {})
        self._cancel_event = cancel_event or threading.Event()
        self._on_status = on_status
        self._on_progress = on_progress
        self._on_notify = on_notify
        self.progress_token = progress_token
        self.log_level = log_level if log_level in LOG_LEVELS else None
        self._can_hand_off = can_hand_off
        #: Which attempt of the tool this run is (1, then 2... after retries on ``retry_on``).
        self.attempt = attempt
        #: The tool's soft time limit (seconds) and when, on the monotonic clock, the run reaches it.
        self._soft_limit = soft_time_limit
        self._soft_deadline = None if soft_time_limit is None else time.monotonic() + soft_time_limit
        self._counters: dict[str, int] = {}
        #: Questions asked in this run, by key (for requestState and replay).
        self.asked: dict[str, Question] = {}

    @property
    def user(self) -> Any:
        """The Django user who made the call, inline or in a task run (where
        it is loaded from the task's owner on first use); ``None`` for an
        anonymous caller, an owner that is not a user, or a deleted user."""
        if self._load_user is not None:
            self._user, self._load_user = self._load_user(), None
        return self._user

    # Questions -----------------------------------------------------------

    def _next_key(self, method: str) -> str:
        prefix = _KEY_PREFIX.get(method, "input")
        self._counters[prefix] = self._counters.get(prefix, 0) + 1
        return f"{prefix}-{self._counters[prefix]}"

    def _check_capability(self, question: Question) -> None:
        needed = _CAPABILITY_FOR_METHOD.get(question.method)
        if needed and needed not in self.capabilities:
            raise MissingCapability({needed: {}}, f"This tool needs the client capability '{needed}'.")

    def can(self, capability: str) -> bool:
        """Whether the client declared ``capability`` (e.g. ``"elicitation"``)."""
        return capability in self.capabilities

    def ask(self, questions: Mapping[str, Question]) -> dict[str, Any]:
        """Ask several questions at once; returns every answer, by key.

        When any answer is missing, the run stops here and the client is asked
        all the unanswered questions together.
        """
        missing: dict[str, dict[str, Any]] = {}
        for key, question in questions.items():
            self._check_capability(question)
            self.asked[key] = question
            if key not in self._answers:
                missing[key] = question.as_request()
            else:
                validate_input_response(question.method, key, self._answers[key])
        if missing:
            raise InputNeeded(missing)
        return {key: self._answers[key] for key in questions}

    def ask_one(self, question: Question, *, key: str | None = None) -> Any:
        key = key or self._next_key(question.method)
        return self.ask({key: question})[key]

    def elicit(
        self, message: str, schema: Mapping[str, Any] | None = None, *, key: str | None = None
    ) -> dict[str, Any]:
        """Ask the user (form elicitation). Returns the ElicitResult:
        ``{"action": "accept" | "decline" | "cancel", "content": {...}}``."""
        result: dict[str, Any] = self.ask_one(elicitation(message, schema), key=key)
        return result

    def sample(
        self, messages: list[dict[str, Any]] | str, *, max_tokens: int = 256, key: str | None = None, **params: Any
    ) -> dict[str, Any]:
        """Ask the client's model. Returns the CreateMessageResult."""
        result: dict[str, Any] = self.ask_one(sampling(messages, max_tokens=max_tokens, **params), key=key)
        return result

    def list_roots(self, *, key: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.ask_one(roots(), key=key)
        return result

    def answered(self, key: str) -> Any | None:
        return self._answers.get(key)

    # Task phases ---------------------------------------------------------

    def hand_off(self) -> None:
        """End the inline phase of a task tool: everything before this call runs
        within the ``tools/call`` request (it may ask questions the MRTR way);
        everything after runs as a durable task. A no-op inside the task."""
        if self._can_hand_off and not self.in_task:
            raise HandOff()

    # Notifications ----------------------------------------------------------

    def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the tool got. Inline, ``notifications/progress`` when
        the caller asked for it. Inside a task, the task's status message:
        ``message``, or the numbers when there is none ("step 3 of 10"); a
        2025-11-25 task whose request carried a ``progressToken`` also sends
        ``notifications/progress`` with the numbers on its session's stream.
        Returns at once: inside a task, reports are coalesced like
        ``report_status``."""
        _check_number("progress", progress)
        if total is not None:
            _check_number("total", total)
        params: dict[str, Any] = {"progress": progress}
        if total is not None:
            params["total"] = total
        if message:
            params["message"] = message
        if self.progress_token is not None and self._on_notify is not None:
            self._on_notify("notifications/progress", {"progressToken": self.progress_token, **params})
        elif self.in_task:
            status = message or progress_text(progress, total)
            if self._on_progress is not None:
                self._on_progress(status, params)
            else:
                self.report_status(status)

    def log(self, level: str, data: Any, *, logger: str | None = None) -> None:
        """Send ``notifications/message`` if the request's log level admits it."""
        if level not in LOG_LEVELS:
            raise ValueError(f"unknown log level {level!r}")
        if self.log_level is None or self._on_notify is None:
            return
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(self.log_level):
            return
        params: dict[str, Any] = {"level": level, "data": data}
        if logger:
            params["logger"] = logger
        self._on_notify("notifications/message", params)

    # Status and cancellation --------------------------------------------------

    def report_status(self, message: str) -> None:
        """Set the task's ``statusMessage`` (ignored outside a task). Returns
        at once: a run's latest message is written at most once per
        ``STATUS_INTERVAL_SECONDS``, and one still pending when the run asks
        for input, returns or is cancelled is dropped."""
        if self._on_status is not None:
            self._on_status(message)

    @property
    def cancelled(self) -> bool:
        """Whether the tool should stop: the task was cancelled, or the run
        reached its soft time limit."""
        return self._cancel_event.is_set() or self._past_soft_limit()

    def _past_soft_limit(self) -> bool:
        return self._soft_deadline is not None and time.monotonic() >= self._soft_deadline

    def check_cancelled(self) -> None:
        """Stop here if the task was cancelled (``TaskCancelled``) or the run
        reached its soft time limit (``SoftTimeLimitExceeded``)."""
        if self._cancel_event.is_set():
            raise TaskCancelled()
        if self._past_soft_limit():
            assert self._soft_limit is not None
            raise SoftTimeLimitExceeded(self._soft_limit)

    def sleep(self, seconds: float) -> None:
        """Sleep, waking at once if the task is cancelled (``TaskCancelled``)
        or the run reaches its soft time limit (``SoftTimeLimitExceeded``)."""
        end = time.monotonic() + max(0.0, float(seconds))
        while True:
            self.check_cancelled()
            now = time.monotonic()
            if now >= end:
                return
            until = end if self._soft_deadline is None else min(end, self._soft_deadline)
            self._cancel_event.wait(timeout=max(0.0, until - now))

    def wait(self, event: threading.Event, timeout: float | None = None) -> bool:
        """Wait for ``event`` unless cancelled first; returns whether it was set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not event.is_set():
            self.check_cancelled()
            step = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if step <= 0:
                return False
            event.wait(step)
        return True

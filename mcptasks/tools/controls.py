"""How a tool's task runs are executed: its Celery queue, its time limits and
its retries, as its ``@tool(...)`` options give them, overridden per site by
``MCPTASKS["TOOL_CONTROLS"]`` (keyed by tool name, for tools the site does not
own; the merge is ``mcptasks.tools.effective``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

#: The options ``TOOL_CONTROLS`` may set for a tool, with the types they take.
OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "queue": (str,),
    "time_limit": (int, float),
    "soft_time_limit": (int, float),
    "retries": (int,),
    "retry_on": (list, tuple),
    "retry_backoff": (int, float),
    "retry_backoff_max": (int, float),
    "concurrency": (int,),
}

#: Seconds between a hard limit's outcome and the kill of a prefork process
#: still running the tool: the outcome is written first, by the run's own
#: process, so the kill never decides how the task ends.
HARD_KILL_MARGIN_SECONDS = 1.0


@dataclass(frozen=True)
class ToolControls:
    """A tool's execution controls; ``None`` (or ``0``) leaves one off."""

    #: The Celery queue of the tool's runs (``None``: ``CELERY_QUEUE``, else Celery's default).
    queue: str | None = None
    #: Seconds from a run's start to its stop; the task ends as a tool error.
    time_limit: float | None = None
    #: Seconds from a run's start to ``SoftTimeLimitExceeded`` in the tool.
    soft_time_limit: float | None = None
    #: Further attempts after a declared exception (``retry_on``).
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = ()
    #: The first backoff (seconds); each next one doubles, up to ``retry_backoff_max``.
    retry_backoff: float = 1.0
    retry_backoff_max: float = 600.0
    #: At most this many runs at once across every worker (``None``: no limit).
    concurrency: int | None = None

    def backoff(self, retry: int, *, jitter: random.Random | None = None) -> float:
        """The wait before retry number ``retry`` (1 for the first): exponential,
        capped, with "full jitter" over its upper half so that runs that failed
        together do not come back together."""
        ceiling = min(self.retry_backoff_max, self.retry_backoff * 2.0 ** (retry - 1))
        draw: float = (jitter or random).random()
        return max(0.0, ceiling / 2 + draw * ceiling / 2)

    def retries_for(self, exc: BaseException) -> bool:
        return bool(self.retries) and isinstance(exc, self.retry_on)


def validate(name: str, options: Any) -> ToolControls:
    """``TOOL_CONTROLS[name]`` as controls over the defaults, or ``ValueError``
    saying what is wrong (the system check reports it)."""
    if not isinstance(options, Mapping):
        raise ValueError(f"TOOL_CONTROLS[{name!r}] must be a dict of options")
    unknown = set(options) - set(OPTION_TYPES)
    if unknown:
        raise ValueError(f"TOOL_CONTROLS[{name!r}] has unknown options {sorted(unknown)}")
    values: dict[str, Any] = {}
    for key, value in options.items():
        if value is None and key in ("queue", "time_limit", "soft_time_limit", "concurrency"):
            values[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, OPTION_TYPES[key]):
            raise ValueError(f"TOOL_CONTROLS[{name!r}][{key!r}] has the wrong type: {type(value).__name__}")
        if key == "retry_on":
            values[key] = _exception_classes(name, value)
        else:
            values[key] = value
    return check(name, ToolControls(**values))


def check(name: str, controls: ToolControls) -> ToolControls:
    """Refuse controls that contradict themselves (``ValueError``)."""
    if controls.queue is not None and not controls.queue.strip():
        raise ValueError(f"tool {name!r}: queue must be a non-empty name")
    for key in ("time_limit", "soft_time_limit"):
        value = getattr(controls, key)
        if value is not None and not value > 0:
            raise ValueError(f"tool {name!r}: {key} must be positive seconds")
    soft, hard = controls.soft_time_limit, controls.time_limit
    if soft is not None and hard is not None and soft >= hard:
        raise ValueError(f"tool {name!r}: soft_time_limit must be below time_limit")
    if controls.concurrency is not None and controls.concurrency < 1:
        raise ValueError(f"tool {name!r}: concurrency must be at least 1")
    if controls.retries < 0:
        raise ValueError(f"tool {name!r}: retries must not be negative")
    if controls.retries and not controls.retry_on:
        raise ValueError(f"tool {name!r}: retries need the exceptions to retry on (retry_on)")
    if not all(isinstance(c, type) and issubclass(c, Exception) for c in controls.retry_on):
        raise ValueError(f"tool {name!r}: retry_on takes exception classes")
    if controls.retry_backoff < 0 or controls.retry_backoff_max < controls.retry_backoff:
        raise ValueError(f"tool {name!r}: retry_backoff must be >= 0 and at most retry_backoff_max")
    return controls


def _exception_classes(name: str, paths: Iterable[Any]) -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for path in paths:
        if not isinstance(path, str):
            raise ValueError(f"TOOL_CONTROLS[{name!r}]['retry_on'] takes dotted paths of exception classes")
        try:
            cls = import_string(path)
        except ImportError as exc:
            raise ValueError(f"TOOL_CONTROLS[{name!r}]['retry_on']: cannot import {path!r}: {exc}") from None
        found.append(cls)
    return tuple(found)

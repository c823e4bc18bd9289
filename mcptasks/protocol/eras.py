"""Rules that differ between the protocol eras and reach past the wire.

The worker asks here how a run's result leaves its task, so that neither the
domain nor the worker knows which era says what.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..models import Era, TaskStatus
from ..tools.results import is_tool_error


def status_after_result(era: str, result: Mapping[str, Any]) -> str:
    """The status a tool's ``CallToolResult`` leaves its task in.

    2025-11-25 (experimental tasks): an ``isError`` result fails the task; its
    result is still kept for ``tasks/result``. 2026-07-28: a tool error is a
    completed task whose result says ``isError``.
    """
    if era == Era.LEGACY and is_tool_error(result):
        return TaskStatus.FAILED
    return TaskStatus.COMPLETED

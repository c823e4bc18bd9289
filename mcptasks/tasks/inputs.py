"""The questions a waiting task has asked and not yet had answered."""

from __future__ import annotations

from typing import Any

from ..models import InputRequest, InputRequestState


def pending_inputs(task_id: str) -> dict[str, Any]:
    """The task's pending input requests: key -> ``{"method", "params"}``."""
    rows = InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING).values_list(
        "key", "method", "params"
    )
    return {key: {"method": method, "params": params} for key, method, params in rows}

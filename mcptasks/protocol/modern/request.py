"""One modern request, validated, and what the task methods read from it:
shared by the thread path's handlers (:mod:`handlers`) and the event loop's
(:mod:`on_loop`), so each check has one home."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...conf import settings
from ...errors import InvalidParams, TaskNotFound, missing_tasks_extension
from ...models import Task
from .. import authorization, limits
from ..caller import Caller
from ..jsonrpc import Message
from .headers import META_LOG_LEVEL, has_tasks_extension


class Request:
    """One modern request, validated: the handlers' input."""

    def __init__(
        self, message: Message, caller: Caller, capabilities: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.message = message
        self.headers = headers or {}
        self.params = message.params
        self.meta: dict[str, Any] = message.params.get("_meta") or {}
        self.caller = caller
        self.capabilities = capabilities

    @property
    def tasks_enabled(self) -> bool:
        return has_tasks_extension(self.capabilities)

    @property
    def wants_notifications(self) -> bool:
        return "progressToken" in self.meta or META_LOG_LEVEL in self.meta


def task_id_param(req: Request) -> str:
    """The task id a task method names; -32021 first, then -32602."""
    if not req.tasks_enabled:
        raise missing_tasks_extension()
    task_id = req.params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidParams('"taskId" (a string) is required')
    if not limits.storable_id(task_id, 64):
        raise TaskNotFound()  # no stored id is like it: the same answer as any unknown id
    return task_id


def owned_task(req: Request, task: Task | None) -> Task:
    """The looked-up task, if the caller may see it (-32602 otherwise)."""
    if task is None:
        raise TaskNotFound()
    authorization.require_task(req.caller, task)
    return task


def marks_in_the_read(req: Request) -> bool:
    """Whether tasks/get marks an outcome's first read as it reads (no scopes to refuse it after)."""
    return req.caller.scopes is None


def input_responses(req: Request) -> dict[str, Any]:
    """tasks/update's answers, checked for shape and size (-32602)."""
    responses = req.params.get("inputResponses")
    if not isinstance(responses, dict):
        raise InvalidParams('"inputResponses" (an object) is required')
    limits.check_size(responses, settings.MAX_INPUT_RESPONSES_BYTES, "inputResponses")
    return responses

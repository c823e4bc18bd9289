"""One modern request, validated: the input of the handlers (:mod:`handlers`),
on a thread and on the event loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..caller import Caller
from ..jsonrpc import Message
from ..task_methods import THREAD, Route
from .headers import META_LOG_LEVEL, has_tasks_extension


class Request:
    """One modern request, validated: the handlers' input."""

    def __init__(
        self,
        message: Message,
        caller: Caller,
        capabilities: dict[str, Any],
        headers: Mapping[str, str] | None = None,
        route: Route = THREAD,
    ) -> None:
        self.message = message
        self.headers = headers or {}
        self.params = message.params
        self.meta: dict[str, Any] = message.params.get("_meta") or {}
        self.caller = caller
        self.capabilities = capabilities
        self.route = route  # the task store's steps: on this thread, or on the event loop

    @property
    def tasks_enabled(self) -> bool:
        return has_tasks_extension(self.capabilities)

    @property
    def wants_notifications(self) -> bool:
        return "progressToken" in self.meta or META_LOG_LEVEL in self.meta

"""One request of a 2025-era session, as the handlers take it, and the shape
of their results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...models import LegacySession
from .. import jsonrpc
from ..caller import Caller
from ..modern.headers import META_SERVER_INFO
from ..modern.request import Request
from ..streaming import Stream

TASKS_VERSION = "2025-11-25"


@dataclass
class Call:
    """One request of a session: the handlers' input."""

    message: jsonrpc.Message
    caller: Caller
    session: LegacySession

    @property
    def params(self) -> dict[str, Any]:
        return self.message.params

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.message.params.get("_meta")
        return meta if isinstance(meta, dict) else {}

    @property
    def version(self) -> str:
        return self.session.protocol_version

    @property
    def tasks_enabled(self) -> bool:
        return self.version == TASKS_VERSION

    @property
    def may_ask(self) -> bool:
        """The server sends the client requests only after ``initialized``."""
        return self.session.initialized_at is not None

    def modern_request(self, params: dict[str, Any] | None = None) -> Request:
        """This call as the 2026-07-28 handlers take it (to reuse them)."""
        body = {k: v for k, v in (self.params if params is None else params).items() if k != "_meta"}
        message = jsonrpc.Message(method=self.message.method, params=body, id=self.message.id)
        return Request(message, self.caller, dict(self.session.client_capabilities))


Reply = dict[str, Any] | Stream


def legacy_result(value: dict[str, Any]) -> dict[str, Any]:
    """A 2026-07-28 result in 2025 form: no ``resultType``, no caching hints,
    no ``serverInfo`` in ``_meta``."""
    out = {k: v for k, v in value.items() if k not in ("resultType", "ttlMs", "cacheScope")}
    meta = {k: v for k, v in (out.pop("_meta", None) or {}).items() if k != META_SERVER_INFO}
    if meta:
        out["_meta"] = meta
    return out

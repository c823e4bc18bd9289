"""A small JSON-RPC client for the 2026-07-28 wire.

It builds what a conforming client sends (``params._meta`` with the protocol
version and the client capabilities, and the ``MCP-Protocol-Version``,
``Mcp-Method`` and ``Mcp-Name`` headers) and hands back the HTTP status and the
decoded body. Every part can be overridden or dropped, so negative tests can
send exactly the malformed request they mean to.

Two transports: Django's test client (in-process) and httpx (a live server).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = "2026-07-28"
TASKS_EXT = "io.modelcontextprotocol/tasks"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"

#: Declares the tasks extension (and nothing else).
TASKS_CAPS: dict[str, Any] = {"extensions": {TASKS_EXT: {}}}
#: Declares the tasks extension, elicitation and sampling.
FULL_CAPS: dict[str, Any] = {"elicitation": {}, "sampling": {}, "extensions": {TASKS_EXT: {}}}
#: Declares nothing.
NO_CAPS: dict[str, Any] = {}

TERMINAL = frozenset({"completed", "failed", "cancelled"})

_UNSET: Any = object()
_ids = itertools.count(1)

#: Methods whose ``Mcp-Name`` header mirrors a body field, and the field.
_NAME_FIELD = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}


def build_meta(
    capabilities: Mapping[str, Any] | None = FULL_CAPS,
    *,
    version: str | None = PROTOCOL_VERSION,
    client_info: bool = True,
) -> dict[str, Any]:
    """The request ``_meta``; ``None`` for a field leaves it out."""
    meta: dict[str, Any] = {}
    if version is not None:
        meta[META_VERSION] = version
    if client_info:
        meta[META_CLIENT_INFO] = {"name": "mcptasks-tests", "version": "1.0.0"}
    if capabilities is not None:
        meta[META_CAPABILITIES] = dict(capabilities)
    return meta


def build_headers(method: str, params: Mapping[str, Any], version: str | None = PROTOCOL_VERSION) -> dict[str, str]:
    headers = {"Accept": "application/json, text/event-stream", "Mcp-Method": method}
    if version is not None:
        headers["MCP-Protocol-Version"] = version
    name_field = _NAME_FIELD.get(method)
    if name_field is not None and isinstance(params.get(name_field), str):
        headers["Mcp-Name"] = params[name_field]
    return headers


@dataclass
class Reply:
    """One HTTP exchange: status, decoded JSON body (or ``None``), headers."""

    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    raw: bytes = b""
    request: dict[str, Any] = field(default_factory=dict)
    #: For an SSE response: every message before the final response.
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def result(self) -> dict[str, Any]:
        assert isinstance(self.body, dict) and "result" in self.body, (
            f"expected a result, got {self.status} {self.body}"
        )
        return self.body["result"]

    @property
    def error(self) -> dict[str, Any]:
        assert isinstance(self.body, dict) and "error" in self.body, f"expected an error, got {self.status} {self.body}"
        return self.body["error"]

    @property
    def ok(self) -> bool:
        return isinstance(self.body, dict) and "result" in self.body

    def __repr__(self) -> str:  # shows up in assertion messages
        return f"Reply(status={self.status}, body={self.body!r})"


class RpcClient:
    """Sends modern-wire JSON-RPC requests; subclasses provide ``_post``."""

    def __init__(
        self, *, token: str | None = None, capabilities: Mapping[str, Any] = FULL_CAPS, validate: bool = True
    ) -> None:
        self.token = token
        self.capabilities = dict(capabilities)
        #: Validate every server message against the pinned schemas.
        self.validate = validate

    # Transport --------------------------------------------------------------

    def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        raise NotImplementedError

    def _send(self, method: str, path: str, headers: dict[str, str]) -> Reply:
        raise NotImplementedError

    # Building requests ------------------------------------------------------------

    def request(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        capabilities: Mapping[str, Any] | None = _UNSET,
        version: str | None = PROTOCOL_VERSION,
        meta: Mapping[str, Any] | None = _UNSET,
        meta_extra: Mapping[str, Any] | None = None,
        request_id: Any = _UNSET,
        headers: Mapping[str, str | None] | None = None,
        notification: bool = False,
        token: str | None = _UNSET,
    ) -> Reply:
        """Send one request.

        ``meta`` replaces the whole ``_meta`` (``None`` omits it); otherwise it
        is built from ``capabilities`` and ``version``, plus ``meta_extra``
        (a ``progressToken``, say). ``headers`` override
        the computed headers (a ``None`` value removes one).
        """
        params = dict(params or {})
        if meta is _UNSET:
            caps = self.capabilities if capabilities is _UNSET else capabilities
            params["_meta"] = {**build_meta(caps, version=version), **dict(meta_extra or {})}
        elif meta is not None:
            params["_meta"] = dict(meta)
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notification:
            body["id"] = next(_ids) if request_id is _UNSET else request_id
        computed = build_headers(method, params, version)
        for name, value in (headers or {}).items():
            for existing in [k for k in computed if k.lower() == name.lower()]:
                del computed[existing]
            if value is not None:
                computed[name] = value
        reply = self.post_raw(json.dumps(body).encode(), computed, token=token, request=body)
        if self.validate:
            from tests.support.schemas import assert_valid_message, assert_valid_notification

            if isinstance(reply.body, dict):
                assert_valid_message(method, reply.body)
            for event in reply.events:
                assert_valid_notification(event)
        return reply

    def post_raw(
        self,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        token: str | None = _UNSET,
        request: dict[str, Any] | None = None,
    ) -> Reply:
        all_headers = {"Content-Type": "application/json", **dict(headers or {})}
        token = self.token if token is _UNSET else token
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        reply = self._post(payload, all_headers)
        reply.request = request or {}
        return reply

    # Conveniences -------------------------------------------------------------------

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, **kwargs: Any) -> Reply:
        params: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
        params.update(kwargs.pop("extra", {}))
        return self.request("tools/call", params, **kwargs)

    def tasks_get(self, task_id: str, **kwargs: Any) -> Reply:
        return self.request("tasks/get", {"taskId": task_id}, **kwargs)

    def tasks_update(self, task_id: str, responses: Any, **kwargs: Any) -> Reply:
        return self.request("tasks/update", {"taskId": task_id, "inputResponses": responses}, **kwargs)

    def tasks_cancel(self, task_id: str, **kwargs: Any) -> Reply:
        return self.request("tasks/cancel", {"taskId": task_id}, **kwargs)

    def create_task(self, name: str, arguments: Mapping[str, Any] | None = None, **kwargs: Any) -> str:
        """Call a tool that must answer with a CreateTaskResult; return the id."""
        reply = self.call_tool(name, arguments, **kwargs)
        assert reply.status == 200, reply
        result = reply.result
        assert result.get("resultType") == "task", f"expected a CreateTaskResult, got {result}"
        return result["taskId"]

    def wait_for(
        self,
        task_id: str,
        statuses: Iterable[str] = TERMINAL,
        *,
        timeout: float = 15.0,
        interval: float = 0.05,
        on_poll: Callable[[Reply], None] | None = None,
    ) -> dict[str, Any]:
        """Poll tasks/get until the status is one of ``statuses`` (or terminal)."""
        wanted = set(statuses) | TERMINAL
        deadline = time.monotonic() + timeout
        last: Reply | None = None
        while True:
            last = self.tasks_get(task_id)
            if on_poll is not None:
                on_poll(last)
            assert last.status == 200, last
            if last.result["status"] in wanted:
                return last.result
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} still {last.result['status']} after {timeout}s: {last.body}")
            time.sleep(interval)


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """The JSON messages of an SSE body (one per ``data:`` line)."""
    messages = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if line.startswith("data:"):
            messages.append(json.loads(line[5:].strip()))
    return messages


def decode_reply(status: int, headers: Mapping[str, str], raw: bytes) -> Reply:
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if content_type.startswith("text/event-stream"):
        messages = parse_sse(raw)
        final = [m for m in messages if "id" in m and ("result" in m or "error" in m)]
        events = [m for m in messages if m not in final]
        return Reply(status=status, body=final[-1] if final else None, headers=headers, raw=raw, events=events)
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    return Reply(status=status, body=body, headers=headers, raw=raw)


class DjangoRpc(RpcClient):
    """Through ``django.test.Client`` (no server process; no SSE streams)."""

    def __init__(self, client: Any, path: str = "/mcp", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client
        self.path = path

    def _reply(self, response: Any) -> Reply:
        assert not response.streaming, "streamed responses need a live server (use the live client)"
        return decode_reply(response.status_code, dict(response.headers), response.content)

    def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        content_type = headers.pop("Content-Type", "application/json")
        return self._reply(self.client.post(self.path, data=body, content_type=content_type, headers=headers))

    def send(self, http_method: str, headers: Mapping[str, str] | None = None) -> Reply:
        handler = getattr(self.client, http_method.lower())
        return self._reply(handler(self.path, headers=dict(headers or {})))


class HttpRpc(RpcClient):
    """Over HTTP to a running server (httpx)."""

    def __init__(self, url: str, *, timeout: float = 15.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import httpx

        self.url = url
        self.http = httpx.Client(timeout=timeout)

    def _reply(self, response: Any) -> Reply:
        return decode_reply(response.status_code, dict(response.headers), response.content)

    def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        return self._reply(self.http.post(self.url, content=body, headers=headers))

    def send(self, http_method: str, headers: Mapping[str, str] | None = None) -> Reply:
        return self._reply(self.http.request(http_method, self.url, headers=dict(headers or {})))

    def close(self) -> None:
        self.http.close()

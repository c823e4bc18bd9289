"""A small client for the 2025-era session wire (``initialize``,
``Mcp-Session-Id``), for tests that need to send exactly what they mean to.

Two transports, like ``tests.support.rpc``: Django's test client (in-process;
no SSE streams) and httpx (a live server; SSE streams can be read as they
come). Every JSON body and SSE message the server sends can be validated
against the pinned 2025-11-25 schema.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tests.support.rpc import Reply, decode_reply
from tests.support.schemas import assert_valid

SCHEMA = "2025-11-25.schema.json"
VERSION = "2025-11-25"
CAPS: dict[str, Any] = {"elicitation": {}, "sampling": {}}
RELATED = "io.modelcontextprotocol/related-task"

_ids = itertools.count(1)

#: Result definitions of the 2025-11-25 schema, by method.
RESULT_DEFS = {
    "initialize": "InitializeResult",
    "ping": "EmptyResult",
    "logging/setLevel": "EmptyResult",
    "tools/list": "ListToolsResult",
    "tools/call": "CallToolResult",
    "prompts/list": "ListPromptsResult",
    "prompts/get": "GetPromptResult",
    "resources/list": "ListResourcesResult",
    "resources/read": "ReadResourceResult",
    "completion/complete": "CompleteResult",
    "tasks/get": "GetTaskResult",
    "tasks/list": "ListTasksResult",
    "tasks/cancel": "CancelTaskResult",
}
#: Server messages by method (requests and notifications on SSE streams).
MESSAGE_DEFS = {
    "elicitation/create": "ElicitRequest",
    "sampling/createMessage": "CreateMessageRequest",
    "notifications/progress": "ProgressNotification",
    "notifications/message": "LoggingMessageNotification",
    "notifications/tasks/status": "TaskStatusNotification",
}


def assert_valid_reply(method: str, body: Any, *, task: bool = False) -> None:
    """The envelope, then the result by method (a CreateTaskResult when ``task``)."""
    assert isinstance(body, dict), body
    if "error" in body:
        assert_valid(SCHEMA, "JSONRPCErrorResponse", body)
        return
    assert_valid(SCHEMA, "JSONRPCResultResponse", body)
    definition = "CreateTaskResult" if task else RESULT_DEFS.get(method, "Result")
    assert_valid(SCHEMA, definition, body["result"])


def assert_valid_message(message: Any) -> None:
    definition = MESSAGE_DEFS.get(message.get("method"))
    if definition is not None:
        assert_valid(SCHEMA, definition, message)
    elif "id" in message:
        assert_valid(SCHEMA, "JSONRPCRequest", message)
    else:
        assert_valid(SCHEMA, "JSONRPCNotification", message)


class LegacyClient:
    """One session's worth of requests; subclasses provide the transport."""

    def __init__(self, *, token: str | None = None, version: str = VERSION, validate: bool = True) -> None:
        self.token = token
        self.version = version
        self.session_id: str | None = None
        self.validate = validate

    def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        raise NotImplementedError

    def _send(self, http_method: str, headers: dict[str, str]) -> Reply:
        raise NotImplementedError

    def headers(self, *, session: bool = True, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session_id and session:
            headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = self.version
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for name, value in (extra or {}).items():
            if value is None:
                headers.pop(name, None)
            else:
                headers[name] = value
        return headers

    def post(self, body: Any, **header_options: Any) -> Reply:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self._post(payload, self.headers(**header_options))

    def initialize(
        self, version: str | None = None, capabilities: Mapping[str, Any] = CAPS, *, initialized: bool = True
    ) -> Reply:
        params = {
            "protocolVersion": version or self.version,
            "capabilities": dict(capabilities),
            "clientInfo": {"name": "mcptasks-legacy-tests", "version": "1.0.0"},
        }
        reply = self.post({"jsonrpc": "2.0", "id": next(_ids), "method": "initialize", "params": params}, session=False)
        assert reply.status == 200, reply
        if self.validate:
            assert_valid_reply("initialize", reply.body)
        self.session_id = next((v for k, v in reply.headers.items() if k.lower() == "mcp-session-id"), None)
        self.version = reply.result["protocolVersion"]
        if initialized:
            assert self.notify("notifications/initialized").status == 202
        return reply

    def request(self, method: str, params: Mapping[str, Any] | None = None, **header_options: Any) -> Reply:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": next(_ids), "method": method}
        if params is not None:
            body["params"] = dict(params)
        reply = self.post(body, **header_options)
        reply.request = body
        if self.validate and reply.status == 200 and isinstance(reply.body, dict):
            task = method == "tools/call" and "task" in reply.body.get("result", {})
            assert_valid_reply(method, reply.body, task=task)
            for event in reply.events:
                assert_valid_message(event)
        return reply

    def notify(self, method: str, params: Mapping[str, Any] | None = None) -> Reply:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            body["params"] = dict(params)
        return self.post(body)

    def respond(self, request_id: Any, result: Any = None, *, error: Mapping[str, Any] | None = None) -> Reply:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            body["error"] = dict(error)
        else:
            body["result"] = result
        return self.post(body)

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, **params: Any) -> Reply:
        return self.request("tools/call", {"name": name, "arguments": dict(arguments or {}), **params})

    def create_task(self, name: str, arguments: Mapping[str, Any] | None = None, ttl: int | None = 60_000) -> str:
        reply = self.call_tool(name, arguments, task={} if ttl is None else {"ttl": ttl})
        assert reply.status == 200 and "task" in reply.result, reply
        return reply.result["task"]["taskId"]

    def delete(self) -> Reply:
        return self._send("DELETE", self.headers())


class DjangoLegacy(LegacyClient):
    def __init__(self, client: Any, path: str = "/mcp", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client
        self.path = path

    def _reply(self, response: Any) -> Reply:
        assert not response.streaming, "a streamed response needs a live server"
        return decode_reply(response.status_code, dict(response.headers), response.content)

    def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        content_type = headers.pop("Content-Type", "application/json")
        return self._reply(self.client.post(self.path, data=body, content_type=content_type, headers=headers))

    def _send(self, http_method: str, headers: dict[str, str]) -> Reply:
        return self._reply(getattr(self.client, http_method.lower())(self.path, headers=headers))


class HttpLegacy(LegacyClient):
    def __init__(self, url: str, *, timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import httpx

        self.url = url
        self.http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        response = self.http.post(self.url, content=body, headers=headers)
        return decode_reply(response.status_code, dict(response.headers), response.content)

    def _send(self, http_method: str, headers: dict[str, str]) -> Reply:
        response = self.http.request(http_method, self.url, headers=headers)
        return decode_reply(response.status_code, dict(response.headers), response.content)

    @contextmanager
    def stream(self, body: Any | None = None, *, url: str | None = None) -> Iterator[SseReader]:
        """POST ``body`` (or GET the session stream when ``None``) and read
        the SSE response message by message."""
        headers = self.headers()
        if body is None:
            context = self.http.stream("GET", url or self.url, headers={**headers, "Accept": "text/event-stream"})
        else:
            context = self.http.stream("POST", url or self.url, content=json.dumps(body).encode(), headers=headers)
        with context as response:
            yield SseReader(response, validate=self.validate)


class SseReader:
    """The messages of one SSE response, read as they arrive. A request may
    also be answered with one JSON object instead of a stream (the server's
    choice, e.g. ``tasks/result`` of a task already finished): that object is
    then the only message."""

    def __init__(self, response: Any, *, validate: bool) -> None:
        self.response = response
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "")
        self.validate = validate
        self._lines: Iterator[str]
        if self.content_type.startswith("application/json"):
            response.read()
            self._lines = iter([f"data: {response.text}"])
        else:
            self._lines = response.iter_lines()

    def next(self) -> dict[str, Any]:
        """The next JSON-RPC message (keep-alive comments are skipped)."""
        for line in self._lines:
            if line.startswith("data:"):
                message = json.loads(line[5:].strip())
                if self.validate and "method" in message:
                    assert_valid_message(message)
                return message
        raise AssertionError("the stream ended")

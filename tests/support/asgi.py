"""One MCP request straight through ``mcp_router``, in-process, as an ASGI
server would deliver it (no Django test client, so no middleware)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

from django.core.asgi import get_asgi_application
from django.utils.datastructures import CaseInsensitiveMapping

from mcptasks.web.asgi import mcp_router
from tests.support.rpc import Reply, RpcClient, build_headers, build_meta, decode_reply


def http_scope(body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
    raw = [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    raw += [
        (b"host", b"testserver"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": raw,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


async def apost(
    app: Any, body: bytes, headers: Mapping[str, str], on_send: Callable[[dict[str, Any]], None] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """:func:`post_asgi` on the running event loop, to ``app``."""
    sent: list[dict[str, Any]] = []
    finished = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if on_send is not None:
            on_send(message)

    await app(http_scope(body, headers), receive, send)
    finished.set()
    response_headers = {k.decode().lower(): v.decode() for k, v in sent[0].get("headers", [])}
    return sent[0]["status"], response_headers, b"".join(m.get("body", b"") for m in sent[1:])


def post_asgi(
    body: bytes, headers: Mapping[str, str], on_send: Callable[[dict[str, Any]], None] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """Status, response headers (lower-case names) and raw body of one POST
    through ``mcp_router``, on an event loop of its own."""
    return asyncio.run(apost(mcp_router(get_asgi_application(), path="/mcp"), body, headers, on_send))


class AsgiRpc(RpcClient):
    """Through ``mcp_router`` in-process, as an ASGI server delivers requests
    (so polls may be served on the event loop)."""

    polls_sent = 0

    def request(self, method: str, *args: Any, **kwargs: Any) -> Reply:
        if method == "tasks/get":
            self.polls_sent += 1
        return super().request(method, *args, **kwargs)

    def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        headers = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-length", "host")}
        status, response_headers, raw = post_asgi(body, headers)
        return decode_reply(status, CaseInsensitiveMapping(response_headers), raw)


def serve_asgi(
    method: str,
    params: dict[str, Any],
    headers: Mapping[str, str] | None = None,
    on_send: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """Status, response headers (lower-case names) and the decoded JSON body
    of one request; ``headers`` go on top of the request's MCP headers, and
    ``on_send(message)`` sees each message as the server sends it."""
    params = {**params, "_meta": build_meta()}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    status, response_headers, raw = post_asgi(body, {**build_headers(method, params), **(headers or {})}, on_send)
    return status, response_headers, json.loads(raw)

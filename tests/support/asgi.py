"""One MCP request straight through ``mcp_router``, in-process, as an ASGI
server would deliver it (no Django test client, so no middleware)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

from django.core.asgi import get_asgi_application

from mcptasks.web.asgi import mcp_router
from tests.support.rpc import build_headers, build_meta


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
    app = mcp_router(get_asgi_application(), path="/mcp")
    sent: list[dict[str, Any]] = []

    async def run() -> None:
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

        await app(http_scope(body, {**build_headers(method, params), **(headers or {})}), receive, send)
        finished.set()

    asyncio.run(run())
    response_headers = {k.decode().lower(): v.decode() for k, v in sent[0].get("headers", [])}
    return sent[0]["status"], response_headers, json.loads(b"".join(m.get("body", b"") for m in sent[1:]))

"""A minimal HTTP/1.1 client on asyncio streams, for sending many requests fast.

The fuzzer needs two things a normal client will not give it: sending header
names and values exactly as generated (a normal client validates them), and
a throughput of thousands of requests a second from one process on a small
machine. Each connection is kept alive; a connection the server closes (or a
streamed answer we stop reading) is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    status: int
    #: Lower-cased names; a repeated header keeps its last value.
    headers: dict[str, str]
    body: bytes
    elapsed: float
    #: For ``text/event-stream``: whether we stopped reading before its end.
    truncated: bool = False
    all_headers: list[tuple[str, str]] = field(default_factory=list)


class ProtocolFailure(Exception):
    """The server's answer was not valid HTTP/1.1, or the connection broke."""


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=2**22)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        *,
        stream_timeout: float = 2.0,
        timeout: float = 30.0,
    ) -> RawResponse:
        """Send one request and read its answer. ``headers`` go out as given,
        after ``Host`` (unless one is given) and ``Content-Length``."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        names = {name.lower() for name, _ in headers}
        head = [f"{method} {path} HTTP/1.1".encode()]
        if b"host" not in names:
            head.append(f"Host: {self.host}:{self.port}".encode())
        head.append(f"Content-Length: {len(body)}".encode())
        head.extend(name + b": " + value for name, value in headers)
        started = time.monotonic()
        self.writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        try:
            response = await asyncio.wait_for(self._read(stream_timeout), timeout)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            await self.close()
            raise ProtocolFailure(f"{type(exc).__name__}: {exc}") from exc
        response.elapsed = time.monotonic() - started
        if response.truncated or response.headers.get("connection", "").lower() == "close":
            await self.close()
        return response

    async def _read(self, stream_timeout: float) -> RawResponse:
        assert self.reader is not None
        status_line = await self.reader.readuntil(b"\r\n")
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"bad status line {status_line!r}")
        status = int(parts[1])
        all_headers: list[tuple[str, str]] = []
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode("latin-1").partition(":")
            all_headers.append((name.strip().lower(), value.strip()))
        headers = dict(all_headers)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            streamed = headers.get("content-type", "").startswith("text/event-stream")
            body, truncated = await self._chunks(stream_timeout if streamed else None)
        elif "content-length" in headers:
            body, truncated = await self.reader.readexactly(int(headers["content-length"])), False
        elif status in (204, 304) or 100 <= status < 200:
            body, truncated = b"", False
        else:  # until the server closes
            body, truncated = await self.reader.read(), False
            headers["connection"] = "close"
        return RawResponse(status, headers, body, 0.0, truncated, all_headers)

    async def _chunks(self, stream_timeout: float | None) -> tuple[bytes, bool]:
        """A chunked body; an event stream is read for at most
        ``stream_timeout`` seconds or until it carries a final response."""
        assert self.reader is not None
        out = bytearray()
        deadline = None if stream_timeout is None else time.monotonic() + stream_timeout

        async def next_chunk() -> bytes | None:
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return None
            data = await self.reader.readexactly(size)
            await self.reader.readexactly(2)
            return data

        while True:
            if deadline is None:
                chunk = await next_chunk()
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return bytes(out), True
                try:
                    chunk = await asyncio.wait_for(next_chunk(), left)
                except TimeoutError:
                    return bytes(out), True
            if chunk is None:
                return bytes(out), False
            out.extend(chunk)
            if deadline is not None and _has_final_response(out):
                # A final response ends the exchange; a server may still
                # keep the stream open for a moment (we do not wait for it).
                return bytes(out), True


def _has_final_response(data: bytearray) -> bool:
    import json

    for line in bytes(data).split(b"\n"):
        if line.startswith(b"data:"):
            with contextlib.suppress(ValueError):
                message = json.loads(line[5:])
                if isinstance(message, dict) and "id" in message and ("result" in message or "error" in message):
                    return True
    return False

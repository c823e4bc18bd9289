"""A small asyncio MCP client over raw HTTP/1.1 keep-alive connections.

Used where a fixed-rate tool like wrk does not fit: seeding tasks, the
tools/call latency samples (call-latency), the create-to-terminal loop
(throughput) and the paced polling during the purge (scale). It speaks only what the bench needs:
POST with a Content-Length body, answers with Content-Length or chunked
bodies, reconnecting whenever the server closes (gunicorn's sync workers close
after every answer).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

try:  # the bench venv has uvloop; fall back quietly elsewhere
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}
TERMINAL = {"completed", "failed", "cancelled"}


def run(coro: Any) -> Any:
    if uvloop is not None:
        return uvloop.run(coro)
    return asyncio.run(coro)


def rpc_bytes(
    host: str,
    path: str,
    method: str,
    params: dict[str, Any],
    name: str,
    rid: int | str = 1,
    meta: dict[str, Any] | None = None,
    token: str | None = None,
) -> bytes:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": meta or META}},
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
        f"Mcp-Method: {method}\r\nMcp-Name: {name}\r\n"
        + (f"Authorization: Bearer {token}\r\n" if token else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


class Conn:
    """One keep-alive connection; ``send`` returns (status, body)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        self.hostport = f"{self.host}:{self.port}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        for attempt in (0, 1):
            if self.writer is None:
                await self._open()
            try:
                self.writer.write(raw)
                return await self._read()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _read(self) -> tuple[int, bytes]:
        assert self.reader is not None
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = None
        chunked = False
        close = False
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            key = key.strip().lower()
            if key == b"content-length":
                length = int(value)
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif key == b"connection" and b"close" in value.lower():
                close = True
        if chunked:
            body = bytearray()
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                body += await self.reader.readexactly(size + 2)
                del body[-2:]
            data = bytes(body)
        elif length is not None:
            data = await self.reader.readexactly(length)
        else:
            data = await self.reader.read()
            close = True
        if close:
            self.close()
        return status, data


@dataclass
class Client:
    url: str
    #: A bearer token sent with every request (None: anonymous).
    token: str | None = None

    def call_bytes(
        self, tool: str, arguments: dict[str, Any] | None = None, meta: dict[str, Any] | None = None
    ) -> bytes:
        c = urlsplit(self.url)
        params = {"name": tool, "arguments": arguments or {}}
        return rpc_bytes(f"{c.hostname}:{c.port}", c.path, "tools/call", params, tool, meta=meta, token=self.token)

    def get_bytes(self, task_id: str) -> bytes:
        c = urlsplit(self.url)
        return rpc_bytes(f"{c.hostname}:{c.port}", c.path, "tasks/get", {"taskId": task_id}, task_id, token=self.token)


def _result(status: int, body: bytes) -> dict[str, Any]:
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
    message = json.loads(body)
    if "result" not in message:
        raise RuntimeError(f"JSON-RPC error: {body[:300]!r}")
    return message["result"]


# Seeding ---------------------------------------------------------------------------------


async def create_tasks(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    n: int,
    concurrency: int = 16,
    meta: dict[str, Any] | None = None,
    token: str | None = None,
) -> list[str]:
    client = Client(url, token)
    raw = client.call_bytes(tool, arguments, meta=meta)
    ids: list[str] = []
    left = iter(range(n))

    async def worker() -> None:
        conn = Conn(url)
        try:
            for _ in left:
                result = _result(*await conn.send(raw))
                if result.get("resultType") != "task":
                    raise RuntimeError(f"not a task: {result}")
                ids.append(result["taskId"])
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ids


async def statuses(url: str, ids: list[str], concurrency: int = 16, token: str | None = None) -> dict[str, str]:
    client = Client(url, token)
    out: dict[str, str] = {}
    left = iter(ids)

    async def worker() -> None:
        conn = Conn(url)
        try:
            for tid in left:
                out[tid] = _result(*await conn.send(client.get_bytes(tid)))["status"]
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def wait_terminal(url: str, ids: list[str], timeout: float = 120.0, token: str | None = None) -> dict[str, int]:
    """Poll until every task is terminal; returns the count per status."""
    deadline = time.monotonic() + timeout
    pending = list(ids)
    seen: dict[str, str] = {}
    while pending:
        got = await statuses(url, pending, token=token)
        seen.update(got)
        pending = [t for t in pending if got[t] not in TERMINAL]
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(pending)} task(s) still not terminal after {timeout}s")
            await asyncio.sleep(0.2)
    counts: dict[str, int] = {}
    for s in seen.values():
        counts[s] = counts.get(s, 0) + 1
    return counts


# call-latency: tools/call latency ---------------------------------------------------------------------


@dataclass
class Samples:
    latencies: list[float] = field(default_factory=list)  # seconds
    errors: int = 0
    started: float = 0.0
    finished: float = 0.0
    ids: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        span = self.finished - self.started
        return len(self.latencies) / span if span > 0 else 0.0


async def call_latency(url: str, tool: str, n: int, concurrency: int, warmup: int = 0) -> Samples:
    """``n`` tools/call of ``tool`` over ``concurrency`` connections, each timed."""
    client = Client(url)
    raw = client.call_bytes(tool)
    out = Samples()
    budget = iter(range(n))

    async def worker(count: Iterable[int]) -> None:
        conn = Conn(url)
        try:
            for _ in count:
                t0 = time.perf_counter()
                try:
                    result = _result(*await conn.send(raw))
                except Exception:
                    out.errors += 1
                    conn.close()
                    continue
                dt = time.perf_counter() - t0
                if result.get("resultType") == "task":
                    out.latencies.append(dt)
                    out.ids.append(result["taskId"])
                else:
                    out.errors += 1
        finally:
            conn.close()

    if warmup:
        warm = iter(range(warmup))
        await asyncio.gather(*(worker(warm) for _ in range(concurrency)))
        out.latencies.clear()
        out.ids.clear()
    out.started = time.perf_counter()
    await asyncio.gather(*(worker(budget) for _ in range(concurrency)))
    out.finished = time.perf_counter()
    return out


# throughput: create to terminal ------------------------------------------------------------------------


@dataclass
class E2E:
    completed: int = 0
    failed: int = 0
    errors: int = 0
    polls: int = 0
    window: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.completed / self.window if self.window else 0.0


async def end_to_end(
    url: str, concurrency: int, duration: float, warmup: float, poll_interval: float, tool: str = "noop"
) -> E2E:
    """``concurrency`` clients, each creating a task of ``tool`` (no
    arguments) and polling it every ``poll_interval`` seconds until terminal,
    then the next. Counts the tasks observed terminal within the measured
    window (after ``warmup``)."""
    client = Client(url)
    raw = client.call_bytes(tool)
    out = E2E()
    t_start = time.perf_counter()
    w_start = t_start + warmup
    w_end = w_start + duration

    async def worker() -> None:
        conn = Conn(url)
        await asyncio.sleep(random.random() * poll_interval)  # spread the clients
        try:
            while time.perf_counter() < w_end:
                t0 = time.perf_counter()
                try:
                    task = _result(*await conn.send(raw))
                    tid = task["taskId"]
                    get = client.get_bytes(tid)
                    status = task.get("status")
                    while status not in TERMINAL:
                        await asyncio.sleep(poll_interval)
                        status = _result(*await conn.send(get))["status"]
                        if w_start <= time.perf_counter() < w_end:
                            out.polls += 1
                except Exception:
                    out.errors += 1
                    conn.close()
                    await asyncio.sleep(poll_interval)
                    continue
                t1 = time.perf_counter()
                if w_start <= t1 < w_end:
                    if status == "completed":
                        out.completed += 1
                    else:
                        out.failed += 1
                    out.latencies.append(t1 - t0)
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.window = duration
    return out


# scale: paced polling ---------------------------------------------------------------------------------


async def paced_polls(
    url: str, ids: list[str], pollers: int, interval: float, stop: asyncio.Event
) -> list[tuple[float, float, int]]:
    """``pollers`` clients each polling a random id every ``interval`` seconds
    until ``stop``; returns (start time, latency, HTTP status) per poll."""
    client = Client(url)
    out: list[tuple[float, float, int]] = []

    async def worker() -> None:
        conn = Conn(url)
        await asyncio.sleep(random.random() * interval)
        next_at = time.perf_counter()
        try:
            while not stop.is_set():
                raw = client.get_bytes(random.choice(ids))
                t0 = time.perf_counter()
                try:
                    status, _ = await conn.send(raw)
                except Exception:
                    status = 0
                    conn.close()
                out.append((t0, time.perf_counter() - t0, status))
                next_at += interval
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    next_at = time.perf_counter()
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(pollers)))
    return out

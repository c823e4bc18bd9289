"""Per-request costs measured inside one process, without an HTTP server.

    DJANGO_SETTINGS_MODULE=bench.settings DATABASE_URL=... python -m bench.inprocess

Prints one JSON document: for tools/call (no-op) and tasks/get (working and
completed task), the SQL statements one request runs and the microseconds a
request takes through Django's full handler (middleware, view, JSON), next to
the bare view through the same handler, the ORM lookup alone and a raw
psycopg primary-key SELECT. The differences say where a request's time goes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}


def body(method: str, params: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}})


def headers(method: str, name: str) -> dict[str, str]:
    return {
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
        "Mcp-Name": name,
        "Accept": "application/json, text/event-stream",
    }


def post(c: Client, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
    r = c.post("/mcp", body(method, params), content_type="application/json", headers=headers(method, name))
    if r.status_code != 200:
        raise RuntimeError(f"{method}: HTTP {r.status_code} {r.content[:300]!r}")
    return json.loads(r.content)


def timed(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def queries(fn) -> list[str]:
    """The SQL one call runs, on whichever thread runs it (the view may hand
    the work to a thread pool, so a per-connection wrapper would miss it)."""
    from django.db.backends import utils

    seen: list[str] = []
    original = utils.CursorWrapper._execute_with_wrappers

    def record(self, sql, params, many, executor):
        seen.append(" ".join(str(sql).split())[:200])
        return original(self, sql, params, many, executor)

    utils.CursorWrapper._execute_with_wrappers = record
    try:
        fn()
    finally:
        utils.CursorWrapper._execute_with_wrappers = original
    return seen


def main() -> None:
    from mcptasks.models import Task

    c = Client()
    out: dict[str, Any] = {}
    call = lambda: post(c, "tools/call", {"name": "noop", "arguments": {}}, "noop")  # noqa: E731
    out["tools/call"] = {"sql": queries(call), "us": timed(call, 100)}

    working = post(c, "tools/call", {"name": "sleep", "arguments": {"seconds": 3600}}, "sleep")["result"]["taskId"]
    done_id = Task.objects.filter(status="completed", tool_name="noop").values_list("id", flat=True).first()
    for label, tid in (("tasks/get working", working), ("tasks/get completed", done_id)):
        if tid is None:
            continue
        get = lambda tid=tid: post(c, "tasks/get", {"taskId": tid}, tid)  # noqa: E731
        first = queries(get)
        out[label] = {"sql": queries(get), "us": timed(get, 500)}
        if first != out[label]["sql"]:
            out[f"{label} (first read)"] = {"sql": first}
    post(c, "tasks/cancel", {"taskId": working}, working)

    bare = lambda: c.post("/bare", "{}", content_type="application/json")  # noqa: E731
    out["bare view (same handler)"] = {"us": timed(bare, 1000)}
    orm = lambda: Task.objects.filter(pk=done_id, owner="anonymous").first()  # noqa: E731
    out["ORM lookup alone"] = {"us": timed(orm, 1000)}
    connection.ensure_connection()
    raw = connection.connection

    def pk() -> None:
        with raw.cursor() as cur:
            cur.execute("SELECT * FROM mcptasks_task WHERE id = %s", (done_id,))
            cur.fetchall()

    out["raw psycopg PK SELECT"] = {"us": timed(pk, 1000)}
    db = connection.settings_dict
    out["database"] = {
        "CONN_MAX_AGE": db.get("CONN_MAX_AGE"),
        "CONN_HEALTH_CHECKS": db.get("CONN_HEALTH_CHECKS"),
        "pool": (db.get("OPTIONS") or {}).get("pool"),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

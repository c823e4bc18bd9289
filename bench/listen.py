"""Listen streams: many concurrent ``subscriptions/listen`` streams
on one ASGI process, with tasks changing under them.

``python3 -m bench listen [--streams 1000]`` (bench/__main__.py prepares the
app venv and runs this module inside it). It starts, with names unique to the
run (database, Celery queue) that are dropped at the end:

* one ``uvicorn project.asgi:application --workers 1`` (uvloop, httptools) on
  ``bench.settings`` with Postgres and the Redis channel layer, abuse limits
  off (``BENCH_LIMITS=off``: one anonymous client opens every stream);
* one ``celery -A project worker`` on Redis (prefork, ``--workers`` slots).

Then, from this process (one asyncio client, uvloop):

1. creates ``streams * tasks-per-stream`` tasks of the bench tool ``gated``;
   each run asks for a go-ahead at once, so every task waits in
   ``input_required`` and holds no worker;
2. opens the streams, each naming its own tasks; every stream must get its
   acknowledgement and a snapshot of each of its tasks;
3. leaves them open and idle for ``--idle`` seconds;
4. answers the tasks (``tasks/update``) at a steady ``--rate`` in random
   order: each answer commits ``working`` in the web process, then a worker
   reports ``step 1`` … ``step N`` (random short sleeps) and completes, so
   every stream receives ``2 + steps`` changes per task while all stay open;
5. waits for every stream to see each of its tasks end, then closes them.

It measures the web process's RSS (VmRSS from /proc) before the streams open,
with all open and idle, sampled every 0.25 s under load, and its high-water
mark (VmHWM); the latency from commit to delivery of every change; the client's
CPU time and event-loop lag; and checks that each stream got its ack and every
committed change of its tasks, in order, ending with the terminal one.

Commit to delivery: with ``BENCH_COMMIT_LOG`` the bench app stamps each
committed change in every process of the stack, before it is published
(bench/benchapp/commits.py); the client stamps each notification when its
chunk is read off the socket. Both are ``time.time()`` on one machine. The
notification's own ``lastUpdatedAt`` gives a cruder upper bound (stamped
before the transaction's last statements and its commit, in milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg

from bench import client, envs, procs
from bench.stacks import Bench, Services

REPO = envs.REPO
RESULTS = REPO / "bench" / "results"

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
#: The bench tool asks for a go-ahead (an elicitation): the client declares it.
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {
        "elicitation": {},
        "extensions": {"io.modelcontextprotocol/tasks": {}},
    },
}
GO = {"go": {"action": "accept", "content": {}}}
TERMINAL = client.TERMINAL


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# The web process -------------------------------------------------------------------------


def proc_kb(pid: int, field_name: str) -> int:
    """A ``/proc/<pid>/status`` field in kB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


def mb(kb: float) -> float:
    return round(kb / 1024, 1)


# One stream -------------------------------------------------------------------------------


@dataclass
class Stream:
    sid: str
    task_ids: list[str]
    opened: float = 0.0  # request sent (perf_counter)
    acked: float = 0.0  # ack read (perf_counter)
    ack: dict[str, Any] | None = None
    #: Every notifications/tasks: (receive wall time, taskId, status, statusMessage, lastUpdatedAt).
    seen: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    keepalives: int = 0
    problems: list[str] = field(default_factory=list)
    ended_by_server: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # ack and every snapshot read
    done: asyncio.Event = field(default_factory=asyncio.Event)  # every task seen terminal
    _terminal: set[str] = field(default_factory=set)
    _expected: int = 0

    def handle(self, message: dict[str, Any], t: float) -> None:
        params = message.get("params") or {}
        if (params.get("_meta") or {}).get(SUBSCRIPTION_ID) != self.sid:
            self.problems.append(f"wrong or missing subscription id: {str(message)[:200]}")
        method = message.get("method")
        if self.ack is None:
            if method != "notifications/subscriptions/acknowledged":
                self.problems.append(f"first message is not the acknowledgement: {str(message)[:200]}")
            self.ack = params
            self.acked = time.perf_counter()
            self._expected = len((params.get("notifications") or {}).get("taskIds") or [])
            if not self._expected:
                self.ready.set()
            return
        if method != "notifications/tasks":
            self.problems.append(f"unexpected message: {str(message)[:200]}")
            return
        tid = params.get("taskId", "")
        status = params.get("status", "")
        self.seen.append((t, tid, status, params.get("statusMessage", ""), params.get("lastUpdatedAt", "")))
        if len(self.seen) == self._expected:
            self.ready.set()
        if status in TERMINAL:
            self._terminal.add(tid)
            if self._terminal >= set(self.task_ids):
                self.done.set()


async def run_stream(url: str, stream: Stream, gate: asyncio.Semaphore, stop: asyncio.Event) -> None:
    """Open one listen stream and read it until ``stop`` (or the server ends it)."""
    parts = urlsplit(url)
    raw = client.rpc_bytes(
        f"{parts.hostname}:{parts.port}",
        parts.path,
        "subscriptions/listen",
        {"notifications": {"taskIds": stream.task_ids}},
        "listen",
        rid=stream.sid,
        meta=META,
    )
    writer = None
    try:
        async with gate:  # bounded concurrent opens; released once the snapshots are in
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            stream.opened = time.perf_counter()
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            lower = head.lower()
            if status != 200 or b"text/event-stream" not in lower or b"chunked" not in lower:
                body = await asyncio.wait_for(reader.read(500), 5)
                stream.problems.append(f"HTTP {status}: {head[:200]!r} {body[:300]!r}")
                return
            reading = asyncio.ensure_future(_read_events(reader, stream))
            ready = asyncio.ensure_future(stream.ready.wait())
            await asyncio.wait({reading, ready}, return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if reading.done():
            reading.result()
            stream.ended_by_server = True
        else:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
    except Exception as exc:  # recorded: the check reports it
        stream.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        stream.ready.set()
        if writer is not None:
            writer.close()


async def _read_events(reader: asyncio.StreamReader, stream: Stream) -> None:
    """Chunked SSE: one event per chunk as the server writes them, but split
    on blank lines anyway."""
    buf = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            return
        chunk = await reader.readexactly(size + 2)
        t = time.time()
        buf += chunk[:-2]
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b":"):
                stream.keepalives += 1
                continue
            data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
            stream.handle(json.loads(data), t)


# Load ---------------------------------------------------------------------------------------


async def answer_all(url: str, ids: list[str], rate: float, connections: int = 4) -> dict[str, Any]:
    """``tasks/update`` with the go-ahead for every task, in the given order,
    the i-th sent at ``i / rate`` seconds (as far as the server keeps up)."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}"
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    late: list[float] = []
    errors: list[str] = []

    async def sender() -> None:
        conn = client.Conn(url)
        try:
            while (tid := await queue.get()) is not None:
                raw = client.rpc_bytes(
                    host, parts.path, "tasks/update", {"taskId": tid, "inputResponses": GO}, tid, meta=META
                )
                try:
                    client._result(*await conn.send(raw))
                except Exception as exc:
                    errors.append(f"{tid}: {exc}")
                    conn.close()
        finally:
            conn.close()

    workers = [asyncio.ensure_future(sender()) for _ in range(connections)]
    t0 = time.perf_counter()
    for i, tid in enumerate(ids):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            late.append(-delay)
        queue.put_nowait(tid)
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    span = time.perf_counter() - t0
    return {
        "answers": len(ids),
        "seconds": round(span, 1),
        "rate": round(len(ids) / span, 1) if span else 0.0,
        "errors": errors[:20],
        "error_count": len(errors),
    }


class LoopLag:
    """How late this process's event loop wakes a 10 ms sleeper: if the client
    is the bottleneck, its receive stamps are late too."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._task: asyncio.Future[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.samples.append(time.perf_counter() - t - 0.01)

    def start(self) -> None:
        self.samples = []
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
        return summary_ms(self.samples)


class RssSampler:
    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid = pid
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self._task: asyncio.Future[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, KeyError):
                self.samples.append((time.time(), proc_kb(self.pid, "VmRSS")))
            await asyncio.sleep(self.every)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def peak(self, since: float = 0.0) -> int:
        return max((kb for t, kb in self.samples if t >= since), default=0)


def client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def summary_ms(values: list[float]) -> dict[str, float]:
    """p50, p99, max (milliseconds) and count of ``values`` (seconds)."""
    if not values:
        return {"count": 0}
    v = sorted(values)

    def pct(p: float) -> float:
        return round(v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))] * 1000, 2)

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": round(v[-1] * 1000, 2), "count": len(v)}


# The run ------------------------------------------------------------------------------------


@dataclass
class Config:
    streams: int
    tasks_per_stream: int
    steps: int
    max_seconds: float
    rate: float
    idle: float
    open_concurrency: int
    drain_timeout: float


def db_statuses(bench: Bench) -> dict[str, int]:
    with psycopg.connect(bench.services.libpq(bench.db), autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM mcptasks_task GROUP BY status").fetchall()
    return {s: int(n) for s, n in rows}


async def drive(bench: Bench, url: str, web_pid: int, cfg: Config) -> tuple[dict[str, Any], list[Stream]]:
    out: dict[str, Any] = {}
    n_tasks = cfg.streams * cfg.tasks_per_stream

    # 1. The tasks, each waiting in input_required.
    t = time.perf_counter()
    args = {"steps": cfg.steps, "max_seconds": cfg.max_seconds}
    ids = await client.create_tasks(url, "gated", args, n_tasks, concurrency=8, meta=META)
    deadline = time.monotonic() + max(120.0, n_tasks / 5)
    while True:
        counts = await asyncio.to_thread(db_statuses, bench)
        if counts.get("input_required", 0) >= n_tasks:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"tasks did not all reach input_required: {counts}")
        await asyncio.sleep(0.5)
    out["setup_s"] = round(time.perf_counter() - t, 1)
    log(f"{n_tasks} tasks waiting for input ({out['setup_s']} s)")

    await asyncio.sleep(2)
    out["rss_before_kb"] = proc_kb(web_pid, "VmRSS")
    log(f"web RSS before the streams: {mb(out['rss_before_kb'])} MB")

    # 2. The streams.
    streams = [
        Stream(f"listen-{i}", ids[i * cfg.tasks_per_stream : (i + 1) * cfg.tasks_per_stream])
        for i in range(cfg.streams)
    ]
    stop = asyncio.Event()
    gate = asyncio.Semaphore(cfg.open_concurrency)
    lag = LoopLag()
    rss = RssSampler(web_pid)
    rss.start()
    cpu0, t0 = client_cpu(), time.perf_counter()
    runners = [asyncio.ensure_future(run_stream(url, s, gate, stop)) for s in streams]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in streams)), 60 + cfg.streams / 10)
    except TimeoutError:
        for s in streams:
            if not s.ready.is_set():
                s.problems.append("no acknowledgement and snapshots in time")
    open_s = time.perf_counter() - t0
    out["open"] = {
        "seconds": round(open_s, 1),
        "client_cpu_s": round(client_cpu() - cpu0, 2),
        "time_to_ack": summary_ms([s.acked - s.opened for s in streams if s.acked]),
        "failed": sum(1 for s in streams if s.problems),
    }
    log(f"{cfg.streams} streams open in {open_s:.1f} s ({out['open']['failed']} failed)")

    # 3. Open and idle.
    lag.start()
    cpu0, t0 = client_cpu(), time.perf_counter()
    await asyncio.sleep(cfg.idle)
    out["rss_open_idle_kb"] = proc_kb(web_pid, "VmRSS")
    out["idle"] = {"seconds": cfg.idle, "client_cpu_s": round(client_cpu() - cpu0, 2), "loop_lag_ms": lag.stop()}
    log(f"web RSS with {cfg.streams} streams open and idle: {mb(out['rss_open_idle_kb'])} MB")

    # 4. Load: answer every task at a steady rate while all the streams stay open.
    order = list(ids)
    random.shuffle(order)
    meter = procs.CpuMeter(
        {
            **bench.cpu_groups(bench.webs["uvicorn-1"]),
            "client": lambda: [psutil.Process(os.getpid())],
        }
    )
    meter.begin()
    lag.start()
    load_t0 = time.time()
    cpu0, t0 = client_cpu(), time.perf_counter()
    out["answers"] = await answer_all(url, order, cfg.rate)
    log(f"answered {len(order)} tasks at {out['answers']['rate']}/s; waiting for the last changes")
    pending = [s.done.wait() for s in streams if not s.problems]
    try:
        await asyncio.wait_for(asyncio.gather(*pending), cfg.drain_timeout)
    except TimeoutError:
        log(f"not every stream saw its tasks end within {cfg.drain_timeout} s")
    load_s = time.perf_counter() - t0
    cores = meter.end()
    out["load"] = {
        "seconds": round(load_s, 1),
        "client_cpu_s": round(client_cpu() - cpu0, 2),
        "loop_lag_ms": lag.stop(),
        "cores": cores,
        "other_load_cores": round(max(0.0, cores["machine"] - sum(v for k, v in cores.items() if k != "machine")), 2),
    }
    out["rss_peak_load_kb"] = rss.peak(since=load_t0)
    out["rss_after_load_kb"] = proc_kb(web_pid, "VmRSS")
    out["rss_hwm_kb"] = proc_kb(web_pid, "VmHWM")

    # 5. Close.
    stop.set()
    await asyncio.gather(*runners)
    await asyncio.sleep(3)
    out["rss_after_close_kb"] = proc_kb(web_pid, "VmRSS")
    rss.stop()
    out["rss_samples"] = rss.samples
    out["db_statuses"] = await asyncio.to_thread(db_statuses, bench)
    return out, streams


# Analysis -----------------------------------------------------------------------------------


def parse_iso(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def read_trace(path: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[tuple[str, int], dict[str, float]]]:
    """Committed changes per task, in commit order; and per change (task id,
    ``at``) when its publish began and ended and when the web process received it."""
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    hops: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record[0] == "commit":
                _, tid, kind, status, message, updated, at, t, pid = record
                per[tid].append(
                    {
                        "kind": kind,
                        "status": status,
                        "message": message,
                        "updated": updated,
                        "us": at,
                        "at": t,
                        "pid": pid,
                    }
                )
            elif record[0] == "sent":
                _, tid, at, t0, t1, _pid = record
                hops[(tid, at)].setdefault("send_start", t0)
                hops[(tid, at)].setdefault("send_end", t1)
            elif record[0] == "received":
                _, tid, at, t, _pid = record
                hops[(tid, at)].setdefault("received", t)
            elif record[0] == "gc":
                _, t, seconds, _collected, pid = record
                hops[("gc", pid)].setdefault("pauses", []).append((t, seconds))
    for changes in per.values():
        changes.sort(key=lambda c: c["at"])
    return per, hops


def analyse(
    streams: list[Stream],
    commits: dict[str, list[dict[str, Any]]],
    hops: dict[tuple[str, int], dict[str, float]],
    web_pid: int,
) -> dict[str, Any]:
    latency: list[float] = []
    by_publisher: dict[str, list[float]] = {"web": [], "worker": []}
    upper: list[float] = []
    stamp_to_commit: list[float] = []
    unmatched = 0
    problems: dict[str, int] = defaultdict(int)
    examples: list[str] = []
    streams_ok = 0
    raw: list[tuple[Any, ...]] = []
    legs: dict[str, list[float]] = defaultdict(list)

    def bad(kind: str, detail: str) -> None:
        problems[kind] += 1
        if len(examples) < 10:
            examples.append(f"{kind}: {detail}")

    for s in streams:
        before = sum(problems.values())
        for p in s.problems:
            bad("stream error", f"{s.sid} {p}")
        if s.ack is None:
            bad("no acknowledgement", s.sid)
        elif sorted((s.ack.get("notifications") or {}).get("taskIds", [])) != sorted(s.task_ids):
            bad("acknowledgement lists other tasks", s.sid)
        if s.ended_by_server:
            bad("stream ended by the server", s.sid)
        per_task: dict[str, list[tuple[float, str, str, str, str]]] = defaultdict(list)
        for item in s.seen:
            per_task[item[1]].append(item)
        for tid in s.task_ids:
            got = per_task.get(tid, [])
            if not got:
                bad("no snapshot", f"{s.sid} {tid}")
                continue
            snapshot, live = got[0], got[1:]
            if snapshot[2] != "input_required":
                bad("snapshot not input_required", f"{s.sid} {tid} {snapshot[2]}")
            changes = commits.get(tid, [])
            # What the stream must carry after its snapshot: every change committed after it.
            after = [c for c in changes if c["updated"] > snapshot[4]]
            want = [(c["status"], c["message"], c["updated"]) for c in after]
            have = [(x[2], x[3], x[4]) for x in live]
            if have != want:
                bad("changes differ from the commits", f"{s.sid} {tid} got {have} want {want}")
            if not have or have[-1][0] not in TERMINAL:
                bad("no terminal change", f"{s.sid} {tid}")
            for x, c in zip(live, after, strict=False):
                if (x[2], x[3], x[4]) != (c["status"], c["message"], c["updated"]):
                    unmatched += 1
                    continue
                dt = x[0] - c["at"]
                latency.append(dt)
                h = hops.get((tid, c["us"]), {})
                # The legs of a worker's change (the web process's own changes reach
                # its streams before their group_send: notify._Publisher._drain).
                if c["pid"] != web_pid and {"send_start", "send_end", "received"} <= set(h):
                    legs["commit → publish begins"].append(h["send_start"] - c["at"])
                    legs["publish (group_send)"].append(h["send_end"] - h["send_start"])
                    legs["publish ends → web process receives"].append(h["received"] - h["send_end"])
                    legs["web process receives → client reads"].append(x[0] - h["received"])
                raw.append(
                    (
                        round(c["at"], 6),
                        round(dt, 6),
                        c["pid"],
                        c["status"],
                        c["message"],
                        s.sid,
                        *(h.get(k) for k in ("send_start", "send_end", "received")),
                    )
                )
                by_publisher["web" if c["pid"] == web_pid else "worker"].append(dt)
                upper.append(x[0] - parse_iso(x[4]))
                stamp_to_commit.append(c["at"] - parse_iso(c["updated"]))
        if sum(problems.values()) == before:
            streams_ok += 1
    return {
        "streams_ok": streams_ok,
        "streams": len(streams),
        "problems": dict(problems),
        "examples": examples,
        "unmatched": unmatched,
        "notifications": sum(len(s.seen) for s in streams),
        "keepalives": sum(s.keepalives for s in streams),
        "commit_to_delivery_ms": summary_ms(latency),
        "by_publisher_ms": {k: summary_ms(v) for k, v in by_publisher.items()},
        "last_updated_to_delivery_ms": summary_ms(upper),
        "last_updated_to_commit_ms": summary_ms(stamp_to_commit),
        "legs_ms": {k: summary_ms(v) for k, v in legs.items()},
        "gc_pauses_ms": {
            ("web" if pid == web_pid else str(pid)): [[round(t, 3), round(sec * 1000, 1)] for t, sec in h["pauses"]]
            for (kind, pid), h in hops.items()
            if kind == "gc"
        },
        "raw": sorted(raw),
    }


def table(res: dict[str, Any]) -> str:
    a = res["analysis"]
    lat = a["commit_to_delivery_ms"]
    ub = a["last_updated_to_delivery_ms"]
    load = res["load"]
    rows = [
        ("streams open at once", f"{res['config']['streams']:,} ({a['streams_ok']:,} fully correct)"),
        ("web RSS before the streams", f"{mb(res['rss_before_kb'])} MB"),
        ("web RSS, streams open and idle", f"{mb(res['rss_open_idle_kb'])} MB"),
        (
            "web RSS, peak under load (sampled / VmHWM)",
            f"{mb(res['rss_peak_load_kb'])} MB / {mb(res['rss_hwm_kb'])} MB",
        ),
        ("web RSS after the streams closed", f"{mb(res['rss_after_close_kb'])} MB"),
        (
            "commit → delivery p50 / p99 / max",
            f"{lat.get('p50')} / {lat.get('p99')} / {lat.get('max')} ms ({lat.get('count', 0):,} changes)",
        ),
        (
            "lastUpdatedAt → delivery p50 / p99 / max (upper bound, ms precision)",
            f"{ub.get('p50')} / {ub.get('p99')} / {ub.get('max')} ms",
        ),
        (
            "load",
            f"{res['answers']['rate']} tasks/s answered, {load['seconds']} s; "
            f"{a['notifications']:,} notifications, {a['keepalives']:,} keep-alives",
        ),
        ("stream opening", f"{res['open']['seconds']} s; time to ack p50 {res['open']['time_to_ack'].get('p50')} ms"),
        (
            "cores under load",
            ", ".join(f"{k} {v}" for k, v in load["cores"].items()) + f"; other load {load['other_load_cores']}",
        ),
        (
            "client CPU (open / idle / load)",
            f"{res['open']['client_cpu_s']} / {res['idle']['client_cpu_s']} / {load['client_cpu_s']} s; "
            f"loop lag under load p99 {load['loop_lag_ms'].get('p99')} ms, max {load['loop_lag_ms'].get('max')} ms",
        ),
    ]
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench listen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--tasks-per-stream", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="status messages per task run")
    ap.add_argument("--max-seconds", type=float, default=0.2, help="longest sleep after each step")
    ap.add_argument("--rate", type=float, default=20.0, help="tasks answered (started) per second")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds the streams stay idle before the load")
    ap.add_argument("--workers", type=int, default=8, help="Celery worker processes (prefork)")
    ap.add_argument("--open-concurrency", type=int, default=64, help="streams being opened at once")
    ap.add_argument("--drain-timeout", type=float, default=60.0)
    ap.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() in the stack's processes once Django is set up"
    )
    ap.add_argument("--keep-db", action="store_true")
    args = ap.parse_args()
    cfg = Config(
        args.streams,
        args.tasks_per_stream,
        args.steps,
        args.max_seconds,
        args.rate,
        args.idle,
        args.open_concurrency,
        args.drain_timeout,
    )
    os.chdir(REPO)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * args.streams + 1024
    if soft < want:  # the web process holds one socket per stream (inherited)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    out = RESULTS / f"listen-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    commit_log = out / "commits.jsonl"
    os.environ["BENCH_LIMITS"] = "off"
    os.environ["BENCH_COMMIT_LOG"] = str(commit_log)
    if args.gc_freeze:
        os.environ["BENCH_GC_FREEZE"] = "1"

    services = Services()
    bench = Bench(services, out)
    res: dict[str, Any] = {
        "config": {**vars(cfg), "gc_freeze": args.gc_freeze},
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "machine": {
            "cpu": _cpu_model(),
            "cores": psutil.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30),
        },
    }
    ids: list[str] = []
    try:
        log(f"database {bench.db}, queue {bench.queue}, results in {out.relative_to(REPO)}")
        bench.prepare_db()
        web = bench.start_mcp_web("uvicorn-1")
        bench.start_mcp_workers(concurrency=args.workers)
        web_pid = web.proc.pid
        tree = procs.tree([web_pid])
        if len(tree) != 1:
            raise RuntimeError(f"expected one web process, found {[p.pid for p in tree]}")
        log(f"uvicorn ×1 pid {web_pid}, celery worker ×{args.workers}; load average {res['loadavg_start']}")
        measured, streams = client.run(drive(bench, web.url, web_pid, cfg))
        ids = [tid for s in streams for tid in s.task_ids]
        res.update(measured)
        res["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    finally:
        bench.shutdown(keep_db=args.keep_db)
        with contextlib.suppress(Exception):  # channel-layer groups left by a stream the server did not close
            r = services.redis_client()
            for i in range(0, len(ids), 1000):
                r.delete(*[f"asgi:group:mcptasks.task.{tid}" for tid in ids[i : i + 1000]])
    res["analysis"] = analyse(streams, *read_trace(commit_log), web_pid)
    (out / "rss.json").write_text(json.dumps(res.pop("rss_samples", [])))
    # One line per delivered change: commit stamp, latency (s), publishing pid, status, message, stream.
    (out / "deliveries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in res["analysis"].pop("raw")))
    (out / "result.json").write_text(json.dumps(res, indent=2))
    print()
    print(table(res))
    a = res["analysis"]
    if a["problems"]:
        print("\nproblems:", json.dumps(a["problems"]))
        for e in a["examples"]:
            print("  ", e[:400])
    print(f"\nby publisher: {json.dumps(a['by_publisher_ms'])}")
    print(f"lastUpdatedAt → commit stamp: {json.dumps(a['last_updated_to_commit_ms'])}")
    for leg, values in a["legs_ms"].items():
        print(f"{leg} (worker changes): {json.dumps(values)}")
    print(f"full garbage collections of the web process (ms): {[ms for _, ms in a['gc_pauses_ms'].get('web', [])]}")
    print(f"full record: {(out / 'result.json').relative_to(REPO)}")
    sys.exit(0 if a["streams_ok"] == a["streams"] else 1)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    main()

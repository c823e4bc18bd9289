"""Where the time goes: py-spy samples of the mcptasks processes under load.

Each profile samples a process tree (web workers or Celery workers) with
``py-spy record --gil --subprocesses`` while wrk or the bench client drives
one hot path. ``--gil`` keeps only samples of a thread holding the GIL: the
Python work of the process, without the time spent waiting on Postgres, Redis,
the network or another thread (on a busy 2-core machine py-spy's own idle
detection counts runnable-but-waiting threads as busy). So each share below is
a share of the interpreter time the process burns.

Each sample is attributed to one layer: the innermost frame that belongs to a
known layer decides (a json.dumps called by the ORM counts as JSON). Inclusive
shares of a few key functions are reported too.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import client, envs, wrk
from bench.measures import log
from bench.stacks import Bench

# (layer, regex on the frame's file path), innermost match wins.
LAYERS: list[tuple[str, str]] = [
    ("DB driver (psycopg)", r"/psycopg(_pool)?/|psycopg_binary"),
    ("Django DB backend", r"/django/db/backends/|/django/db/transaction\.py|/django/db/utils\.py"),
    ("Django ORM (query building, model init)", r"/django/db/"),
    ("JSON encode/decode", r"/json/|orjson"),
    ("Abuse limits (throttle counters, cache)", r"/mcptasks/protocol/limits\.py|/django/core/cache/"),
    ("Celery/kombu and Redis clients", r"/celery/|/kombu/|/redis/|/amqp/|/vine/|/billiard/"),
    ("Caller identity (DRF auth)", r"/rest_framework/|/mcptasks/web/identity\.py"),
    ("pydantic", r"/pydantic"),
    (
        "Signals and on_commit hooks",
        r"/django/dispatch/|/mcptasks/signals\.py|/mcptasks/protocol/publishing\.py|/mcptasks/notify/",
    ),
    ("asgiref (sync_to_async, thread hops)", r"/asgiref/"),
    ("Threads / executors", r"/threading\.py|/concurrent/futures/|/queue\.py"),
    ("Logging", r"/logging/"),
    ("Django middleware", r"/django/middleware/|/django/contrib/[a-z_]+/middleware\.py|/django/utils/deprecation\.py"),
    ("Django sessions/auth/messages", r"/django/contrib/"),
    ("Django URL resolving", r"/django/urls/"),
    ("Django request/response objects", r"/django/http/|/django/core/handlers/|/django/utils/|/django/core/signing"),
    ("mcptasks protocol and web", r"/mcptasks/protocol/|/mcptasks/web/"),
    ("mcptasks lifecycle/execution", r"/mcptasks/"),
    ("uvicorn/httptools (ASGI server)", r"/uvicorn/|httptools|/h11/|uvloop"),
    ("gunicorn (WSGI server)", r"/gunicorn/"),
    ("asyncio", r"/asyncio/"),
    ("socket/selectors/ssl", r"/socket\.py|/selectors\.py|/ssl\.py"),
]
_LAYER_RE = [(name, re.compile(rx)) for name, rx in LAYERS]
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

KEY_FUNCTIONS = [
    ("the /mcp endpoint (view or ASGI handler)", r"mcp_endpoint \(|MCPHandler\.__call__"),
    ("a poll served on the event loop", r"_poll_on_loop \("),
    ("identify (caller identity)", r"identify \("),
    ("Django middleware chain", r"/django/utils/deprecation\.py"),
    ("the task lookup (task_for, owned_task)", r"task_for \(|owned_task \("),
    ("detailed_task / task_fields", r"detailed_task \(|task_fields \("),
    ("note_result_retrieved (audit of a finished task's read)", r"note_result_retrieved \("),
    ("tasks.create_task", r"create_task \(.*mcptasks/tasks/creation"),
    ("quota (per-owner active count)", r"/mcptasks/tasks/quota\.py"),
    ("dispatch.enqueue_run (Celery publish)", r"enqueue_run \("),
    ("limits (throttles, quotas)", r"/mcptasks/protocol/limits\.py"),
    ("sync_to_async hop", r"/asgiref/sync\.py"),
    ("JSON", r"/json/"),
    ("execution.run_task (a task run)", r"run_task \(.*mcptasks/worker/execution"),
    ("runs.claim", r"(claim|start_run) \(.*mcptasks/tasks/runs"),
    ("transitions.finish_run / complete", r"(finish_run|complete) \(.*mcptasks/tasks/transitions"),
    ("lease monitor thread", r"mcptasks/worker/leases\.py"),
    ("follower check before a publish", r"mcptasks/notify/followers\.py"),
    ("Celery task protocol/trace", r"/celery/app/trace\.py"),
]


def parse(raw: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in raw.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        stacks.append((frames.split(";"), int(count)))
    return stacks


def attribute(frames: list[str]) -> str:
    for frame in reversed(frames):
        m = _FRAME.match(frame)
        path = m.group("file") if m else frame
        path = "/" + path.lstrip("/")
        for name, rx in _LAYER_RE:
            if rx.search(path):
                return name
    leaf = frames[-1] if frames else "?"
    return f"other: {leaf[:60]}"


def analyze(raw: Path, within: str | None = None) -> dict[str, Any]:
    """Layer shares; with ``within`` (a regex on a frame), only of the stacks
    that pass through that frame (e.g. the time inside one task run)."""
    stacks = parse(raw)
    if within:
        rx = re.compile(within)
        stacks = [(f, n) for f, n in stacks if any(rx.search(x) for x in f)]
    total = sum(n for _, n in stacks) or 1
    layers: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    for frames, n in stacks:
        layers[attribute(frames)] += n
        leaves[frames[-1]] += n
        joined = ";".join(frames)
        for label, rx in KEY_FUNCTIONS:
            if re.search(rx, joined):
                keys[label] += n
    return {
        "samples": total,
        "layers": [(k, round(100 * v / total, 1)) for k, v in layers.most_common()],
        "inclusive": [(k, round(100 * keys[k] / total, 1)) for k, _ in KEY_FUNCTIONS if keys[k]],
        "top_self": [(k, round(100 * v / total, 1)) for k, v in leaves.most_common(15)],
    }


def spy(pid: int, seconds: float, out: Path, rate: int = 200, wall: bool = False) -> subprocess.Popen[bytes]:
    """``wall``: every thread, waiting or not (``--idle``), for wall-clock
    shares of where a request or a run spends its time."""
    py_spy = envs.APP_VENV / "bin" / "py-spy"
    return subprocess.Popen(
        [
            str(py_spy),
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--idle" if wall else "--gil",
            "-r",
            str(rate),
            "-d",
            str(int(seconds)),
            "-f",
            "raw",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _profile(pid: int, seconds: float, out: Path, load, wall_within: str | None = None) -> dict[str, Any]:
    proc = spy(pid, seconds, out, wall=wall_within is not None)
    time.sleep(0.5)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(load() or {}))
    t.start()
    t.join()
    _, err = proc.communicate(timeout=seconds + 30)
    if not out.exists():
        raise RuntimeError(f"py-spy failed: {err.decode()[-400:]}")
    data = analyze(out, wall_within)
    data["load"] = result
    if wall_within:
        data["wall_within"] = wall_within
    return data


def run(
    bench: Bench, workdir: Path, names: list[str], ids: dict[str, dict[str, Path]], part: str, seconds: float = 8.0
) -> dict:
    """Profiles. ``part="polls"`` (while the seeded tasks still work): tasks/get
    on working and on completed tasks. ``part="rest"``: tools/call on each
    mcptasks web configuration, and the Celery workers while 32 clients run
    no-op tasks end to end."""
    out: dict[str, Any] = {}
    jobs = (
        [("tasks/get working", "get", "working"), ("tasks/get completed", "get", "completed")]
        if part == "polls"
        else [("tools/call", "call", None)]
    )
    for name in names:
        web = bench.webs[name]
        for label, mode, state in jobs:
            arg = ids[name][state] if state else None
            if mode == "call":
                arg = workdir / "tool-noop.txt"
                arg.write_text("noop\n")
            raw = workdir / f"spy-{name}-{label.replace('/', '_').replace(' ', '-')}.txt"
            data = _profile(
                web.proc.pid,
                seconds,
                raw,
                lambda url=web.url, mode=mode, arg=arg: {
                    "rps": wrk.run(url, mode, ids_file=arg, connections=32, duration=seconds - 1)["rps"]
                },
            )
            out[f"{name} {label}"] = data
            log(f"profile {name} {label}: {data['samples']} samples, top layers {data['layers'][:4]}")
            bench.wait_quiet()
    if part == "polls":
        return out
    if bench.mcp_workers is not None:
        web = bench.webs[names[-1]]
        raw = workdir / "spy-celery-e2e.txt"
        data = _profile(
            bench.mcp_workers.pid,
            seconds,
            raw,
            lambda: {"tasks_per_s": client.run(client.end_to_end(web.url, 32, seconds - 2, 0.5, 0.02)).rate},
        )
        out["celery workers, no-op tasks end to end"] = data
        log(f"profile celery: {data['samples']} samples, top layers {data['layers'][:4]}")
        bench.wait_quiet()
        # Wall clock inside a task run: what a run waits on, not only what it computes.
        data = _profile(
            bench.mcp_workers.pid,
            seconds,
            workdir / "spy-celery-e2e-wall.txt",
            lambda: {"tasks_per_s": client.run(client.end_to_end(web.url, 32, seconds - 2, 0.5, 0.02)).rate},
            wall_within=r"^run_task \(mcptasks/worker/execution\.py",
        )
        data["by_call_site"] = call_sites(workdir / "spy-celery-e2e-wall.txt", "run_task (mcptasks/worker/execution.py")
        out["celery workers, wall clock inside execution.run_task"] = data
        log(f"profile celery wall: {data['samples']} samples, top layers {data['layers'][:4]}")
        bench.wait_quiet()
    web = bench.webs[names[0]]
    noop = workdir / "tool-noop.txt"
    for conns in (1, 32):
        data = _profile(
            web.proc.pid,
            seconds,
            workdir / f"spy-{names[0]}-tools_call-c{conns}-wall.txt",
            lambda conns=conns: {
                "rps": wrk.run(web.url, "call", ids_file=noop, connections=conns, duration=seconds - 1)["rps"]
            },
            wall_within=r"^call_tool \(mcptasks/protocol/modern/handlers\.py",
        )
        data["by_call_site"] = call_sites(workdir / f"spy-{names[0]}-tools_call-c{conns}-wall.txt", "call_tool (")
        out[f"{names[0]} tools/call, {conns} caller(s), wall clock inside call_tool"] = data
        log(f"profile {names[0]} tools/call c{conns} wall: {data['samples']} samples, {data['by_call_site'][:3]}")
        bench.wait_quiet()
    return out


def call_sites(raw: Path, within: str, top: int = 8) -> list[tuple[str, float]]:
    """Wall-clock shares by the innermost mcptasks frame (file:line) of the
    stacks through ``within``: which line of mcptasks the time is spent under."""
    counts: Counter[str] = Counter()
    total = 0
    for frames, n in parse(raw):
        if not any(within in f for f in frames):
            continue
        total += n
        mine = [f for f in frames if re.search(r"\(mcptasks/", f)]
        counts[mine[-1] if mine else "?"] += n
    return [(k, round(100 * v / max(total, 1), 1)) for k, v in counts.most_common(top)]


def inprocess(bench: Bench) -> dict[str, Any]:
    """bench/inprocess.py against the bench database (SQL per request, µs per layer)."""
    result = subprocess.run(
        [str(envs.APP_PY), "-m", "bench.inprocess"],
        cwd=envs.REPO,
        env=bench.mcp_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        return {"error": result.stderr[-1500:]}
    return json.loads(result.stdout.strip().splitlines()[-1])

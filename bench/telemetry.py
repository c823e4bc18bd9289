"""P1 (tasks/get polls, 32 connections, wrk) with telemetry off and on, in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.telemetry [--seconds 8] [--rounds 3]

Two single-process uvicorn servers of the example site (``bench.settings``)
share one database and its seeded tasks: one with ``MCP_TELEMETRY=off``, one
with ``native`` and the OpenTelemetry SDK set up with the in-memory span
exporter behind a batch span processor and the in-memory metric reader
(``BENCH_OTEL=memory``, bench/otel_memory.py). The rounds alternate between
the two (off, on, then on, off, ...) so that the machine's drift falls on both,
and each measure polls working tasks and completed tasks. Prints one line per
run and a JSON summary with the median of each and the cost of telemetry,
and then the microseconds of CPU the request hooks themselves take per
request in each mode (timed in one process, so the machine's load matters
less there than to the polls per second).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench import wrk

REPO = Path(__file__).resolve().parent.parent

SEED = """
import json, sys
from django.utils import timezone
from mcptasks.models import Task, TaskStatus
from mcptasks.tasks import lifecycle
n = int(sys.argv[1])
working = [lifecycle.create_task(owner="anonymous", tool_name="slow_compute", arguments={}, enqueue=False).id
           for _ in range(n)]
done = [lifecycle.create_task(owner="anonymous", tool_name="slow_compute", arguments={}, enqueue=False).id
        for _ in range(n)]
Task.objects.filter(pk__in=done).update(
    status=TaskStatus.COMPLETED, result={"content": [{"type": "text", "text": "ok"}], "isError": False},
    updated_at=timezone.now())
print(json.dumps({"working": working, "completed": done}))
"""


def database_urls(base: str, name: str) -> tuple[str, str]:
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}", base


def env_for(database_url: str, mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": database_url,
            "MCP_TELEMETRY": mode,
            "MCP_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(REPO),
        }
    )
    if mode == "native":
        env["BENCH_OTEL"] = "memory"
    return env


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("server did not start")


HOOKS = """
import json, time
import django
django.setup()
from django.conf import settings
from django.test import override_settings
from mcptasks.telemetry import requests as hooks

data = {"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"taskId": "t" * 32, "_meta": {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
headers = {"mcp-protocol-version": "2026-07-28", "content-type": "application/json"}
body = {"jsonrpc": "2.0", "id": 7, "result": {"taskId": "t" * 32, "status": "working"}}

def thread_path():
    state = hooks.open_request(data, headers)
    hooks.note_reply(body, 200)
    hooks.close_request(state)

def loop_path():
    hooks.served_on_loop(data, headers, hooks.now_ns(), body, 200)

out = {}
for mode in ("off", "native"):
    with override_settings(MCPTASKS={**settings.MCPTASKS, "TELEMETRY": mode}):
        for name, fn in (("thread_path", thread_path), ("loop_path", loop_path)):
            for _ in range(2000):
                fn()
            best = None
            for _ in range(5):
                t0 = time.process_time()
                for _ in range(N):
                    fn()
                each = (time.process_time() - t0) / N * 1e6
                best = each if best is None else min(best, each)
            out[f"{mode}_{name}_us"] = round(best, 2)
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=500)
    args = parser.parse_args()

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = f"mcptasks_bench_otel_{os.getpid()}"
    database_url, _ = database_urls(base, name)
    admin = psycopg.connect(base.replace("postgres://", "postgresql://", 1), autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    servers: dict[str, subprocess.Popen[bytes]] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-otel-"))
    try:
        env = env_for(database_url, "off")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=REPO,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        seeded = json.loads(
            subprocess.run(
                [sys.executable, "-c", "import django; django.setup()\n" + SEED, str(args.tasks)],
                cwd=REPO,
                env=env,
                check=True,
                capture_output=True,
            )
            .stdout.decode()
            .strip()
            .splitlines()[-1]
        )
        ids = {}
        for state, values in seeded.items():
            ids[state] = work / f"{state}.txt"
            ids[state].write_text("\n".join(values) + "\n")
        ports = {"off": 18931, "native": 18932}
        for mode, port in ports.items():
            # One process each, as bench/stacks.py runs every contender (uvloop, httptools, no access log).
            argv = [sys.executable, "-m", "uvicorn", "project.asgi:application", "--port", str(port)]
            argv += ["--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log"]
            servers[mode] = subprocess.Popen(argv, cwd=REPO, env=env_for(database_url, mode), start_new_session=True)
        for mode, port in ports.items():
            wait_up(f"http://127.0.0.1:{port}/", servers[mode])
        urls = {mode: f"http://127.0.0.1:{port}/mcp" for mode, port in ports.items()}
        for mode in ports:  # warm processes, connections and the identity cache
            wrk.run(urls[mode], "get", ids_file=ids["working"], connections=32, duration=2)
        results: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = ["off", "native"] if r % 2 == 0 else ["native", "off"]
            for state in ("working", "completed"):
                for mode in order:
                    data = wrk.measured(urls[mode], "get", ids_file=ids[state], connections=32, duration=args.seconds)
                    row = {
                        "round": r,
                        "mode": mode,
                        "state": state,
                        "rps": round(data["rps"]),
                        "p50_ms": round(data["lat_p50_us"] / 1000, 2),
                        "p99_ms": round(data["lat_p99_us"] / 1000, 2),
                        "errors": data["errors"],
                        "wrk_cores": data["loadgen_cores"],
                    }
                    results.append(row)
                    print(json.dumps(row), flush=True)
        summary: dict[str, Any] = {"seconds": args.seconds, "rounds": args.rounds, "tasks": args.tasks}
        for state in ("working", "completed"):
            med = {
                mode: {
                    key: statistics.median(x[key] for x in results if x["mode"] == mode and x["state"] == state)
                    for key in ("rps", "p50_ms", "p99_ms")
                }
                for mode in ports
            }
            off, on = med["off"]["rps"], med["native"]["rps"]
            cost_us = (1e6 / on - 1e6 / off) if on and off else None
            summary[state] = {
                **med,
                "throughput_change_pct": round(100 * (on - off) / off, 1),
                "us_per_poll_added": round(cost_us, 1) if cost_us is not None else None,
            }
        # The hooks alone, in one process (the best of five timings of N calls, in
        # the process's CPU time, export threads included):
        # what telemetry adds to one request's CPU, free of the machine's noise.
        # With the SDK (in-memory export), and with the API alone (a site that
        # installed no SDK: the mode is native but every span is a no-op).
        for label, sdk in (("hooks", True), ("hooks_api_only", False)):
            hook_env = env_for(database_url, "native")
            if not sdk:
                hook_env.pop("BENCH_OTEL")
            hooks = subprocess.run(
                [sys.executable, "-c", "N = 20000\n" + HOOKS], cwd=REPO, env=hook_env, check=True, capture_output=True
            )
            summary[label] = json.loads(hooks.stdout.decode().strip().splitlines()[-1])
        print("SUMMARY " + json.dumps(summary), flush=True)
    finally:
        for proc in servers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    main()

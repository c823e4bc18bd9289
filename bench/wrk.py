"""The load generator for the high-rate measures: wrk (C, epoll) with a Lua
script for the MCP wire (bench/lua/mcp.lua).

Each run reports wrk's own CPU use (from the kernel's rusage of the child), so
the table can show the load generator was never the bottleneck.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

LUA = Path(__file__).resolve().parent / "lua" / "mcp.lua"


def run(
    url: str,
    mode: str,
    *,
    ids_file: Path | None = None,
    connections: int = 32,
    duration: float = 8.0,
    threads: int = 1,
    timeout: str = "10s",
    token: str | None = None,
) -> dict:
    wrk = shutil.which("wrk")
    if not wrk:
        raise RuntimeError("wrk is not installed")
    argv = [
        wrk,
        f"-t{min(threads, connections)}",
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        timeout,
        "-s",
        str(LUA),
        url,
        "--",
        mode,
    ]
    if ids_file is not None:
        argv.append(str(ids_file))
        if token:
            argv.append(token)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    wall = time.monotonic() - t0
    # communicate() reaped it; its rusage is in RUSAGE_CHILDREN, so take the
    # difference around the run instead (single-threaded bench: nothing else
    # is reaped meanwhile that uses measurable CPU).
    line = next((ln for ln in out.decode().splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err.decode()[-500:]} {out.decode()[-500:]}")
    data = json.loads(line[len("WRKJSON ") :])
    seconds = data["duration_us"] / 1e6
    data["rps"] = data["requests"] / seconds if seconds else 0.0
    data["errors"] = data["bad"] + data["err_connect"] + data["err_read"] + data["err_write"] + data["err_timeout"]
    data["wall"] = wall
    return data


class ChildCpu:
    """CPU seconds of reaped children (wrk) between ``begin`` and ``end``."""

    def begin(self) -> None:
        r = os.times()
        self._t = r.children_user + r.children_system
        self._w = time.monotonic()

    def end(self) -> float:
        r = os.times()
        used = r.children_user + r.children_system - self._t
        return used / max(time.monotonic() - self._w, 1e-9)


def measured(url: str, mode: str, **kwargs) -> dict:
    """``run`` plus wrk's CPU use in cores (``loadgen_cores``)."""
    meter = ChildCpu()
    meter.begin()
    data = run(url, mode, **kwargs)
    data["loadgen_cores"] = round(meter.end(), 3)
    return data

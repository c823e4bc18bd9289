"""Processes the bench starts, and the CPU they (and the services) use.

Every process is started in its own session (process group) and remembered;
``stop_all`` ends exactly those groups and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

_started: list[subprocess.Popen[bytes]] = []


def start(argv: list[str], *, env: Mapping[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("ab")
    proc = subprocess.Popen(
        argv, cwd=cwd, env=dict(env), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
    )
    handle.close()
    _started.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 8.0) -> None:
    """SIGTERM the process group the bench started, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    if proc in _started:
        _started.remove(proc)


def stop_all() -> None:
    for proc in list(reversed(_started)):
        stop(proc)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, *, timeout: float = 60.0) -> None:
    """Until a server/discover POST answers (any HTTP status is an answer)."""
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "server/discover",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        }
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "server/discover",
    }
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=2) as r:
                r.read()
                return
        except urllib.error.HTTPError:
            return
        except OSError as exc:
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout}s ({last}):\n{tail(log)}")


# CPU accounting ------------------------------------------------------------------------------


def tree(pids: Iterable[int]) -> list[psutil.Process]:
    out: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        out[p.pid] = p
        try:
            for c in p.children(recursive=True):
                out[c.pid] = c
        except psutil.NoSuchProcess:
            pass
    return list(out.values())


def _cpu(procs: Iterable[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def postgres_backends(dbname: str) -> list[psutil.Process]:
    """Postgres backends serving ``dbname`` (their titles name the database)."""
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cmd.startswith("postgres:") and f" {dbname} " in f"{cmd} ":
            out.append(p)
    return out


def redis_servers() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("redis-server")]


@dataclass
class CpuMeter:
    """CPU seconds used by named groups of processes over an interval.

    Groups are callables returning process lists, re-evaluated at the end too,
    so backends that appear during the interval are counted (from their start)."""

    groups: dict[str, object]
    _before: dict[str, dict[int, float]] = field(default_factory=dict)
    _t0: float = 0.0
    _sys0: tuple[float, float] = (0.0, 0.0)

    def _snapshot(self) -> dict[str, dict[int, float]]:
        snap: dict[str, dict[int, float]] = {}
        for name, get in self.groups.items():
            per: dict[int, float] = {}
            for p in get():  # type: ignore[operator]
                try:
                    t = p.cpu_times()
                    per[p.pid] = t.user + t.system
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            snap[name] = per
        return snap

    def begin(self) -> None:
        self._before = self._snapshot()
        self._sys0 = _machine_times()
        self._t0 = time.monotonic()

    def end(self) -> dict[str, float]:
        """Cores used per group (CPU seconds / wall seconds), and by the whole machine."""
        after = self._snapshot()
        wall = max(time.monotonic() - self._t0, 1e-9)
        out = {}
        for name, per in after.items():
            before = self._before.get(name, {})
            used = sum(v - before.get(pid, 0.0) for pid, v in per.items())
            out[name] = round(used / wall, 3)
        busy1, _ = _machine_times()
        out["machine"] = round((busy1 - self._sys0[0]) / wall, 3)
        return out


def _machine_times() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine so far."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + sum(getattr(t, k, 0.0) for k in ("irq", "softirq", "steal"))
    return busy, t.idle + getattr(t, "iowait", 0.0)


def wait_quiet(
    groups: Mapping[str, object], *, below: float = 0.15, settle: float = 1.0, timeout: float = 90.0
) -> float:
    """Until the given groups together use less than ``below`` cores over
    ``settle`` seconds (a backlog has drained). Returns the seconds waited."""
    t0 = time.monotonic()
    meter = CpuMeter(dict(groups))
    while time.monotonic() - t0 < timeout:
        meter.begin()
        time.sleep(settle)
        used = meter.end()
        if sum(v for k, v in used.items() if k != "machine") < below:
            break
    return time.monotonic() - t0

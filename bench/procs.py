"""Processes the bench starts, and the CPU they (and the services) use.

Starting and stopping them is the tests' launcher (tests/support/processes.py):
every process in its own session (process group), remembered, and
``stop_all`` ends exactly those groups and nothing else.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from tests.support.processes import kill_group, wait_answering

# The one launcher of the tests and the bench, used through this module.
from tests.support.processes import start as start
from tests.support.processes import stop_all as stop_all
from tests.support.processes import tail as tail


def stop(proc: subprocess.Popen[bytes], grace: float = 8.0) -> None:
    """SIGTERM the process group the bench started, then SIGKILL what is left."""
    kill_group(proc, grace=grace)


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, *, timeout: float = 60.0) -> None:
    """Until a server/discover POST answers (any HTTP status is an answer)."""
    try:
        wait_answering(url, proc, log, ok=None, timeout=timeout)
    except AssertionError as exc:  # the bench reports failures as RuntimeError
        raise RuntimeError(str(exc)) from exc


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

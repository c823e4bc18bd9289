"""The throughput floor: Celery alone, on mcptasks' bench workers.

A client process (bench/floor_client.py) publishes ``bench.floor_noop``, a
Celery task that does nothing and touches no database, with the options
mcptasks publishes a run with, to the bench's mcptasks queue, from as many
publishers as the throughput measure has clients, each keeping one message in flight. The same
two worker processes that run mcptasks' tasks in the throughput measure execute them. The rate
is what the design could reach if everything but Celery (HTTP, Postgres,
mcptasks' own code) cost nothing; the report gives it as a ratio to the
peer's throughput in the same round.
"""

from __future__ import annotations

import json
import queue
import statistics
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from bench import envs, procs
from bench.measures import THROUGHPUT, Config, log
from bench.stacks import Bench

#: The record's measure name, and the name ``--skip`` takes.
MEASURE = "celery-floor"
CONTENDER = "celery"


def _lines(stream: Any, out: queue.Queue[str | None]) -> None:
    for line in stream:
        out.put(line.rstrip("\n"))
    out.put(None)


def _expect(lines: queue.Queue[str | None], timeout: float) -> str:
    line = lines.get(timeout=timeout)
    if line is None:
        raise RuntimeError("the floor client exited early")
    return line


def run_once(bench: Bench, cfg: Config, r: int, publishers: int = 32) -> dict[str, Any]:
    """One measured run of round ``r``: the record."""
    workers = [p.pid for p in [bench.mcp_workers, *bench.mcp_more_workers] if p is not None]
    gate = bench.wait_machine_quiet()
    argv = [str(envs.APP_PY), "-m", "bench.floor_client", str(publishers), str(cfg.throughput_warmup)]
    argv += [str(cfg.throughput_seconds), f"{bench.queue}-floor-"]
    bench.logs.mkdir(parents=True, exist_ok=True)
    with (bench.logs / "floor-client.log").open("ab") as err:
        proc = subprocess.Popen(
            argv,
            cwd=envs.REPO,
            env=bench.mcp_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
        meter = procs.CpuMeter(
            {
                "workers": lambda: procs.tree(workers),
                "redis": procs.redis_servers,
                "client": lambda: procs.tree([proc.pid]),
            }
        )
        start = 30.0 + cfg.throughput_warmup  # Django's setup, then the warm-up
        if _expect(lines, start) != "begin":
            raise RuntimeError("the floor client did not begin")
        meter.begin()
        if _expect(lines, cfg.throughput_seconds + 10) != "end":
            raise RuntimeError("the floor client did not end")
        cpu = meter.end()
        data = json.loads(_expect(lines, 20))
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            procs.stop(proc)
    return {
        "measure": MEASURE,
        "variant": f"c{publishers}",
        "contender": CONTENDER,
        "round": r,
        "concurrency": publishers,
        "value": data["rate"],
        **data,
        "executing_processes": bench.mcp_executing,
        "cpu": cpu,
        **gate,
    }


def run(bench: Bench, cfg: Config, r: int, publishers: int = 32) -> list[dict]:
    """Round ``r``'s run, logged, then the backlog drained like the throughput runs.
    A failure is logged and leaves the round without a floor: the throughput measure goes on."""
    try:
        rec = run_once(bench, cfg, r, publishers)
    except Exception as exc:
        log(f"celery floor r{r} failed: {exc!r} (see floor-client.log)")
        return []
    ms = cpu_ms_per_message(rec)
    log(
        f"celery floor c={publishers:2} r{r} celery    {rec['value']:7.1f} msgs/s"
        f"  p50 {rec['latency_p50_ms'] or 0:.1f} ms"
        f"  timeouts {rec['timeouts']}  CPU ms/msg {ms}  cpu {rec['cpu']}"
    )
    bench.wait_quiet(timeout=60)
    return [rec]


def hook(bench: Bench, cfg: Config) -> Callable[[int], list[dict]]:
    """For ``measures.throughput``: the floor's run of a round, run right after the peer's."""
    return lambda r: run(bench, cfg, r)


def rounds(bench: Bench, cfg: Config) -> list[dict]:
    """The floor in rounds of its own (throughput skipped: no peer rate to compare)."""
    recs: list[dict] = []
    for r in range(cfg.rounds):
        recs += run(bench, cfg, r)
    return recs


# Report ---------------------------------------------------------------------------------------


def cpu_ms_per_message(rec: dict) -> dict[str, float]:
    """CPU milliseconds per executed message of each group of one run."""
    rate = rec.get("value") or 0.0
    cpu = rec.get("cpu") or {}
    return {g: round(1000 * cpu[g] / rate, 2) for g in ("workers", "redis", "client") if g in cpu and rate}


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def note(records: list[dict], peer: str, mcp: list[str]) -> str:
    """The floor note of the throughput row: Celery's rate and CPU per message, and
    that rate as a ratio to the peer's throughput (and mcptasks' throughput as a share
    of it), round by round."""
    runs = [r for r in records if r["measure"] == MEASURE and r["contender"] == CONTENDER]
    if not runs:
        return ""
    per = [cpu_ms_per_message(r) for r in runs]
    ms = {g: _med([p[g] for p in per if g in p]) for g in ("workers", "redis", "client")}
    text = (
        f"Celery alone (no database, no HTTP): {_med([r['value'] for r in runs]):,.0f} msgs/s, "
        f"{ms['workers']:.2f} ms CPU per message in the workers (Redis {ms['redis']:.2f}, "
        f"publisher {ms['client']:.2f}); the same 2 workers and queue, {runs[0]['concurrency']} publishers"
    )
    runs = [r for r in records if r["measure"] == THROUGHPUT and r["variant"] == "c32"]
    floor = {r["round"]: r["value"] for r in runs}
    theirs = {r["round"]: r["value"] for r in runs if r["contender"] == peer}
    at = [floor[k] / theirs[k] for k in floor if theirs.get(k)]
    if at:
        text += (
            f"; that rate is {_med(at):.2f}× the peer's throughput in the same round: the most this design could reach"
        )
    shares = []
    for n in mcp:
        mine = {r["round"]: r["value"] for r in runs if r["contender"] == n}
        share = [mine[k] / floor[k] for k in mine if floor.get(k)]
        if share:
            shares.append(f"{n}'s throughput is {100 * _med(share):.0f} % of it")
    if shares:
        text += "; " + ", ".join(shares)
    return text

"""The measures, each one alternating the contenders round by round.

A record is one run of one contender: ``{"measure", "variant", "contender",
"round", "value", ...}``. Ratios are taken within a round (adjacent runs), so
the noise of a shared 2-core machine hits both sides of a ratio alike.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import client, envs, procs, wrk
from bench.stacks import Bench

#: The measures, named for what they measure (a record's ``"measure"``).
#: ``tasks/get`` answered per second by 32 pollers, and against the number of pollers:
POLLS = "polls"
POLLS_SWEEP = "polls-sweep"
#: ``tools/call`` latency (p50, p99) of a tool that finishes at once, 1 and 32 callers:
CALL_LATENCY = "call-latency"
#: No-op tasks per second from creation to a terminal status, 32 clients, and against the number of clients:
THROUGHPUT = "throughput"
THROUGHPUT_SWEEP = "throughput-sweep"
#: The same for tasks whose tool reports its progress ten times (``steps``), 32 clients:
STEPS = "steps"


@dataclass
class Config:
    quick: bool = False
    rounds: int = 3
    polls_seconds: float = 6.0
    polls_tasks: int = 500
    sweep_seconds: float = 4.0
    polls_sweep_pollers: list[int] = field(default_factory=lambda: [1, 4, 16, 32, 64])
    call_requests_1: int = 200
    call_requests_32: int = 500
    throughput_seconds: float = 6.0
    throughput_warmup: float = 2.0
    throughput_poll: float = 0.02
    throughput_sweep_clients: list[int] = field(default_factory=lambda: [1, 4, 16, 32, 64])
    scale_small: int = 10_000
    scale_large: int = 10_000_000
    scale_purge: int = 1_000_000
    scale_pollers: int = 16
    scale_poll_interval: float = 0.25
    scale_purge_cap: float = 120.0
    pgbench_seconds: float = 8.0

    @classmethod
    def quick_mode(cls) -> Config:
        return cls(
            quick=True,
            rounds=1,
            polls_seconds=4.0,
            polls_tasks=200,
            sweep_seconds=3.0,
            polls_sweep_pollers=[],
            call_requests_1=60,
            call_requests_32=200,
            throughput_seconds=4.0,
            throughput_warmup=1.0,
            throughput_sweep_clients=[],
            scale_small=10_000,
            scale_large=100_000,
            scale_purge=20_000,
            scale_purge_cap=20.0,
            pgbench_seconds=4.0,
        )


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _order(contenders: list[str], r: int) -> list[str]:
    """A, B, A', then A', B, A: the peer sits between the two mcptasks runs."""
    return contenders if r % 2 == 0 else list(reversed(contenders))


def _cpu_run(bench: Bench, name: str, fn, db: str | None = None) -> tuple[Any, dict[str, float]]:
    meter = procs.CpuMeter(bench.cpu_groups(bench.webs[name], db))
    meter.begin()
    out = fn()
    return out, meter.end()


def write_ids(path: Path, ids: list[str]) -> Path:
    path.write_text("\n".join(ids) + "\n")
    return path


# Seeding ------------------------------------------------------------------------------------------


def seed(bench: Bench, names: list[str], n: int, workdir: Path) -> dict[str, dict[str, Path]]:
    """For each contender: ``n`` working tasks (sleep 3600 s) and ``n``
    completed no-op tasks; their ids in files for wrk. With ``bench.token``,
    also ``n`` completed no-op tasks created with that bearer token, which
    mcptasks gives to the token's user (the peer, anonymous, ignores it)."""
    out: dict[str, dict[str, Path]] = {}
    for name in names:
        url = bench.webs[name].url
        if name in out:
            continue
        # The no-op tasks first: the sleeping ones then hold every worker.
        done = client.run(client.create_tasks(url, "noop", {}, n))
        counts = client.run(client.wait_terminal(url, done, timeout=300))
        if counts.get("completed", 0) != n:
            raise RuntimeError(f"{name}: seeded no-op tasks ended {counts}")
        mine: list[str] = []
        if bench.token:
            mine = client.run(client.create_tasks(url, "noop", {}, n, token=bench.token))
            counts = client.run(client.wait_terminal(url, mine, timeout=300, token=bench.token))
            if counts.get("completed", 0) != n:
                raise RuntimeError(f"{name}: seeded no-op tasks with a token ended {counts}")
        working = client.run(client.create_tasks(url, "sleep", {"seconds": 3600}, n))
        st = client.run(client.statuses(url, working[:50]))
        if any(s != "working" for s in st.values()):
            raise RuntimeError(f"{name}: seeded sleep tasks are not all working: {set(st.values())}")
        out[name] = {
            "working": write_ids(workdir / f"ids-{name}-working.txt", working),
            "completed": write_ids(workdir / f"ids-{name}-completed.txt", done),
        }
        if mine:
            out[name]["completed-auth"] = write_ids(workdir / f"ids-{name}-completed-auth.txt", mine)
    return out


def share_seeds(seeds: dict[str, dict[str, Path]], names: list[str], source: str) -> None:
    """The mcptasks configurations share one database: they poll the same tasks."""
    for name in names:
        seeds[name] = seeds[source]


async def _cancel_all(url: str, ids: list[str]) -> int:
    c = client.Client(url)
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    done = 0
    it = iter(ids)

    async def worker() -> None:
        nonlocal done
        conn = client.Conn(url)
        try:
            for tid in it:
                raw = client.rpc_bytes(
                    f"{parts.hostname}:{parts.port}", parts.path, "tasks/cancel", {"taskId": tid}, tid
                )
                status, _ = await conn.send(raw)
                done += status == 200
        finally:
            conn.close()

    del c
    await asyncio.gather(*(worker() for _ in range(8)))
    return done


def cancel_seeded(bench: Bench, name: str, ids_file: Path) -> int:
    ids = [x for x in ids_file.read_text().split() if x]
    return client.run(_cancel_all(bench.webs[name].url, ids))


# Floors and the load generator's own limit -----------------------------------------------------


def loadgen_check(bench: Bench, cfg: Config, logs: Path) -> dict[str, Any]:
    """wrk against a trivial uvloop server: how far above the measured rates
    the load generator itself can go, and what it costs."""
    from bench.stacks import free_port

    port = free_port()
    proc = procs.start(
        [str(envs.APP_PY), "-m", "bench.trivial_server", str(port)],
        env=bench.mcp_env(),
        log=logs / "trivial.log",
        cwd=envs.REPO,
    )
    try:
        time.sleep(1.0)
        meter = procs.CpuMeter({"server": lambda: procs.tree([proc.pid])})
        meter.begin()
        data = wrk.measured(f"http://127.0.0.1:{port}/", "bare", connections=32, duration=cfg.sweep_seconds)
        cpu = meter.end()
    finally:
        procs.stop(proc)
    return {
        "rps": data["rps"],
        "loadgen_cores": data["loadgen_cores"],
        "server_cores": cpu["server"],
        "p50_us": data["lat_p50_us"],
        "errors": data["errors"],
    }


def pgbench(bench: Bench, cfg: Config) -> dict[str, Any]:
    """Database floors, in a scratch database: pgbench's built-in select-only
    script (a primary-key SELECT on pgbench_accounts, 32 clients), and the
    durable-commit floor: a one-row INSERT per transaction, 1 and 32 clients
    (every task creation and state change commits at least once)."""
    name = f"{bench.db}_pgbench"
    bench.services.recreate_db(name)
    secs = str(int(cfg.pgbench_seconds))

    def bench_run(argv: list[str]) -> dict[str, Any]:
        out = subprocess.run(["pgbench", "-n", *argv, "-T", secs, conn], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"pgbench {' '.join(argv)} failed: {out.stderr.strip()[-500:]}")
        m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
        lat = re.search(r"latency average = ([\d.]+) ms", out.stdout)
        return {"tps": float(m.group(1)) if m else 0.0, "latency_ms": float(lat.group(1)) if lat else None}

    try:
        conn = bench.services.libpq(name)
        subprocess.run(["pgbench", "-i", "-q", "-s", "10", conn], check=True, capture_output=True)
        results: dict[str, Any] = {}
        for mode in ("simple", "prepared"):
            results[mode] = bench_run(["-S", "-M", mode, "-c", "32", "-j", "2"])
        bench.logs.mkdir(parents=True, exist_ok=True)
        script = bench.logs / "commit.sql"
        script.write_text("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, now());\n")
        for clients in (1, 32):
            results[f"commit_c{clients}"] = bench_run(
                ["-f", str(script), "-c", str(clients), "-j", "2" if clients > 1 else "1"]
            )
        return results
    finally:
        bench.services.drop_db(name)


# polls: tasks/get per second -------------------------------------------------------------------------------------


def _poll_run(
    bench: Bench, name: str, ids: Path, connections: int, seconds: float, token: str | None = None
) -> dict[str, Any]:
    web = bench.webs[name]
    gate = bench.wait_machine_quiet()
    s0 = bench.pg_sessions() if web.kind == "mcptasks" else 0
    data, cpu = _cpu_run(
        bench,
        name,
        lambda: wrk.measured(web.url, "get", ids_file=ids, connections=connections, duration=seconds, token=token),
    )
    data["cpu"] = cpu
    data.update(gate)
    if web.kind == "mcptasks":
        data["pg_sessions_per_1k"] = round(1000 * (bench.pg_sessions() - s0) / max(data["requests"], 1), 2)
    return data


def _bare_run(bench: Bench, name: str, path: str, seconds: float) -> dict[str, Any]:
    web = bench.webs[name]
    gate = bench.wait_machine_quiet()
    data, cpu = _cpu_run(
        bench, name, lambda: wrk.measured(f"{web.base}{path}", "bare", connections=32, duration=seconds)
    )
    data["cpu"] = cpu
    data.update(gate)
    return data


def _slim(data: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "rps",
        "errors",
        "lat_p50_us",
        "lat_p99_us",
        "lat_max_us",
        "loadgen_cores",
        "cpu",
        "requests",
        "pg_sessions_per_1k",
        "gate_wait_s",
        "foreign_cores_before",
    )
    return {k: data[k] for k in keep if k in data}


#: The floor view of each server: the cheapest Django view for it (an async
#: view under ASGI, where a sync one pays a thread hop; a sync view under WSGI,
#: where an async one pays an event loop per request).
FLOOR_VIEW = {"uvicorn": "/bare-async", "gunicorn": "/bare"}


#: The polls measure's variants: which seeded tasks are polled, and with the bearer token or not.
POLLED_STATES = ("working", "completed", "completed-auth")


def polls(
    bench: Bench, cfg: Config, contenders: list[str], seeds: dict[str, dict[str, Path]], floors: bool = True
) -> list[dict]:
    """tasks/get per second, 32 pollers, on working and on completed tasks,
    and on completed tasks with a bearer token (as real clients poll); the
    bare-view floor on each mcptasks configuration in the same rounds."""
    recs: list[dict] = []
    mcp_names = [c for c in contenders if bench.webs[c].kind == "mcptasks"] if floors else []
    for name in contenders:  # warm every process and connection
        wrk.run(bench.webs[name].url, "get", ids_file=seeds[name]["working"], connections=32, duration=2)
    for name in mcp_names:
        wrk.run(f"{bench.webs[name].base}/bare", "bare", connections=32, duration=1)
    for state in (s for s in POLLED_STATES if s in seeds[contenders[0]]):
        for r in range(cfg.rounds):
            for name in _order(contenders, r):
                token = bench.token if state.endswith("-auth") else None
                data = _poll_run(bench, name, seeds[name][state], 32, cfg.polls_seconds, token=token)
                recs.append(
                    {
                        "measure": POLLS,
                        "variant": state,
                        "contender": name,
                        "round": r,
                        "value": data["rps"],
                        **_slim(data),
                    }
                )
                log(
                    f"polls {state:14} r{r} {name:9} {data['rps']:8.0f} polls/s  errors {data['errors']}  "
                    f"wrk {data['loadgen_cores']:.2f} cores  cpu {data['cpu']}"
                )
            if state == "working" and floors and "bare-asgi" in bench.webs:
                data = _bare_run(bench, "bare-asgi", "/", cfg.polls_seconds)
                recs.append(
                    {
                        "measure": "floor-asgi",
                        "variant": "floor",
                        "contender": "uvicorn",
                        "round": r,
                        "path": "bare ASGI app",
                        "value": data["rps"],
                        **_slim(data),
                    }
                )
                log(f"floor bare ASGI app r{r} {data['rps']:8.0f} req/s    errors {data['errors']}")
            if state == "working":
                for name in _order(mcp_names, r):
                    path = FLOOR_VIEW[bench.webs[name].key]
                    data = _bare_run(bench, name, path, cfg.polls_seconds)
                    recs.append(
                        {
                            "measure": "floor-view",
                            "variant": "floor",
                            "contender": name,
                            "round": r,
                            "path": path,
                            "value": data["rps"],
                            **_slim(data),
                        }
                    )
                    log(
                        f"floor {path:11} r{r} {name:9} {data['rps']:8.0f} req/s    errors {data['errors']}  "
                        f"wrk {data['loadgen_cores']:.2f} cores"
                    )
    for name in mcp_names:  # the other kind of bare view, once, for the record
        path = "/bare" if FLOOR_VIEW[bench.webs[name].key] == "/bare-async" else "/bare-async"
        data = _bare_run(bench, name, path, cfg.sweep_seconds)
        recs.append(
            {
                "measure": "floor-view",
                "variant": path.strip("/"),
                "contender": name,
                "round": 0,
                "path": path,
                "value": data["rps"],
                **_slim(data),
            }
        )
        log(f"floor {path:11}    {name:9} {data['rps']:8.0f} req/s")
    return recs


def polls_sweep(bench: Bench, cfg: Config, contenders: list[str], seeds: dict[str, dict[str, Path]]) -> list[dict]:
    recs = []
    for i, conc in enumerate(cfg.polls_sweep_pollers):
        for name in _order(contenders, i):
            data = _poll_run(bench, name, seeds[name]["working"], conc, cfg.sweep_seconds)
            recs.append(
                {
                    "measure": POLLS_SWEEP,
                    "variant": f"c{conc}",
                    "contender": name,
                    "round": 0,
                    "concurrency": conc,
                    "value": data["rps"],
                    **_slim(data),
                }
            )
            log(f"polls sweep c={conc:3} {name:9} {data['rps']:8.0f} polls/s  p50 {data['lat_p50_us'] / 1000:.1f} ms")
    return recs


# call-latency: tools/call latency ------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def call_latency(bench: Bench, cfg: Config, contenders: list[str]) -> list[dict]:
    recs = []
    for r in range(cfg.rounds):
        for name in _order(contenders, r):
            url = bench.webs[name].url
            for conc, n in ((1, cfg.call_requests_1), (32, cfg.call_requests_32)):
                gate = bench.wait_machine_quiet()
                samples, cpu = _cpu_run(
                    bench,
                    name,
                    lambda url=url, n=n, conc=conc: client.run(
                        client.call_latency(url, "noop", n, conc, warmup=max(conc, 10))
                    ),
                )
                lat = [x * 1000 for x in samples.latencies]
                rec = {
                    "measure": CALL_LATENCY,
                    "variant": f"c{conc}",
                    "contender": name,
                    "round": r,
                    "value": _pct(lat, 50),
                    "p50_ms": _pct(lat, 50),
                    "p99_ms": _pct(lat, 99),
                    "max_ms": max(lat) if lat else float("nan"),
                    "rate": samples.rate,
                    "n": len(lat),
                    "errors": samples.errors,
                    "cpu": cpu,
                    **gate,
                }
                recs.append(rec)
                log(
                    f"call latency c={conc:2} r{r} {name:9} p50 {rec['p50_ms']:6.2f} ms  p99 {rec['p99_ms']:7.2f} ms  "
                    f"{samples.rate:6.0f} calls/s  errors {samples.errors}  cpu {cpu}"
                )
            waited = bench.wait_quiet()
            log(f"   drained the backlog in {waited:.1f}s")
    return recs


# throughput: end to end -------------------------------------------------------------------------------------


def throughput(
    bench: Bench,
    cfg: Config,
    contenders: list[str],
    conc: int,
    rounds: int,
    variant: str = "",
    seconds: float = 0.0,
    after_peer: Callable[[int], list[dict]] | None = None,
    tool: str = "noop",
) -> list[dict]:
    """End to end, tasks of ``tool``; ``after_peer(round)`` runs right after
    the peer's run of each round (the Celery floor, bench/celery_floor.py),
    so that it sits next to it."""
    recs = []
    seconds = seconds or cfg.throughput_seconds
    for r in range(rounds):
        for name in _order(contenders, r):
            url = bench.webs[name].url
            gate = bench.wait_machine_quiet()
            e, cpu = _cpu_run(
                bench,
                name,
                lambda url=url: client.run(
                    client.end_to_end(url, conc, seconds, cfg.throughput_warmup, cfg.throughput_poll, tool=tool)
                ),
            )
            lat = [x * 1000 for x in e.latencies]
            executing = bench.webs[name].executing_processes
            rec = {
                "measure": variant or THROUGHPUT,
                "variant": f"c{conc}",
                "contender": name,
                "round": r,
                "concurrency": conc,
                "tool": tool,
                "value": e.rate,
                # Fair counts: the processes that execute tasks differ per side.
                "executing_processes": executing,
                "per_process": e.rate / executing if executing else float("nan"),
                "completed": e.completed,
                "failed": e.failed,
                "errors": e.errors,
                "polls_per_task": e.polls / max(e.completed + e.failed, 1),
                "latency_p50_ms": _pct(lat, 50),
                "latency_p99_ms": _pct(lat, 99),
                "cpu": cpu,
                **gate,
            }
            recs.append(rec)
            log(
                f"{variant or THROUGHPUT} c={conc:2} r{r} {name:9} {e.rate:7.1f} {tool} tasks/s"
                f"  create→terminal p50 {rec['latency_p50_ms']:.0f} ms"
                f"  failed {e.failed} errors {e.errors}  cpu {cpu}"
            )
            bench.wait_quiet(timeout=60)
            if after_peer is not None and bench.webs[name].kind == "peer":
                recs += after_peer(r)
    return recs


def summarize(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")

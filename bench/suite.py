"""The bench suite: mcptasks against fastmcp-tasks, side by side, in one run.

Started by ``python3 -m bench`` (which prepares the virtualenvs); runs inside
bench/.venvs/app. Options: ``--quick``, ``--skip scale,profile,...``,
``--write-data`` / ``--no-data``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import celery_floor, durable_peer, envs, measures, procs, profiling, report, scale
from bench.measures import Config, log
from bench.stacks import Bench, Services

REPO = envs.REPO
RESULTS = REPO / "bench" / "results"
#: The figures of a full run, which docs/performance.md links.
DATA = REPO / "docs" / "data" / "bench.json"
IMG = REPO / "docs" / "img"


def _run(argv: list[str], **kw: Any) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw).stdout.strip()
    except Exception:
        return "?"


def machine() -> dict[str, Any]:
    import psutil

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30),
        "kernel": platform.release(),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def versions(services: Services) -> dict[str, str]:
    def peer(pkg: str) -> str:
        return _run([str(envs.PEER_PY), "-c", f"from importlib.metadata import version; print(version('{pkg}'))"])

    pg = "?"
    try:
        with services.admin() as conn:
            pg = conn.execute("SHOW server_version").fetchone()[0]
    except Exception:
        pass
    try:
        redis = services.redis_client().info("server")["redis_version"]
    except Exception:
        redis = "?"
    wrk_v = _run(["sh", "-c", "wrk --version 2>&1 | head -1"]).split(" ")[1] if shutil.which("wrk") else "?"
    return {
        "python": platform.python_version(),
        "django": metadata.version("django"),
        "gunicorn": metadata.version("gunicorn"),
        "uvicorn": metadata.version("uvicorn"),
        "postgres": pg,
        "redis": redis,
        "fastmcp": peer("fastmcp"),
        "fastmcp_tasks": peer("fastmcp-tasks"),
        "pydocket": peer("pydocket"),
        "wrk": wrk_v,
    }


def git_rev() -> str:
    rev = _run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO)
    dirty = _run(["git", "status", "--porcelain", "--", "mcptasks", "project", "requirements"], cwd=REPO)
    return f"{rev}{' + uncommitted changes' if dirty else ''}"


def database_settings(bench: Bench) -> str:
    code = (
        "import json; from django.db import connection as c; d = c.settings_dict; "
        "print(json.dumps({'CONN_MAX_AGE': d.get('CONN_MAX_AGE'), 'pool': (d.get('OPTIONS') or {}).get('pool')}))"
    )
    return bench.shell(code, check=False) or "?"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a short pass (a few minutes)")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of: polls,call-latency,throughput,steps,throughput-durable-peer,celery-floor,scale,"
        "sweeps,profile,pgbench",
    )
    ap.add_argument("--mcptasks", default="uvicorn,gunicorn", help="mcptasks web configurations to run")
    ap.add_argument("--peer-web-workers", type=int, default=2)
    ap.add_argument(
        "--mcp-worker-pool",
        default="threads",
        choices=["prefork", "threads"],
        help="mcptasks' 2 worker processes: prefork children, or 2 threads-pool workers (--mcp-worker-threads each)",
    )
    ap.add_argument("--mcp-worker-threads", type=int, default=4)
    ap.add_argument(
        "--no-defaults",
        action="store_true",
        help="skip bin/run's defaults (`manage.py mcptasks run`) against the peer's single process",
    )
    ap.add_argument(
        "--no-poll-snapshot",
        action="store_true",
        help="serve mcptasks' polls without the poll snapshot (MCP_POLL_SNAPSHOT=false): its keep-or-go measure",
    )
    ap.add_argument("--scale-rows", type=int, help="rows of the scale measure's large table (default 10M, quick 100k)")
    ap.add_argument("--scale-purge", type=int, help="expired rows among them (default 1M, quick 20k)")
    data = ap.add_mutually_exclusive_group()
    data.add_argument(
        "--write-data",
        action="store_true",
        help="write the figures to docs/data/bench.json and the plots to docs/img/ (default for full runs)",
    )
    data.add_argument("--no-data", action="store_true")
    ap.add_argument("--report-only", metavar="DIR", help="rebuild the table (and data file) from DIR/results.json")
    ap.add_argument("--profile-from", metavar="DIR", help="with --report-only: take the profiles from DIR's run")
    args = ap.parse_args()
    # Stop cleanly (servers, databases, Redis keys) on Ctrl-C and on SIGTERM,
    # even when started in the background with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    if args.report_only:
        report_only(Path(args.report_only), write_data=args.write_data, profile_from=args.profile_from)
        return
    skip = {s.strip().lower() for s in args.skip.split(",") if s.strip()}
    cfg = Config.quick_mode() if args.quick else Config()
    write_data = args.write_data or (not args.quick and not args.no_data)
    if args.scale_rows:
        cfg.scale_large = args.scale_rows
    if args.scale_purge:
        cfg.scale_purge = args.scale_purge

    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = RESULTS / stamp
    workdir.mkdir(parents=True, exist_ok=True)
    latest = RESULTS / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(stamp)

    services = Services()
    bench = Bench(services, logs=workdir / "logs", poll_interval_ms=500)
    if cfg.quick:  # a smoke pass: wait less for a quiet machine
        bench.gate_max, bench.gate_budget = 5.0, 30.0
    mcp_names = [n.strip() for n in args.mcptasks.split(",") if n.strip()]
    contenders = [mcp_names[0], "peer", *mcp_names[1:]]
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "config": cfg.__dict__,
        "contenders": contenders,
        "peer_web_workers": args.peer_web_workers,
        "mcp_worker_pool": args.mcp_worker_pool,
        "poll_snapshot": not args.no_poll_snapshot,
        "mcp_worker_threads": args.mcp_worker_threads if args.mcp_worker_pool == "threads" else None,
        "machine": machine(),
        "git": git_rev(),
        "records": [],
    }
    t0 = time.monotonic()
    log(f"bench: {'quick' if cfg.quick else 'full'} run, results in {workdir.relative_to(REPO)}")
    try:
        results["versions"] = versions(services)
        bench.prepare_db()
        bench.make_token()
        results["database"] = database_settings(bench)
        log(f"mcptasks database settings: {results['database']}")
        if "pgbench" not in skip:
            # Before the stacks start: their connections would leave pgbench's
            # 32 clients too few of Postgres's max_connections.
            results["pgbench"] = measures.pgbench(bench, cfg)
            log(f"pgbench -S: {results['pgbench']}")
        bench.start_mcp_workers(2, pool=args.mcp_worker_pool, threads=args.mcp_worker_threads)
        for n in mcp_names:
            bench.start_mcp_web(n, snapshot=not args.no_poll_snapshot)
        if "uvicorn" in mcp_names:
            bench.start_bare_asgi()
        bench.start_peer_web(args.peer_web_workers)
        bench.start_peer_workers(2)
        pair = [] if args.no_defaults else ["run", "peer1"]
        if pair:
            bench.start_mcp_run()
            bench.start_peer_single()
        results["defaults_pair"] = pair
        log("stacks up: " + ", ".join(f"{k} {w.url}" for k, w in bench.webs.items()))

        bench.wait_machine_quiet()
        results["loadgen"] = measures.loadgen_check(bench, cfg, bench.logs)
        log(f"load generator check: {results['loadgen']}")

        seeds = measures.seed(bench, [mcp_names[0], "peer", *pair[1:]], cfg.polls_tasks, workdir)
        measures.share_seeds(seeds, [*mcp_names, *pair[:1]], mcp_names[0])
        log(f"seeded {cfg.polls_tasks} working and {cfg.polls_tasks} completed tasks on each side")

        if measures.POLLS not in skip:
            results["records"] += measures.polls(bench, cfg, contenders, seeds)
            if pair:
                results["records"] += measures.polls(bench, cfg, pair, seeds, floors=False)
            if "sweeps" not in skip:
                results["records"] += measures.polls_sweep(bench, cfg, contenders, seeds)

        if "profile" not in skip and not cfg.quick:
            try:  # the polls, while the seeded tasks still work
                results["profile"] = profiling.run(bench, workdir, mcp_names, seeds, "polls")
            except Exception as exc:
                log(f"profiling failed: {exc!r}")
                results["profile_error"] = repr(exc)
        for name in (mcp_names[0], "peer", *pair[1:]):
            measures.cancel_seeded(bench, name, seeds[name]["working"])
        log(f"cancelled the seeded sleep tasks; quiet after {bench.wait_quiet():.1f}s")

        if measures.CALL_LATENCY not in skip:
            results["records"] += measures.call_latency(bench, cfg, contenders)
            if pair:
                results["records"] += measures.call_latency(bench, cfg, pair)
        floor = celery_floor.hook(bench, cfg) if celery_floor.MEASURE not in skip else None
        if measures.THROUGHPUT not in skip:
            results["records"] += measures.throughput(bench, cfg, contenders, 32, cfg.rounds, after_peer=floor)
            if pair:
                results["records"] += measures.throughput(bench, cfg, pair, 32, cfg.rounds)
            if "sweeps" not in skip:
                for conc in (c for c in cfg.throughput_sweep_clients if c != 32):
                    results["records"] += measures.throughput(
                        bench, cfg, contenders, conc, 1, variant=measures.THROUGHPUT_SWEEP, seconds=cfg.sweep_seconds
                    )
        elif floor is not None:
            results["records"] += celery_floor.rounds(bench, cfg)
        if measures.STEPS not in skip:
            results["records"] += measures.throughput(
                bench, cfg, contenders, 32, cfg.rounds, variant=measures.STEPS, tool="steps"
            )
        if durable_peer.MEASURE.lower() not in skip:
            results["records"] += durable_peer.run(bench, cfg, mcp_names[0], args.peer_web_workers)
        if "profile" not in skip and not cfg.quick:
            try:
                results.setdefault("profile", {}).update(profiling.run(bench, workdir, mcp_names, seeds, "rest"))
                results["inprocess"] = profiling.inprocess(bench)
            except Exception as exc:
                log(f"profiling failed: {exc!r}")
                results["profile_error"] = repr(exc)
            log(f"in-process costs: {json.dumps(results['inprocess'])[:600]}")

        bench.shutdown(keep_db=False)
        if "scale" not in skip:
            bench.logs.mkdir(parents=True, exist_ok=True)
            try:
                results["scale"] = scale.run(bench, cfg, workdir, key=mcp_names[0])
            except Exception as exc:  # report what was measured, and why scale is missing
                log(f"scale failed: {exc!r}")
                results["scale_error"] = repr(exc)
    except KeyboardInterrupt:
        log("interrupted")
        raise
    finally:
        procs.stop_all()
        bench.shutdown(keep_db=False)
        results["elapsed_s"] = time.monotonic() - t0
        results["gate_wait_s"] = round(bench.gate_used, 1)
        (workdir / "results.json").write_text(json.dumps(results, indent=1, default=str))

    text = report.table(results)
    (workdir / "table.md").write_text(text)
    plot_dir = IMG if write_data else workdir
    made = report.plots(results, plot_dir)
    print()
    print(report.machine_block(results))
    print()
    print(text)
    if results.get("profile"):
        print(profile_text(results))
    if write_data:
        report.write_data(results, DATA, made, profile_text(results) if results.get("profile") else "")
        log(f"wrote {DATA.relative_to(REPO)} and {', '.join(str(p.relative_to(REPO)) for p in made)}")
    log(f"done in {results['elapsed_s'] / 60:.1f} min; raw results: {(workdir / 'results.json').relative_to(REPO)}")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def report_only(workdir: Path, write_data: bool, profile_from: str | None = None) -> None:
    results = report.current_names(json.loads((workdir / "results.json").read_text()))
    if profile_from:
        other = json.loads((Path(profile_from) / "results.json").read_text())
        results["profile"] = other.get("profile", {})
        results["inprocess"] = other.get("inprocess", {})
        results["profile_run"] = f"{other['started']}, commit `{other['git']}`"
    text = report.table(results)
    (workdir / "table.md").write_text(text)
    made = report.plots(results, IMG if write_data else workdir)
    print(report.machine_block(results))
    print()
    print(text)
    if results.get("profile"):
        print(profile_text(results))
    if write_data:
        report.write_data(results, DATA, made, profile_text(results) if results.get("profile") else "")


def profile_text(results: dict[str, Any]) -> str:
    lines = [
        "### Where the time goes",
        "",
        "py-spy `--gil` samples (interpreter time) of the mcptasks processes under load; each sample is",
        "attributed to the innermost known layer of its stack (`bench/profiling.py`). The *wall clock*",
        "profiles sample every thread, waiting or not, inside the function named.",
        "",
    ]
    if results.get("profile_run"):
        lines += [f"Profiles from a separate profiling pass ({results['profile_run']}).", ""]
    for name, data in results.get("profile", {}).items():
        load = ", ".join(f"{k} {v:.0f}" for k, v in (data.get("load") or {}).items())
        lines.append(f"- **{name}** ({data['samples']} samples; {load} while profiled):")
        lines.append("  - layers: " + ", ".join(f"{k} {v} %" for k, v in data["layers"][:10]))
        lines.append("  - inclusive: " + ", ".join(f"{k} {v} %" for k, v in data["inclusive"]))
        if data.get("by_call_site"):
            lines.append("  - by mcptasks line: " + ", ".join(f"`{k}` {v} %" for k, v in data["by_call_site"][:6]))
    ip = results.get("inprocess") or {}
    if ip and "error" not in ip:
        lines.append("")
        lines.append("In-process, one request at a time through Django's test client (no HTTP server; the")
        lines.append("ASGI fast path for /mcp, if any, is not on this path):")
        lines.append("")
        for k, v in ip.items():
            if isinstance(v, dict) and ("us" in v or "sql" in v):
                took = f"{v['us']:.0f} µs" if "us" in v else "SQL only"
                sql = f", {len(v['sql'])} SQL statements" if "sql" in v else ""
                lines.append(f"- {k}: {took}{sql}")
                for q in v.get("sql", []):
                    lines.append(f"  - `{q[:150]}`")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if Path(sys.prefix).resolve() != envs.APP_VENV.resolve():
        print("run the bench with: python3 -m bench", file=sys.stderr)
    main()

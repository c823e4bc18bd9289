"""Turn the records into the table, the plots and the data file that
docs/performance.md links (docs/data/bench.json)."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import celery_floor
from bench.measures import CALL_LATENCY, POLLS, POLLS_SWEEP, STEPS, THROUGHPUT, THROUGHPUT_SWEEP
from bench.stacks import MCP_WEB, PEER_LABEL, PEER_SINGLE_LABEL, RUN_LABEL

#: The names earlier runs gave the measures, in their results.json (``--report-only``).
EARLIER_NAMES = {
    "P1": POLLS,
    "P1-sweep": POLLS_SWEEP,
    "P2": CALL_LATENCY,
    "P3": THROUGHPUT,
    "P3-sweep": THROUGHPUT_SWEEP,
    "floor3": celery_floor.MEASURE,
}


#: Web processes of the peer in the run being reported (older results: 1).
_peer_workers = 2


def label(name: str) -> str:
    if name == "run":
        return RUN_LABEL
    if name == "peer1":
        return PEER_SINGLE_LABEL
    if name == "peer-fsync":
        return "fastmcp-tasks, Redis appendfsync always"
    if name == "peer":
        return PEER_LABEL if _peer_workers == 2 else PEER_LABEL.replace(" ×2", f" ×{_peer_workers}").replace(" ×1", "")
    return MCP_WEB[name]["label"]


def use(results: dict[str, Any]) -> None:
    global _peer_workers
    _peer_workers = int(results.get("peer_web_workers", 1))


def current_names(results: dict[str, Any]) -> dict[str, Any]:
    """An earlier run's results with the measures under today's names."""
    for record in results.get("records", []):
        record["measure"] = EARLIER_NAMES.get(record["measure"], record["measure"])
    for old, new in (("scaled", "scale"), ("p4_error", "scale_error")):
        if old in results:
            results[new] = results.pop(old)
    return results


def med(values: list[float]) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else float("nan")


def by(records: list[dict], measure: str, variant: str | None = None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["measure"] == measure and (variant is None or r["variant"] == variant):
            out[r["contender"]].append(r)
    return out


def ratios(
    records: list[dict], measure: str, variant: str, name: str, field: str = "value", peer: str = "peer"
) -> list[float]:
    """value(name) / value(peer), round by round."""
    rows = by(records, measure, variant)
    mine = {r["round"]: r[field] for r in rows.get(name, [])}
    theirs = {r["round"]: r[field] for r in rows.get(peer, [])}
    return [mine[k] / theirs[k] for k in sorted(mine) if theirs.get(k)]


def foreign(r: dict) -> float | None:
    """Cores the rest of the machine used during one run (machine minus the bench's own)."""
    cpu = r.get("cpu") or {}
    if "machine" not in cpu:
        return None
    ours = sum(v for k, v in cpu.items() if k != "machine") + (r.get("loadgen_cores") or 0)
    return max(0.0, cpu["machine"] - ours)


def fmt(v: float, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if unit == "ms":
        return f"{v:.1f} ms" if v >= 10 else f"{v:.2f} ms"
    if abs(v) >= 100:
        return f"{v:,.0f}{(' ' + unit) if unit else ''}"
    return f"{v:.1f}{(' ' + unit) if unit else ''}"


def fr(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.2f}×"


def summarize(results: dict[str, Any], names: list[str] | None = None, peer: str = "peer") -> dict[str, Any]:
    """The table's rows for ``names`` (default: the main contenders), each
    mcptasks configuration against ``peer``."""
    recs = results["records"]
    names = names or results["contenders"]
    mcp = [n for n in names if n != peer]
    s: dict[str, Any] = {"rows": [], "goals": []}

    def row(
        title: str,
        measure: str,
        variant: str,
        unit: str,
        field: str = "value",
        higher_better: bool = True,
        floor: str = "",
        goal: str = "",
    ) -> dict[str, Any]:
        rows = by(recs, measure, variant)
        vals = {n: med([r[field] for r in rows.get(n, [])]) for n in names}
        rat = {n: med(ratios(recs, measure, variant, n, field, peer)) for n in mcp}
        noise = med([foreign(r) for rr in rows.values() for r in rr if foreign(r) is not None])
        entry = {
            "noise": noise,
            "title": title,
            "unit": unit,
            "values": vals,
            "ratios": rat,
            "floor": floor,
            "goal": goal,
            "higher_better": higher_better,
        }
        s["rows"].append(entry)
        return entry

    # polls
    floors = by(recs, "floor-view", "floor")
    floor_med = {n: med([r["value"] for r in floors.get(n, [])]) for n in mcp}
    pg = results.get("pgbench") or {}
    for variant in ("working", "completed", "completed-auth"):
        if variant.endswith("-auth"):
            if not by(recs, POLLS, variant):
                continue
            e = row(
                "polls/s, 32 pollers, completed tasks, bearer token",
                POLLS,
                variant,
                "/s",
                goal="≥ 5× peer",
            )
            anon = {
                n: med(
                    [
                        a / b
                        for a, b in _paired(
                            by(recs, POLLS, variant).get(n, []), by(recs, POLLS, "completed").get(n, [])
                        )
                    ]
                )
                for n in mcp
            }
            e["floor"] = (
                "mcptasks: a DRF token as `Authorization: Bearer` (`mcptasks.web.identity.BearerTokenAuthentication`), "
                "on tasks its user created; "
                + ", ".join(f"{n} at {100 * v:.0f} % of its anonymous rate" for n, v in anon.items())
                + ". The peer has no authentication configured: it gets the same header and ignores it"
            )
            continue
        e = row(
            f"polls/s, 32 pollers, {variant} tasks", POLLS, variant, "/s", goal="≥ 5× peer, ≥ 50 % of the bare view"
        )
        if variant == "working" and any(floors.get(n) for n in mcp):
            pct = {}
            for n in mcp:
                per_round = []
                polled = {r["round"]: r["value"] for r in by(recs, POLLS, "working").get(n, [])}
                fl = {r["round"]: r["value"] for r in floors.get(n, [])}
                per_round = [polled[k] / fl[k] for k in polled if fl.get(k)]
                pct[n] = med(per_round)
            e["floor"] = "; ".join(
                f"bare Django view {fmt(floor_med[n], '/s')} on {n} (polls at {100 * pct[n]:.0f} % of it)" for n in mcp
            )
            asgi = by(recs, "floor-asgi", "floor").get("uvicorn", [])
            if asgi and "uvicorn" in mcp:
                polled_uvicorn = {r["round"]: r["value"] for r in by(recs, POLLS, "working").get("uvicorn", [])}
                share = med(
                    [
                        polled_uvicorn[r["round"]] / r["value"]
                        for r in asgi
                        if r["round"] in polled_uvicorn and r["value"]
                    ]
                )
                e["floor"] += (
                    f"; bare ASGI app under the same uvicorn command {fmt(med([r['value'] for r in asgi]), '/s')} "
                    f"(polls at {100 * share:.0f} % of it)"
                )
                e["pct_asgi"] = share
            if pg:
                e["floor"] += (
                    f"; pgbench -S {fmt(pg['simple']['tps'], 'tps')} (prepared {fmt(pg['prepared']['tps'], 'tps')})"
                )
            sess = {n: med([r.get("pg_sessions_per_1k") for r in by(recs, POLLS, "working").get(n, [])]) for n in mcp}
            e["floor"] += "; new Postgres sessions per 1k polls: " + ", ".join(f"{n} {fmt(v)}" for n, v in sess.items())
            e["pct_floor"] = pct
    # call latency
    commit = ""
    if pg.get("commit_c1"):
        commit = (
            f"durable commit floor (pgbench, 1-row INSERT): {fmt(pg['commit_c1']['latency_ms'], 'ms')} at 1 client, "
            f"{fmt(pg['commit_c32']['tps'])} commits/s at 32"
        )
    for conc in (1, 32):
        for field, what in (("p50_ms", "p50"), ("p99_ms", "p99")):
            e = row(
                f"tools/call {what}, {conc} caller{'s' if conc > 1 else ''}",
                CALL_LATENCY,
                f"c{conc}",
                "ms",
                field,
                higher_better=False,
                goal="p50 ≤ 5 ms, p99 ≤ 20 ms, ≤ peer",
            )
            if conc == 1 and what == "p50" and commit:
                e["floor"] = commit
    # throughput
    e = row("no-op tasks/s, create→terminal, 32 clients", THROUGHPUT, "c32", "/s", goal="≥ 1.5× peer")
    if peer == "peer":  # the floor runs on the main configuration's workers only
        e["floor"] = celery_floor.note(recs, peer, mcp)
    runs = by(recs, THROUGHPUT, "c32")
    if any("per_process" in r for rr in runs.values() for r in rr):
        counts = {n: med([r.get("executing_processes") for r in runs.get(n, [])]) for n in names}
        e = row(
            "no-op tasks/s per executing process, 32 clients",
            THROUGHPUT,
            "c32",
            "/s",
            "per_process",
            goal="fair process counts",
        )
        e["floor"] = "processes that execute tasks: " + ", ".join(
            f"{label(n)} {counts[n]:.0f}" for n in names if not math.isnan(counts[n])
        )
        cpu_rows = {n: med([r["value"] / _stack_cores(r) for r in runs.get(n, []) if _stack_cores(r)]) for n in names}
        e["floor"] += "; tasks per second of CPU, whole stack: " + ", ".join(
            f"{label(n)} {fmt(v)}" for n, v in cpu_rows.items() if not math.isnan(v)
        )
        e["floor"] += "; CPU per task, ms: " + "; ".join(
            f"{label(n)} {text}" for n in names if (text := _cpu_per_task(runs.get(n, [])))
        )
        s["throughput_cpu_per_task"] = {n: _cpu_per_task_ms(runs.get(n, [])) for n in names}
    _steps_rows(recs, names, row, s)
    if peer == "peer":
        _durable_peer_row(recs, names, mcp, s)
    return s


STEPS_TITLE = "`steps` tasks/s (10 progress reports each), create→terminal, 32 clients"
STEPS_CPU_TITLE = "`steps` tasks per second of CPU, whole stack, 32 clients"


def _steps_rows(recs: list[dict], names: list[str], row: Any, s: dict[str, Any]) -> None:
    """The ``steps`` measure: its rate, and its rate per second of the whole
    stack's CPU, with the CPU per task by process group and the machine's busy
    time per task beside them."""
    runs = by(recs, STEPS, "c32")
    if not runs:
        return
    for rr in runs.values():
        for r in rr:
            cores = _stack_cores(r)
            r["per_cpu_second"] = r["value"] / cores if cores and r.get("value") else float("nan")
    row(STEPS_TITLE, STEPS, "c32", "/s", goal="≥ 1× peer")
    e = row(STEPS_CPU_TITLE, STEPS, "c32", "/CPU-s", "per_cpu_second", goal="≥ 1.5× peer")
    busy = {
        n: med(
            [
                1000 * r["cpu"]["machine"] / r["value"]
                for r in runs.get(n, [])
                if r.get("value") and "machine" in r.get("cpu", {})
            ]
        )
        for n in names
    }
    e["floor"] = (
        "CPU per task, ms: "
        + "; ".join(f"{label(n)} {text}" for n in names if (text := _cpu_per_task(runs.get(n, []))))
        + "; machine busy per task (client included), ms: "
        + ", ".join(f"{label(n)} {v:.1f}" for n, v in busy.items() if not math.isnan(v))
    )
    s["steps_cpu_per_task"] = {n: _cpu_per_task_ms(runs.get(n, [])) for n in names}


def _durable_peer_row(recs: list[dict], names: list[str], mcp: list[str], s: dict[str, Any]) -> None:
    """Throughput against the peer on a Redis that fsyncs every write
    (bench/durable_peer.py); its values sit in the peer's column."""
    from bench.durable_peer import KEY, MEASURE

    rows = by(recs, MEASURE, "c32")
    if not rows.get(KEY):
        return
    values = {n: med([r["value"] for r in rows.get(n, [])]) for n in mcp}
    values.update({n: med([r["value"] for r in rows[KEY]]) for n in names if n not in mcp})
    cpu = "; ".join(f"{label(n)} {text}" for n in [*mcp, KEY] if (text := _cpu_per_task(rows.get(n, []))))
    s["rows"].append(
        {
            "noise": med([foreign(r) for rr in rows.values() for r in rr if foreign(r) is not None]),
            "title": "no-op tasks/s, create→terminal, 32 clients, the peer's Redis on `appendfsync always`",
            "unit": "/s",
            "values": values,
            "ratios": {n: med(ratios(recs, MEASURE, "c32", n, peer=KEY)) for n in mcp},
            "floor": "the peer on a Redis of its own (`appendonly yes`, `appendfsync always`); "
            f"CPU per task, ms: {cpu}",
            "goal": "≥ 1.5× peer",
            "higher_better": True,
        }
    )
    s["throughput_durable_peer_cpu_per_task"] = {n: _cpu_per_task_ms(rows.get(n, [])) for n in [*mcp, KEY]}


#: The process groups of a run's CPU record, in the order the report gives them.
_CPU_GROUPS = ("web", "workers", "postgres", "redis")


def _cpu_per_task_ms(runs: list[dict]) -> dict[str, float]:
    """Median CPU milliseconds each process group spent per completed task
    (throughput): where a task's cost goes, and so where the floor of a design is."""
    out: dict[str, float] = {}
    for group in (*_CPU_GROUPS, "stack"):
        values = []
        for r in runs:
            cpu = r.get("cpu") or {}
            cores = _stack_cores(r) if group == "stack" else cpu.get(group)
            if cores is not None and r.get("value"):
                values.append(1000 * cores / r["value"])
        if values:
            out[group] = med(values)
    return out


def _cpu_per_task(runs: list[dict]) -> str:
    ms = _cpu_per_task_ms(runs)
    if "stack" not in ms:
        return ""
    parts = ", ".join(f"{g} {ms[g]:.1f}" for g in _CPU_GROUPS if ms.get(g))
    polls = med([r["polls_per_task"] for r in runs if "polls_per_task" in r])
    return f"{ms['stack']:.1f} ({parts}; {polls:.1f} polls a task)"


def _paired(mine: list[dict], other: list[dict]) -> list[tuple[float, float]]:
    """(mine, other) values of the same rounds."""
    theirs = {r["round"]: r["value"] for r in other}
    return [(r["value"], theirs[r["round"]]) for r in mine if theirs.get(r["round"])]


def _stack_cores(r: dict) -> float:
    """Cores one run's stack used: web, workers, Postgres and Redis."""
    cpu = r.get("cpu") or {}
    return sum(v for k, v in cpu.items() if k != "machine")


def goal_lines(results: dict[str, Any], s: dict[str, Any]) -> list[str]:
    names = results["contenders"]
    mcp = [n for n in names if n != "peer"]
    lines = []
    rows = {r["title"]: r for r in s["rows"]}

    def best(title: str, higher: bool = True) -> tuple[str, float]:
        r = rows[title]
        cands = [(n, r["ratios"][n]) for n in mcp if not math.isnan(r["ratios"][n])]
        if not cands:
            return ("–", float("nan"))
        return max(cands, key=lambda x: x[1]) if higher else min(cands, key=lambda x: x[1])

    polled = rows["polls/s, 32 pollers, working tasks"]
    n, r = best(polled["title"])
    pct = polled.get("pct_floor", {}).get(n, float("nan"))
    ok = r >= 5 and pct >= 0.5
    asgi = polled.get("pct_asgi") if n == "uvicorn" else None
    lines.append(
        f"- **polls** ({label(n) if n != '–' else '–'}): {fr(r)} fastmcp-tasks (goal ≥ 5×), {100 * pct:.0f} % of the "
        f"bare Django view (goal ≥ 50 %)"
        + (f", {100 * asgi:.0f} % of a bare ASGI app" if asgi else "")
        + f": **{'met' if ok else 'not met'}**"
        + ("" if ok else f" — short by {max(0.0, 5 - r) / 5 * 100:.0f} % on the ratio" if r < 5 else "")
    )
    worst = {}
    for n in mcp:
        v = [rows[t]["values"][n] for t in rows if t.startswith("tools/call") and "p50" in t]
        w = [rows[t]["values"][n] for t in rows if t.startswith("tools/call") and "p99" in t]
        rr = [rows[t]["ratios"][n] for t in rows if t.startswith("tools/call")]
        worst[n] = (max(v), max(w), max(rr))
    n = min(mcp, key=lambda k: worst[k][0])
    p50, p99, rr = worst[n]
    ok = p50 <= 5 and p99 <= 20 and rr <= 1
    lines.append(
        f"- **call latency** ({label(n)}): worst p50 {fmt(p50, 'ms')} (goal ≤ 5 ms), "
        f"worst p99 {fmt(p99, 'ms')} (goal ≤ 20 ms), "
        f"at most {fr(rr)} the peer's latency (goal ≤ 1×): **{'met' if ok else 'not met'}**"
    )
    n, r = best("no-op tasks/s, create→terminal, 32 clients")
    lines.append(
        f"- **throughput** ({label(n) if n != '–' else '–'}): {fr(r)} fastmcp-tasks (goal ≥ 1.5×): "
        f"**{'met' if r >= 1.5 else 'not met'}**"
    )
    if STEPS_CPU_TITLE in rows:
        n, r = best(STEPS_CPU_TITLE)
        rate = rows[STEPS_TITLE]["ratios"].get(n, float("nan")) if n != "–" else float("nan")
        ok = r >= 1.5 and rate >= 1.0
        lines.append(
            f"- **steps** ({label(n) if n != '–' else '–'}): {fr(r)} fastmcp-tasks per CPU-second (goal ≥ 1.5×), "
            f"{fr(rate)} its tasks/s (goal ≥ 1×): **{'met' if ok else 'not met'}**"
        )
    title = "no-op tasks/s, create→terminal, 32 clients, the peer's Redis on `appendfsync always`"
    if title in rows:
        n, r = best(title)
        lines.append(
            f"- **throughput, durable peer** ({label(n) if n != '–' else '–'}): {fr(r)} fastmcp-tasks on "
            f"`appendfsync always` (goal ≥ 1.5×): **{'met' if r >= 1.5 else 'not met'}**"
        )
    scaled = results.get("scale")
    if scaled and "large" in scaled:
        pr = scaled["purge_run"]
        slow = scaled["slowdown_c1_p50"]
        lines.append(
            f"- **scale** ({label(scaled['config'])}): p50 {fmt(scaled['small']['c1_p50_ms'], 'ms')} at "
            f"{scaled['small_stats']['rows']:,} rows, {fmt(scaled['large']['c1_p50_ms'], 'ms')} at "
            f"{scaled['large_stats']['rows']:,} rows: {slow:.2f}× "
            f"(goal ≤ 1.2×, **{'met' if slow <= 1.2 else 'not met'}**); "
            f"purge deleted {pr['deleted']:,} rows in {pr['purge_seconds']} s"
            f"{' (capped)' if pr['capped'] else ''}, slowest poll "
            f"{fmt(pr['during_max_ms'], 'ms')}, {pr['during_over_50ms']} of {pr['polls_during']} polls over 50 ms "
            f"(goal none, **{'met' if pr['during_over_50ms'] == 0 and pr['polls_during'] else 'not met'}**)"
        )
    return lines


def table(results: dict[str, Any]) -> str:
    use(results)
    s = summarize(results)
    names = results["contenders"]
    mcp = [n for n in names if n != "peer"]
    head = [
        "measure",
        *(label(n) for n in names),
        *(f"ratio {n} ÷ peer" for n in mcp),
        "other load (cores)",
        "floor / note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in s["rows"]:
        cells = [r["title"]]
        cells += [fmt(r["values"][n], r["unit"] if r["unit"] == "ms" else "") for n in names]
        cells += [fr(r["ratios"][n]) for n in mcp]
        cells.append("–" if math.isnan(r["noise"]) else f"{r['noise']:.2f}")
        cells.append(r["floor"] or ("lower is better" if not r["higher_better"] else ""))
        lines.append("| " + " | ".join(cells) + " |")
    scaled = results.get("scale")
    if scaled and "large" in scaled:
        cfg = scaled["config"]
        blank = ["–"] * len(names)
        idx = names.index(cfg) if cfg in names else 0

        def scale_row(title: str, value: str, note: str) -> None:
            cells = list(blank)
            cells[idx] = value
            lines.append("| " + " | ".join([title, *cells, *(["–"] * len(mcp)), "–", note]) + " |")

        scale_row(
            f"tasks/get p50, 1 poller, {scaled['small_stats']['rows']:,} rows",
            fmt(scaled["small"]["c1_p50_ms"], "ms"),
            f"32 pollers: p50 {fmt(scaled['small']['c32_p50_ms'], 'ms')}, {fmt(scaled['small']['c32_rps'])}/s",
        )
        scale_row(
            f"tasks/get p50, 1 poller, {scaled['large_stats']['rows']:,} rows",
            fmt(scaled["large"]["c1_p50_ms"], "ms"),
            f"{scaled['slowdown_c1_p50']:.2f}× the small table, median of per-round ratios (goal ≤ 1.2×); "
            "32 pollers: p50 "
            f"{fmt(scaled['large']['c32_p50_ms'], 'ms')}, {fmt(scaled['large']['c32_rps'])}/s; "
            f"table {scaled['large_stats']['size']}",
        )
        pr = scaled["purge_run"]
        what = (
            f"stopped after {pr['purge_seconds']} s having deleted {pr['deleted']:,} of {pr['expired_before']:,} "
            f"({pr['rows_per_s']:,} rows/s, all of them would take ~{pr['projected_seconds']} s)"
            if pr["capped"]
            else f"{pr['deleted']:,} rows in {pr['purge_seconds']} s ({pr['rows_per_s']:,} rows/s)"
        )
        scale_row(
            f"slowest poll during the purge of {pr['expired_before']:,} expired rows",
            fmt(pr["during_max_ms"], "ms"),
            f"purge {what}; {pr['polls_during']} paced polls: p50 {fmt(pr['during_p50_ms'], 'ms')}, "
            f"p99 {fmt(pr['during_p99_ms'], 'ms')}, {pr['during_over_50ms']} over 50 ms (5 s before it: p50 "
            f"{fmt(pr['before_p50_ms'], 'ms')}, max {fmt(pr['before_max_ms'], 'ms')})",
        )
    lg = results.get("loadgen") or {}
    if lg:
        used = [r.get("loadgen_cores") for r in results["records"] if r.get("loadgen_cores") is not None]
        lines.append(
            f"| load generator: wrk, 1 thread | max {max(used, default=0):.2f} cores in any run | "
            + " | ".join(["–"] * (len(names) + len(mcp)))
            + f" | against a trivial server: {fmt(lg['rps'])} req/s on {lg['loadgen_cores']:.2f} cores, "
            f"{1e6 * lg['loadgen_cores'] / max(lg['rps'], 1):.0f} µs of CPU per request |"
        )
    foreign_all = [f for f in (foreign(r) for r in results["records"]) if f is not None]
    notes = []
    if foreign_all:
        notes.append(
            f"- Noise: while the bench ran, processes outside it (other sessions' test suites, etc.) used a median "
            f"{med(foreign_all):.2f} of the {results['machine']['cores']} cores (max {max(foreign_all):.2f}; per "
            f"measure in the *other load* column); every ratio "
            f"above is taken between adjacent runs of one round. Before each run the bench waited (up to 20 s, "
            f"{results.get('gate_wait_s', 0):.0f} s in all) for that load to fall below half a core."
        )
    out = "\n".join(lines) + "\n\n" + "\n".join(goal_lines(results, s) + notes) + "\n"
    if any(r["contender"] == "run" for r in results["records"]):
        out += "\n" + defaults_table(results)
    return out


def defaults_table(results: dict[str, Any]) -> str:
    """bin/run's defaults (``manage.py mcptasks run``) against the peer's
    single process, measured in the same run."""
    names = ["run", "peer1"]
    s = summarize(results, names, peer="peer1")
    head = ["measure", label("run"), label("peer1"), "ratio", "other load (cores)", "note"]
    lines = [
        "With `bin/run`'s defaults: `manage.py mcptasks run` (one uvicorn process; a Celery prefork worker of 4 "
        "children and beat as its children) against fastmcp-tasks as one uvicorn process (its own Docket worker "
        "inside), alternated round by round like the rest:",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in s["rows"]:
        note = r["floor"] or ("lower is better" if not r["higher_better"] else "")
        cells = [r["title"], *(fmt(r["values"][n], r["unit"] if r["unit"] == "ms" else "") for n in names)]
        cells += [fr(r["ratios"]["run"]), "–" if math.isnan(r["noise"]) else f"{r['noise']:.2f}", note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plots(results: dict[str, Any], outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    use(results)
    outdir.mkdir(parents=True, exist_ok=True)
    names = results["contenders"]
    made = []
    specs = [
        (
            POLLS_SWEEP,
            "tasks/get per second",
            "polls per second against concurrent pollers (working tasks)",
            "bench-polls.png",
            "pollers",
        ),
        (
            THROUGHPUT_SWEEP,
            "no-op tasks per second, create→terminal",
            "tasks per second end to end against concurrent clients (2 worker processes)",
            "bench-throughput.png",
            "clients",
        ),
    ]
    for measure, ylabel, title, fname, xlabel in specs:
        recs = [r for r in results["records"] if r["measure"] in (measure, measure.split("-")[0] + "-sweep")]
        if measure == THROUGHPUT_SWEEP:
            recs = [r for r in results["records"] if r["measure"] in (THROUGHPUT, THROUGHPUT_SWEEP)]
        if not recs:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
        for n in names:
            pts: dict[int, list[float]] = defaultdict(list)
            for r in recs:
                if r["contender"] == n:
                    pts[int(r["concurrency"])].append(r["value"])
            if not pts:
                continue
            xs = sorted(pts)
            ax.plot(xs, [med(pts[x]) for x in xs], marker="o", label=label(n))
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"concurrent {xlabel}")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        xs_all = sorted({int(r["concurrency"]) for r in recs})
        ax.set_xticks(xs_all)
        ax.set_xticklabels([str(x) for x in xs_all])
        fig.tight_layout()
        path = outdir / fname
        fig.savefig(path)
        plt.close(fig)
        made.append(path)
    return made


def machine_block(results: dict[str, Any]) -> str:
    m = results["machine"]
    v = results["versions"]
    lines = [
        f"Run {results['started']} ({'quick' if results['config']['quick'] else 'full'} mode, "
        f"{results['elapsed_s'] / 60:.1f} min), commit `{results['git']}`.",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['kernel']}; load average at start "
        f"{m['loadavg']}.",
        f"- Software: Python {v['python']}, Django {v['django']}, gunicorn {v['gunicorn']}, uvicorn {v['uvicorn']}, "
        f"PostgreSQL {v['postgres']}, Redis {v['redis']}; peer: fastmcp {v['fastmcp']}, fastmcp-tasks "
        f"{v['fastmcp_tasks']}, pydocket {v['pydocket']}; wrk {v['wrk']}.",
        f"- mcptasks database settings seen by Django: `{results.get('database')}`.",
    ]
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    """``value`` as strict JSON: NaN (a figure not measured) becomes null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_data(results: dict[str, Any], path: Path, plot_paths: list[Path], profile: str = "") -> None:
    """The run's figures as the data file the docs link: what ran and where,
    each row of the table (values per contender, ratios to the peer, the
    other load, floors and goals), the scale measure, the goal lines, the
    table and profile as Markdown, and the plots' paths."""
    use(results)
    summary = summarize(results)
    run_keys = (
        "started",
        "elapsed_s",
        "git",
        "machine",
        "versions",
        "database",
        "contenders",
        "peer_web_workers",
        "mcp_worker_pool",
        "mcp_worker_threads",
        "defaults_pair",
        "gate_wait_s",
        "loadgen",
        "pgbench",
    )
    data = {
        "run": {key: results.get(key) for key in run_keys},
        "config": results["config"],
        "labels": {n: label(n) for n in results["contenders"]},
        "rows": summary["rows"],
        "goals": goal_lines(results, summary),
        "scale": results.get("scale"),
        "table_markdown": table(results),
        "profile_markdown": profile,
        "plots": [p.relative_to(path.parent.parent).as_posix() for p in plot_paths],
    }
    if any(r["contender"] == "run" for r in results["records"]):
        data["labels"].update({n: label(n) for n in ("run", "peer1")})
        data["defaults_rows"] = summarize(results, ["run", "peer1"], peer="peer1")["rows"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(data), indent=1, default=str, allow_nan=False) + "\n")

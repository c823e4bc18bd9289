"""The scale measure: tasks/get with 10k and with 10M rows, and a purge of 1M expired rows
while polls run. mcptasks only (the peer keeps its tasks in Redis keys with a
TTL; it has no table to grow).

Rows are made with ``INSERT ... SELECT generate_series`` in a dedicated
database (dropped at the end). The column list comes from the live table, so
the generator follows the schema as it evolves: known columns get realistic
values, any other NOT NULL column a neutral one for its type.

Row ``g`` (1-based) has id ``md5(g)``: the bench computes ids without reading
them back. Layout, for ``large`` rows in all:

* ``g <= purge``: completed, expired an hour ago (the purge's work), with two
  TaskEvent rows each, as real finished tasks have;
* otherwise completed (2 % working), expiring in a week; one in ten belongs to
  the anonymous owner the bench polls as, the rest to 1,000 other owners.

The 10k-row baseline is a second database holding the large one's last 10k
rows; the two are polled alternately, each through its own server.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import client, envs, procs, wrk
from bench.measures import Config, log
from bench.stacks import Bench, manage_argv

KNOWN = {
    "id": "md5(g::text)",
    "owner": "CASE WHEN g % 10 = 0 THEN 'anonymous' ELSE 'user' || (g % 1000)::text END",
    "tool_name": "'noop'",
    "arguments": "'{}'::jsonb",
    "era": "'2026-07-28'",
    "client_capabilities": '\'{"extensions":{"io.modelcontextprotocol/tasks":{}}}\'::jsonb',
    "status": "CASE WHEN g > {purge} AND g % 50 = 7 THEN 'working' ELSE 'completed' END",
    "status_message": "''",
    "result": "CASE WHEN g > {purge} AND g % 50 = 7 THEN NULL ELSE "
    '\'{"content":[{"type":"text","text":"ok"}],"isError":false}\'::jsonb END',
    "error": "NULL",
    "created_at": "now() - make_interval(secs => ({large} - g) / 1000.0)",
    "updated_at": "now() - make_interval(secs => ({large} - g) / 1000.0)",
    "ttl_ms": "3600000",
    "expires_at": "CASE WHEN g <= {purge} THEN now() - interval '1 hour' ELSE now() + interval '7 days' END",
    "poll_interval_ms": "500",
    "attempts": "1",
    "dispatched_at": "now() - make_interval(secs => ({large} - g) / 1000.0)",
    "lease_owner": "''",
    "lease_expires_at": "NULL",
    "cancel_requested_at": "NULL",
    "cancelled_by": "''",
}

NEUTRAL = {
    "character varying": "''",
    "text": "''",
    "integer": "0",
    "bigint": "0",
    "smallint": "0",
    "boolean": "false",
    "jsonb": "'{}'::jsonb",
    "timestamp with time zone": "now()",
}


def task_id(g: int) -> str:
    return hashlib.md5(str(g).encode()).hexdigest()


class ScaleDb:
    def __init__(self, bench: Bench, large: int, purge: int, suffix: str = "scale") -> None:
        self.bench = bench
        self.name = f"{bench.db}_{suffix}"
        self.large = large
        self.purge = purge

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.bench.services.libpq(self.name), autocommit=True)

    def create(self) -> None:
        self.bench.prepare_db(self.name)

    def _select_list(self, conn: psycopg.Connection) -> tuple[list[str], list[str]]:
        rows = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = 'mcptasks_task' ORDER BY ordinal_position"
        ).fetchall()
        cols, exprs = [], []
        for col, dtype, nullable in rows:
            if col in KNOWN:
                expr = KNOWN[col].replace("{purge}", str(self.purge)).replace("{large}", str(self.large))
            elif nullable == "YES":
                continue
            else:
                expr = NEUTRAL.get(dtype, "DEFAULT")
            cols.append(col)
            exprs.append(expr)
        return cols, exprs

    def _secondary_indexes(self, conn: psycopg.Connection) -> list[tuple[str, str]]:
        """(name, CREATE INDEX statement) of the indexes that back no constraint."""
        return conn.execute(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i "
            "WHERE i.tablename IN ('mcptasks_task', 'mcptasks_taskevent') AND i.schemaname = current_schema() "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"
        ).fetchall()

    def insert(self, lo: int, hi: int) -> float:
        """Rows ``lo..hi`` (inclusive), plus the events of the expired ones.

        A big batch goes in without the secondary indexes, which are then
        rebuilt from their own definitions (much faster than maintaining them
        row by row); the schema ends exactly as the migrations made it."""
        t0 = time.monotonic()
        with self.connect() as conn:
            conn.execute("SET synchronous_commit = off")
            conn.execute("SET maintenance_work_mem = '1GB'")
            indexes = self._secondary_indexes(conn) if hi - lo > 200_000 else []
            for name, _ in indexes:
                conn.execute(f'DROP INDEX "{name}"')
            cols, exprs = self._select_list(conn)
            step = 1_000_000
            for a in range(lo, hi + 1, step):
                b = min(hi, a + step - 1)
                conn.execute(
                    f"INSERT INTO mcptasks_task ({', '.join(cols)}) "
                    f"SELECT {', '.join(exprs)} FROM generate_series({a}, {b}) AS g"
                )
                e_hi = min(b, self.purge)
                if a <= e_hi:
                    conn.execute(
                        "INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail) "
                        "SELECT md5(g::text), now() - interval '2 hours', k.kind, k.f, k.t, 'system', '{}'::jsonb "
                        f"FROM generate_series({a}, {e_hi}) AS g, "
                        "(VALUES ('created', '', 'working'), ('transition', 'working', 'completed')) AS k(kind, f, t)"
                    )
            for _, ddl in indexes:
                conn.execute(ddl)
            conn.execute("ANALYZE mcptasks_task")
            conn.execute("ANALYZE mcptasks_taskevent")
        return time.monotonic() - t0

    def stats(self) -> dict[str, Any]:
        with self.connect() as conn:
            rows = conn.execute("SELECT count(*) FROM mcptasks_task").fetchone()[0]
            size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('mcptasks_task'))").fetchone()[0]
            expired = conn.execute(
                "SELECT count(*) FROM mcptasks_task WHERE expires_at < now() AND status <> 'working'"
            ).fetchone()[0]
        return {"rows": rows, "size": size, "expired": expired}

    def poll_ids(self, lo: int, hi: int, n: int, path: Path) -> Path:
        """``n`` ids of the anonymous owner's completed, unexpired tasks in ``lo..hi``."""
        rng = random.Random(lo * 31 + hi)
        lo = max(lo, self.purge + 1)
        ids = []
        while len(ids) < n:
            g = rng.randrange(lo, hi + 1)
            g -= g % 10
            if g < lo or g % 50 == 7:
                continue
            ids.append(task_id(g))
        path.write_text("\n".join(ids) + "\n")
        return path

    def drop(self) -> None:
        self.bench.services.drop_db(self.name)


def _latency(bench: Bench, url: str, ids: Path, seconds: float) -> dict[str, Any]:
    gate = bench.wait_machine_quiet()
    one = wrk.measured(url, "get", ids_file=ids, connections=1, duration=seconds)
    many = wrk.measured(url, "get", ids_file=ids, connections=32, duration=seconds)
    return {
        "c1_p50_ms": one["lat_p50_us"] / 1000,
        "c1_p99_ms": one["lat_p99_us"] / 1000,
        "c1_rps": one["rps"],
        "c32_p50_ms": many["lat_p50_us"] / 1000,
        "c32_rps": many["rps"],
        "errors": one["errors"] + many["errors"],
        **gate,
    }


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def run(bench: Bench, cfg: Config, workdir: Path, key: str = "uvicorn") -> dict[str, Any]:
    """Two databases, one of ``scale_small`` rows and one of ``scale_large`` (the
    small one's rows are the large one's last rows), each behind its own
    server; the two are polled alternately, round by round, and the slowdown
    is the median of the per-round ratios. Then the purge, on the large one."""
    out: dict[str, Any] = {"config": key, "large": cfg.scale_large, "small": cfg.scale_small, "purge": cfg.scale_purge}
    small = ScaleDb(bench, cfg.scale_large, cfg.scale_purge, suffix="scale_small")
    large = ScaleDb(bench, cfg.scale_large, cfg.scale_purge)
    try:
        small_lo = cfg.scale_large - cfg.scale_small + 1
        small.create()
        small.insert(small_lo, cfg.scale_large)
        large.create()
        t = large.insert(1, cfg.scale_large)
        out["generate_seconds"] = round(t, 1)
        out["small_stats"] = small.stats()
        out["large_stats"] = large.stats()
        log(f"scale: generated {out['large_stats']['rows']:,} rows ({out['large_stats']['size']}) in {t:.1f}s")
        # The poll snapshot off on both: it would serve the small table's 1,000
        # ids from memory once warm, while the large one's 10,000 ids (two polls
        # each to enter it) mostly read, which measures the snapshot, not the table.
        webs = {
            "small": bench.start_mcp_web(key, db=small.name, snapshot=False),
            "large": bench.start_mcp_web(key, db=large.name, snapshot=False),
        }
        ids = {
            "small": small.poll_ids(small_lo, cfg.scale_large, 1000, workdir / "ids-scale-small.txt"),
            "large": large.poll_ids(1, cfg.scale_large, 10_000, workdir / "ids-scale-large.txt"),
        }
        for which in ("small", "large"):  # warm both
            wrk.run(webs[which].url, "get", ids_file=ids[which], connections=8, duration=3)
        rounds: dict[str, list[dict[str, Any]]] = {"small": [], "large": []}
        ratios = []
        for r in range(cfg.rounds):
            for which in ("small", "large") if r % 2 == 0 else ("large", "small"):
                rounds[which].append(_latency(bench, webs[which].url, ids[which], cfg.sweep_seconds))
            ratios.append(rounds["large"][-1]["c1_p50_ms"] / rounds["small"][-1]["c1_p50_ms"])
            log(f"scale round {r}: small {rounds['small'][-1]}  large {rounds['large'][-1]}")
        out["small"] = _median(rounds["small"])
        out["large"] = _median(rounds["large"])
        out["rounds"] = rounds
        out["slowdown_c1_p50"] = statistics.median(ratios)
        out["slowdown_rounds"] = ratios
        small_name = next(k for k, v in bench.webs.items() if v is webs["small"])
        bench.stop_web(small_name)
        small.drop()

        out["purge_run"] = purge_while_polling(bench, cfg, webs["large"].url, ids["large"], large)
        out["after_purge_stats"] = large.stats()
        log(f"scale purge: {out['purge_run']}")
        bench.stop_web(next(k for k, v in bench.webs.items() if v is webs["large"]))
    finally:
        small.drop()
        large.drop()
    return out


def purge_while_polling(bench: Bench, cfg: Config, url: str, ids_file: Path, db: ScaleDb) -> dict[str, Any]:
    """Paced polls (``scale_pollers`` clients, one poll each every
    ``scale_poll_interval`` s: well below saturation, so a slow poll is the purge's
    doing and not queueing), 5 s alone, then while ``manage.py mcptasks prune``
    deletes the expired rows. The purge is stopped after ``scale_purge_cap``
    seconds (the bench must end); its rate then projects the full time."""
    ids = [x for x in ids_file.read_text().split() if x]
    env = bench.mcp_env(db=db.name)
    marks: dict[str, Any] = {}
    expired_before = db.stats()["expired"]

    async def go() -> list[tuple[float, float, int]]:
        stop = asyncio.Event()
        polls = asyncio.create_task(client.paced_polls(url, ids, cfg.scale_pollers, cfg.scale_poll_interval, stop))
        await asyncio.sleep(5.0)
        marks["purge_start"] = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *manage_argv("mcptasks", "prune"),
            cwd=str(envs.REPO),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=cfg.scale_purge_cap)
            marks["capped"] = False
        except TimeoutError:
            proc.terminate()
            stdout, stderr = await proc.communicate()
            marks["capped"] = True
        marks["purge_end"] = time.perf_counter()
        marks["rc"] = proc.returncode
        marks["stdout"] = stdout.decode()[-300:]
        marks["stderr"] = stderr.decode()[-600:]
        await asyncio.sleep(1.0)
        stop.set()
        return await polls

    meter = procs.CpuMeter({"postgres": lambda: procs.postgres_backends(db.name)})
    meter.begin()
    polls = client.run(go())
    cpu = meter.end()
    start, end = marks["purge_start"], marks["purge_end"]
    before = [lat * 1000 for t, lat, _ in polls if t < start]
    during = [lat * 1000 for t, lat, _ in polls if start <= t <= end]
    bad = sum(1 for _, _, s in polls if s != 200)
    deleted = expired_before - db.stats()["expired"]
    seconds = end - start
    rate = deleted / seconds if seconds else 0.0

    def pct(v: list[float], q: float) -> float:
        if not v:
            return float("nan")
        s = sorted(v)
        return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]

    return {
        "purge_seconds": round(seconds, 1),
        "deleted": deleted,
        "expired_before": expired_before,
        "capped": marks["capped"],
        "rows_per_s": round(rate),
        "projected_seconds": round(expired_before / rate) if rate else None,
        "rc": marks["rc"],
        "stderr": marks["stderr"] if marks["rc"] and not marks["capped"] else "",
        "polls_before": len(before),
        "before_p50_ms": pct(before, 50),
        "before_max_ms": max(before, default=0),
        "polls_during": len(during),
        "during_p50_ms": pct(during, 50),
        "during_p99_ms": pct(during, 99),
        "during_max_ms": max(during, default=0),
        "during_over_50ms": sum(1 for x in during if x > 50),
        "non_200": bad,
        "postgres_cores": cpu["postgres"],
        "machine_cores": cpu["machine"],
    }

"""The throughput measure against the peer on a Redis that fsyncs every write.

mcptasks acknowledges a task once its row is committed (fsync'd) in Postgres;
the peer, on a default Redis, acknowledges what is only in memory. This measure runs throughput
(no-op tasks end to end, 32 clients) against the peer whose Docket lives on a
Redis of its own with ``appendonly yes`` and ``appendfsync always``: the peer
made as durable as a committed row. The bench starts that Redis on a free
port (its data in the run's log directory), the peer's web and workers on it,
and stops and removes all of it after the measure. CPU is kept per process
group as in throughput, the peer's Redis group being that Redis alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from bench import envs, measures, procs
from bench.measures import Config, log
from bench.stacks import PEER_APP, REPO, Bench, Web, free_port, uvicorn_argv

#: The measure's name, in records and in ``--skip``.
MEASURE = "throughput-durable-peer"
#: The durable peer's key among the bench's webs.
KEY = "peer-fsync"


def start_redis(bench: Bench) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server that appends and fsyncs every write; its URL."""
    binary = os.environ.get("BENCH_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        raise RuntimeError("the durable-peer measure needs redis-server on PATH (or BENCH_REDIS_SERVER)")
    port = free_port()
    data = bench.logs / "redis-fsync"
    data.mkdir(parents=True, exist_ok=True)
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
    argv += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    proc = procs.start(argv, env=os.environ, log=bench.logs / "redis-fsync.log", cwd=REPO)
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                policy = client.config_get("appendfsync")
                if policy.get("appendfsync") != "always":
                    raise RuntimeError(f"the durable peer's Redis is not on appendfsync always: {policy}")
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the durable peer's Redis did not start; see {bench.logs / 'redis-fsync.log'}"
                    ) from None
                time.sleep(0.1)
    finally:
        client.close()
    return proc, url


def start_peer(bench: Bench, web_workers: int, workers: int, redis_url: str, server: subprocess.Popen[bytes]) -> Web:
    """The peer as in throughput (``web_workers`` web processes, ``workers`` worker
    processes), its Docket on ``redis_url``."""
    env = bench.peer_env(docket=f"{bench.docket}-fsync", redis_url=redis_url)
    port = free_port()
    log_path = bench.logs / "peer-fsync-web.log"
    argv = uvicorn_argv(envs.PEER_PY, PEER_APP, port, workers=web_workers if web_workers > 1 else None)
    proc = procs.start(argv, env=env, log=log_path, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    web = Web(KEY, "fastmcp-tasks, Redis appendfsync always", f"{base}/mcp", base, proc, log_path, "peer")
    web.redis_server = server
    for index in range(workers):
        argv = [str(envs.PEER_PY), "-m", "fastmcp_tasks.worker_cli", "worker", "bench/peer_server.py:mcp"]
        web.workers.append(procs.start(argv, env=env, log=bench.logs / f"peer-fsync-worker-{index}.log", cwd=REPO))
    web.executing_processes = web_workers + workers
    procs.wait_ready(web.url, proc, log_path)
    return web


def run(bench: Bench, cfg: Config, mcptasks: str, web_workers: int, workers: int = 2) -> list[dict[str, Any]]:
    """The measure's records: ``mcptasks`` and the durable peer, alternating round by
    round as throughput does; everything the measure started is stopped after it."""
    server, url = start_redis(bench)
    web: Web | None = None
    try:
        web = start_peer(bench, web_workers, workers, url, server)
        bench.webs[KEY] = web
        log(f"{MEASURE}: the peer on Redis appendfsync always at {url}, web {web.url}")
        return measures.throughput(bench, cfg, [mcptasks, KEY], 32, cfg.rounds, variant=MEASURE)
    finally:
        bench.webs.pop(KEY, None)
        for proc in [*(web.workers if web else []), *([web.proc] if web else []), server]:
            procs.stop(proc)
        shutil.rmtree(bench.logs / "redis-fsync", ignore_errors=True)

"""The parts of a task's cost that issue 28 names as candidates, each measured
inside one process against the real services:

    DJANGO_SETTINGS_MODULE=bench.settings DATABASE_URL=... REDIS_URL=... \
        python -m bench.task_costs [n]

- the first read of a finished task's outcome (``reads`` marks it read and
  records its ``result_retrieved`` event in the poll's statement, a commit)
  against a later read of the same task (a plain SELECT);
- the follower check a publisher makes before each publish
  (``notify.is_followed``: one Redis round trip on the Redis layer).

Prints one JSON document: CPU (this process) and wall microseconds per
operation, medians of five batches of ``n``. Indicative only: the figures
move with the machine's load, and Postgres's and Redis's own CPU is not in
them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from mcptasks.notify import fabric as notify  # noqa: E402
from mcptasks.tasks import lifecycle, reads  # noqa: E402
from mcptasks.worker import jobs  # noqa: E402


def per_call(fn: Callable[[int], object], n: int) -> dict[str, float]:
    """CPU and wall microseconds per call of ``fn(i)``, median of 5 batches."""
    cpu, wall = [], []
    for batch in range(5):
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(n):
            fn(batch * n + i)
        cpu.append((time.process_time() - c0) / n * 1e6)
        wall.append((time.perf_counter() - w0) / n * 1e6)
    return {"cpu_us": round(statistics.median(cpu), 1), "wall_us": round(statistics.median(wall), 1)}


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "200"))
    owner = "bench-costs"
    ids = [lifecycle.create_task(owner=owner, tool_name="noop", arguments={}, enqueue=False).id for _ in range(5 * n)]
    for task_id in ids:
        jobs.run_task(task_id)
    out: dict[str, object] = {"n": n}
    out["first outcome read (marks it, records its event)"] = per_call(
        lambda i: reads.poll(ids[i], owner, actor="client:bench"), n
    )
    out["later read of the same task"] = per_call(lambda i: reads.poll(ids[i], owner, actor="client:bench"), n)
    group = notify.task_group(ids[0])
    out["follower check (notify.is_followed), nobody follows"] = per_call(lambda i: notify.is_followed(group), n)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

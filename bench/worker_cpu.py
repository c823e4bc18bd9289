"""CPU of the worker's execution path per no-op task, in one process.

    DJANGO_SETTINGS_MODULE=bench.settings DATABASE_URL=... REDIS_URL=... \
        python -m bench.worker_cpu [tasks] [--profile] [--tool NAME]

Creates ``tasks`` no-op tasks (or tasks of the bench tool ``NAME``, such as
``steps``; not enqueued), then runs each through the
Celery job's body (``mcptasks.worker.jobs.run_task``) on this thread, as a
prefork child does, and prints the process CPU per task (this thread and the
publisher's and lease monitor's threads together). With ``--profile`` it
prints cProfile's top functions by cumulative time instead. Indicative only:
the figure moves with the machine's load.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from mcptasks.tasks import lifecycle  # noqa: E402
from mcptasks.worker import jobs  # noqa: E402


def main() -> None:
    count = int(next((a for a in sys.argv[1:] if a.isdigit()), "500"))
    tool = sys.argv[sys.argv.index("--tool") + 1] if "--tool" in sys.argv else "noop"
    ids = [
        lifecycle.create_task(owner="bench", tool_name=tool, arguments={}, enqueue=False).id for _ in range(count + 50)
    ]
    for task_id in ids[:50]:  # warm up connections and caches
        jobs.run_task(task_id)
    ids = ids[50:]
    if "--profile" in sys.argv:
        profile = cProfile.Profile()
        profile.enable()
        for task_id in ids:
            jobs.run_task(task_id)
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        return
    cpu, wall = time.process_time(), time.perf_counter()
    for task_id in ids:
        jobs.run_task(task_id)
    time.sleep(1.0)  # let the publisher's and the status writer's threads drain
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall - 1.0
    print(
        json.dumps(
            {
                "tasks": count,
                "tool": tool,
                "cpu_ms_per_task": round(cpu * 1000 / count, 3),
                "wall_ms_per_task": round(wall * 1000 / count, 3),
            }
        )
    )


if __name__ == "__main__":
    main()

"""Settings for the benchmark: the example site plus the bench fixtures.

Everything else (database, broker, MCP_* tuning) comes from the environment
exactly as for project.settings, so the bench measures what users run.

One change: the bench drives a single anonymous caller far past the per-caller
abuse limits a public server wants (thousands of calls and polls a second, on
the same few hundred tasks). The limits stay on, so their bookkeeping is paid
on every request as in production, but at values a run never reaches. With
``BENCH_LIMITS=off`` they are turned off instead (``None``).
"""

import os
from dataclasses import fields

from mcptasks.conf import MCPTasksSettings
from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS, MCPTASKS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]
ROOT_URLCONF = "bench.urls"

_known = {f.name for f in fields(MCPTasksSettings)}
_off = os.environ.get("BENCH_LIMITS", "on") == "off"
_unreachable = {
    "POLL_BURST": None if _off else 1_000_000,
    "MAX_ACTIVE_TASKS_PER_OWNER": None if _off else 1_000_000_000,
    "THROTTLE_RATES": {} if _off else {"call": "1000000/s", "update": "1000000/s", "listen": "1000000/s"},
}
MCPTASKS = {**MCPTASKS, **{k: v for k, v in _unreachable.items() if k in _known}}

# bench/telemetry.py: telemetry on, exported in memory.
if os.environ.get("BENCH_OTEL") == "memory":
    from bench import otel_memory

    otel_memory.install()

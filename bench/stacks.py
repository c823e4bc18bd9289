"""The systems under test, started as users would run them.

mcptasks (Postgres + Redis), in the server configurations its users choose:

* ``uvicorn``: ``uvicorn project.asgi:application --workers 2`` (ASGI),
  uvloop + httptools;
* ``gunicorn``: ``gunicorn project.wsgi:application -w 2`` (WSGI, sync
  workers);

both with the example site's own database settings (whatever project/settings.py
makes of an unset ``CONN_MAX_AGE``: the bench reports what Django saw),

plus ``celery -A project worker --concurrency 2`` (two worker processes).

fastmcp-tasks (Docket on Redis): ``uvicorn bench.peer_server:app --workers 2``
(as many web processes as mcptasks gets; each also runs a Docket worker, as
fastmcp-tasks always does) plus two ``python -m fastmcp_tasks.worker_cli
worker`` processes.

Every name is unique to the run (databases, Celery queue, Docket name), so
nothing else on the machine is touched; Redis keys are deleted at the end.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from tests.support import processes
from tests.support.processes import free_port as free_port

from bench import envs, procs

REPO = envs.REPO


@dataclass
class Services:
    pg: str = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    redis: str = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")
    redis_db: int = int(os.environ.get("BENCH_REDIS_DB", "9"))
    tag: str = field(default_factory=lambda: f"{os.getpid()}")

    def db_url(self, name: str) -> str:
        p = urlsplit(self.pg)
        return urlunsplit((p.scheme, p.netloc, f"/{name}", p.query, p.fragment))

    def libpq(self, name: str) -> str:
        p = urlsplit(self.db_url(name))
        return urlunsplit(("postgresql", p.netloc, p.path, p.query, p.fragment))

    @property
    def redis_url(self) -> str:
        return f"{self.redis.rstrip('/')}/{self.redis_db}"

    def admin(self) -> psycopg.Connection:
        p = urlsplit(self.pg)
        return psycopg.connect(urlunsplit(("postgresql", p.netloc, p.path, p.query, "")), autocommit=True)

    def recreate_db(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')

    def drop_db(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def redis_client(self):
        import redis

        return redis.Redis.from_url(self.redis_url)

    def delete_keys(self, *patterns: str) -> int:
        r = self.redis_client()
        n = 0
        for pattern in patterns:
            batch = []
            for key in r.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    n += r.delete(*batch)
                    batch = []
            if batch:
                n += r.delete(*batch)
        return n


# Contenders ---------------------------------------------------------------------------------


def uvicorn_argv(python: Path, app: str, port: int, workers: int | None = None) -> list[str]:
    """Every contender's uvicorn command line: uvloop and httptools, no access log."""
    return processes.uvicorn_argv(port, app, python=python, workers=workers or 1, production_loop=True)


def manage_argv(*args: str) -> list[str]:
    """``manage.py`` of the example site (run from the repository) with these arguments."""
    return [str(envs.APP_PY), "manage.py", *args]


MCP_APP = "project.asgi:application"
MCP_WEB = {
    "uvicorn": {
        "label": "mcptasks · uvicorn ×2",
        "argv": lambda port: uvicorn_argv(envs.APP_PY, MCP_APP, port, workers=2),
    },
    "gunicorn": {
        "label": "mcptasks · gunicorn ×2",
        "argv": lambda port: [
            str(envs.APP_PY),
            "-m",
            "gunicorn",
            "project.wsgi:application",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "2",
            "--log-level",
            "warning",
        ],
    },
    # The listen-stream bench (bench/listen.py): one ASGI process holds every stream.
    "uvicorn-1": {
        "label": "mcptasks · uvicorn ×1",
        "argv": lambda port: uvicorn_argv(envs.APP_PY, MCP_APP, port, workers=1),
    },
}
PEER_LABEL = "fastmcp-tasks · uvicorn ×2"
PEER_APP = "bench.peer_server:app"

# bin/run's defaults: ``manage.py mcptasks run``, one uvicorn
# process with its own Celery worker (prefork, 4 children) and beat, beside
# the peer's single process (one uvicorn process running its Docket worker).
RUN_LABEL = "mcptasks · `mcptasks run` defaults"
PEER_SINGLE_LABEL = "fastmcp-tasks · 1 process"


@dataclass
class Web:
    key: str
    label: str
    url: str
    base: str
    proc: subprocess.Popen[bytes]
    log: Path
    kind: str  # "mcptasks" or "peer"
    #: ``mcptasks run``: the web is the process itself, its children (the
    #: Celery worker and beat) are workers.
    runs_own_workers: bool = False
    #: Processes that execute tasks for this contender (throughput per process).
    executing_processes: int = 0
    #: Worker processes of this contender alone (the durable peer); empty: the bench's shared ones.
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: A Redis server of this contender alone (the durable peer), its CPU group.
    redis_server: subprocess.Popen[bytes] | None = None

    def pids(self) -> list[int]:
        return [self.proc.pid]


@dataclass
class Bench:
    """All the processes of one bench run, and their shared names."""

    services: Services
    logs: Path
    poll_interval_ms: int = 500
    db: str = ""
    queue: str = ""
    docket: str = ""
    #: A DRF token of a bench user (``make_token``), for the authenticated polls.
    token: str = ""
    webs: dict[str, Web] = field(default_factory=dict)
    mcp_workers: subprocess.Popen[bytes] | None = None
    #: Further worker processes (the threads pool runs one process per slot of
    #: ``start_mcp_workers``' count; prefork needs only the first).
    mcp_more_workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    peer_workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: Processes executing mcptasks' runs: prefork children, or threads-pool workers.
    mcp_executing: int = 0
    #: The quiet gate (wait_machine_quiet): foreign cores allowed, longest
    #: single wait, and the total wait a run may spend.
    gate_foreign: float = 0.5
    gate_max: float = 20.0
    gate_budget: float = 240.0
    gate_used: float = 0.0

    def __post_init__(self) -> None:
        tag = self.services.tag
        self.db = self.db or f"mcptasks_bench_{tag}"
        self.queue = f"mcptasks-bench-{tag}"
        self.docket = f"bench-peer-{tag}"

    # Environments ------------------------------------------------------------------------

    def mcp_env(self, db: str | None = None, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MCP_", "FASTMCP_", "DB_"))
            and k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "CONN_MAX_AGE", "DJANGO_SETTINGS_MODULE")
        }
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "bench.settings",
                "DATABASE_URL": self.services.db_url(db or self.db),
                "CELERY_BROKER_URL": self.services.redis_url,
                "REDIS_URL": self.services.redis_url,
                "MCP_CELERY_QUEUE": self.queue,
                "MCP_ALLOW_ANONYMOUS": "true",
                "MCP_POLL_INTERVAL_MS": str(self.poll_interval_ms),
                "MCP_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra)
        return env

    def peer_env(self, docket: str | None = None, redis_url: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_", "FASTMCP_"))}
        env.update(
            {
                "FASTMCP_DOCKET_URL": redis_url or self.services.redis_url,
                "FASTMCP_DOCKET_NAME": docket or self.docket,
                "BENCH_POLL_INTERVAL_MS": str(self.poll_interval_ms),
                "FASTMCP_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    # Setup -------------------------------------------------------------------------------

    def prepare_db(self, db: str | None = None) -> None:
        name = db or self.db
        self.services.recreate_db(name)
        self.manage("migrate", "-v0", db=name)

    def make_token(self) -> str:
        """A user and its DRF token in the bench database: real clients send a
        bearer token, so the polls measure also polls with one."""
        code = (
            "from django.contrib.auth import get_user_model; from rest_framework.authtoken.models import Token; "
            "u, _ = get_user_model().objects.get_or_create(username='bench-client'); "
            "print(Token.objects.get_or_create(user=u)[0].key)"
        )
        self.token = self.shell(code)
        return self.token

    def manage(self, *args: str, db: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``manage.py <args>`` on the bench database (or ``db``), its output captured."""
        result = subprocess.run(manage_argv(*args), cwd=REPO, env=self.mcp_env(db=db), capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def shell(self, code: str, *, check: bool = True) -> str | None:
        """The last line ``code`` prints in ``manage.py shell`` (None: it failed
        or printed nothing, with ``check=False``)."""
        result = self.manage("shell", "-c", code, check=check)
        out = result.stdout.strip()
        if result.returncode != 0 or not out:
            if check:
                raise RuntimeError(f"manage.py shell printed nothing for: {code}")
            return None
        return out.splitlines()[-1]

    def start_mcp_run(self) -> Web:
        """``manage.py mcptasks run`` with its defaults (one uvicorn process,
        a prefork worker of 4 children, beat), on its own Celery queue so the
        other contenders' workers never take its runs. Its sweeper is slowed
        to once a day: the seeded sleep tasks wait unclaimed in the shared
        database, and its sweeper would otherwise hand them to this worker."""
        port = free_port()
        log = self.logs / "mcptasks-run.log"
        env = self.mcp_env(MCP_CELERY_QUEUE=f"{self.queue}-run", MCP_SWEEP_SECONDS="86400")
        # The Celery app is the example site's (the bench's settings module lives in bench/).
        argv = manage_argv("mcptasks", "run", "--host", "127.0.0.1", "--port", str(port), "--celery-app", "project")
        proc = procs.start(argv, env=env, log=log, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        web = Web("run", RUN_LABEL, f"{base}/mcp", base, proc, log, "mcptasks", runs_own_workers=True)
        web.executing_processes = 4  # the prefork worker's default concurrency
        procs.wait_ready(web.url, proc, log)
        self.webs["run"] = web
        return web

    def start_peer_single(self) -> Web:
        """The peer as one process: one uvicorn worker, its own Docket worker
        inside, on a Docket of its own (no worker_cli process takes its tasks)."""
        port = free_port()
        log = self.logs / "peer-single.log"
        argv = uvicorn_argv(envs.PEER_PY, PEER_APP, port)
        proc = procs.start(argv, env=self.peer_env(docket=f"{self.docket}-single"), log=log, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        web = Web("peer1", PEER_SINGLE_LABEL, f"{base}/mcp", base, proc, log, "peer", executing_processes=1)
        procs.wait_ready(web.url, proc, log)
        self.webs["peer1"] = web
        return web

    def start_mcp_web(
        self, key: str, *, db: str | None = None, conn_max_age: str | None = None, snapshot: bool = True
    ) -> Web:
        spec = MCP_WEB[key]
        port = free_port()
        extra = {"CONN_MAX_AGE": conn_max_age} if conn_max_age is not None else {}
        if not snapshot:  # every poll reads the database (scale: the table's own cost)
            extra["MCP_POLL_SNAPSHOT"] = "false"
        name = key if db is None and conn_max_age is None else f"{key}-{db or 'main'}-{conn_max_age}"
        log = self.logs / f"mcptasks-{name}.log"
        proc = procs.start(spec["argv"](port), env=self.mcp_env(db=db, **extra), log=log, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        web = Web(key, spec["label"], f"{base}/mcp", base, proc, log, "mcptasks")
        procs.wait_ready(web.url, proc, log)
        self.webs[name] = web
        # The bench's shared Celery workers (start_mcp_workers) run its tasks.
        web.executing_processes = self.mcp_executing
        return web

    def start_bare_asgi(self) -> Web:
        """bench/bare_asgi.py under the mcptasks uvicorn command line."""
        port = free_port()
        log = self.logs / "bare-asgi.log"
        argv = uvicorn_argv(envs.APP_PY, "bench.bare_asgi:app", port, workers=2)
        proc = procs.start(argv, env=self.mcp_env(), log=log, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        web = Web("bare-asgi", "bare ASGI app · uvicorn ×2", f"{base}/mcp", base, proc, log, "floor")
        procs.wait_ready(web.url, proc, log)
        self.webs["bare-asgi"] = web
        return web

    def start_mcp_workers(self, concurrency: int = 2, pool: str = "prefork", threads: int = 8) -> None:
        """``concurrency`` worker processes: one prefork worker with that many
        children, or that many ``--pool threads`` workers of ``threads`` slots
        each (runs mostly wait on Postgres, so threads overlap them)."""
        count = 1 if pool == "prefork" else concurrency
        self.mcp_executing = concurrency
        for index in range(count):
            log = self.logs / ("mcptasks-celery.log" if index == 0 else f"mcptasks-celery-{index}.log")
            argv = [
                str(envs.APP_PY),
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "--pool",
                pool,
                "--concurrency",
                str(concurrency if pool == "prefork" else threads),
                "-Q",
                self.queue,
                "-n",
                f"{self.queue}-{index}@%h",
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
            proc = procs.start(argv, env=self.mcp_env(), log=log, cwd=REPO)
            if index == 0:
                self.mcp_workers = proc
            else:
                self.mcp_more_workers.append(proc)

    def start_peer_web(self, workers: int = 1) -> Web:
        port = free_port()
        log = self.logs / "peer-web.log"
        argv = uvicorn_argv(envs.PEER_PY, PEER_APP, port, workers=workers if workers > 1 else None)
        proc = procs.start(argv, env=self.peer_env(), log=log, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        # Each web process runs a Docket worker, and so does each worker_cli process.
        web = Web("peer", PEER_LABEL, f"{base}/mcp", base, proc, log, "peer", executing_processes=workers)
        procs.wait_ready(web.url, proc, log)
        self.webs["peer"] = web
        return web

    def start_peer_workers(self, count: int = 2) -> None:
        for i in range(count):
            log = self.logs / f"peer-worker-{i}.log"
            argv = [str(envs.PEER_PY), "-m", "fastmcp_tasks.worker_cli", "worker", "bench/peer_server.py:mcp"]
            self.peer_workers.append(procs.start(argv, env=self.peer_env(), log=log, cwd=REPO))
        if "peer" in self.webs:
            self.webs["peer"].executing_processes += count

    def stop_web(self, name: str) -> None:
        web = self.webs.pop(name, None)
        if web is not None:
            procs.stop(web.proc)

    # CPU groups ----------------------------------------------------------------------------

    def cpu_groups(self, web: Web, db: str | None = None) -> dict[str, Callable[[], list]]:
        """Process groups whose CPU the bench reports for a run against ``web``."""
        if web.runs_own_workers:
            name = db or self.db
            return {
                "web": lambda: [p for p in procs.tree([web.proc.pid]) if p.pid == web.proc.pid],
                "workers": lambda: [p for p in procs.tree([web.proc.pid]) if p.pid != web.proc.pid],
                "postgres": lambda: procs.postgres_backends(name),
                "redis": procs.redis_servers,
            }
        if web.kind == "mcptasks":
            workers = [p.pid for p in [self.mcp_workers, *self.mcp_more_workers] if p is not None]
            name = db or self.db
            return {
                "web": lambda: procs.tree(web.pids()),
                "workers": lambda: procs.tree(workers),
                "postgres": lambda: procs.postgres_backends(name),
                "redis": procs.redis_servers,
            }
        pw = [p.pid for p in web.workers or self.peer_workers]
        server = web.redis_server
        return {
            "web": lambda: procs.tree(web.pids()),
            "workers": lambda: procs.tree(pw),
            "postgres": lambda: [],
            "redis": (lambda: procs.tree([server.pid])) if server is not None else procs.redis_servers,
        }

    def all_groups(self) -> dict[str, Callable[[], list]]:
        pids = [w.proc.pid for w in self.webs.values()]
        pids += [p.pid for p in [self.mcp_workers, *self.mcp_more_workers] if p is not None]
        pids += [p.pid for p in self.peer_workers]
        pids += [p.pid for w in self.webs.values() for p in (*w.workers, w.redis_server) if p is not None]
        db = self.db
        return {"stack": lambda: procs.tree(pids), "postgres": lambda: procs.postgres_backends(db)}

    def wait_machine_quiet(self) -> dict[str, float]:
        """Before a measured run: wait until the rest of the machine (other
        sessions' tests, say) leaves the cores mostly free, up to
        ``gate_max`` seconds a time and ``gate_budget`` seconds a bench run.
        Returns the wait and the foreign load last seen."""
        t0 = time.monotonic()
        foreign = 0.0
        groups = self.all_groups()
        while True:
            meter = procs.CpuMeter(groups)
            meter.begin()
            time.sleep(0.5)
            used = meter.end()
            foreign = max(0.0, used["machine"] - used["stack"] - used["postgres"])
            waited = time.monotonic() - t0
            if foreign <= self.gate_foreign or waited >= self.gate_max or self.gate_used + waited >= self.gate_budget:
                break
        self.gate_used += waited
        return {"gate_wait_s": round(waited, 1), "foreign_cores_before": round(foreign, 2)}

    def wait_quiet(self, timeout: float = 120.0) -> float:
        return procs.wait_quiet(self.all_groups(), below=0.12, timeout=timeout)

    def pg_sessions(self, db: str | None = None) -> int:
        """Sessions Postgres has opened on the database so far (PG 14+)."""
        with psycopg.connect(self.services.libpq(db or self.db), autocommit=True) as conn:
            row = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
            return int(row[0]) if row else 0

    def shutdown(self, keep_db: bool = False) -> None:
        procs.stop_all()
        self.webs.clear()
        try:
            # The queue and Docket patterns also cover the `mcptasks run` queue and the single peer's Docket.
            self.services.delete_keys(f"*{self.queue}*", f"{self.docket}*", "_kombu.binding.*" + self.queue + "*")
        except Exception as exc:  # Redis gone: nothing to clean
            print(f"bench: could not delete Redis keys: {exc}")
        if not keep_db:
            try:
                self.services.drop_db(self.db)
            except Exception as exc:
                print(f"bench: could not drop {self.db}: {exc}")

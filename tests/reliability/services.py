"""Private Postgres and Redis servers that the reliability tests may stop,
restart and kill without harming anyone else on the machine.

Each is a child of the test process on a free port with its data in a
temporary directory: a Postgres cluster made with ``initdb`` (as the
``postgres`` user when the tests run as root, because Postgres refuses to run
as root) and a ``redis-server`` without persistence.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.live import free_port


class ServiceUnavailable(RuntimeError):
    """The binaries to run a private server are not installed."""


# Postgres ----------------------------------------------------------------------------------


def postgres_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live: ``MCPTASKS_PG_BINDIR``, then
    Debian's versioned directory, then ``PATH``."""
    configured = os.environ.get("MCPTASKS_PG_BINDIR")
    candidates = [configured] if configured else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("initdb")
    if which:
        candidates.append(str(Path(which).resolve().parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    raise ServiceUnavailable("initdb/pg_ctl not found (set MCPTASKS_PG_BINDIR)")


class PrivatePostgres:
    """A throwaway cluster: ``start``, ``stop``, ``restart``, ``url``."""

    def __init__(self, root: Path | None = None) -> None:
        self.bindir = postgres_bindir()
        self.root = Path(root or tempfile.mkdtemp(prefix="mcptasks-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self.run_as: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise ServiceUnavailable("running as root and there is no postgres user") from exc
            self.run_as = "postgres"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _cmd(self, *argv: str) -> list[str]:
        return ["runuser", "-u", self.run_as, "--", *argv] if self.run_as else list(argv)

    def _run(self, *argv: str, timeout: float = 120) -> None:
        result = subprocess.run(self._cmd(*argv), capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def init(self) -> None:
        if self.run_as:
            user = pwd.getpwnam(self.run_as)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        # Durability is not under test here (the process restarts, the disk does not).
        options = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            "max_connections": "300",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "64MB",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# mcptasks reliability tests\n")
            for name, value in options.items():
                conf.write(f"{name} = {value}\n")

    def start(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash: no checkpoint)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def is_running(self) -> bool:
        result = subprocess.run(
            self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"), capture_output=True
        )
        return result.returncode == 0

    def restart(self, down_seconds: float = 0.0, mode: str = "fast") -> None:
        self.stop(mode)
        time.sleep(down_seconds)
        self.start()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.is_running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        self.init()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


# Redis --------------------------------------------------------------------------------------


class PrivateRedis:
    """A ``redis-server`` child without persistence: ``start``, ``stop``, ``url``."""

    def __init__(self) -> None:
        binary = os.environ.get("MCPTASKS_REDIS_SERVER") or shutil.which("redis-server")
        if not binary:
            raise ServiceUnavailable("redis-server not found (set MCPTASKS_REDIS_SERVER)")
        self.binary = binary
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        import redis

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            with contextlib.suppress(redis.RedisError):
                if redis.Redis.from_url(self.url, socket_timeout=1).ping():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout}s")

    def stop(self) -> None:
        """Stop at once, losing whatever it held (as a restart without
        persistence does)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# One pair per test process --------------------------------------------------------------------


@dataclass
class Services:
    postgres: PrivatePostgres
    redis: PrivateRedis


# One pair of private servers per test process, however many modules use it.
_services: Services | None = None
_users = 0
_lock = threading.Lock()


def acquire_services() -> Services:
    """The process's private Postgres and Redis, started by the first caller."""
    global _services, _users
    with _lock:
        if _services is None:
            postgres = PrivatePostgres()
            redis = PrivateRedis()
            try:
                postgres.init()
                postgres.start()
                redis.start()
            except BaseException:
                postgres.destroy()
                redis.stop()
                raise
            _services = Services(postgres, redis)
            atexit.register(_stop_at_exit, _services)
        _users += 1
        return _services


def _stop_at_exit(services: Services) -> None:
    """However the session ends, leave no server behind."""
    services.redis.stop()
    services.postgres.destroy()


def release_services() -> None:
    """One user fewer; the last one stops the servers."""
    global _services, _users
    with _lock:
        _users -= 1
        if _users == 0 and _services is not None:
            _services.redis.stop()
            _services.postgres.destroy()
            _services = None

"""The one launcher of the processes that the tests and the bench start.

Each process runs in a session (process group) of its own, logs to a file,
and is remembered until it is stopped, so that a run ends exactly the groups
it started (``stop_all``) and nothing else on the machine. ``wait_answering``
holds until a server answers MCP's ``server/discover``.

tests/support/live.py builds the test stacks on it, and bench/stacks.py the
bench's. Standard library only: the bench's virtualenv has none of the test
packages.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Container, Mapping
from pathlib import Path

from tests.support.waiting import wait_until

_started: list[subprocess.Popen[bytes]] = []
_started_lock = threading.Lock()

#: MCP's ``server/discover``, the request a server answers once it is up.
DISCOVER_BODY = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "server/discover",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    },
}
DISCOVER_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "server/discover",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(argv: list[str], *, env: Mapping[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Run ``argv`` in a session of its own, appending its output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=dict(env), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    with _started_lock:
        _started.append(proc)
    return proc


def kill_group(proc: subprocess.Popen[bytes], *, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):  # children may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with _started_lock:
        if proc in _started:
            _started.remove(proc)


def stop_all(*, grace: float = 5.0) -> None:
    """Stop every process started here and not stopped yet, the newest first."""
    with _started_lock:
        running = list(reversed(_started))
    for proc in running:
        kill_group(proc, grace=grace)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_ready(
    proc: subprocess.Popen[bytes],
    log: Path,
    status: Callable[[], int],
    ok: Container[int] | None,
    *,
    what: str,
    timeout: float = 60.0,
    interval: float = 0.1,
) -> None:
    """Until ``status()`` (an HTTP request's status) is in ``ok`` (any status
    when ``ok`` is None); an exception from it (no server yet) counts as not
    yet. Fails with the end of ``log`` if ``proc`` exits first."""
    last: list[object] = [None]

    def answered() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode} before answering:\n{tail(log)}")
        try:
            last[0] = status()
        except Exception as exc:  # connection refused, reset, timed out: not up yet
            last[0] = exc
            return False
        return ok is None or last[0] in ok

    wait_until(answered, timeout, interval, what=f"{what} answering", explain=lambda: f"last: {last[0]}\n{tail(log)}")


def discover_status(url: str, *, timeout: float = 2.0) -> int:
    """The HTTP status of a ``server/discover`` POST to ``url``."""
    request = urllib.request.Request(url, json.dumps(DISCOVER_BODY).encode(), DISCOVER_HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


def wait_answering(
    url: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    *,
    ok: Container[int] | None = None,
    timeout: float = 60.0,
) -> None:
    """Until a ``server/discover`` on ``url`` answers with a status in ``ok``
    (any status when ``ok`` is None)."""
    wait_ready(proc, log, lambda: discover_status(url), ok, what=f"server at {url}", timeout=timeout, interval=0.2)


def uvicorn_argv(
    port: int,
    app: str,
    *,
    python: str | Path = sys.executable,
    workers: int = 1,
    graceful_shutdown: int | None = None,
    lifespan: bool = True,
    production_loop: bool = False,
) -> list[str]:
    """The command of a web process serving ``app`` on 127.0.0.1:``port``;
    ``production_loop``: uvloop and httptools with no access log, as the
    bench's contenders run."""
    argv = [str(python), "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
    if workers > 1:
        argv += ["--workers", str(workers)]
    if graceful_shutdown is not None:
        argv += ["--timeout-graceful-shutdown", str(graceful_shutdown)]
    if not lifespan:
        argv += ["--lifespan", "off"]
    if production_loop:
        argv += ["--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    return [*argv, "--log-level", "warning"]

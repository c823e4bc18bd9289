"""The official Python SDK at its 2025-11-25 release line (``mcp==1.30.0``),
in a virtualenv of its own: the test environment pins a later ``mcp``.

The virtualenv is created once and reused, under
``$MCPTASKS_LEGACY_SDK_VENV`` (default ``~/.cache/mcptasks/venvs/mcp-1.30.0``).
Scenarios run as a subprocess (tests/support/legacy_sdk_client.py) and
report what they observed as JSON.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MCP_VERSION = "1.30.0"
CLIENT = Path(__file__).resolve().parent / "legacy_sdk_client.py"


def venv_dir() -> Path:
    default = f"~/.cache/mcptasks/venvs/mcp-{MCP_VERSION}"
    return Path(os.environ.get("MCPTASKS_LEGACY_SDK_VENV", default)).expanduser()


def _installed(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('mcp'))"],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def sdk_python() -> Path:
    """The virtualenv's interpreter, with ``mcp==1.30.0`` installed."""
    root = venv_dir()
    python = root / "bin" / "python"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs on one machine build it once
        if _installed(python) != MCP_VERSION:
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True)
            install = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"mcp=={MCP_VERSION}"],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert install.returncode == 0, f"installing mcp=={MCP_VERSION} failed:\n{install.stderr[-3000:]}"
    assert _installed(python) == MCP_VERSION, f"{root} does not hold mcp {MCP_VERSION}"
    return python


def run_client(
    python: Path, url: str, *scenarios: str, token: str | None = None, task_id: str | None = None, timeout: float = 300
) -> dict[str, Any]:
    """Run SDK scenarios against ``url``; returns ``{scenario: observations}``."""
    argv = [str(python), str(CLIENT), url, *scenarios]
    if token:
        argv += ["--token", token]
    if task_id:
        argv += ["--task-id", task_id]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON"))}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"SDK client failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"SDK client printed nothing:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])

"""Create or reuse the bench's two virtualenvs, and find the load generator.

Standard library only: this runs under whatever ``python3`` starts the bench,
before any dependency is there.

* ``bench/.venvs/app``: mcptasks' pinned requirements plus the bench's own
  (requirements/bench.txt): gunicorn, uvloop, httptools, psutil, matplotlib,
  py-spy.
* ``bench/.venvs/peer``: fastmcp + fastmcp-tasks (bench/peer-requirements.txt),
  kept apart so neither side's pins touch the other.

A venv is rebuilt only when its requirements files change (a stamp holds
their digest).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENVS = REPO / "bench" / ".venvs"
APP_VENV = VENVS / "app"
PEER_VENV = VENVS / "peer"
APP_PY = APP_VENV / "bin" / "python"
PEER_PY = PEER_VENV / "bin" / "python"

APP_REQUIREMENTS = [REPO / "requirements" / "base.txt", REPO / "requirements" / "bench.txt"]
PEER_REQUIREMENTS = [REPO / "bench" / "peer-requirements.txt"]


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def ensure_venv(path: Path, requirements: list[Path], install_file: Path) -> None:
    stamp = path / ".bench-stamp"
    want = _digest(requirements)
    if stamp.exists() and stamp.read_text().strip() == want and (path / "bin" / "python").exists():
        return
    print(f"bench: preparing {path.relative_to(REPO)} (first run, or its requirements changed)", flush=True)
    if path.exists():
        shutil.rmtree(path)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    result = subprocess.run([*pip, "-r", str(install_file)], capture_output=True, text=True)
    if result.returncode != 0:
        noise = "is ignored: it is neither a file nor a directory"
        err = "\n".join(line for line in result.stderr.splitlines() if noise not in line)
        raise SystemExit(f"bench: pip install into {path} failed:\n{err}")
    stamp.write_text(want)


def ensure_wrk() -> str:
    """The path of ``wrk``, installing Debian's package when it is missing and we may."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("bench: installing wrk (apt-get install wrk)", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        ok = subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, capture_output=True).returncode == 0
        if not ok:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, capture_output=True)
        found = shutil.which("wrk")
    if not found:
        raise SystemExit("bench: needs wrk (Debian: apt-get install wrk)")
    return found


def ensure_all() -> None:
    VENVS.mkdir(parents=True, exist_ok=True)
    ensure_venv(APP_VENV, APP_REQUIREMENTS, REPO / "requirements" / "bench.txt")
    ensure_venv(PEER_VENV, PEER_REQUIREMENTS, REPO / "bench" / "peer-requirements.txt")
    ensure_wrk()

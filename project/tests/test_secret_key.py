"""The example site's ``SECRET_KEY``: never the public development key on a
site that ``bin/run`` started. ``python -m project.secret_key`` (the step of
``bin/run``) makes a random key in ``var/secret_key`` once and keeps it; the
settings read it unless ``SECRET_KEY`` is set in the environment or ``.env``.

Each case runs on a copy of the example site's package in a folder of its
own, so that the checkout's own ``var/`` and ``.env`` are never touched.
tests/test_live_fresh_run.py checks the same through ``bin/run`` itself.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from project.secret_key import DEVELOPMENT_KEY, make_key, read_key

REPO = Path(__file__).resolve().parents[2]


def test_make_key_makes_a_private_random_key_once(tmp_path: Path):
    path = tmp_path / "var" / "secret_key"
    key = make_key(path)
    assert len(key) >= 50 and not key.startswith("django-insecure-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert make_key(path) == key == read_key(path)
    assert make_key(tmp_path / "other" / "secret_key") != key
    assert [p.name for p in path.parent.iterdir()] == ["secret_key"], "no draft left behind"


def test_starts_at_once_agree_on_one_key(tmp_path: Path):
    path = tmp_path / "secret_key"
    keys: list[str] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        keys.append(make_key(path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(keys) == 8 and set(keys) == {read_key(path)}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder holding a copy of ``project/`` and nothing else of the checkout."""
    shutil.copytree(REPO / "project", tmp_path / "project", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def run_in(site: Path, code: list[str], env_extra: dict[str, str] | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    # The copy's ``project`` first (the current folder), the checkout's ``mcptasks`` after it.
    env.update({"PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": "project.settings", **(env_extra or {})})
    done = subprocess.run([sys.executable, *code], cwd=site, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


MAKE = ["-m", "project.secret_key"]
SETTINGS_KEY = ["-c", "from django.conf import settings; print(settings.SECRET_KEY)"]


def test_first_start_makes_the_key_the_site_then_keeps(site: Path):
    assert run_in(site, SETTINGS_KEY) == DEVELOPMENT_KEY  # by hand, before any bin/run
    run_in(site, MAKE)
    key = read_key(site / "var" / "secret_key")
    assert key and key != DEVELOPMENT_KEY
    assert run_in(site, SETTINGS_KEY) == key
    run_in(site, MAKE)  # the next start
    assert read_key(site / "var" / "secret_key") == key
    assert run_in(site, SETTINGS_KEY) == key


def test_a_key_from_the_environment_wins_and_none_is_made(site: Path):
    run_in(site, MAKE, {"SECRET_KEY": "from-the-environment"})
    assert not (site / "var" / "secret_key").exists()
    assert run_in(site, SETTINGS_KEY, {"SECRET_KEY": "from-the-environment"}) == "from-the-environment"


def test_a_key_from_dot_env_wins_and_none_is_made(site: Path):
    (site / ".env").write_text("SECRET_KEY=from-dot-env\n")
    run_in(site, MAKE)
    assert not (site / "var" / "secret_key").exists()
    assert run_in(site, SETTINGS_KEY) == "from-dot-env"

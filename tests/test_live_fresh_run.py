"""``bin/run`` from nothing: a copy of the checkout with no virtualenv, where
``bin/run`` alone builds the venv from the run's requirements, then serves a
task to ``completed``, once on Postgres + Redis and once on the embedded
default. The test suite's own venv has more packages than the run's, so only
a venv that ``bin/run`` built shows a package missing from the run's install
(as kombu's Redis transport needing ``packaging`` once did).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from project.secret_key import DEVELOPMENT_KEY
from tests.support import live, postgres_only
from tests.support.rpc import HttpRpc

pytestmark = [pytest.mark.live, postgres_only.BOTH_SETUPS_ALREADY]


def checkout_files(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree's files that git tracks or would (not the ignored ones):
    what a clean clone of the change would hold."""
    target = tmp_path_factory.mktemp("fresh") / "mcptasks"
    for name in checkout_files(live.REPO):
        source = live.REPO / name
        if not source.is_file():  # deleted in the working tree
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name)
    assert not (target / ".venv").exists()
    return target


def run_env(checkout: Path, services: dict[str, str]) -> dict[str, str]:
    """The environment of a newcomer's shell: no virtualenv active, nothing
    of the test run's own settings, the services named (or none)."""
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in live._SCRUB and not k.startswith(("MCP_", "DJANGO_", "VIRTUAL_ENV", "PYTHON"))
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(
        {
            # A venv of the interpreter the suite runs on, not of the suite's venv.
            "PYTHON": getattr(sys, "_base_executable", sys.executable),
            "MCPTASKS_RUN_VENV": str(checkout / ".venv"),
            "PORT": str(live.free_port()),
            "PYTHONUNBUFFERED": "1",
            **services,
        }
    )
    return env


@pytest.fixture
def postgres_and_redis() -> Iterator[dict[str, str]]:
    base = os.environ.get("DATABASE_URL", live.DEFAULT_DATABASE_URL)
    # A database that does not exist yet: bin/run makes it, as a newcomer's server would need.
    name = f"mcptasks_live_{os.getpid()}_{os.urandom(3).hex()}"
    redis_url = os.environ.get("MCPTASKS_TEST_REDIS_URL", live.DEFAULT_REDIS_URL)
    try:
        yield {
            "DATABASE_URL": live.with_database(base, name),
            "CELERY_BROKER_URL": redis_url,
            "REDIS_URL": redis_url,
            # The run's own queue: nothing shared with other runs on this Redis.
            "MCP_CELERY_QUEUE": f"mcptasks-fresh-{name}",
        }
    finally:
        live.drop_database(base, name)


def serve_one_task(checkout: Path, env: dict[str, str], log: Path) -> None:
    """Start ``bin/run``, drive one task to ``completed``, then stop it with
    SIGTERM: it must stop by itself, with no SIGKILL needed."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["bin/run"], cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{env['PORT']}/mcp"
    try:
        # The first start builds the venv: allow for the install.
        live.wait_http(url, proc, log, timeout=420)
        client = HttpRpc(url)
        try:
            task_id = client.create_task("slow_compute", {"seconds": 0, "label": "fresh"})
            final = client.wait_for(task_id, timeout=60)
        except Exception as exc:  # a worker that died takes the run down: show why
            raise AssertionError(f"{exc!r}\n{live.tail(log, 80)}") from exc
        finally:
            client.close()
        assert final["status"] == "completed", f"{final}\n{live.tail(log)}"
        assert_admin_styles_served(url.removesuffix("/mcp"), checkout)
        os.killpg(proc.pid, signal.SIGTERM)
        # uvicorn re-raises the signal it handled once it has shut down.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM), live.tail(log)
    finally:
        live.kill_group(proc)


def assert_admin_styles_served(base: str, checkout: Path) -> None:
    """bin/run collected the static files (compressed copies too) and the web
    process serves the stylesheet the admin's pages link (WhiteNoise): the
    browser test checks the styles applied, on the same command."""
    page = httpx.get(f"{base}/admin/login/", timeout=10)
    href = re.search(r'<link rel="stylesheet" href="([^"]*/admin/css/base\.css)">', page.text)
    assert page.status_code == 200 and href, page.text[:2000]
    css = httpx.get(f"{base}{href.group(1)}", headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css"), css.headers
    assert "--header-bg" in css.text
    collected = checkout / "var" / "static" / "admin" / "css"
    assert (collected / "base.css").exists() and (collected / "base.css.gz").exists()


def test_bin_run_builds_its_own_venv_and_serves_on_postgres_and_redis(
    checkout: Path, postgres_and_redis: dict[str, str], tmp_path: Path
) -> None:
    serve_one_task(checkout, run_env(checkout, postgres_and_redis), tmp_path / "run.log")
    venv_python = checkout / ".venv" / "bin" / "python"
    assert venv_python.exists(), "bin/run did not build its venv where MCPTASKS_RUN_VENV says"
    # The run's venv has the run's requirements and nothing of the test set.
    probe = subprocess.run(
        [str(venv_python), "-c", "import importlib.util as u; print(u.find_spec('pytest') is None)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "True"


def test_bin_run_with_no_environment_serves_on_the_embedded_default(checkout: Path, tmp_path: Path) -> None:
    env = run_env(checkout, {})
    serve_one_task(checkout, env, tmp_path / "run.log")
    assert (checkout / "var" / "db.sqlite3").exists()
    # No SECRET_KEY anywhere: bin/run made one of the checkout's own, private, and the site uses it.
    key_file = checkout / "var" / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(key) >= 50 and key != DEVELOPMENT_KEY
    print_key = "from django.conf import settings; print(settings.SECRET_KEY)"
    used = subprocess.run(
        [str(checkout / ".venv" / "bin" / "python"), "-c", print_key],
        cwd=checkout,
        env={**env, "DJANGO_SETTINGS_MODULE": "project.settings"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert used.stdout.strip() == key

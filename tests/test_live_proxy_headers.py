"""``mcptasks run`` believes ``X-Forwarded-For`` / ``X-Forwarded-Proto`` only
from the proxies it is told to trust (``--forwarded-allow-ips`` or the
``FORWARDED_ALLOW_IPS`` environment variable), not from loopback by default.

The headers reach what the site advertises: with them believed, a request
that claims ``https`` gets an ``https`` resource in the protected resource
metadata. The configuration itself: tests/test_proxy_headers.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import live

pytestmark = pytest.mark.live

FORWARDED = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('proxy') / 'run.sqlite3'}"
    env = live.base_env({"DATABASE_URL": url})
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=live.REPO, env=env, check=True, capture_output=True
    )
    yield url


def advertised_resource(database: str, tmp_path: Path, args: list[str], env_extra: dict[str, str]) -> str:
    """Start ``mcptasks run`` and return the resource its metadata names for a
    request that carries forwarded headers."""
    env = live.base_env({**live.LIVE_SETTINGS, "DATABASE_URL": database, "CELERY_BROKER_URL": "memory://"})
    env.pop("FORWARDED_ALLOW_IPS", None)
    env.update(env_extra)
    port = live.free_port()
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "mcptasks", "run", "--port", str(port), "--concurrency", "1", *args],
            cwd=live.REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        live.wait_http(f"http://127.0.0.1:{port}/mcp", proc, log)
        reply = httpx.get(
            f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", headers=FORWARDED, timeout=10
        )
        assert reply.status_code == 200, (reply.text, live.tail(log))
        return str(reply.json()["resource"])
    finally:
        live.kill_group(proc)


@pytest.mark.parametrize(
    ("args", "env_extra", "scheme"),
    [
        pytest.param([], {}, "http", id="untold"),
        pytest.param(["--forwarded-allow-ips", "127.0.0.1"], {}, "https", id="flag"),
        pytest.param([], {"FORWARDED_ALLOW_IPS": "127.0.0.1"}, "https", id="environment"),
        pytest.param([], {"FORWARDED_ALLOW_IPS": "192.0.2.1"}, "http", id="another-proxy"),
    ],
)
def test_run_believes_forwarded_headers_only_when_told(
    database: str, tmp_path: Path, args: list[str], env_extra: dict[str, str], scheme: str
):
    resource = advertised_resource(database, tmp_path, args, env_extra)
    assert resource.startswith(f"{scheme}://127.0.0.1:") and resource.endswith("/mcp"), resource

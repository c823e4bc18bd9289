"""A live stack (Postgres, uvicorn, a Celery worker on Redis) with the admin
served next to /mcp, and a headless Debian Chromium driven by Playwright.

The admin is served exactly as ``bin/run`` serves it: by ``manage.py
mcptasks run`` (which ``bin/run`` execs), static files included, with no
test-only wrapper around the site.

Chromium is the system package (``apt-get install chromium``), launched via
``executable_path``: no browser is ever downloaded. Without it the tests
skip, saying so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import live

CHROMIUM = Path(os.environ.get("MCPTASKS_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: The width the admin must fit (issue 29: the task list at 1,400 px).
VIEWPORT_WIDTH = 1400
ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin-browser-test"


def artifacts_dir() -> Path:
    """Where screenshots go: ``$MCPTASKS_ARTIFACTS`` or ``artifacts/`` (gitignored)."""
    path = Path(os.environ.get("MCPTASKS_ARTIFACTS", live.REPO / "artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class AdminSite:
    stack: live.LiveStack
    base_url: str

    @property
    def mcp_url(self) -> str:
        return self.stack.url


@pytest.fixture(scope="module")
def admin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdminSite]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium) to run the browser test"
        )
    pytest.importorskip("playwright.sync_api", reason="pip install playwright (no `playwright install` needed)")
    log_dir = tmp_path_factory.mktemp("admin-stack")
    stack = live.start_stack(log_dir, settings={"MCP_LEASE_SECONDS": "5", "MCP_HEARTBEAT_SECONDS": "1"})
    try:
        port = live.free_port()
        # What bin/run execs: web, worker and beat from one command.
        run = [sys.executable, "manage.py", "mcptasks", "run", "--port", str(port), "--concurrency", "1"]
        web = stack.start("admin-web", run)
        base_url = f"http://127.0.0.1:{port}"
        login = f"{base_url}/admin/login/"
        log = log_dir / "admin-web.log"
        live.wait_ready(web, log, lambda: httpx.get(login, timeout=2).status_code, (200,), what="the admin")
        stack.shell(
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            f"get_user_model().objects.create_superuser({ADMIN_USER!r}, 'admin@example.com', {ADMIN_PASSWORD!r})\n"
            "print(json.dumps(True))\n"
        )
        yield AdminSite(stack=stack, base_url=base_url)
    finally:
        live.teardown_stack(stack)


@pytest.fixture(scope="module")
def browser(admin_site: AdminSite) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": VIEWPORT_WIDTH, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    try:
        yield page
    finally:
        context.close()


def admin_styles(page: Any) -> dict[str, Any]:
    """What the page's stylesheets did: the computed styles of the admin's
    header (Django's base.css) and of a status badge (mcptasks/admin.css)."""
    return dict(
        page.evaluate(
            """() => {
                const header = getComputedStyle(document.querySelector('#header'));
                const badge = document.querySelector('.mcptasks-badge');
                const sheets = [...document.styleSheets].map(s => s.href || '');
                return {
                    header_display: header.display,
                    header_background: header.backgroundColor,
                    badge_radius: badge ? getComputedStyle(badge).borderRadius : null,
                    base_css: sheets.some(h => h.endsWith('/static/admin/css/base.css')),
                };
            }"""
        )
    )

"""The example site's own tests: its settings, its tools and its front page.

The suite's other tests run on the test site (tests/testapp/); these load the
example site in a process of its own, as ``manage.py`` would, on a SQLite file
of the test's own and with no other service named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

#: Services and settings of the calling environment that the site must not see.
SCRUB = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "PORT", "HOST")

FRONT_PAGE = """
import django, json
django.setup()
from django.test import Client
response = Client().get("/", HTTP_HOST="testserver")
print(json.dumps({"status": response.status_code, "type": response["Content-Type"], "html": response.content.decode()}))
"""

TOOLS = """
import django, json
django.setup()
from mcptasks.conf import settings
from mcptasks.tools.registry import registry
print(json.dumps({
    "server": settings.SERVER_NAME,
    "tools": {tool.name: tool.task for tool in registry.all()},
    "prompts": sorted(registry.prompts),
}))
"""


def site_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUB and not k.startswith("MCP_")}
    return {**env, "DJANGO_SETTINGS_MODULE": "project.settings", **extra}


def on_the_site(code: str, env: dict[str, str]) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def front_page(tmp_path: Path, **extra: str) -> str:
    env = site_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", **extra)
    page = on_the_site(FRONT_PAGE, env)
    assert page["status"] == 200
    assert page["type"].startswith("text/html")
    html: str = page["html"]
    return html


def test_the_front_page_gives_the_exact_mcp_url_and_a_client_config(tmp_path: Path) -> None:
    html = front_page(tmp_path)
    assert '<code id="mcp-url">http://testserver/mcp</code>' in html
    config_text = html.split('<pre id="client-config">', 1)[1].split("</pre>", 1)[0]
    config = json.loads(config_text.replace("&quot;", '"'))
    assert config == {"mcpServers": {"mcptasks-example": {"type": "http", "url": "http://testserver/mcp"}}}


def test_the_front_page_lists_the_tools_and_links_the_admin(tmp_path: Path) -> None:
    html = front_page(tmp_path)
    assert "<code>slow_compute</code>" in html
    assert 'href="/admin/"' in html


def test_the_front_page_says_when_sign_in_is_required(tmp_path: Path) -> None:
    assert "no sign-in is needed" in front_page(tmp_path)
    html = front_page(tmp_path, MCP_ALLOW_ANONYMOUS="false")
    assert "This site requires sign-in" in html
    assert "no sign-in is needed" not in html


def test_the_demo_tools_include_the_conformance_fixtures(tmp_path: Path) -> None:
    served = on_the_site(TOOLS, site_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}"))
    assert served["server"] == "mcptasks-example"
    # What the README's walk-through and the conformance suite call.
    assert served["tools"]["slow_compute"] == "optional"
    assert {"greet", "test_simple_text", "test_tool_with_task", "confirm_delete"} <= set(served["tools"])
    assert "test_simple_prompt" in served["prompts"]


def test_with_no_environment_the_site_runs_on_the_embedded_default_without_warnings() -> None:
    code = (
        "import django, json\ndjango.setup()\nfrom django.conf import settings\n"
        "from django.core.management import call_command\n"
        "call_command('check', fail_level='WARNING')\n"
        "print(json.dumps({'engine': settings.DATABASES['default']['ENGINE'], "
        "'broker': settings.CELERY_BROKER_URL, 'layer': settings.CHANNEL_LAYERS['default']['BACKEND']}))"
    )
    found = on_the_site(code, site_env())
    assert found == {
        "engine": "django.db.backends.sqlite3",
        "broker": "memory://",
        "layer": "channels.layers.InMemoryChannelLayer",
    }

"""The example site's landing page: what it serves and how to connect."""

from __future__ import annotations

import json
from typing import Any

from django.test import override_settings


def page(client: Any) -> str:
    response = client.get("/", HTTP_HOST="testserver")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    return response.content.decode()


def test_landing_page_gives_the_exact_mcp_url_and_a_client_config(client: Any) -> None:
    html = page(client)
    assert '<code id="mcp-url">http://testserver/mcp</code>' in html
    config_text = html.split('<pre id="client-config">', 1)[1].split("</pre>", 1)[0]
    config = json.loads(config_text.replace("&quot;", '"'))
    assert config == {"mcpServers": {"mcptasks-example": {"type": "http", "url": "http://testserver/mcp"}}}


def test_landing_page_lists_the_tools_and_links_the_admin(client: Any) -> None:
    html = page(client)
    assert "<code>slow_compute</code>" in html
    assert 'href="/admin/"' in html


def test_landing_page_says_when_sign_in_is_required(client: Any) -> None:
    assert "no sign-in is needed" in page(client)
    with override_settings(MCPTASKS={"ALLOW_ANONYMOUS": False}):
        html = page(client)
    assert "This site requires sign-in" in html
    assert "no sign-in is needed" not in html

"""``manage.py mcptasks run`` serves the site's static files (the admin's CSS
and JS) with WhiteNoise when the site does not serve them itself
(mcptasks/worker/static_files.py). The browser test
(tests/browser/test_live_admin_browser.py) checks the styled admin as
``bin/run`` serves it; here the ASGI layer itself."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from mcptasks.worker.static_files import WHITENOISE_MIDDLEWARE, StaticFiles, with_static_files


async def _site(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"site"})


def _get(app: Any, path: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": headers or []}
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return {
        "status": start["status"],
        "headers": {k.decode(): v.decode() for k, v in start["headers"]},
        "body": b"".join(m.get("body", b"") for m in sent[1:]),
    }


def test_a_site_without_static_configuration_gets_the_admin_css_from_the_finders() -> None:
    app, line = with_static_files(_site)
    assert isinstance(app, StaticFiles)
    assert line == "static files: /static/ from the staticfiles finders (WhiteNoise)"
    css = _get(app, "/static/admin/css/base.css")
    assert css["status"] == 200
    assert css["headers"]["content-type"].startswith("text/css")
    assert b"--header-bg" in css["body"]
    assert int(css["headers"]["content-length"]) == len(css["body"])
    # A conditional request is answered 304 from WhiteNoise's ETag.
    again = _get(app, "/static/admin/css/base.css", headers=[(b"if-none-match", css["headers"]["etag"].encode())])
    assert again["status"] == 304 and again["body"] == b""
    # HEAD: the headers and no body.
    head = _get(app, "/static/admin/css/base.css", method="HEAD")
    assert head["status"] == 200 and head["body"] == b""
    # Anything else goes to the site: an unknown static path and every other path.
    assert _get(app, "/static/admin/css/nothing-here.css")["body"] == b"site"
    assert _get(app, "/admin/login/")["body"] == b"site"
    assert _get(app, "/mcp")["body"] == b"site"


def test_files_collected_into_static_root_are_served_too(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "only-collected.css").write_text("body { color: rebeccapurple; }\n")
    with override_settings(STATIC_ROOT=str(tmp_path)):
        app, line = with_static_files(_site)
    assert line == "static files: /static/ from STATIC_ROOT and the staticfiles finders (WhiteNoise)"
    got = _get(app, "/static/site/only-collected.css")
    assert got["status"] == 200 and b"rebeccapurple" in got["body"]


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"MIDDLEWARE": [WHITENOISE_MIDDLEWARE]}, "static files: served by the site (WhiteNoise middleware)"),
        (
            {"STATIC_URL": "https://cdn.example.com/static/"},
            "static files: not served here (STATIC_URL is unset or on another host)",
        ),
    ],
)
def test_a_site_that_serves_its_own_static_files_is_left_alone(overrides: dict[str, Any], said: str) -> None:
    with override_settings(**overrides):
        app, line = with_static_files(_site)
    assert app is _site
    assert line == said

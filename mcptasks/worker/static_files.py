"""Static files for ``manage.py mcptasks run``: the admin's stylesheets and
scripts, served by WhiteNoise in front of the site's ASGI application.

uvicorn serves no static files. A site that serves its own (WhiteNoise's
middleware in ``MIDDLEWARE``, or a ``STATIC_URL`` on another host) is left
alone. For any other site the runner serves them itself: what
``collectstatic`` put in ``STATIC_ROOT`` when it exists, and everything the
staticfiles finders find (what ``collectstatic`` would collect), indexed once
at start, so a site that never configured static files still gets a styled
admin. The files are read on a thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

WHITENOISE_MIDDLEWARE = "whitenoise.middleware.WhiteNoiseMiddleware"
_CHUNK = 64 * 1024


def with_static_files(application: ASGIApp) -> tuple[ASGIApp, str]:
    """``application``, with the site's static files in front of it where
    the site does not serve them itself; and a line saying which."""
    if WHITENOISE_MIDDLEWARE in getattr(django_settings, "MIDDLEWARE", ()):
        return application, "static files: served by the site (WhiteNoise middleware)"
    static_url = str(getattr(django_settings, "STATIC_URL", "") or "")
    if not static_url or urlsplit(static_url).netloc:
        return application, "static files: not served here (STATIC_URL is unset or on another host)"
    try:
        from whitenoise.middleware import WhiteNoiseMiddleware
    except ImportError:
        return application, "static files: not served (pip install whitenoise, or mcptasks[server])"
    files = WhiteNoiseMiddleware(get_response=None)  # reads STATIC_URL, STATIC_ROOT and WHITENOISE_* settings
    files.use_finders = True
    if not files.autorefresh:  # with autorefresh (DEBUG) files are looked up per request instead
        files.add_files_from_finders()
    collected = bool(files.static_root) and os.path.isdir(files.static_root)
    source = "STATIC_ROOT and the staticfiles finders" if collected else "the staticfiles finders"
    return StaticFiles(application, files), f"static files: {files.static_prefix} from {source} (WhiteNoise)"


class StaticFiles:
    """An ASGI application: a request under the static prefix that names a
    known file gets it from WhiteNoise (its caching headers, compressed
    variants and ranges); every other request goes to ``application``."""

    def __init__(self, application: ASGIApp, files: Any) -> None:
        self.application = application
        self.files = files
        self.prefix: str = files.static_prefix

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith(self.prefix):
            static_file = await asyncio.to_thread(self._find, path) if self.files.autorefresh else self._find(path)
            if static_file is not None:
                await self._serve(static_file, scope, send)
                return
        await self.application(scope, receive, send)

    def _find(self, path: str) -> Any:
        if self.files.autorefresh:
            return self.files.find_file(path)
        return self.files.files.get(path)

    async def _serve(self, static_file: Any, scope: Scope, send: Any) -> None:
        method = scope.get("method", "GET")
        response = await asyncio.to_thread(static_file.get_response, method, _request_headers(scope))
        headers = [(name.lower().encode("latin-1"), str(value).encode("latin-1")) for name, value in response.headers]
        await send({"type": "http.response.start", "status": int(response.status), "headers": headers})
        body = response.file
        if body is None:
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            while True:
                chunk = await asyncio.to_thread(body.read, _CHUNK)
                if not chunk:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await asyncio.to_thread(body.close)


def _request_headers(scope: Scope) -> Mapping[str, str]:
    """The request's headers as WhiteNoise reads them (WSGI ``HTTP_*`` keys)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = "HTTP_" + raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers

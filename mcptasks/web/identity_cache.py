"""A short-lived, in-process memory of who a request's credentials named.

DRF's authentication classes are synchronous (a database query per bearer
token), so a poll served on the event loop cannot run them. What it can do is
reuse the outcome of a whole :func:`~mcptasks.web.authorization.authenticate`
(identification, audience and scope checks included) that a thread computed a
moment ago for the same credentials: for ``MCPTASKS["IDENTITY_CACHE_SECONDS"]``
at most, and never past the token's own expiry. A revoked token is therefore
refused at most that many seconds late, and so is a deactivated user's (a
user saved inactive, or deleted, is forgotten at once in the process that
saved it). Only successes are remembered: a refusal is always recomputed.

The key is a hash of everything ``authenticate`` reads from the request
(credentials, and the host and scheme the resource URL is built from), and a
request is only eligible when its authentication classes are known to read
nothing else (no cookies: sessions carry CSRF rules of their own).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils.module_loading import import_string
from rest_framework.authentication import BasicAuthentication, TokenAuthentication

from ..conf import settings
from ..protocol.caller import Caller
from ..tools.owners import owner_for

#: Most callers remembered at once (the oldest go first).
MAX_ENTRIES = 4096

#: Authentication classes that read only the ``Authorization`` header (and,
#: for the OAuth toolkit's, the query string): named, so that this module
#: never imports django-oauth-toolkit.
_HEADER_ONLY_CLASS_NAMES = {
    "oauth2_provider.contrib.rest_framework.authentication.OAuth2Authentication",
    "oauth2_provider.contrib.rest_framework.OAuth2Authentication",
}
_HEADER_ONLY_BASES = (TokenAuthentication, BasicAuthentication)

#: Request headers that can change what ``authenticate`` decides (lower case).
_KEY_HEADERS = ("authorization", "host", "x-forwarded-host", "x-forwarded-port", "x-forwarded-proto")

_entries: OrderedDict[str, tuple[float, Caller]] = OrderedDict()
_lock = threading.Lock()


@lru_cache(maxsize=8)
def _classes_read_only_headers(paths: tuple[str, ...]) -> bool:
    for path in paths:
        cls = import_string(path)
        names = {f"{base.__module__}.{base.__qualname__}" for base in cls.__mro__}
        if not (issubclass(cls, _HEADER_ONLY_BASES) or names & _HEADER_ONLY_CLASS_NAMES):
            return False
    return True


def request_key(headers: Mapping[str, str], scope: Mapping[str, Any]) -> str | None:
    """The cache key for a request (lower-case ``headers``, its ASGI
    ``scope``), or ``None`` when its caller must not come from the cache."""
    if not settings.IDENTITY_CACHE_SECONDS or "cookie" in headers:
        return None
    if not _classes_read_only_headers(tuple(settings.AUTHENTICATION_CLASSES)):
        return None
    proxy_header = getattr(django_settings, "SECURE_PROXY_SSL_HEADER", None)
    parts = [headers.get(name, "") for name in _KEY_HEADERS]
    if proxy_header:
        parts.append(headers.get(proxy_header[0].removeprefix("HTTP_").replace("_", "-").lower(), ""))
    server = scope.get("server") or ("", "")
    query = scope.get("query_string", b"")
    parts += [scope.get("scheme", ""), scope.get("root_path", ""), str(server[0]), str(server[1])]
    parts.append(query.decode("latin-1") if isinstance(query, bytes) else str(query))
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def lookup(key: str) -> Caller | None:
    """The caller remembered for ``key``, while it is fresh."""
    with _lock:
        found = _entries.get(key)
        if found is None:
            return None
        if found[0] <= time.monotonic():
            del _entries[key]
            return None
        return found[1]


def _token_lifetime(auth: Any) -> float | None:
    """Seconds the credential is still valid for, when it says."""
    if isinstance(auth, Mapping):
        exp = auth.get("exp")
        return float(exp) - time.time() if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None
    expires = getattr(auth, "expires", None)
    if isinstance(expires, datetime):
        return expires.timestamp() - time.time()
    return None


def remember(key: str, caller: Caller) -> None:
    """Keep ``caller`` (the result of a whole ``authenticate``) for ``key``."""
    seconds = settings.IDENTITY_CACHE_SECONDS
    if not seconds:
        return
    lifetime = _token_lifetime(caller.auth)
    if lifetime is not None:
        seconds = min(seconds, lifetime)
    if seconds <= 0:
        return
    with _lock:
        _entries[key] = (time.monotonic() + seconds, caller)
        _entries.move_to_end(key)
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)


def clear() -> None:
    with _lock:
        _entries.clear()


@receiver(setting_changed)
def _forget(**kwargs: Any) -> None:
    # Any setting may change an outcome (scopes, resource URL, classes, hosts).
    clear()


def forget_owner(owner: str) -> None:
    """Drop every caller remembered for ``owner``."""
    with _lock:
        for key in [key for key, (_, caller) in _entries.items() if caller.owner == owner]:
            del _entries[key]


@receiver(post_save, sender=django_settings.AUTH_USER_MODEL)
def _forget_inactive_user(sender: Any, instance: Any, **kwargs: Any) -> None:
    if not getattr(instance, "is_active", True):
        forget_owner(owner_for(instance))


@receiver(post_delete, sender=django_settings.AUTH_USER_MODEL)
def _forget_deleted_user(sender: Any, instance: Any, **kwargs: Any) -> None:
    forget_owner(owner_for(instance))

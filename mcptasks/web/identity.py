"""Who is calling: DRF authentication classes, chosen in ``MCPTASKS``.

A task belongs to the identity that created it; every task method checks it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.http import HttpRequest, QueryDict
from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.parsers import BaseParser
from rest_framework.request import Request

from ..conf import settings
from ..protocol.caller import Caller
from ..tools.owners import owner_for


class BearerTokenAuthentication(TokenAuthentication):
    """DRF tokens sent the way MCP clients send them: ``Authorization: Bearer <key>``."""

    keyword = "Bearer"


class NotAuthenticated(Exception):
    def __init__(self, message: str, www_authenticate: str | None = None, status: int = 401) -> None:
        super().__init__(message)
        self.message = message
        self.www_authenticate = www_authenticate
        self.status = status  # 403 for a token that lacks a needed scope


class _BodyIgnored(BaseParser):
    """The body is JSON-RPC, never credentials: an authentication class that
    reads ``request.POST`` (django-oauth-toolkit's does) sees an empty form
    instead of an unsupported media type."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> QueryDict:
        return QueryDict()


@lru_cache(maxsize=8)
def _authenticator_classes(paths: tuple[str, ...]) -> tuple[type, ...]:
    return tuple(import_string(path) for path in paths)


def identify(request: HttpRequest) -> Caller:
    """The caller of ``request``, or ``NotAuthenticated``.

    Credentials that are present but wrong are always refused, even when
    anonymous access is allowed.
    """
    authenticators = [cls() for cls in _authenticator_classes(settings.AUTHENTICATION_CLASSES)]
    drf_request = Request(request, parsers=[_BodyIgnored()], authenticators=authenticators)
    try:
        user = drf_request.user
    except exceptions.APIException as exc:
        header = authenticators[0].authenticate_header(drf_request) if authenticators else None
        raise NotAuthenticated(str(exc.detail), header) from None
    if user is not None and getattr(user, "is_authenticated", False):
        if not getattr(user, "is_active", True):
            # Not every authentication class checks (django-oauth-toolkit's
            # does not): a deactivated account's credentials are refused here.
            header = authenticators[0].authenticate_header(drf_request) if authenticators else None
            raise NotAuthenticated("User inactive or deleted.", header)
        return Caller(owner=owner_for(user), user=user, auth=drf_request.auth, authenticated=True)
    if settings.ALLOW_ANONYMOUS:
        return Caller(owner=settings.ANONYMOUS_OWNER)
    header = next((h for h in (a.authenticate_header(drf_request) for a in authenticators) if h), None)
    raise NotAuthenticated("Authentication credentials were not provided.", header)

"""The example site's authorization server endpoints that differ from
django-oauth-toolkit's own.

* ``ThrottledTokenView``: the token endpoint, with failed attempts counted by
  django-axes like failed logins, and refused with 429 once past the limit:
  per client address, and for a confidential client per client id as the
  account (its secret is what is guessed, from anywhere). A public client's
  id is no secret (it travels in authorize URLs; a CIMD id is a URL), so its
  failures count per address and per address and client only
  (:func:`lockout_parameters`): a stranger cannot lock it for its users.
  Guessing a client secret, an authorization code or a refresh token is then
  as slow as guessing a password.
* ``ResourceServerIntrospectionView``: RFC 7662 introspection for the
  resource servers the site names (``OAUTH_INTROSPECTION_CLIENTS``, their
  client ids, each a confidential client that authenticates with its secret),
  and nobody else: not a registered MCP client, not a bearer token. The site
  mounts it only when it names some (project/urls.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any
from urllib.parse import unquote_plus

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest, HttpResponse, JsonResponse
from oauth2_provider.models import get_application_model
from oauth2_provider.oauth2_backends import get_oauthlib_core
from oauth2_provider.views import IntrospectTokenView, TokenView
from oauthlib.common import Request as OAuthlibRequest

#: Token endpoint errors that mean a wrong secret, code or refresh token.
COUNTED_ERRORS = {"invalid_client", "invalid_grant"}
#: The account the token endpoint's failures count against, apart from users'.
CLIENT_ACCOUNT_PREFIX = "oauth-client:"
#: The account of a client with no secret (public, unknown or CIMD): counted per address.
PUBLIC_CLIENT_ACCOUNT_PREFIX = "oauth-public-client:"


def basic_client_id(request: HttpRequest) -> str | None:
    """The client id of an HTTP Basic ``Authorization`` header (RFC 6749 2.3.1)."""
    kind, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if kind.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    client_id, separator, _secret = decoded.partition(":")
    return unquote_plus(client_id) if separator else None


def token_request_credentials(request: HttpRequest) -> dict[str, str | None]:
    """What django-axes counts a token request's failures against: the
    address (always) and the client's id as the account, marked public
    unless a confidential client has that id."""
    client_id = basic_client_id(request) or request.POST.get("client_id") or None
    if not client_id:
        return {"username": None}
    prefix = CLIENT_ACCOUNT_PREFIX if confidential(client_id) else PUBLIC_CLIENT_ACCOUNT_PREFIX
    return {"username": f"{prefix}{client_id}"}


def confidential(client_id: str) -> bool:
    application = get_application_model()
    kinds = application.objects.filter(client_id=client_id).values_list("client_type", flat=True)[:1]
    return list(kinds) == [application.CLIENT_CONFIDENTIAL]


def lockout_parameters(request_or_attempt: Any, credentials: dict[str, Any] | None = None) -> list[str | list[str]]:
    """django-axes' ``AXES_LOCKOUT_PARAMETERS``: per address and per account,
    except a public client's account, which counts per address and client."""
    username = (credentials or {}).get("username") or getattr(request_or_attempt, "username", None)
    if isinstance(username, str) and username.startswith(PUBLIC_CLIENT_ACCOUNT_PREFIX):
        return ["ip_address", ["ip_address", "username"]]
    return ["ip_address", "username"]


def oauth_error(response: HttpResponse) -> str | None:
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    return body.get("error") if isinstance(body, dict) else None


def too_many_attempts(request: HttpRequest) -> JsonResponse:
    cool_off = get_cool_off(request)
    seconds = math.ceil(cool_off.total_seconds()) if cool_off else None
    wait = f"try again in {seconds} seconds" if seconds else "ask the site's operator to unlock it"
    response = JsonResponse(
        {
            "error": "temporarily_unavailable",
            "error_description": f"Too many failed attempts from this address or for this client: {wait}.",
        },
        status=429,
    )
    if seconds:
        response["Retry-After"] = str(seconds)
    return response


class ThrottledTokenView(TokenView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        credentials = token_request_credentials(request)
        if not AxesProxyHandler.is_allowed(request, credentials):
            return too_many_attempts(request)
        response: HttpResponse = super().post(request, *args, **kwargs)
        if response.status_code in (400, 401) and oauth_error(response) in COUNTED_ERRORS:
            user_login_failed.send(sender=type(self), credentials=credentials, request=request)
            if getattr(request, "axes_locked_out", False):
                # This failure reached the limit: answer in OAuth's JSON,
                # not with the middleware's page for people.
                request.axes_locked_out = False  # type: ignore[attr-defined]
                return too_many_attempts(request)
        return response


class ResourceServerIntrospectionView(IntrospectTokenView):
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "OPTIONS" and self.introspecting_client_id(request) not in introspection_clients():
            return JsonResponse(
                {
                    "error": "invalid_client",
                    "error_description": "Only the resource servers this site names may introspect tokens.",
                },
                status=401,
                headers={"WWW-Authenticate": 'Basic realm="introspection"'},
            )
        response: HttpResponse = super().dispatch(request, *args, **kwargs)
        return response

    def introspecting_client_id(self, request: HttpRequest) -> str | None:
        """The id of the client that authenticated with its secret, if any."""
        core = get_oauthlib_core()
        uri, http_method, body, headers = core._extract_params(request)
        oauth_request = OAuthlibRequest(uri, http_method, body, headers)
        if not core.server.request_validator.authenticate_client(oauth_request):
            return None
        client_id = getattr(oauth_request.client, "client_id", None)
        return client_id if isinstance(client_id, str) else None


def introspection_clients() -> frozenset[str]:
    return frozenset(getattr(settings, "OAUTH_INTROSPECTION_CLIENTS", ()))

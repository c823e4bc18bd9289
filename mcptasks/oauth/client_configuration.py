"""RFC 7592 client configuration (``GET``/``PUT``/``DELETE /o/register/<client_id>/``),
held to the rules of registration.

Every registrant, anonymous ones included, receives a registration access
token for its client. django-oauth-toolkit's update checks that token but not
the registration permission, so a client registered for the authorization code
grant could switch itself to ``client_credentials`` (tokens with no user's
approval), to the device flow, or to any redirect URI. Here an update must
pass the same :func:`mcptasks.oauth.registration.metadata_allowed` as a
registration; mount this view in place of the toolkit's::

    path("register/<str:client_id>/", ClientConfigurationView.as_view(), name="dcr-register-management")
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from oauth2_provider.views import DynamicClientRegistrationManagementView

from .registration import metadata_allowed


def invalid_metadata(description: str) -> JsonResponse:
    return JsonResponse({"error": "invalid_client_metadata", "error_description": description}, status=400)


class ClientConfigurationView(DynamicClientRegistrationManagementView):
    def put(self, request: HttpRequest, client_id: str, *args: Any, **kwargs: Any) -> HttpResponse:
        authenticated = self._authenticate_registration_request(request, client_id)
        if isinstance(authenticated, HttpResponse):
            return authenticated  # the toolkit's 401, before anything about the body
        try:
            data = json.loads(request.body)
        except (ValueError, RecursionError):  # RecursionError: nesting too deep to parse
            return invalid_metadata("The request body must be a JSON object.")
        if not isinstance(data, dict):
            return invalid_metadata("The request body must be a JSON object.")
        if not metadata_allowed(data):
            return invalid_metadata(
                "An MCP client may use only the authorization code grant (with refresh tokens) "
                "and https or loopback redirect URIs."
            )
        response: HttpResponse = super().put(request, client_id, *args, **kwargs)
        return response

"""RFC 9728 protected resource metadata for the MCP endpoint, and the
registration endpoint that MCP clients use.

django-oauth-toolkit's view writes the document; mcptasks supplies what
describes the endpoint: its canonical URL, the issuers and the scopes, all
from ``MCPTASKS``, so that the metadata, the 401 challenge and the audience
check can never disagree.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from oauth2_provider.views import DynamicClientRegistrationView, OAuthProtectedResourceMetadataView

from ..conf import settings
from ..protocol.authorization import endpoint_path, scopes_supported
from ..web import authorization


class ProtectedResourceMetadataView(OAuthProtectedResourceMetadataView):
    """Serves ``/.well-known/oauth-protected-resource/<endpoint path>`` (the
    path form clients derive from the MCP URL) and the root form."""

    def get(self, request: HttpRequest, *args: Any, resource_path: str | None = None, **kwargs: Any) -> HttpResponse:
        if not authorization.enabled():
            raise Http404("MCPTASKS['AUTHORIZATION_SERVERS'] is not set")
        if resource_path is not None and "/" + resource_path.strip("/") != endpoint_path().rstrip("/"):
            raise Http404("No protected resource at this path")
        return super().get(request, *args, **kwargs)

    def get_resource(self, request: HttpRequest) -> str:
        return authorization.resource_url(request, endpoint_path())

    def get_authorization_servers(self, request: HttpRequest) -> list[str]:
        return authorization.authorization_servers(request, self.get_resource(request))

    def get_scopes_supported(self) -> list[str]:
        return scopes_supported()

    def get_resource_name(self) -> str:
        return settings.RESOURCE_NAME or settings.SERVER_NAME


class ClientRegistrationView(DynamicClientRegistrationView):
    """django-oauth-toolkit's RFC 7591 registration endpoint, which answers a
    body nested too deeply for Python's JSON parser with 400
    ``invalid_client_metadata`` (the toolkit's own parse lets the
    ``RecursionError`` through, a 500). Mount it in place of the toolkit's::

        path("o/register/", ClientRegistrationView.as_view(), name="dcr-register")
    """

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            json.loads(request.body or b"null")
        except RecursionError:
            return JsonResponse(
                {"error": "invalid_client_metadata", "error_description": "Request body is nested too deeply"},
                status=400,
            )
        except ValueError:
            pass  # not JSON: the toolkit answers invalid_client_metadata
        response: HttpResponse = super().post(request, *args, **kwargs)
        return response

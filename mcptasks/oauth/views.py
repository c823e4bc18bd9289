"""RFC 9728 protected resource metadata for the MCP endpoint.

django-oauth-toolkit's view writes the document; mcptasks supplies what
describes the endpoint: its canonical URL, the issuers and the scopes, all
from ``MCPTASKS``, so that the metadata, the 401 challenge and the audience
check can never disagree.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from oauth2_provider.views import OAuthProtectedResourceMetadataView

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
        response: HttpResponse = super().get(request, *args, **kwargs)
        return response

    def get_resource(self, request: HttpRequest) -> str:
        return authorization.resource_url(request, endpoint_path())

    def get_authorization_servers(self, request: HttpRequest) -> list[str]:
        return authorization.authorization_servers(request, self.get_resource(request))

    def get_scopes_supported(self) -> list[str]:
        return scopes_supported()

    def get_resource_name(self) -> str:
        return settings.RESOURCE_NAME or settings.SERVER_NAME

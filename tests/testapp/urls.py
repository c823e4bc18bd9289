"""The test site's routes: the admin, Django's sign-in pages, the
authorization server (django-oauth-toolkit, metadata at the root) and the
MCP endpoint at ``/mcp``."""

from django.contrib import admin
from django.urls import include, path
from oauth2_provider import urls as oauth2_urls

from tests.testapp.consent import ConsentView

oauth2_endpoints = [
    path("authorize/", ConsentView.as_view(), name="authorize"),
    *(route for route in oauth2_urls.base_urlpatterns if route.name != "authorize"),
    *oauth2_urls.dcr_urlpatterns,
]
oauth2_routes = ([*oauth2_urls.metadata_urlpatterns, path("o/", include(oauth2_endpoints))], "oauth2_provider")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    # RFC 9728 metadata for /mcp, ahead of the toolkit's generic document.
    path("", include("mcptasks.oauth.urls")),
    path("", include(oauth2_routes)),
    path("mcp", include("mcptasks.urls")),
]

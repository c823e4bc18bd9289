from django.contrib import admin
from django.urls import include, path
from oauth2_provider import urls as oauth2_urls

from mcptasks.telemetry.scrape import metrics_view
from project.consent import ConsentView
from project.views import home

# django-oauth-toolkit: RFC 8414 metadata at the root (the issuer is this
# site's origin); the authorization (our consent page), token, revocation and
# registration endpoints under /o/.
oauth2_endpoints = [
    path("authorize/", ConsentView.as_view(), name="authorize"),
    *(route for route in oauth2_urls.base_urlpatterns if route.name != "authorize"),
    *oauth2_urls.dcr_urlpatterns,
]
oauth2_routes = ([*oauth2_urls.metadata_urlpatterns, path("o/", include(oauth2_endpoints))], "oauth2_provider")

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    # RFC 9728 metadata for /mcp, ahead of the toolkit's generic document.
    path("", include("mcptasks.oauth.urls")),
    path("", include(oauth2_routes)),
    path("mcp", include("mcptasks.urls")),
    # Prometheus scrape (staff, or MCP_METRICS_TOKEN): with OTEL_METRICS_EXPORTER=prometheus.
    path("metrics", metrics_view, name="metrics"),
]

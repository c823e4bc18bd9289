from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from oauth2_provider import urls as oauth2_urls
from oauth2_provider import views as oauth2_views

from mcptasks.oauth.client_configuration import ClientConfigurationView
from mcptasks.oauth.views import ClientRegistrationView
from mcptasks.telemetry.scrape import metrics_view
from project.consent import ConsentView
from project.oauth_server import ResourceServerIntrospectionView, ThrottledTokenView
from project.views import home

# django-oauth-toolkit: RFC 8414 metadata at the root (the issuer is this
# site's origin); under /o/ only the endpoints this site serves: authorization
# (our consent page), token, revocation and registration. No device flow, and
# introspection only for the resource servers the site names (mcptasks checks
# tokens in this site's own database and needs none).
oauth2_endpoints = [
    path("authorize/", ConsentView.as_view(), name="authorize"),
    path("token/", ThrottledTokenView.as_view(), name="token"),
    path("revoke_token/", oauth2_views.RevokeTokenView.as_view(), name="revoke-token"),
    path("register/", ClientRegistrationView.as_view(), name="dcr-register"),
    # RFC 7592 updates held to the registration rules.
    path("register/<str:client_id>/", ClientConfigurationView.as_view(), name="dcr-register-management"),
]
if getattr(settings, "OAUTH_INTROSPECTION_CLIENTS", None):
    oauth2_endpoints.append(path("introspect/", ResourceServerIntrospectionView.as_view(), name="introspect"))
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

"""The test site's routes: the admin, Django's sign-in pages, the
authorization server (django-oauth-toolkit, metadata at the root) and the
MCP endpoint at ``/mcp``.

Under /o/ only what the site serves, with mcptasks' views as a site uses
them: authorization (the consent page), token, revocation, and registration
and its RFC 7592 updates held to mcptasks' rules. No device flow and no
introspection.
"""

from django.contrib import admin
from django.urls import include, path
from oauth2_provider import urls as oauth2_urls
from oauth2_provider import views as oauth2_views

from mcptasks.oauth.client_configuration import ClientConfigurationView
from mcptasks.oauth.views import ClientRegistrationView
from tests.testapp.consent import ConsentView

oauth2_endpoints = [
    path("authorize/", ConsentView.as_view(), name="authorize"),
    path("token/", oauth2_views.TokenView.as_view(), name="token"),
    path("revoke_token/", oauth2_views.RevokeTokenView.as_view(), name="revoke-token"),
    path("register/", ClientRegistrationView.as_view(), name="dcr-register"),
    path("register/<str:client_id>/", ClientConfigurationView.as_view(), name="dcr-register-management"),
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

"""Mount at the site root, before django-oauth-toolkit's own metadata routes::

path("", include("mcptasks.oauth.urls")),
"""

from django.urls import path

from .views import ProtectedResourceMetadataView

app_name = "mcptasks_oauth"

urlpatterns = [
    path(
        ".well-known/oauth-protected-resource",
        ProtectedResourceMetadataView.as_view(),
        name="protected-resource-metadata",
    ),
    path(
        ".well-known/oauth-protected-resource/<path:resource_path>",
        ProtectedResourceMetadataView.as_view(),
        name="protected-resource-metadata-path",
    ),
]

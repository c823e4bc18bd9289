"""A site that serves /mcp but neither metadata document (for checks W021 and W022)."""

from django.urls import include, path

urlpatterns = [path("mcp", include("mcptasks.urls"))]

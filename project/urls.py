from django.contrib import admin
from django.urls import include, path

from project.views import home

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("mcp", include("mcptasks.urls")),
]

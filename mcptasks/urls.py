from django.urls import path

from .web.views import mcp_endpoint

app_name = "mcptasks"

urlpatterns = [path("", mcp_endpoint, name="endpoint")]

from django.urls import path

from .views import mcp_endpoint

app_name = "mcptasks"

urlpatterns = [path("", mcp_endpoint, name="endpoint")]

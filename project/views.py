"""The example site's own pages (everything else is mcptasks and the admin)."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from mcptasks import registry
from mcptasks.conf import settings as mcp_settings


def home(request: HttpRequest) -> HttpResponse:
    """What this site serves, and how to point an MCP client at it."""
    mcp_url = request.build_absolute_uri(reverse("mcptasks:endpoint"))
    server_name = mcp_settings.SERVER_NAME
    client_config = {"mcpServers": {server_name: {"type": "http", "url": mcp_url}}}
    context = {
        "server_name": server_name,
        "server_version": mcp_settings.SERVER_VERSION,
        "mcp_url": mcp_url,
        "client_config": json.dumps(client_config, indent=2),
        "allow_anonymous": mcp_settings.ALLOW_ANONYMOUS,
        "tools": sorted(registry.all(), key=lambda tool: tool.name),
        "admin_url": reverse("admin:index"),
    }
    return render(request, "index.html", context)

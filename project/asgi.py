"""ASGI entry point: ``uvicorn project.asgi:application``.

``/mcp`` is served straight from ASGI by mcptasks (no Django middleware on the
hot path); everything else (the admin) goes through Django. Long-lived MCP
responses (subscriptions/listen, legacy session streams, a blocked
tasks/result) are async generators on the event loop, fed by the Channels
layer, so an open stream holds no thread.
"""

import os

from django.core.asgi import get_asgi_application

from project import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
telemetry.configure()  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set

django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (after Django is set up)

from mcptasks import mcp_router  # noqa: E402

application = ProtocolTypeRouter({"http": mcp_router(django_application, path="/mcp")})

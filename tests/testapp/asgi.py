"""The test site's ASGI application (``uvicorn tests.testapp.asgi:application``):
``/mcp`` straight from ASGI by mcptasks, everything else through Django."""

import os

from django.core.asgi import get_asgi_application

from tests.testapp import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.testapp.settings")
telemetry.configure()  # OTLP export when the environment names an endpoint

django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (after Django is set up)

from mcptasks import mcp_router  # noqa: E402

application = ProtocolTypeRouter({"http": mcp_router(django_application, path="/mcp")})

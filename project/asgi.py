"""ASGI entry point: ``uvicorn project.asgi:application``.

HTTP goes through Channels' protocol router to Django. Long-lived MCP
responses (subscriptions/listen, legacy session streams, a blocked
tasks/result) are async generators on the event loop, fed by the Channels
layer, so an open stream holds no thread.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (after Django is set up)

application = ProtocolTypeRouter({"http": django_application})

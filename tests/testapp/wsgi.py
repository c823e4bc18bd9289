"""The test site's WSGI application (``mcptasks run`` looks for ``asgi`` beside it)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.testapp.settings")

application = get_wsgi_application()

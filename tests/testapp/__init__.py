"""The test site: the Django site the test suite and its live stacks run.

It is laid out as a site made by ``startproject`` and Celery's "First steps
with Django" (``settings``, ``urls``, ``asgi``, ``wsgi``, ``celery`` and this
``__init__`` importing the app), with one app of its own (this package) whose
``mcp_tools`` holds the tools the tests call. It imports nothing from the
example site (``project``); tests/test_test_site.py checks that.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]

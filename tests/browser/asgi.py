"""The test site with its static files served (admin CSS and JS), for the
browser test: uvicorn does not serve them, and the screenshots should look
like the admin operators see behind a real static server."""

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from tests.testapp.asgi import application as site

application = ASGIStaticFilesHandler(site)

"""The smallest Django settings that the django-stubs mypy plugin needs to type-check mcptasks.

The plugin sets Django up to learn the models; it needs the installed apps, not
the example site or a database server. ``[tool.mypy]`` in pyproject.toml names
this module.
"""

SECRET_KEY = "type-checking-only"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "rest_framework.authtoken",
    "mcptasks",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True

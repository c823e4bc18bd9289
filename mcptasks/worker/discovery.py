"""How ``manage.py mcptasks run`` finds the site's ASGI application and Celery app.

Nothing here names a particular site: every answer comes from a flag, a
setting, or the conventions ``django-admin startproject`` and Celery's "First
steps with Django" leave in a site. Each answer says where it came from, for
the startup line.

ASGI application, first found wins:

1. ``--asgi`` (or the ``ASGI_APPLICATION_PATH`` environment variable);
2. ``settings.ASGI_APPLICATION`` (``mysite.asgi.application``);
3. the ``asgi`` module beside ``settings.WSGI_APPLICATION``
   (``mysite.wsgi.application`` → ``mysite.asgi.application``), when it exists.

Celery app, first found wins:

1. ``--celery-app`` (or the ``MCPTASKS_CELERY_APP`` environment variable);
2. ``MCPTASKS["CELERY_APP"]``;
3. the package of the settings module, looked up the way ``celery -A`` does
   (``mysite.settings`` → ``mysite``, which finds ``mysite.celery:app``), then
   each enclosing package (``mysite.settings.prod`` → ``mysite.settings``,
   ``mysite``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import CommandError

from ..conf import settings as mcp_settings

ASGI_ENV = "ASGI_APPLICATION_PATH"
CELERY_APP_ENV = "MCPTASKS_CELERY_APP"


@dataclass(frozen=True)
class Found:
    """What was chosen (``name``, as a server or ``celery -A`` takes it), why
    (``source``), and the object itself."""

    name: str
    source: str
    obj: Any


# ASGI ----------------------------------------------------------------------------------------------


def split_object_path(path: str) -> tuple[str, str]:
    """``mysite.asgi:application`` or ``mysite.asgi.application`` → (module, attribute)."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise ValueError(f"{path!r} is not a dotted path to an object (e.g. mysite.asgi.application)")
    return module, attr


def module_exists(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (its parent packages are imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package is missing or is not a package
        return False


def _load_asgi(path: str, source: str) -> Found:
    try:
        module_name, attr = split_object_path(path)
    except ValueError as exc:
        raise CommandError(f"{source}: {exc}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"{source} names {path!r}, but {module_name!r} cannot be imported: {exc}") from exc
    application = getattr(module, attr, None)
    if not callable(application):
        raise CommandError(f"{source} names {path!r}, but {module_name!r} has no ASGI application {attr!r}")
    return Found(name=f"{module_name}:{attr}", source=source, obj=application)


def find_asgi_application(flag: str | None = None) -> Found:
    if flag:
        return _load_asgi(flag, "--asgi")
    if os.environ.get(ASGI_ENV):
        return _load_asgi(os.environ[ASGI_ENV], ASGI_ENV)
    configured = getattr(django_settings, "ASGI_APPLICATION", None)
    if configured:
        return _load_asgi(configured, "settings.ASGI_APPLICATION")
    wsgi = getattr(django_settings, "WSGI_APPLICATION", None)
    if wsgi:
        try:
            wsgi_module, attr = split_object_path(wsgi)
        except ValueError:
            wsgi_module = ""
        package = wsgi_module.rpartition(".")[0]
        beside = f"{package}.asgi" if package else "asgi"
        if wsgi_module and module_exists(beside):
            return _load_asgi(f"{beside}:{attr}", f"the asgi module beside WSGI_APPLICATION ({wsgi})")
    example = _site_package() or "mysite"
    raise CommandError(
        "No ASGI application found: settings.ASGI_APPLICATION is not set, and there is no asgi module "
        f"beside WSGI_APPLICATION ({wsgi or 'not set'}). Set ASGI_APPLICATION = "
        f'"{example}.asgi.application" in your settings (the asgi.py that startproject made), '
        f"or pass --asgi {example}.asgi:application."
    )


# Celery --------------------------------------------------------------------------------------------


def _settings_module() -> str:
    # override_settings hides SETTINGS_MODULE (it reads None there), hence the environment too.
    return getattr(django_settings, "SETTINGS_MODULE", None) or os.environ.get("DJANGO_SETTINGS_MODULE", "")


def settings_packages() -> list[str]:
    """The packages enclosing the settings module, innermost first."""
    parts = _settings_module().split(".")[:-1]
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _site_package() -> str:
    packages = settings_packages()
    return packages[-1] if packages else ""


def _as_celery_app(candidate: Any) -> Any | None:
    from celery import Celery

    return candidate if isinstance(candidate, Celery) else None


def _load_celery(name: str, source: str) -> Found:
    from celery.app.utils import find_app

    try:
        app = _as_celery_app(find_app(name))
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"{source} names the Celery app {name!r}, which cannot be loaded: {exc}") from exc
    if app is None:
        raise CommandError(f"{source} names {name!r}, which is not a Celery app")
    return Found(name=name, source=source, obj=app)


def find_celery_app(flag: str | None = None) -> Found:
    if flag:
        return _load_celery(flag, "--celery-app")
    if os.environ.get(CELERY_APP_ENV):
        return _load_celery(os.environ[CELERY_APP_ENV], CELERY_APP_ENV)
    if mcp_settings.CELERY_APP:
        return _load_celery(mcp_settings.CELERY_APP, 'MCPTASKS["CELERY_APP"]')
    from celery.app.utils import find_app

    packages = settings_packages()
    for package in packages:
        try:
            app = _as_celery_app(find_app(package))
        except (ImportError, AttributeError):
            continue  # not this package: try the enclosing one, as the docstring says
        if app is not None:
            return Found(name=package, source=f"the package of the settings module {_settings_module()}", obj=app)
    example = _site_package() or "mysite"
    looked = ", ".join(packages) if packages else f"no package (the settings module is {_settings_module()!r})"
    raise CommandError(
        f"No Celery app found (looked in {looked}, the way `celery -A` does). Create {example}/celery.py with "
        f'`app = Celery("{example}")` and import it in {example}/__init__.py, as Celery\'s "First steps '
        f'with Django" describes; or set MCPTASKS = {{"CELERY_APP": "{example}.celery:app"}}, or pass '
        f"--celery-app {example}.celery:app."
    )

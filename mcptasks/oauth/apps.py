"""``"mcptasks.oauth"`` in ``INSTALLED_APPS``: connects what must run whoever
changes a user (the admin, a shell, a script), not only on a request."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_save


class MCPTasksOAuthConfig(AppConfig):
    name = "mcptasks.oauth"
    label = "mcptasks_oauth"
    verbose_name = "mcptasks with django-oauth-toolkit"

    def ready(self) -> None:
        from .deactivation import revoke_on_deactivation

        post_save.connect(revoke_on_deactivation, sender=settings.AUTH_USER_MODEL, dispatch_uid="mcptasks-oauth-revoke")

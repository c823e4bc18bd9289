from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class MCPTasksConfig(AppConfig):
    name = "mcptasks"
    verbose_name = "MCP tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings as django_settings

        from . import authorization, brokers, checks, jobs  # noqa: F401  (registers the system checks and the Celery tasks)
        from .conf import settings

        # A worker on a Redis broker must survive a broker outage (see brokers.py).
        brokers.connect()

        # Tools live in a module of any installed app, found like admin.py.
        autodiscover_modules(settings.TOOLS_MODULE)
        if settings.NOTIFICATIONS and getattr(django_settings, "CHANNEL_LAYERS", None):
            from . import publishing
            from .wire import legacy_sessions

            publishing.connect()
            legacy_sessions.connect()  # notifications/tasks/status to 2025-era sessions

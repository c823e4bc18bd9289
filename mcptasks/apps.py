from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class MCPTasksConfig(AppConfig):
    name = "mcptasks"
    verbose_name = "MCP tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings as django_settings

        from . import checks  # noqa: F401  (registers the system checks)
        from .conf import settings
        from .telemetry import metrics as telemetry_metrics
        from .worker import brokers, dispatch, jobs, queue_depth  # noqa: F401  (jobs registers the Celery tasks)

        # A worker on a Redis broker must survive a broker outage (see brokers.py).
        brokers.connect()
        # Runs leave the domain through its dispatch seam: Celery fills it.
        dispatch.connect()
        # The gauges (native telemetry): the tasks table's, and the run queue's depth.
        telemetry_metrics.connect()
        queue_depth.connect()

        # Tools live in a module of any installed app, found like admin.py.
        autodiscover_modules(settings.TOOLS_MODULE)
        if settings.NOTIFICATIONS and getattr(django_settings, "CHANNEL_LAYERS", None):
            from .protocol import publishing
            from .protocol.legacy import sessions as legacy_sessions

            publishing.connect()
            legacy_sessions.connect()  # notifications/tasks/status to 2025-era sessions

"""System checks (``manage.py check``; ``--tag mcptasks`` for these alone).

Errors are configurations under which mcptasks cannot work at all; warnings
are ones that work on a laptop and fail in production (``DEBUG = False``).

======  ==========================================================================
id      meaning
======  ==========================================================================
E000    ``settings.MCPTASKS`` is invalid (an unknown key, a wrong type)
E001    no Celery broker: task runs are published nowhere
W001    the in-process ``memory://`` broker in production
W002    notifications are on but ``CHANNEL_LAYERS`` is not configured
W003    the in-memory channel layer in production
W004    a database other than PostgreSQL in production
E002    no authentication class and anonymous callers refused: nobody can call
E003    an authentication class cannot be imported
W005    anonymous callers allowed in production
E004    task TTLs that contradict each other or are not positive
E005    a worker lease that a heartbeat cannot keep alive (needs > 2 heartbeats)
W006    cancels noticed more than a second late (``CANCEL_POLL_SECONDS`` > 1)
E006    a count or interval that must be positive is not
W007    the sweeper or the prune is missing from the Celery beat schedule
E007    ``THROTTLE_CACHE`` names no cache of ``CACHES``: no throttle could count
E020    ``AUTHORIZATION_SERVERS`` is empty or lists something that is not an issuer
E021    ``RESOURCE_URL`` is not an absolute http(s) URL
W020    ``SCOPES`` set without ``AUTHORIZATION_SERVERS``: nobody is told where to sign in
W021    no protected resource metadata is routed for the endpoint
W022    a same-site authorization server whose RFC 8414 metadata is not routed
E030    ``TELEMETRY`` is not ``"off"``, ``"propagation"`` or ``"native"``
E040    ``TOOL_CONTROLS`` names an unknown option, a wrong type or limits that contradict
======  ==========================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings
from django.core.checks import Error, Warning, register
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from .protocol.authorization import WELL_KNOWN, endpoint_path

if TYPE_CHECKING:
    from .conf import MCPTasksSettings

TAG = "mcptasks"
IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"
MAINTENANCE_TASKS = ("mcptasks.sweep", "mcptasks.prune_expired")


def _production() -> bool:
    return not django_settings.DEBUG


def _mcp_settings() -> MCPTasksSettings:
    """The validated settings object (a fresh read, so checks see overrides)."""
    from .conf import MCPTasksSettings

    return MCPTasksSettings.from_django()


def _celery_conf() -> Any | None:
    try:
        from celery import current_app
    except ImportError:  # pragma: no cover - celery is a dependency
        return None
    return current_app.conf


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    try:
        conf = _mcp_settings()
    except (TypeError, ValueError) as exc:
        return [Error(f"settings.MCPTASKS is invalid: {exc}", id="mcptasks.E000")]
    if conf.THROTTLE_CACHE not in django_settings.CACHES:
        # At run time a cache that fails is an outage, served uncounted: a misnamed one must not look like one.
        return [
            Error(
                f"MCPTASKS['THROTTLE_CACHE'] is {conf.THROTTLE_CACHE!r}, which names no cache in CACHES: "
                "no throttle could count a request.",
                hint=f"Name one of {sorted(django_settings.CACHES)}, or add it to CACHES.",
                id="mcptasks.E007",
            )
        ]
    return []


@register(TAG)
def check_celery(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    conf = _celery_conf()
    broker = getattr(django_settings, "CELERY_BROKER_URL", None) or (conf.broker_url if conf is not None else None)
    if not broker:
        return [
            Error(
                "No Celery broker is configured: task runs would go to Celery's default "
                "(amqp://guest@localhost) and never reach a worker.",
                hint="Set CELERY_BROKER_URL (e.g. redis://host:6379/0) and load your Celery app "
                "in your site package's __init__.py, as Celery's \"First steps with Django\" describes.",
                id="mcptasks.E001",
            )
        ]
    errors: list[Any] = []
    if str(broker).startswith("memory://") and _production():
        errors.append(
            Warning(
                "Celery uses the in-process memory:// broker with DEBUG = False: runs are seen only by a "
                "worker inside this same process (`manage.py mcptasks run`), and are lost when it stops.",
                hint="Use a real broker (Redis or RabbitMQ) and separate `celery worker` processes.",
                id="mcptasks.W001",
            )
        )
    schedule = getattr(django_settings, "CELERY_BEAT_SCHEDULE", None)
    if schedule is None and conf is not None:
        schedule = conf.beat_schedule
    scheduled = {entry.get("task") for entry in (schedule or {}).values() if isinstance(entry, dict)}
    missing = [name for name in MAINTENANCE_TASKS if name not in scheduled]
    if missing:
        errors.append(
            Warning(
                f"The Celery beat schedule has no {', '.join(missing)}: runs lost to dead workers are never "
                "recovered, or expired tasks never deleted.",
                hint="CELERY_BEAT_SCHEDULE = {**mcptasks.worker.beat.BEAT_SCHEDULE, ...}, and run `celery beat` "
                "(or call `manage.py mcptasks sweep` / `prune` from cron).",
                id="mcptasks.W007",
            )
        )
    return errors


@register(TAG)
def check_channel_layer(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    try:
        notifications = _mcp_settings().NOTIFICATIONS
    except (TypeError, ValueError):
        return []  # reported by E000
    layers = getattr(django_settings, "CHANNEL_LAYERS", None) or {}
    default = layers.get("default")
    if not default:
        if notifications:
            return [
                Warning(
                    "CHANNEL_LAYERS has no 'default' layer: task notifications and subscriptions/listen are off.",
                    hint="Configure channels_redis.core.RedisChannelLayer, or set MCPTASKS['NOTIFICATIONS'] = False.",
                    id="mcptasks.W002",
                )
            ]
        return []
    if default.get("BACKEND") == IN_MEMORY_LAYER and _production():
        return [
            Warning(
                "The default channel layer is in memory with DEBUG = False: a task change made by a worker "
                "never reaches a client listening on another process.",
                hint="Use channels_redis.core.RedisChannelLayer.",
                id="mcptasks.W003",
            )
        ]
    return []


@register(TAG)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    engine = django_settings.DATABASES.get("default", {}).get("ENGINE", "")
    if _production() and "postgresql" not in engine:
        return [
            Warning(
                f"The default database is {engine or 'not configured'} with DEBUG = False. mcptasks relies on "
                "PostgreSQL's row locks (SELECT ... FOR UPDATE) to keep concurrent transitions safe, and on its "
                "partial indexes to stay fast.",
                hint="Use PostgreSQL in production (e.g. DATABASE_URL=postgres://...).",
                id="mcptasks.W004",
            )
        ]
    return []


@register(TAG)
def check_authentication(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    try:
        conf = _mcp_settings()
    except (TypeError, ValueError):
        return []
    errors: list[Any] = []
    if not conf.AUTHENTICATION_CLASSES and not conf.ALLOW_ANONYMOUS:
        errors.append(
            Error(
                "MCPTASKS['AUTHENTICATION_CLASSES'] is empty and ALLOW_ANONYMOUS is False: nobody can call the server.",
                hint="Name at least one authentication class, or allow anonymous callers explicitly.",
                id="mcptasks.E002",
            )
        )
    for path in conf.AUTHENTICATION_CLASSES:
        try:
            import_string(path)
        except ImportError as exc:
            errors.append(Error(f"Authentication class {path!r} cannot be imported: {exc}", id="mcptasks.E003"))
    if conf.ALLOW_ANONYMOUS and _production():
        errors.append(
            Warning(
                f"MCPTASKS['ALLOW_ANONYMOUS'] is True with DEBUG = False: every unauthenticated caller shares "
                f"the identity {conf.ANONYMOUS_OWNER!r} and so sees every other anonymous caller's tasks.",
                hint="Turn ALLOW_ANONYMOUS off in production unless the server is private.",
                id="mcptasks.W005",
            )
        )
    return errors


@register(TAG)
def check_timing(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    try:
        conf = _mcp_settings()
    except (TypeError, ValueError):
        return []
    errors: list[Any] = []
    if conf.DEFAULT_TTL_MS <= 0 or conf.MAX_TTL_MS <= 0:
        errors.append(
            Error(
                f"Task TTLs must be positive (DEFAULT_TTL_MS={conf.DEFAULT_TTL_MS}, MAX_TTL_MS={conf.MAX_TTL_MS}).",
                id="mcptasks.E004",
            )
        )
    elif conf.DEFAULT_TTL_MS > conf.MAX_TTL_MS:
        errors.append(
            Error(
                f"DEFAULT_TTL_MS ({conf.DEFAULT_TTL_MS}) is above MAX_TTL_MS ({conf.MAX_TTL_MS}): "
                "every task would get the maximum instead of the default.",
                id="mcptasks.E004",
            )
        )
    if conf.HEARTBEAT_SECONDS <= 0 or conf.LEASE_SECONDS <= 2 * conf.HEARTBEAT_SECONDS:
        errors.append(
            Error(
                f"LEASE_SECONDS ({conf.LEASE_SECONDS}) must be more than twice HEARTBEAT_SECONDS "
                f"({conf.HEARTBEAT_SECONDS}): one late heartbeat would otherwise let the sweeper take a live run "
                "away from its worker.",
                hint="The defaults are a 30 s lease renewed every 5 s.",
                id="mcptasks.E005",
            )
        )
    if conf.CANCEL_POLL_SECONDS <= 0:
        errors.append(Error("CANCEL_POLL_SECONDS must be positive.", id="mcptasks.E006"))
    elif conf.CANCEL_POLL_SECONDS > 1:
        errors.append(
            Warning(
                f"CANCEL_POLL_SECONDS is {conf.CANCEL_POLL_SECONDS}: a running tool notices a cancel only that "
                "late, and keeps working (and spending) meanwhile.",
                hint="Keep it at 1 second or less (default 0.25).",
                id="mcptasks.W006",
            )
        )
    positive = {
        "POLL_INTERVAL_MS": conf.POLL_INTERVAL_MS,
        "MAX_ATTEMPTS": conf.MAX_ATTEMPTS,
        "PRUNE_BATCH_SIZE": conf.PRUNE_BATCH_SIZE,
        "DISPATCH_GRACE_SECONDS": conf.DISPATCH_GRACE_SECONDS,
    }
    for name, value in positive.items():
        if value <= 0:
            errors.append(Error(f"MCPTASKS['{name}'] must be positive, not {value}.", id="mcptasks.E006"))
    if conf.PRUNE_PAUSE_SECONDS < 0:
        errors.append(
            Error(
                f"MCPTASKS['PRUNE_PAUSE_SECONDS'] must be zero or more, not {conf.PRUNE_PAUSE_SECONDS}.",
                id="mcptasks.E006",
            )
        )
    return errors


def _http_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.fragment


def _routed(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


@register(TAG)
def check_authorization(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Half-configured resource servers (see docs/authorization.md)."""
    try:
        conf = _mcp_settings()
    except (TypeError, ValueError):
        return []  # mcptasks.E000 reports an invalid MCPTASKS
    servers = conf.AUTHORIZATION_SERVERS
    resource = conf.RESOURCE_URL
    found: list[Any] = []
    if servers is not None:
        bad = [s for s in servers if not (isinstance(s, str) and (s.startswith("/") or _http_url(s)))]
        if not servers or bad:
            found.append(
                Error(
                    "MCPTASKS['AUTHORIZATION_SERVERS'] must list issuer URLs (or '/' for this site): "
                    + (f"{bad!r} are not" if bad else "it is empty, so no client could find where to sign in"),
                    hint="Set it to None to turn the OAuth resource server off.",
                    id="mcptasks.E020",
                )
            )
    if resource is not None and not _http_url(resource):
        found.append(
            Error(
                f"MCPTASKS['RESOURCE_URL'] must be the endpoint's absolute http(s) URL, not {resource!r}.",
                id="mcptasks.E021",
            )
        )
    # Only the site's own baseline: tools' scopes (possibly from a third-party
    # app) only narrow OAuth tokens and are harmless on a site without them.
    if servers is None and conf.SCOPES:
        found.append(
            Warning(
                "MCPTASKS['SCOPES'] is set but MCPTASKS['AUTHORIZATION_SERVERS'] is not: "
                "clients are refused without being told where to get a token with those scopes.",
                id="mcptasks.W020",
            )
        )
    if servers:
        path = endpoint_path().rstrip("/")
        if not _routed(WELL_KNOWN + path):
            found.append(
                Warning(
                    f"No protected resource metadata is served at {WELL_KNOWN + path}: "
                    "clients cannot discover the authorization server.",
                    hint='Add path("", include("mcptasks.oauth.urls")) to the root URLconf.',
                    id="mcptasks.W021",
                )
            )
        for entry in servers:
            if isinstance(entry, str) and entry.startswith("/"):
                metadata = "/.well-known/oauth-authorization-server" + entry.rstrip("/")
                if not _routed(metadata):
                    found.append(
                        Warning(
                            f"AUTHORIZATION_SERVERS names {entry!r} on this site, but nothing serves {metadata}.",
                            hint="Mount django-oauth-toolkit's metadata_urlpatterns at the root.",
                            id="mcptasks.W022",
                        )
                    )
    return found


@register(TAG)
def check_telemetry(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    from .telemetry import MODES

    try:
        mode = _mcp_settings().TELEMETRY
    except (TypeError, ValueError):
        return []  # reported by E000
    if mode in MODES:
        return []
    return [
        Error(
            f"MCPTASKS TELEMETRY is {mode!r}.",
            hint=f"Use one of {', '.join(repr(m) for m in MODES)} (docs/observability.md).",
            id="mcptasks.E030",
        )
    ]


@register(TAG)
def check_tool_controls(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Each ``TOOL_CONTROLS`` entry: known options of the right types, over the
    tool's own options without contradiction (a soft limit below the hard one,
    retries with the exceptions to retry on)."""
    try:
        _mcp_settings()
    except (TypeError, ValueError):
        return []  # E000 says so
    from .tools.effective import problems

    return [Error(f"MCPTASKS TOOL_CONTROLS: {problem}", id="mcptasks.E040") for problem in problems()]

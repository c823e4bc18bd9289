"""Typed settings for mcptasks, read from ``settings.MCPTASKS`` on first use.

Never read at import time: the object is rebuilt whenever Django's
``setting_changed`` signal names ``MCPTASKS``, so ``override_settings`` works in
tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver


def package_version() -> str:
    """The installed distribution's version: pyproject.toml is its one home."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcptasks")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


@dataclass(frozen=True)
class MCPTasksSettings:
    #: Name and version reported in ``serverInfo``.
    SERVER_NAME: str = "mcptasks"
    SERVER_VERSION: str = field(default_factory=package_version)
    INSTRUCTIONS: str | None = None
    #: DRF authentication classes (dotted paths) that identify the caller.
    AUTHENTICATION_CLASSES: tuple[str, ...] = (
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    )
    #: Serve unauthenticated callers under one shared identity. Off by default:
    #: a site must choose it explicitly.
    ALLOW_ANONYMOUS: bool = False
    #: Polls served on the event loop reuse a caller identified (by a thread,
    #: through the classes above) this many seconds ago with the same
    #: credentials, never past a token's own expiry: a revoked token is
    #: refused at most this late. ``0`` or ``None`` turns that off.
    IDENTITY_CACHE_SECONDS: float | None = 5.0
    ANONYMOUS_OWNER: str = "anonymous"
    #: Where installed apps keep their tools (discovered like ``admin.py``).
    TOOLS_MODULE: str = "mcp_tools"
    #: Task time-to-live, from creation, in milliseconds.
    DEFAULT_TTL_MS: int = 60 * 60 * 1000
    MAX_TTL_MS: int = 7 * 24 * 60 * 60 * 1000
    POLL_INTERVAL_MS: int = 1000
    #: Worker lease: a running task's lease is renewed every heartbeat; a task
    #: whose lease lapsed belongs to a dead worker and is picked up again.
    LEASE_SECONDS: float = 30.0
    HEARTBEAT_SECONDS: float = 5.0
    #: How often a running tool's context looks for a cancel (seconds).
    CANCEL_POLL_SECONDS: float = 0.25
    #: A run's status messages (``ctx.report_status``, ``ctx.report_progress``)
    #: are written at most once per this many seconds, the latest one each
    #: time; a message still pending when the run asks for input, finishes or
    #: sees a cancel is dropped. A worker killed mid-run loses at most this
    #: much of them.
    STATUS_INTERVAL_SECONDS: float = 0.25
    #: Runs of one task that may be lost to dead workers before it fails.
    MAX_ATTEMPTS: int = 3
    #: A ``working`` task never claimed within this many seconds of its
    #: dispatch is re-enqueued by the sweeper (its message was lost).
    DISPATCH_GRACE_SECONDS: float = 60.0
    #: Budget for ``task="auto"`` tools: wait this long for the result before
    #: answering with a task handle.
    AUTO_TASK_BUDGET_SECONDS: float = 0.5
    #: Rows deleted per statement when pruning expired tasks.
    PRUNE_BATCH_SIZE: int = 1000
    #: Pause between prune batches (seconds), so that a large prune leaves the
    #: database and the cores to the requests meanwhile.
    PRUNE_PAUSE_SECONDS: float = 0.02
    #: Lifetime of an MRTR ``requestState`` (seconds).
    REQUEST_STATE_MAX_AGE: int = 15 * 60
    #: Caching hints for ``server/discover`` and ``tools/list``.
    LIST_TTL_MS: int = 60 * 1000
    #: Push task changes through the channel layer (when one is configured).
    NOTIFICATIONS: bool = True
    #: Idle ``subscriptions/listen`` streams get an SSE comment this often.
    KEEPALIVE_SECONDS: float = 15.0
    #: Most task ids one ``subscriptions/listen`` may name.
    MAX_LISTEN_TASKS: int = 1000
    # Abuse limits (None turns one off).
    MAX_BODY_BYTES: int | None = 1024 * 1024
    MAX_JSON_DEPTH: int | None = 64
    MAX_ARGUMENTS_BYTES: int | None = 256 * 1024
    MAX_INPUT_RESPONSES_BYTES: int | None = 256 * 1024
    #: Working or waiting tasks one owner may have at once.
    MAX_ACTIVE_TASKS_PER_OWNER: int | None = 1000
    #: Polls of one task allowed per ``pollIntervalMs`` window.
    POLL_BURST: int | None = 10
    #: Per-owner rates, DRF syntax ("N/s", "N/m", ...), by request kind:
    #: ``call`` (tools/call), ``update`` (tasks/update and tasks/cancel),
    #: ``listen`` (subscriptions/listen). A missing kind is not throttled.
    THROTTLE_RATES: dict[str, str] = field(
        default_factory=lambda: {"call": "100/s", "update": "100/s", "listen": "20/s"}
    )
    #: The Django cache that holds throttle counters (share it between
    #: processes, e.g. Redis, for exact limits).
    THROTTLE_CACHE: str = "default"
    #: Throttles count in each process and sync with ``THROTTLE_CACHE`` every
    #: this many milliseconds: exact per process, and across N processes at
    #: most two intervals late (docs/reliability.md). 0 counts every request
    #: in the cache itself (exact across processes, a round trip each).
    THROTTLE_SYNC_MS: int = 100
    #: Threads per web process for the endpoint's database work (each keeps
    #: one database connection).
    WEB_THREADS: int = 8
    #: Database connections per web process for polls served on the event
    #: loop (a poll holds one for a single SELECT, so a few go a long way).
    POLL_CONNECTIONS: int = 4
    #: Prepare the raw statements (Postgres) server-side, once per connection.
    #: Turn off behind a pooler that cannot keep them (PgBouncer in
    #: transaction mode before 1.21, or without ``max_prepared_statements``).
    PREPARE_STATEMENTS: bool = True
    #: Answer polls of unchanged tasks from a per-process snapshot kept true
    #: by Postgres LISTEN/NOTIFY (``mcptasks.tasks.poll_snapshot``), without a
    #: database read. ``False``: every poll reads the database. Postgres only.
    POLL_SNAPSHOT: bool = True
    #: The most tasks a web process keeps in that snapshot.
    POLL_SNAPSHOT_TASKS: int = 10_000
    #: Threads per web process for tools that run inline (within tools/call).
    INLINE_TOOL_THREADS: int = 32
    #: Inline runs (tools and prompts run within their request, streamed or
    #: not) one caller may have in flight at once in one web process; past it,
    #: -31000 with HTTP 429. A run counts until it ends, even after its client
    #: hung up, so a caller cannot fill ``INLINE_TOOL_THREADS`` alone.
    MAX_INLINE_RUNS_PER_OWNER: int | None = 8
    #: Celery queue for tool runs (a tool's own ``queue`` goes first).
    CELERY_QUEUE: str | None = None
    #: Execution controls per tool name, over the tool's own ``@tool(...)``
    #: options: ``queue``, ``time_limit``, ``soft_time_limit``, ``retries``,
    #: ``retry_on`` (dotted paths of exception classes), ``retry_backoff``,
    #: ``retry_backoff_max`` (see mcptasks.tools.controls; checked by E040).
    TOOL_CONTROLS: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The site's Celery app for ``manage.py mcptasks run``, as ``celery -A``
    #: takes it (``"mysite"`` or ``"mysite.celery:app"``). ``None``: found from
    #: the settings module's package, as ``celery -A mysite`` would.
    CELERY_APP: str | None = None
    #: Allowed ``Origin`` values (scheme://host[:port]); ``None`` allows only
    #: origins whose host is in ``ALLOWED_HOSTS`` or is a loopback name.
    ALLOWED_ORIGINS: tuple[str, ...] | None = None
    # OAuth 2.1 resource server (MCP authorization; see mcptasks.web.authorization).
    #: Issuers of the tokens this endpoint accepts, for the protected resource
    #: metadata and the 401 challenge. ``None`` turns the resource-server part
    #: off. An entry that is a path ("/") names an authorization server on this
    #: site, resolved against the request's origin.
    AUTHORIZATION_SERVERS: tuple[str, ...] | None = None
    #: Canonical URL of the MCP endpoint: the RFC 8707 resource that tokens
    #: must be issued for. ``None`` derives it from each request.
    RESOURCE_URL: str | None = None
    #: Scopes every MCP request needs (what the 401 challenge asks for).
    SCOPES: tuple[str, ...] = ()
    #: Scope hierarchy: a granted scope also grants the scopes listed for it.
    SCOPE_HIERARCHY: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: ``resource_name`` in the protected resource metadata.
    RESOURCE_NAME: str | None = None
    # OpenTelemetry (see mcptasks.telemetry and docs/observability.md).
    #: ``"native"``: spans and metrics through the OpenTelemetry API (a no-op
    #: until the site installs an SDK); ``"propagation"``: no spans or
    #: metrics of ours, but the client's trace context reaches the task's
    #: runs; ``"off"``: nothing.
    TELEMETRY: str = "native"
    #: Start each run's span in a trace of its own, linked to the request that
    #: created the task, instead of as that request's child.
    TELEMETRY_RUN_LINKS: bool = False
    #: Report the gauges (tasks working, tasks waiting for input, queue depth)
    #: from this process. Each reading costs a query or a broker round trip.
    TELEMETRY_GAUGES: bool = True
    #: Keep the client's W3C ``baggage`` on the task's row and hand it to its
    #: runs. Off: baggage is the caller's to write, and a run would trust it.
    TELEMETRY_KEEP_BAGGAGE: bool = False
    #: A bearer token that may read the Prometheus scrape view besides staff.
    METRICS_TOKEN: str | None = None

    @classmethod
    def from_django(cls) -> MCPTasksSettings:
        user = dict(getattr(django_settings, "MCPTASKS", {}) or {})
        known = {f.name for f in fields(cls)}
        unknown = set(user) - known
        if unknown:
            raise ValueError(f"Unknown MCPTASKS settings: {sorted(unknown)}")
        values: dict[str, Any] = {}
        for name, value in user.items():
            if name in ("AUTHENTICATION_CLASSES", "ALLOWED_ORIGINS", "AUTHORIZATION_SERVERS", "SCOPES"):
                value = None if value is None else tuple(value)
            if name == "SCOPE_HIERARCHY":
                value = {str(k): tuple(v) for k, v in (value or {}).items()}
            if name == "THROTTLE_RATES":
                value = dict(value or {})
            if name == "TOOL_CONTROLS":
                value = {str(k): v for k, v in (value or {}).items()}
            values[name] = value
        return replace(cls(), **values)


_cached: MCPTasksSettings | None = None


def get_settings() -> MCPTasksSettings:
    global _cached
    if _cached is None:
        _cached = MCPTasksSettings.from_django()
    return _cached


class _SettingsProxy:
    """Attribute access to the current settings: ``conf.settings.MAX_TTL_MS``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(get_settings(), name)


if TYPE_CHECKING:
    # To a type checker the proxy is the settings class, so every read has its
    # field's type and a misspelt name is an error.
    settings: MCPTasksSettings
else:
    settings = _SettingsProxy()


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "MCPTASKS":
        _cached = None

"""Settings for the example site, from the environment (django-environ).

With no environment at all it runs on the embedded default: SQLite, an
in-process Celery broker and an in-memory channel layer. Name real services
to use them:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mcptasks
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0
    REDIS_URL=redis://127.0.0.1:6379/1        # channel layer
"""

from datetime import timedelta
from pathlib import Path

import environ

from mcptasks import BEAT_SCHEDULE
from project.secret_key import DEVELOPMENT_KEY, KEY_FILE, read_key

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
# SECRET_KEY from the environment, else the one bin/run keeps in var/ (see
# project/secret_key.py), else a public development key.
SECRET_KEY = env("SECRET_KEY", default="") or read_key(KEY_FILE) or DEVELOPMENT_KEY
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "oauth2_provider",
    "axes",
    "mcptasks",
    "mcptasks.oauth",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS and JS) from the web process itself: uvicorn serves none.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "project.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several threads write at once on the embedded default (web + worker).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
else:
    # Persistent connections: the endpoint does its database work on a fixed
    # pool of threads (MCPTASKS WEB_THREADS), one connection each.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=300)
    # No health-check query per request: a connection that failed is closed
    # at the end of that request and the next one reconnects.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# bin/run runs collectstatic (compressed copies in STATIC_ROOT); the finders
# cover a process started before it (tests, `manage.py mcptasks run` alone).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# Celery: an in-process broker unless CELERY_BROKER_URL names a real one.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="memory://")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Keep workers' database connections between runs: without it Celery's Django
# fix-up closes them around every task and each run reconnects. mcptasks'
# run job drops a broken or aged connection itself (mcptasks.worker.jobs).
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)
# Retry channel errors too. (A worker that stopped consuming after a broker
# restart was a kombu bug, which mcptasks.worker.brokers works around.)
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600)}
if CELERY_BROKER_URL.startswith("memory://"):
    CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] = 0.02
# Beat's record of last runs, with the example site's other files in var/.
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    **BEAT_SCHEDULE,
    "mcptasks-sweep": {**BEAT_SCHEDULE["mcptasks-sweep"], "schedule": env.float("MCP_SWEEP_SECONDS", default=10.0)},
}

# Channels: Redis when REDIS_URL is set, in memory otherwise.
REDIS_URL = env("REDIS_URL", default="")
if REDIS_URL:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Throttle counters (MCPTASKS["THROTTLE_CACHE"]): in Redis when REDIS_URL is
# set, so that every web process counts against one limit; in each process's
# memory otherwise. The key prefix keeps deployments that share a Redis (one
# per database) apart. Short timeouts: while Redis is down, requests are
# served uncounted (mcptasks.protocol.limits) and must not wait for it.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if REDIS_URL:
    CACHES["throttle"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env("CACHE_KEY_PREFIX", default=f"mcptasks:{DATABASES['default']['NAME']}"),
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }

MCPTASKS = {
    "SERVER_NAME": "mcptasks-example",
    # OAuth access tokens first: that class passes over a token it does not
    # know, so a static DRF token ("Bearer <key>", for scripts) is tried next.
    "AUTHENTICATION_CLASSES": [
        "mcptasks.oauth.authentication.OAuth2Authentication",
        "mcptasks.web.identity.BearerTokenAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    # The example site serves anonymous callers (the conformance suite is one);
    # MCP_ALLOW_ANONYMOUS=false makes every client sign in.
    "ALLOW_ANONYMOUS": env.bool("MCP_ALLOW_ANONYMOUS", default=True),
    # The OAuth resource server: tokens come from this site's own
    # authorization server (django-oauth-toolkit, below), "/" being this
    # site's origin. MCP_RESOURCE_URL pins the endpoint's public URL (behind
    # a proxy, say); without it the URL is taken from each request.
    "AUTHORIZATION_SERVERS": env.list("MCP_AUTHORIZATION_SERVERS", default=["/"]),
    "RESOURCE_URL": env("MCP_RESOURCE_URL", default=None),
    "SCOPES": ["mcp"],
    "SCOPE_HIERARCHY": {"mcp:admin": ["mcp", "mcp:delete"]},
    "POLL_INTERVAL_MS": env.int("MCP_POLL_INTERVAL_MS", default=500),
    "LEASE_SECONDS": env.float("MCP_LEASE_SECONDS", default=30.0),
    "HEARTBEAT_SECONDS": env.float("MCP_HEARTBEAT_SECONDS", default=5.0),
    "DISPATCH_GRACE_SECONDS": env.float("MCP_DISPATCH_GRACE_SECONDS", default=60.0),
    "MAX_ATTEMPTS": env.int("MCP_MAX_ATTEMPTS", default=3),
    "CELERY_QUEUE": env("MCP_CELERY_QUEUE", default=None),
    "WEB_THREADS": env.int("MCP_WEB_THREADS", default=8),
    "POLL_CONNECTIONS": env.int("MCP_POLL_CONNECTIONS", default=4),
    "POLL_SNAPSHOT": env.bool("MCP_POLL_SNAPSHOT", default=True),
    "PRUNE_PAUSE_SECONDS": env.float("MCP_PRUNE_PAUSE_SECONDS", default=0.02),
    # Abuse limits; "0" turns the poll throttle off (benchmarks do).
    "POLL_BURST": env.int("MCP_POLL_BURST", default=10) or None,
    "MAX_ACTIVE_TASKS_PER_OWNER": env.int("MCP_MAX_ACTIVE_TASKS", default=1000) or None,
    "THROTTLE_CACHE": "throttle" if REDIS_URL else "default",
    # OpenTelemetry: "native", "propagation" or "off" (project/telemetry.py
    # exports when OTEL_EXPORTER_OTLP_ENDPOINT is set).
    "TELEMETRY": env("MCP_TELEMETRY", default="native"),
    "METRICS_TOKEN": env("MCP_METRICS_TOKEN", default=None),
}

# The embedded default is a single-process development setup by design: its
# in-process broker, in-memory layer and SQLite would be warned about in
# production, so the example site does not warn about them when they are the
# default. Naming real services brings the checks back.
if "DATABASE_URL" not in env.ENVIRON and "CELERY_BROKER_URL" not in env.ENVIRON and not REDIS_URL:
    SILENCED_SYSTEM_CHECKS = ["mcptasks.W001", "mcptasks.W003", "mcptasks.W004", "mcptasks.W005"]

# django-oauth-toolkit as the site's authorization server for MCP clients:
# RFC 8414 metadata, authorization code with PKCE (S256 only), RFC 8707
# resource indicators, dynamic registration open to MCP clients (within the
# limits of mcptasks.oauth.registration), Client ID Metadata Documents, and
# the RFC 9207 ``iss`` in every authorization response. Users sign in with
# Django's login (templates/registration/login.html) and approve each client
# on templates/oauth2_provider/authorize.html.
OAUTH2_PROVIDER = {
    "SCOPES": {
        "mcp": "Use the MCP tools of this site and follow their tasks",
        "mcp:delete": "Delete files (the confirm_delete tool)",
        "mcp:admin": "Everything the MCP tools of this site can do",
    },
    "DEFAULT_SCOPES": ["mcp"],
    "PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_basic", "client_secret_post"],
    "ACCESS_TOKEN_EXPIRE_SECONDS": env.int("OAUTH_ACCESS_TOKEN_SECONDS", default=3600),
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "DCR_ENABLED": True,
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("mcptasks.oauth.registration.MCPClientRegistrationPermission",),
    "CIMD_ENABLED": True,
    # One deadline over each whole document fetch, and the registration rules
    # for the documents; tokens of deactivated users refused.
    "CIMD_METADATA_FETCHER": "mcptasks.oauth.cimd.MCPClientMetadataFetcher",
    "OAUTH2_VALIDATOR_CLASS": "mcptasks.oauth.validators.ActiveUserOAuth2Validator",
}
LOGIN_URL = "/accounts/login/"
# RFC 7662 introspection, for the client ids of resource servers elsewhere
# that check this site's tokens (confidential clients made in the admin).
# Unset, /o/introspect/ is not mounted: /mcp checks tokens in the database.
OAUTH_INTROSPECTION_CLIENTS = env.list("OAUTH_INTROSPECTION_CLIENTS", default=[])

# django-axes: failed sign-ins (the login page, the admin's, and the token
# endpoint's wrong client secrets, codes and refresh tokens, see
# project/oauth_server.py) counted per client address and per account; past
# SIGN_IN_FAILURE_LIMIT either is refused with 429 for SIGN_IN_COOLOFF_SECONDS.
# The address is the connection's (mcptasks run believes a proxy's
# X-Forwarded-For only when told to trust it).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.int("SIGN_IN_FAILURE_LIMIT", default=10)
AXES_COOLOFF_TIME = timedelta(seconds=env.int("SIGN_IN_COOLOFF_SECONDS", default=900))
# Per address and per account; a public OAuth client per address and client only.
AXES_LOCKOUT_PARAMETERS = "project.oauth_server.lockout_parameters"
AXES_RESET_ON_SUCCESS = True
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]
AXES_COOLOFF_MESSAGE = "Too many failed sign-in attempts from this address or for this account: try again later."

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "mcptasks": {"handlers": ["console"], "level": env("MCP_LOG_LEVEL", default="WARNING")},
    },
}

"""The test site's settings, from the environment.

The live stacks (tests/support/live.py) run the site's processes with this
module and set its services and timings through these variables:
``DATABASE_URL``, ``CELERY_BROKER_URL``, ``REDIS_URL`` (channel layer and
throttle cache), ``MCP_*`` (the mcptasks settings below) and
``CONN_MAX_AGE``. With none set it runs on the embedded default: SQLite in
the temporary directory, an in-process Celery broker and an in-memory
channel layer. The pytest process uses tests/settings.py, which builds on
this module.
"""

import tempfile
from pathlib import Path

import environ

from mcptasks import BEAT_SCHEDULE

SITE_DIR = Path(__file__).resolve().parent
#: Files the site writes when no service is named (SQLite, beat's schedule).
VAR_DIR = Path(tempfile.gettempdir())

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = "insecure-key-of-the-test-site"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", "testserver"]

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
    "mcptasks",
    # Revokes the tokens of a user who is deactivated.
    "mcptasks.oauth",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "tests.testapp.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Ahead of the apps' templates: the sign-in and consent pages.
        "DIRS": [SITE_DIR / "templates"],
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

WSGI_APPLICATION = "tests.testapp.wsgi.application"
ASGI_APPLICATION = "tests.testapp.asgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'mcptasks-testapp.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web threads and the worker write at once.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
else:
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=300)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    # Behind a pooler in transaction mode (the PgBouncer deployment test).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env.bool("DISABLE_SERVER_SIDE_CURSORS", default=False)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"

CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="memory://")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, float] = {"visibility_timeout": 3600}
if CELERY_BROKER_URL.startswith("memory://"):
    CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] = 0.02
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "mcptasks-testapp-celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    **BEAT_SCHEDULE,
    "mcptasks-sweep": {**BEAT_SCHEDULE["mcptasks-sweep"], "schedule": env.float("MCP_SWEEP_SECONDS", default=10.0)},
}

REDIS_URL = env("REDIS_URL", default="")
if REDIS_URL:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Throttle counters: in Redis when the stack has one (every web process
# counts against one limit), in each process's memory otherwise. The prefix
# is the stack's own database, so stacks sharing a Redis stay apart.
CACHES: dict[str, dict[str, object]] = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if REDIS_URL:
    CACHES["throttle"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"mcptasks:{DATABASES['default']['NAME']}",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }

MCPTASKS = {
    "SERVER_NAME": "mcptasks-testapp",
    # OAuth access tokens, then the DRF tokens the tests make for their users.
    "AUTHENTICATION_CLASSES": [
        "mcptasks.oauth.authentication.OAuth2Authentication",
        "mcptasks.web.identity.BearerTokenAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "ALLOW_ANONYMOUS": env.bool("MCP_ALLOW_ANONYMOUS", default=True),
    "AUTHORIZATION_SERVERS": ["/"],
    "RESOURCE_URL": None,
    "SCOPES": ["mcp"],
    "SCOPE_HIERARCHY": {"mcp:admin": ["mcp", "mcp:delete"]},
    "POLL_INTERVAL_MS": env.int("MCP_POLL_INTERVAL_MS", default=500),
    "LEASE_SECONDS": env.float("MCP_LEASE_SECONDS", default=30.0),
    "HEARTBEAT_SECONDS": env.float("MCP_HEARTBEAT_SECONDS", default=5.0),
    "DISPATCH_GRACE_SECONDS": env.float("MCP_DISPATCH_GRACE_SECONDS", default=60.0),
    "MAX_ATTEMPTS": env.int("MCP_MAX_ATTEMPTS", default=3),
    "CELERY_QUEUE": env("MCP_CELERY_QUEUE", default=None),
    "TOOL_CONTROLS": env.json("MCP_TOOL_CONTROLS", default={}),
    "WEB_THREADS": 8,
    "POLL_CONNECTIONS": 4,
    "PREPARE_STATEMENTS": env.bool("MCP_PREPARE_STATEMENTS", default=True),
    "POLL_SNAPSHOT": env.bool("MCP_POLL_SNAPSHOT", default=True),
    "PRUNE_PAUSE_SECONDS": 0.02,
    "POLL_BURST": env.int("MCP_POLL_BURST", default=10) or None,
    "MAX_ACTIVE_TASKS_PER_OWNER": env.int("MCP_MAX_ACTIVE_TASKS", default=1000) or None,
    "THROTTLE_CACHE": "throttle" if REDIS_URL else "default",
}

# The embedded default is a development setup by design: no warnings about
# it when nothing else was named (naming a service brings the checks back).
if "DATABASE_URL" not in env.ENVIRON and "CELERY_BROKER_URL" not in env.ENVIRON and not REDIS_URL:
    SILENCED_SYSTEM_CHECKS = ["mcptasks.W001", "mcptasks.W003", "mcptasks.W004", "mcptasks.W005"]

# django-oauth-toolkit as the site's authorization server (what
# test_live_oauth.py drives): PKCE S256, resource indicators, dynamic
# registration within mcptasks' limits, Client ID Metadata Documents, ``iss``.
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
    "ACCESS_TOKEN_EXPIRE_SECONDS": 3600,
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

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "mcptasks": {"handlers": ["console"], "level": env("MCP_LOG_LEVEL", default="WARNING")},
    },
}

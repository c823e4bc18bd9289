"""The system checks (mcptasks.checks): each fires on the configuration it
names and stays quiet on a sound one."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

# The checks read the engine from settings; overriding it is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")

SOUND = {
    "DEBUG": False,
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    "CHANNEL_LAYERS": {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": []}}},
    "MCPTASKS": {
        "AUTHENTICATION_CLASSES": ["rest_framework.authentication.TokenAuthentication"],
        "ALLOW_ANONYMOUS": False,
    },
}


def use_engine(settings: Any, engine: str) -> None:
    """Name another database engine in the settings the checks read (the
    connections of the run stay as they are)."""
    settings.DATABASES = {**settings.DATABASES, "default": {**settings.DATABASES["default"], "ENGINE": engine}}


@pytest.fixture
def sound(settings: Any) -> Any:
    """A production configuration that passes every check; tests spoil one part.
    Its database is Postgres whatever the run's is (the suite has a SQLite pass)."""
    for name, value in SOUND.items():
        setattr(settings, name, value)
    use_engine(settings, "django.db.backends.postgresql")
    return settings


def ids(**kwargs: Any) -> list[str]:
    return sorted(m.id for m in checks.run_checks(tags=["mcptasks"], **kwargs))


def mcp(settings: Any, **values: Any) -> None:
    settings.MCPTASKS = {**SOUND["MCPTASKS"], **values}


def test_a_sound_production_configuration_passes(sound):
    assert ids() == []


def test_the_checks_run_with_manage_py_check(sound):
    mcp(sound, AUTHENTICATION_CLASSES=[], ALLOW_ANONYMOUS=False)
    with pytest.raises(SystemCheckError, match=r"mcptasks\.E002"):
        call_command("check", "--tag", "mcptasks")


def test_invalid_mcptasks_settings(sound):
    sound.MCPTASKS = {"NO_SUCH_SETTING": 1}
    assert ids() == ["mcptasks.E000"]


# Celery -----------------------------------------------------------------------------------


def test_a_throttle_cache_missing_from_caches(sound):
    mcp(sound, THROTTLE_CACHE="throttles")
    assert ids() == ["mcptasks.E007"]
    sound.CACHES = {**sound.CACHES, "throttles": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert ids() == []


def test_no_broker_anywhere(sound, monkeypatch):
    from celery import current_app

    del sound.CELERY_BROKER_URL
    monkeypatch.setattr(current_app.conf, "broker_url", None)
    assert ids() == ["mcptasks.E001"]


def test_memory_broker_in_production_warns(sound):
    sound.CELERY_BROKER_URL = "memory://"
    assert ids() == ["mcptasks.W001"]
    sound.DEBUG = True
    assert ids() == []


def test_beat_schedule_without_the_sweeper_warns(sound):
    sound.CELERY_BEAT_SCHEDULE = {"mcptasks-prune-expired": {"task": "mcptasks.prune_expired", "schedule": 60}}
    messages = checks.run_checks(tags=["mcptasks"])
    assert [m.id for m in messages] == ["mcptasks.W007"]
    assert "mcptasks.sweep" in messages[0].msg


# Channels ----------------------------------------------------------------------------------


def test_no_channel_layer_warns_while_notifications_are_on(sound):
    sound.CHANNEL_LAYERS = {}
    assert ids() == ["mcptasks.W002"]
    mcp(sound, NOTIFICATIONS=False)
    assert ids() == []


def test_in_memory_channel_layer_in_production_warns(sound):
    sound.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert ids() == ["mcptasks.W003"]
    sound.DEBUG = True
    assert ids() == []


# Database ----------------------------------------------------------------------------------


def test_postgres_in_production(sound):
    assert "postgresql" in sound.DATABASES["default"]["ENGINE"]
    assert ids() == []
    sqlite = {**sound.DATABASES["default"], "ENGINE": "django.db.backends.sqlite3"}
    sound.DATABASES = {**sound.DATABASES, "default": sqlite}
    try:
        assert ids() == ["mcptasks.W004"]
        sound.DEBUG = True
        assert ids() == []
    finally:
        sound.DATABASES = {**sound.DATABASES, "default": {**sqlite, "ENGINE": "django.db.backends.postgresql"}}


# Authentication ------------------------------------------------------------------------------


def test_nobody_can_call(sound):
    mcp(sound, AUTHENTICATION_CLASSES=[], ALLOW_ANONYMOUS=False)
    assert ids() == ["mcptasks.E002"]


def test_anonymous_only_is_fine_in_development(sound):
    mcp(sound, AUTHENTICATION_CLASSES=[], ALLOW_ANONYMOUS=True)
    assert ids() == ["mcptasks.W005"]
    sound.DEBUG = True
    assert ids() == []


def test_unimportable_authentication_class(sound):
    mcp(sound, AUTHENTICATION_CLASSES=["no.such.Authentication"])
    assert ids() == ["mcptasks.E003"]


# Timing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"DEFAULT_TTL_MS": 10_000, "MAX_TTL_MS": 5_000}, ["mcptasks.E004"]),
        ({"DEFAULT_TTL_MS": 0}, ["mcptasks.E004"]),
        ({"MAX_TTL_MS": -1}, ["mcptasks.E004"]),
        ({"DEFAULT_TTL_MS": 5_000, "MAX_TTL_MS": 5_000}, []),
        ({"LEASE_SECONDS": 10, "HEARTBEAT_SECONDS": 5}, ["mcptasks.E005"]),
        ({"LEASE_SECONDS": 10.5, "HEARTBEAT_SECONDS": 5}, []),
        ({"HEARTBEAT_SECONDS": 0}, ["mcptasks.E005"]),
        ({"CANCEL_POLL_SECONDS": 2}, ["mcptasks.W006"]),
        ({"CANCEL_POLL_SECONDS": 1}, []),
        ({"CANCEL_POLL_SECONDS": 0}, ["mcptasks.E006"]),
        ({"MAX_ATTEMPTS": 0}, ["mcptasks.E006"]),
        ({"PRUNE_BATCH_SIZE": 0}, ["mcptasks.E006"]),
        ({"PRUNE_PAUSE_SECONDS": -0.5}, ["mcptasks.E006"]),
        ({"PRUNE_PAUSE_SECONDS": 0}, []),
        ({"POLL_INTERVAL_MS": 0}, ["mcptasks.E006"]),
        ({"DISPATCH_GRACE_SECONDS": -1}, ["mcptasks.E006"]),
        ({"TELEMETRY": "verbose"}, ["mcptasks.E030"]),
        ({"TELEMETRY": "propagation"}, []),
    ],
)
def test_timing_settings(sound, values, expected):
    mcp(sound, **values)
    assert ids() == expected


def test_the_example_site_defaults_warn_only_about_production(settings):
    """The example settings (SQLite, embedded broker, in-memory layer,
    anonymous callers) are fine for DEBUG and say what to change for production."""
    use_engine(settings, "django.db.backends.sqlite3")
    settings.CELERY_BROKER_URL = "memory://"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.MCPTASKS = {**settings.MCPTASKS, "ALLOW_ANONYMOUS": True}
    settings.DEBUG = True
    assert ids() == []
    settings.DEBUG = False
    assert ids() == ["mcptasks.W001", "mcptasks.W003", "mcptasks.W004", "mcptasks.W005"]

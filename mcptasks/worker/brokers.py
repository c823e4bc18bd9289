"""Broker hardening for the Celery workers that run tools.

kombu's Redis transport can leave a worker alive but no longer consuming after
the broker goes away. When the connection breaks, Celery collects it
(``Connection.collect()``), which drops the transport's link to its
``kombu.Connection`` (``transport.client = None``) while a channel that failed
to close on the first try is still open. Celery then closes the connection
again, and the channel restores its unacknowledged messages (or Celery
acknowledges a run that finished meanwhile). Either needs a new Redis client,
and ``Channel._connparams`` reads ``self.connection.client.hostname`` and
fails with ``AttributeError``. That is neither a connection nor a channel
error to Celery, so it logs "Unrecoverable error" and the consumer stops for
good (the process lives on, so a supervisor sees nothing wrong).

:func:`harden_redis_transport` makes ``_connparams`` raise redis-py's
``ConnectionError`` in that state instead: a connection error, which Celery
ignores while closing and recovers from by reconnecting. The messages that
could not be restored stay in Redis's unacked set (kombu restores them after
the visibility timeout) or were lost with the broker; either way the sweeper
re-enqueues tasks nobody claimed, so nothing is lost.

The app applies it when a Celery worker starts with a Redis broker (its
``AppConfig.ready`` connects :func:`on_worker_init` to ``worker_init``); a site
may also call it itself, in any process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

#: Broker URL schemes served by kombu's Redis transport (``kombu.transport.redis``).
REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel"})

#: Set on the wrapper so that a second call sees the work is done.
_MARKER = "__mcptasks_hardened__"


def harden_redis_transport() -> bool:
    """Make kombu's Redis channel raise a connection error, not
    ``AttributeError``, when it needs a new client after its connection was
    closed. Idempotent; never raises.

    Returns ``True`` when the channel is hardened (now or by an earlier call),
    ``False`` when it cannot be: the ``redis`` package is not installed, or
    kombu's internals no longer have the shape this relies on (then nothing is
    changed).
    """
    try:
        from kombu.transport import redis as kombu_redis
        from redis.exceptions import ConnectionError as RedisConnectionError
    except ImportError:
        return False
    channel_class = getattr(kombu_redis, "Channel", None)
    original = getattr(channel_class, "_connparams", None)
    if channel_class is None or not callable(original):
        logger.info("kombu's Redis channel has no _connparams; the broker hardening is not applied")
        return False
    if getattr(original, _MARKER, False):
        return True

    @functools.wraps(original)
    def _connparams(self: Any, *args: Any, **kwargs: Any) -> Any:
        transport = getattr(self, "connection", None)
        if transport is None or getattr(transport, "client", None) is None:
            logger.warning("a Redis broker channel outlived its connection; raising a connection error to reconnect")
            raise RedisConnectionError("the broker connection of this channel is closed")
        return original(self, *args, **kwargs)

    setattr(_connparams, _MARKER, True)
    channel_class._connparams = _connparams
    return True


def uses_redis(urls: Iterable[Any]) -> bool:
    """Whether any of these broker URLs (strings, lists of them, or
    ``;``-separated failover lists, as Celery accepts) is served by kombu's
    Redis transport."""
    for url in urls:
        if not url:
            continue
        candidates = url if isinstance(url, list | tuple) else str(url).split(";")
        for candidate in candidates:
            scheme = str(candidate).strip().partition("://")[0].lower()
            if scheme in REDIS_SCHEMES:
                return True
    return False


def on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    """Celery's ``worker_init`` receiver: harden the transport when the
    worker's broker is Redis. Never lets an error stop the worker."""
    try:
        conf = sender.app.conf
        urls = (conf.broker_url, conf.broker_read_url, conf.broker_write_url)
        if uses_redis(urls):
            harden_redis_transport()
    except Exception:
        logger.warning("could not apply the Redis broker hardening", exc_info=True)


def connect() -> None:
    """Connect :func:`on_worker_init` to Celery's ``worker_init`` signal (once)."""
    from celery import signals

    signals.worker_init.connect(on_worker_init, dispatch_uid="mcptasks.brokers.on_worker_init", weak=False)

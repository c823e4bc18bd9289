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

:func:`keep_redis_clients` is a cost, not a safety, fix: kombu's Redis channel
builds a new redis-py client object for every command it sends without one
(each publish, each acknowledgement), and building one costs more CPU than
the publish's own round trip. The channel keeps one instead, on the same
connection pool. The worker applies it with the hardening; the web process,
at its first run publish on a Redis broker (:func:`before_first_publish`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable, Iterator
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


#: Set on the patched ``conn_or_acquire`` so that a second call sees the work is done.
_KEEPS = "__mcptasks_keeps_clients__"


def keep_redis_clients() -> bool:
    """Make kombu's Redis channel reuse one redis-py client for the commands
    it sends without a client of their own, instead of building one each
    time. Idempotent; never raises.

    The kept client is tied to the channel's connection pool: when the
    channel drops its pools (closing, or in a forked child), the next command
    builds a client on the new pool, as before. A redis-py client holds no
    connection of its own (each command takes one from the pool), so threads
    may share it. Returns ``False``, changing nothing, when kombu's internals
    no longer have the shape this relies on.
    """
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:
        return False
    channel_class = getattr(kombu_redis, "Channel", None)
    original = getattr(channel_class, "conn_or_acquire", None)
    if channel_class is None or not callable(original) or not callable(getattr(channel_class, "_create_client", None)):
        logger.info("kombu's Redis channel has no conn_or_acquire/_create_client; its clients are not kept")
        return False
    if getattr(original, _KEEPS, False):
        return True

    @contextlib.contextmanager
    def conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        kept = self.__dict__.get("_mcptasks_client")
        # ``_pool`` is None once the channel dropped its pools: build anew.
        if kept is None or kept.connection_pool is not getattr(self, "_pool", None):
            kept = self._create_client()
            self.__dict__["_mcptasks_client"] = kept
        yield kept

    setattr(conn_or_acquire, _KEEPS, True)
    conn_or_acquire.__wrapped__ = original  # type: ignore[attr-defined]
    channel_class.conn_or_acquire = conn_or_acquire
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


@functools.cache
def before_first_publish(app: Any) -> None:
    """Once per Celery app, in the process that publishes runs: on a Redis broker,
    :func:`keep_redis_clients`. Never raises."""
    try:
        conf = app.conf
        if uses_redis((conf.broker_url, conf.broker_write_url)):
            keep_redis_clients()
    except Exception:  # a cost, not a safety, measure: publish as Celery would
        logger.warning("could not check the broker before publishing", exc_info=True)


def on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    """Celery's ``worker_init`` receiver: harden the transport when the
    worker's broker is Redis. Never lets an error stop the worker."""
    try:
        conf = sender.app.conf
        urls = (conf.broker_url, conf.broker_read_url, conf.broker_write_url)
        if uses_redis(urls):
            harden_redis_transport()
            keep_redis_clients()
    except Exception:
        logger.warning("could not apply the Redis broker hardening", exc_info=True)


def connect() -> None:
    """Connect :func:`on_worker_init` to Celery's ``worker_init`` signal (once)."""
    from celery import signals

    signals.worker_init.connect(on_worker_init, dispatch_uid="mcptasks.brokers.on_worker_init", weak=False)

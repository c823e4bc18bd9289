"""The Redis broker hardening (``mcptasks.worker.brokers``), on a real Redis.

The live case, a broker outage under load with every worker consuming again
afterwards, is R2 (``tests/reliability/test_live_r2_broker.py``).
"""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace

import pytest
import redis
from celery import Celery
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis

from mcptasks.worker import brokers
from tests.support.live import DEFAULT_REDIS_URL

REDIS_URL = os.environ.get("MCPTASKS_TEST_REDIS_URL", DEFAULT_REDIS_URL)


@pytest.fixture
def broker() -> Connection:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    connection = Connection(REDIS_URL)
    yield connection
    connection.release()


def test_hardening_is_idempotent_and_keeps_the_original():
    assert brokers.harden_redis_transport()
    patched = kombu_redis.Channel._connparams
    assert brokers.harden_redis_transport()
    assert kombu_redis.Channel._connparams is patched
    assert not getattr(patched.__wrapped__, "__mcptasks_hardened__", False)


def test_a_collected_channel_fails_with_a_connection_error(broker):
    """What a worker does when Redis drops: Celery collects the connection,
    then the channel needs a client again (to restore unacked messages)."""
    brokers.harden_redis_transport()
    channel = broker.channel()
    assert channel.client.ping()
    broker.collect()
    assert channel.connection is None or channel.connection.client is None
    with pytest.raises(redis.exceptions.ConnectionError) as caught:
        channel._create_client()
    # Celery recovers from kombu's connection errors (and ignores them while closing).
    assert isinstance(caught.value, broker.connection_errors)


def test_an_open_channel_is_unaffected(broker):
    brokers.harden_redis_transport()
    channel = broker.channel()
    assert channel._connparams()["db"] == channel._prepare_virtual_host(broker.virtual_host)
    assert channel._create_client().ping()


@pytest.mark.parametrize(
    ("urls", "expected"),
    [
        (("redis://127.0.0.1:6379/0", None, None), True),
        (("rediss://cache.example:6380/0", None, None), True),
        (("sentinel://a:26379;sentinel://b:26379", None, None), True),
        ((["amqp://a//", "redis://b/0"], None, None), True),
        (("amqp://guest@localhost//", None, None), False),
        (("memory://", None, None), False),
        (("amqp://a//", "redis://b/0", None), True),
        ((None, None, None), False),
    ],
)
def test_which_brokers_are_redis(urls, expected):
    assert brokers.uses_redis(urls) is expected


def test_the_worker_init_receiver_never_raises():
    # A sender without an app (or with an odd configuration) is logged, not raised.
    brokers.on_worker_init(sender=None)
    brokers.on_worker_init(sender=SimpleNamespace(app=Celery(broker="memory://", set_as_current=False)))
    brokers.on_worker_init(sender=SimpleNamespace(app=Celery(broker=REDIS_URL, set_as_current=False)))
    assert getattr(kombu_redis.Channel._connparams, "__mcptasks_hardened__", False)
    assert getattr(kombu_redis.Channel.conn_or_acquire, "__mcptasks_keeps_clients__", False)


def test_keeping_clients_is_idempotent_and_keeps_the_original():
    assert brokers.keep_redis_clients()
    patched = kombu_redis.Channel.conn_or_acquire
    assert brokers.keep_redis_clients()
    assert kombu_redis.Channel.conn_or_acquire is patched
    assert not getattr(patched.__wrapped__, "__mcptasks_keeps_clients__", False)


def _publish(connection: Connection, queue: str, body: str) -> None:
    with connection.Producer() as producer:
        producer.publish(body, routing_key=queue, declare=[Queue(queue)], serializer="json")


def test_a_channel_publishes_every_message_through_one_kept_client(broker):
    brokers.keep_redis_clients()
    queue = f"mcptasks-test-kept-{uuid.uuid4().hex}"
    channel = broker.default_channel
    try:
        _publish(broker, queue, "first")
        kept = channel.__dict__["_mcptasks_client"]
        assert kept.connection_pool is channel.pool
        _publish(broker, queue, "second")
        assert channel.__dict__["_mcptasks_client"] is kept
        # A command given its own client still uses that one.
        own = channel._create_client()
        with channel.conn_or_acquire(own) as used:
            assert used is own
        bodies = [broker.SimpleQueue(queue).get(timeout=5) for _ in range(2)]
        assert sorted(m.payload for m in bodies) == ["first", "second"]
        for m in bodies:
            m.ack()
    finally:
        redis.Redis.from_url(REDIS_URL).delete(queue)


def test_a_channel_that_dropped_its_pools_builds_a_new_client(broker):
    """What closing a channel, or forking a process, does to its pools: the
    kept client of the old pool is never used again."""
    brokers.keep_redis_clients()
    queue = f"mcptasks-test-kept-{uuid.uuid4().hex}"
    channel = broker.default_channel
    try:
        _publish(broker, queue, "before")
        old = channel.__dict__["_mcptasks_client"]
        channel._disconnect_pools()
        _publish(broker, queue, "after")
        new = channel.__dict__["_mcptasks_client"]
        assert new is not old
        assert new.connection_pool is channel.pool
        assert old.connection_pool is not channel.pool
        assert redis.Redis.from_url(REDIS_URL).llen(queue) == 2
    finally:
        redis.Redis.from_url(REDIS_URL).delete(queue)

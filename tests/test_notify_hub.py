"""The listeners of one event loop share one channel on the Redis layer
(``notify._Hub``): a group is joined once, every listener of it hears each
message, keep-alive timeouts lose nothing, and the receive loop ends once
nobody listens."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from channels_redis.core import RedisChannelLayer
from django.test import override_settings

from mcptasks.notify import fabric as notify
from tests.support.live import DEFAULT_REDIS_URL

REDIS_URL = os.environ.get("MCPTASKS_TEST_REDIS_URL", DEFAULT_REDIS_URL)

pytestmark = pytest.mark.redis


def _layer() -> RedisChannelLayer:
    return RedisChannelLayer(hosts=[REDIS_URL], prefix=f"mcptasks-test-{uuid.uuid4().hex[:8]}")


def _message(group: str, n: int) -> dict[str, object]:
    return {"type": notify.MESSAGE_TYPE, "group": group, "task_id": group, "at": n}


def _listener(layer: RedisChannelLayer, groups: list[str]) -> notify.Listener:
    listener = notify.Listener(groups)
    listener.layer = layer
    return listener


@override_settings(MCPTASKS={"KEEPALIVE_SECONDS": 0.2})
def test_listeners_of_a_loop_share_one_channel_and_lose_nothing_to_timeouts() -> None:
    layer = _layer()
    shared, own = f"g.{uuid.uuid4().hex}", f"g.{uuid.uuid4().hex}"

    async def scenario() -> None:
        async with _listener(layer, [shared]) as a, _listener(layer, [shared, own]) as b:
            assert a.channel == b.channel
            members = await layer.connection(layer.consistent_hash(shared)).zrange(layer._group_key(shared), 0, -1)
            assert len(members) == 1  # joined once for both
            got: dict[str, list[object]] = {"a": [], "b": []}

            async def read(name: str, listener: notify.Listener, want: int) -> None:
                while len(got[name]) < want:
                    # Timeouts far shorter than the gaps between messages.
                    message = await listener.receive(0.005)
                    if message is not None:
                        got[name].append(message["at"])

            readers = asyncio.gather(read("a", a, 20), read("b", b, 30))
            for n in range(20):
                await layer.group_send(shared, _message(shared, n))
                if n % 2:
                    await layer.group_send(own, _message(own, 100 + n))
                await asyncio.sleep(0.02)
            await asyncio.wait_for(readers, 10)
            assert got["a"] == list(range(20))
            assert sorted(got["b"]) == sorted([*range(20), *(100 + n for n in range(1, 20, 2))])
            hub = notify._hubs[asyncio.get_running_loop()]
            receiver = hub._receiver
            assert receiver is not None and not receiver.done()
        # Nobody listens: the memberships are gone and the receive loop ended by itself.
        assert not hub.members
        assert receiver.done() and not receiver.cancelled()
        assert not await layer.connection(layer.consistent_hash(shared)).zrange(layer._group_key(shared), 0, -1)
        await layer.flush()

    asyncio.run(scenario())

"""Task changes reach the Channels layer only when someone follows them
(``mcptasks.notify.followers``), and a follower still misses nothing: a
``subscriptions/listen`` stream opened just before, just after, or racing a
run's finish sees the final state, and a legacy session's stream hears its
task's status. Counted on a real Redis channel layer."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.test import override_settings
from django.utils import timezone

from mcptasks.models import LegacySession
from mcptasks.notify import fabric as notify
from mcptasks.notify import followers
from mcptasks.protocol.legacy import sessions
from mcptasks.protocol.legacy.streams import session_stream
from mcptasks.protocol.subscriptions import listen_stream
from mcptasks.tasks import lifecycle
from tests.support.factories import WORKER, running_task
from tests.support.live import DEFAULT_REDIS_URL
from tests.support.waiting import wait_until

REDIS_URL = os.environ.get("MCPTASKS_TEST_REDIS_URL", DEFAULT_REDIS_URL)
DONE = {"content": [{"type": "text", "text": "done"}], "isError": False}

pytestmark = [pytest.mark.django_db(transaction=True)]


class CountingLayer(RedisChannelLayer):
    """The real Redis layer, counting the groups it is asked to send to."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.sent.append(group)
        await super().group_send(group, message)


@pytest.fixture(autouse=True)
def counting_layer() -> Iterator[CountingLayer]:
    backend = {
        "BACKEND": f"{__name__}.CountingLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": f"mcptasks-test-{uuid.uuid4().hex[:8]}"},
    }
    with override_settings(CHANNEL_LAYERS={"default": backend}):
        layer = get_channel_layer()
        assert isinstance(layer, CountingLayer)
        yield layer


def _finish(task_id: str) -> None:
    assert lifecycle.complete(task_id, DONE, worker=WORKER)


def _statuses_until_terminal(task_id: str, opened: threading.Event | None = None) -> list[str]:
    """Everything a listen stream for the task says, up to its final state."""

    async def follow() -> list[str]:
        statuses: list[str] = []
        stream = listen_stream("sub-1", {}, [task_id])
        try:
            async for message in stream:
                if message is None:
                    continue
                if message["method"] == "notifications/tasks":
                    statuses.append(message["params"]["status"])
                    if opened is not None:  # the first is the state read after joining
                        opened.set()
                    if message["params"]["status"] == "completed":
                        return statuses
        finally:
            await stream.aclose()
        return statuses

    return asyncio.run(asyncio.wait_for(follow(), 20))


class Following(threading.Thread):
    """A listen stream for one task, on its own event loop; ``opened`` once
    it has sent the state it starts from."""

    def __init__(self, task_id: str) -> None:
        super().__init__(daemon=True)
        self.task_id = task_id
        self.opened = threading.Event()
        self.statuses: list[str] | None = None

    def run(self) -> None:
        self.statuses = _statuses_until_terminal(self.task_id, self.opened)


def test_a_change_nobody_follows_is_not_sent_and_a_followed_one_is(counting_layer: CountingLayer) -> None:
    unfollowed = running_task()
    _finish(unfollowed.id)

    followed = running_task()
    stream = Following(followed.id)
    stream.start()
    assert stream.opened.wait(10)
    _finish(followed.id)
    stream.join(20)
    assert stream.statuses == ["working", "completed"]
    wait_until(lambda: notify.task_group(followed.id) in counting_layer.sent)
    time.sleep(0.3)  # the publisher's queue is in order: anything for the first task went before
    assert notify.task_group(unfollowed.id) not in counting_layer.sent
    assert counting_layer.sent == [notify.task_group(followed.id)]


def test_a_stream_opened_after_the_finish_starts_from_the_final_state(counting_layer: CountingLayer) -> None:
    task = running_task()
    _finish(task.id)
    assert _statuses_until_terminal(task.id) == ["completed"]
    assert counting_layer.sent == []


def test_a_stream_racing_the_finish_always_ends_with_the_final_state() -> None:
    for _ in range(12):
        task = running_task()
        stream = Following(task.id)
        stream.start()
        time.sleep(random.uniform(0, 0.05))  # the finish lands anywhere around the stream's opening
        _finish(task.id)
        stream.join(25)
        assert stream.statuses is not None and stream.statuses[-1] == "completed"


def test_the_registration_lapses_and_goes_with_the_stream(counting_layer: CountingLayer) -> None:
    registry = followers.registry_of(counting_layer)
    assert isinstance(registry, followers.RedisRegistry)
    group = notify.task_group("t-lapse")

    async def scenario() -> None:
        await registry.register([group], "channel-a", ttl=0.5)
        assert registry.is_followed(group)
        await asyncio.sleep(0.7)
        assert not registry.is_followed(group), "a process killed while following stops counting"
        await registry.register([group], "channel-b", ttl=30)
        await registry.unregister([group], "channel-b")
        assert not registry.is_followed(group)

    asyncio.run(scenario())


def test_a_legacy_task_is_sent_only_while_its_session_stream_listens(counting_layer: CountingLayer) -> None:
    now = timezone.now()
    session = LegacySession.objects.create(
        owner="alice", protocol_version="2025-11-25", created_at=now, last_seen_at=now
    )
    group = sessions.session_group(session.pk)
    quiet, heard = running_task(era="2025-11-25"), running_task(era="2025-11-25")
    sessions.link_task(quiet, session)
    sessions.link_task(heard, session)
    _finish(quiet.id)

    received: list[dict[str, Any]] = []
    listening = threading.Event()

    async def listen() -> None:
        stream = session_stream(session.pk)
        reading = asyncio.ensure_future(stream.__anext__())
        await asyncio.to_thread(wait_until, lambda: followers.is_followed(counting_layer, group))
        listening.set()
        try:
            while True:
                message = await reading
                if message is not None:
                    received.append(message)
                    return
                reading = asyncio.ensure_future(stream.__anext__())
        finally:
            await stream.aclose()

    listener = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(listen(), 20)), daemon=True)
    listener.start()
    assert listening.wait(15)
    _finish(heard.id)
    listener.join(20)
    assert [m["params"]["taskId"] for m in received] == [heard.id]
    assert received[0]["params"]["status"] == "completed"
    assert group in counting_layer.sent
    assert counting_layer.sent.count(group) == 1, "the first task's finish, unheard, was not sent"

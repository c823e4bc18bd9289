"""A run's Celery message built from the template is the message
``apply_async`` sends (kombu's body, headers and properties), and the event
loop publishes it with redis.asyncio to the queue a worker consumes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from mcptasks.tasks import dispatch
from mcptasks.tasks.dispatch import Route
from mcptasks.worker import dispatch as worker_dispatch
from mcptasks.worker.jobs import run_task
from mcptasks.worker.messages import LoopPublisher, RunMessages, loop_sender

REDIS_URL = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def queue(settings: Any) -> Iterator[str]:
    name = f"mcptasks-runs-{uuid.uuid4().hex[:8]}"
    settings.MCPTASKS = {**settings.MCPTASKS, "CELERY_QUEUE": name}
    yield name
    redis.Redis.from_url(REDIS_URL).delete(name)


def _popped(queue: str) -> dict[str, Any]:
    raw = redis.Redis.from_url(REDIS_URL).rpop(queue)
    assert raw is not None, "nothing was published"
    return json.loads(raw)


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its own ids (fresh for every message) named, not valued."""
    message_id = message["headers"]["id"]
    assert message["headers"]["root_id"] == message["properties"]["correlation_id"] == message_id
    headers = {**message["headers"], "id": "<id>", "root_id": "<id>"}
    properties = {**message["properties"], "correlation_id": "<id>", "delivery_tag": "<tag>"}
    body = json.loads(base64.b64decode(message["body"]))
    return {**message, "headers": headers, "properties": properties, "body": body}


def test_the_template_builds_the_message_apply_async_sends(queue):
    with run_task.app.connection_for_write(REDIS_URL) as connection:
        run_task.apply_async(
            ("task-a",),
            connection=connection,
            retry=True,
            retry_policy=worker_dispatch.PUBLISH_RETRY_POLICY,
            queue=queue,
        )
    sent = _popped(queue)
    built = json.loads(RunMessages().message("task-a"))
    assert _without_ids(built) == _without_ids(sent)
    assert set(built) == set(sent) and set(built["properties"]) == set(sent["properties"])


def test_the_loop_publishes_a_run_to_the_queue(queue):
    publisher = LoopPublisher(RunMessages(), REDIS_URL)
    assert asyncio.run(publisher.send("task-b")) is True
    message = _popped(queue)
    assert json.loads(base64.b64decode(message["body"]))[0] == ["task-b"]
    assert message["headers"]["task"] == run_task.name


def test_a_broker_that_is_not_redis_keeps_runs_on_threads():
    from mcptasks.worker import messages

    # The tests' in-process broker (memory://), or none where another test left
    # a Celery app of its own current: either way not Redis.
    assert not str(messages._broker_url()).startswith(("redis://", "rediss://"))
    assert loop_sender() is None
    assert dispatch.loop_sender() is None


def test_a_redis_broker_sends_runs_from_the_loop(queue, monkeypatch):
    from mcptasks.worker import messages

    monkeypatch.setattr(messages, "_broker_url", lambda: REDIS_URL)
    send = dispatch.loop_sender()
    assert send is not None
    assert asyncio.run(send("task-c")) is True
    assert json.loads(base64.b64decode(_popped(queue)["body"]))[0] == ["task-c"]


def test_a_tools_queue_and_hard_limit_are_in_the_message_as_apply_async_puts_them(queue):
    own = f"{queue}-gpu"
    try:
        with run_task.app.connection_for_write(REDIS_URL) as connection:
            run_task.apply_async(("task-d",), connection=connection, queue=own, time_limit=5.0)
        sent = _popped(own)
        built = json.loads(RunMessages(own).message("task-d", kill_after=5.0))
        assert _without_ids(built) == _without_ids(sent)
        assert built["headers"]["timelimit"] == [5.0, None]
        # The loop's publisher sends each run to its route's queue.
        publisher = LoopPublisher(RunMessages(), REDIS_URL)
        assert asyncio.run(publisher.send("task-e", Route(own, kill_after=3.0))) is True
        message = _popped(own)
        assert json.loads(base64.b64decode(message["body"]))[0] == ["task-e"]
        assert message["headers"]["timelimit"] == [3.0, None]
    finally:
        redis.Redis.from_url(REDIS_URL).delete(own)

"""A run's Celery message, built once from a template, and its publish with
``redis.asyncio`` (the event loop's creation path).

``apply_async`` routes, serializes and wraps every message anew, on a
thread. A run's message differs from the last only in the task id and the
message's own ids, so the web process builds the rest once, with Celery's
own routing (``app.amqp.router``) and message factory
(``app.amqp.as_task_v2``), and fills in those per message: the same bytes
that kombu's Redis transport would ``LPUSH`` (``tests/test_run_messages.py``
compares them with ``apply_async``'s).

Only where that is exactly what kombu would do: a ``redis://`` or
``rediss://`` broker, JSON, no compression, no priority, no key prefix, a
direct route to a queue of the same name. Anything else gets ``None`` from
:func:`loop_publisher`, and creation takes the thread path, which publishes
with ``apply_async`` as before.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from kombu.utils.json import dumps

from ..conf import settings
from ..tasks import dispatch
from .jobs import run_task

logger = logging.getLogger("mcptasks.runtime")

_PROBE = "mcptasks-probe"


class RunMessages:
    """The template of ``run_task``'s messages for one queue (``None``: the
    site's ``CELERY_QUEUE``, else Celery's default route)."""

    def __init__(self, queue_name: str | None = None) -> None:
        app = run_task.app
        options: dict[str, Any] = dict(run_task._get_exec_options())  # type: ignore[attr-defined]
        queue_name = queue_name or settings.CELERY_QUEUE
        if queue_name:
            options["queue"] = queue_name
        ignore_result = options.pop("ignore_result", None)
        if ignore_result is None:
            ignore_result = run_task.ignore_result
        routed = app.amqp.router.route(options, run_task.name, (_PROBE,), {}, None)
        queue = routed["queue"]
        exchange, routing_key = routed.get("exchange"), routed.get("routing_key")
        exchange_type = routed.get("exchange_type") or queue.exchange.type or "direct"
        # As ``send_task_message`` does: a direct route without both an
        # exchange and a key goes to the queue through the anonymous exchange.
        if (not exchange or not routing_key) and exchange_type == "direct":
            exchange, routing_key = "", queue.name
        self.exchange = getattr(exchange, "name", exchange)
        self.routing_key = routing_key
        self.queue = queue.name
        # kombu's Redis transport: the anonymous exchange delivers to the queue
        # named by the key; any other is looked up in bindings (not done here).
        self.direct = self.exchange == ""
        self.priority = routed.get("priority") or 0
        self.delivery_mode = routed.get("delivery_mode") or queue.exchange.delivery_mode or 2
        probe = app.amqp.as_task_v2(
            _PROBE, run_task.name, args=(_PROBE,), kwargs={}, reply_to=app.thread_oid, ignore_result=ignore_result
        )
        self.headers = {k: v for k, v in probe.headers.items() if k not in ("id", "root_id", "argsrepr")}
        self.embed = probe.body[2]
        self.reply_to = probe.properties["reply_to"]

    def message(self, task_id: str, kill_after: float | None = None) -> bytes:
        """One run of ``task_id``, as kombu's Redis transport stores it
        (with Celery's hard time limit ``kill_after``, if any)."""
        message_id = str(uuid.uuid4())
        headers = {**self.headers, "id": message_id, "root_id": message_id, "argsrepr": repr((task_id,))}
        if kill_after:
            headers["timelimit"] = [kill_after, None]
        body = dumps([[task_id], {}, self.embed]).encode()
        envelope = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": message_id,
                "reply_to": self.reply_to,
                "delivery_mode": self.delivery_mode,
                "delivery_info": {"exchange": self.exchange, "routing_key": self.routing_key},
                "priority": self.priority,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        return dumps(envelope).encode()


def _broker_url() -> Any:
    """Where Celery publishes (its write URL, else its URL)."""
    conf = run_task.app.conf
    return conf.broker_write_url or conf.broker_url or ""


def _template_applies(messages: RunMessages) -> bool:
    conf = run_task.app.conf
    url = _broker_url()
    urls = url if isinstance(url, list | tuple) else [url]
    if len(urls) != 1 or not isinstance(urls[0], str) or urls[0].split("://", 1)[0] not in ("redis", "rediss"):
        return False
    transport = conf.broker_transport_options or {}
    return (
        ";" not in urls[0]  # not a failover list
        and not transport.get("global_keyprefix")
        and conf.task_serializer == "json"
        and not conf.task_compression
        and _route_applies(messages)
    )


def _route_applies(messages: RunMessages) -> bool:
    """The queue's route is one kombu's Redis transport takes as the template does."""
    return messages.direct and not messages.priority


class LoopPublisher:
    """Publishes runs on the running event loop, one redis.asyncio client
    per loop (its connections belong to that loop), with one template per
    queue. A queue whose route the template cannot follow (or a delayed run)
    is published by Celery's own path, on a thread."""

    def __init__(self, messages: RunMessages, url: str) -> None:
        self.messages = messages
        self.url = url
        self.clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self.by_queue: dict[str | None, RunMessages | None] = {messages.queue: messages}

    def _messages(self, queue_name: str | None) -> RunMessages | None:
        if queue_name not in self.by_queue:
            try:
                messages = RunMessages(queue_name)
                self.by_queue[queue_name] = messages if _route_applies(messages) else None
            except Exception:  # a cost, not a safety, measure: the thread path publishes as Celery would
                logger.warning("could not build the run message template of queue %s", queue_name, exc_info=True)
                self.by_queue[queue_name] = None
        return self.by_queue[queue_name]

    async def send(self, task_id: str, route: dispatch.Route | None = None) -> bool:
        """``LPUSH`` one run of ``task_id``. ``False`` when it could not be
        sent: the row is durable, and the sweeper re-enqueues it later."""
        from redis import asyncio as aioredis

        route = route or dispatch.Route(self.messages.queue)
        messages = self._messages(route.queue or self.messages.queue) if not route.countdown else None
        if messages is None:
            return await asyncio.to_thread(dispatch.send_on_thread, task_id, route)
        loop = asyncio.get_running_loop()
        client = self.clients.get(loop)
        if client is None:
            client = self.clients[loop] = aioredis.Redis.from_url(self.url)
        try:
            await client.lpush(messages.queue, messages.message(task_id, route.kill_after))
        except Exception:
            logger.warning("could not enqueue task %s; the sweeper will retry", task_id, exc_info=True)
            return False
        return True


_publishers: dict[tuple[Any, ...], LoopPublisher | None] = {}


def loop_sender() -> Callable[[str, dispatch.Route], Awaitable[bool]] | None:
    """The event loop's sender of runs for the current configuration, or
    ``None`` where the template would not be what Celery sends (creation
    then stays on a thread)."""
    # Keyed by what the broker's URL is read from, not by the URL (reading
    # Celery's configuration costs more than the rest of the check): a
    # process configures its Celery app once, before it serves.
    key = (settings.CELERY_QUEUE, _broker_url, run_task.app)
    if key not in _publishers:
        _publishers[key] = _publisher()
    publisher = _publishers[key]
    return publisher.send if publisher is not None else None


def _publisher() -> LoopPublisher | None:
    try:
        messages = RunMessages()
        if not _template_applies(messages):
            return None
        return LoopPublisher(messages, _broker_url())
    except Exception:  # a cost, not a safety, measure: the thread path publishes as Celery would
        logger.warning("could not build the run message template", exc_info=True)
        return None

"""A run's Celery message built once per queue from a template, and published with
``redis.asyncio`` on the event loop (docs/architecture.md says where and why)."""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from kombu.utils.json import dumps

from ..conf import settings
from ..tasks import dispatch
from .jobs import run_task

logger = logging.getLogger("mcptasks.runtime")

_PROBE = "mcptasks-probe"


class RunMessages:
    """``run_task``'s messages to one queue (``None``: ``CELERY_QUEUE``, else Celery's default route),
    from Celery's router and message factory: the bytes kombu's Redis transport would ``LPUSH``."""

    def __init__(self, queue_name: str | None = None) -> None:
        app = run_task.app
        options: dict[str, Any] = dict(run_task._get_exec_options())  # type: ignore[attr-defined]
        options["queue"] = queue_name or settings.CELERY_QUEUE or options["queue"]
        routed = app.amqp.router.route(options, run_task.name, (_PROBE,), {}, None)
        queue = routed["queue"]
        exchange, routing_key = routed.get("exchange"), routed.get("routing_key")
        exchange_type = routed.get("exchange_type") or queue.exchange.type or "direct"
        # As ``send_task_message`` does: a direct route short of an exchange or key takes the anonymous one.
        if (not exchange or not routing_key) and exchange_type == "direct":
            exchange, routing_key = "", queue.name
        self.exchange = getattr(exchange, "name", exchange)
        self.queue = queue.name
        self.priority = routed.get("priority") or 0
        probe = app.amqp.as_task_v2(
            _PROBE, run_task.name, args=(_PROBE,), reply_to=app.thread_oid, ignore_result=run_task.ignore_result
        )
        self.headers = {k: v for k, v in probe.headers.items() if k not in ("id", "root_id", "argsrepr")}
        self.embed = probe.body[2]
        self.properties = {
            "reply_to": probe.properties["reply_to"],
            "delivery_mode": routed.get("delivery_mode") or queue.exchange.delivery_mode or 2,
            "delivery_info": {"exchange": self.exchange, "routing_key": routing_key},
            "priority": self.priority,
            "body_encoding": "base64",
        }

    def message(self, task_id: str, kill_after: float | None = None) -> bytes:
        """One run of ``task_id`` (with Celery's hard time limit ``kill_after``)."""
        message_id = str(uuid.uuid4())
        headers = {**self.headers, "id": message_id, "root_id": message_id, "argsrepr": repr((task_id,))}
        if kill_after:
            headers["timelimit"] = [kill_after, None]
        envelope = {
            "body": base64.b64encode(dumps([[task_id], {}, self.embed]).encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {**self.properties, "correlation_id": message_id, "delivery_tag": str(uuid.uuid4())},
        }
        return dumps(envelope).encode()


def _broker_url() -> Any:  # where Celery publishes
    return run_task.app.conf.broker_write_url or run_task.app.conf.broker_url or ""


def _template(queue_name: str | None) -> RunMessages | None:
    """The queue's template, where kombu's Redis transport takes its route as the template does."""
    try:
        messages = RunMessages(queue_name)
    except Exception:  # a cost, not a safety, measure: the thread path publishes as Celery would
        logger.warning("could not build the run message template of queue %s", queue_name, exc_info=True)
        return None
    # The anonymous exchange delivers to the queue the key names (any other, through its bindings).
    return messages if messages.exchange == "" and not messages.priority else None


class LoopPublisher:
    """Publishes runs on the running event loop: a redis.asyncio client per loop, a template per
    queue. A delayed run, or one whose route no template follows, goes by Celery's path on a thread."""

    def __init__(self, messages: RunMessages, url: str) -> None:
        self.messages = messages
        self.url = url
        self.clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self.by_queue: dict[str, RunMessages | None] = {messages.queue: messages}

    async def send(self, task_id: str, route: dispatch.Route | None = None) -> bool:
        from redis import asyncio as aioredis

        route = route or dispatch.Route(self.messages.queue)
        queue = route.queue or self.messages.queue
        if queue not in self.by_queue:
            self.by_queue[queue] = _template(queue)
        messages = self.by_queue[queue]
        if messages is None or route.countdown:
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


def loop_sender() -> dispatch.LoopSender | None:
    return _sender(settings.CELERY_QUEUE, _broker_url, run_task.app)


# Keyed by what the URL is read from, not the URL, which costs more to read: a
# process configures its Celery app once, before it serves.
@functools.cache
def _sender(queue_name: str | None, broker_url: Callable[[], Any], app: Any) -> dispatch.LoopSender | None:
    url = broker_url()
    if isinstance(url, list | tuple) and len(url) == 1:
        url = url[0]
    # Only where the template is what kombu sends: one redis:// or rediss:// URL (no
    # failover list), JSON, no compression, no key prefix (and a direct route).
    one_redis = isinstance(url, str) and url.split("://", 1)[0] in ("redis", "rediss") and ";" not in url
    conf = app.conf
    as_is = conf.task_serializer == "json" and not conf.task_compression
    if not (one_redis and as_is and not (conf.broker_transport_options or {}).get("global_keyprefix")):
        return None
    messages = _template(queue_name)
    return LoopPublisher(messages, url).send if messages is not None else None

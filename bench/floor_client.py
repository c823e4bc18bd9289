"""The publishers of the throughput floor (bench/celery_floor.py), one process.

``python -m bench.floor_client PUBLISHERS WARMUP SECONDS KEY_PREFIX``, with
the bench's mcptasks environment (``Bench.mcp_env``). Each publisher thread
publishes ``bench.floor_noop`` exactly as mcptasks publishes a run
(``mcptasks.worker.dispatch.enqueue_run``: the same Celery app, queue, retry
policy and broker client) and waits for the worker's reply before the next, so
as many messages are in flight as there are publishers.

It prints ``begin`` and ``end`` around the measured window (the bench meters
CPU between the two), then one JSON line of results, and exits when its stdin
closes, so that it is still alive when the bench reads its CPU.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import uuid


def main() -> None:
    publishers, warmup, seconds, prefix = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    import django

    django.setup()
    import redis
    from django.conf import settings as django_settings
    from mcptasks.conf import settings
    from mcptasks.worker import brokers, dispatch

    from bench.benchapp.tasks import floor_noop

    conf = floor_noop.app.conf
    if brokers.uses_redis((conf.broker_url, conf.broker_write_url)):
        brokers.keep_redis_clients()  # as dispatch does in the web process
    options = {"queue": settings.CELERY_QUEUE} if settings.CELERY_QUEUE else {}
    replies = redis.Redis.from_url(django_settings.REDIS_URL or conf.broker_url)
    window = {"begin": float("inf"), "end": float("inf")}
    stop = threading.Event()
    counts = [0] * publishers
    published = [0] * publishers
    timeouts = [0] * publishers
    latencies: list[list[float]] = [[] for _ in range(publishers)]

    def publisher(index: int) -> None:
        key = f"{prefix}{index}-{uuid.uuid4().hex[:8]}"
        try:
            while not stop.is_set():
                t0 = time.monotonic()
                floor_noop.apply_async((key,), retry=True, retry_policy=dispatch.PUBLISH_RETRY_POLICY, **options)
                published[index] += 1
                if replies.blpop([key], timeout=5) is None:
                    timeouts[index] += 1
                    continue
                now = time.monotonic()
                if window["begin"] <= now < window["end"]:
                    counts[index] += 1
                    latencies[index].append(now - t0)
        finally:
            replies.delete(key)

    threads = [threading.Thread(target=publisher, args=(i,), daemon=True) for i in range(publishers)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    window["begin"] = time.monotonic()
    print("begin", flush=True)
    time.sleep(seconds)
    window["end"] = time.monotonic()
    print("end", flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    executed = sum(counts)
    lat = sorted(x * 1000 for per in latencies for x in per)
    elapsed = window["end"] - window["begin"]
    out = {
        "executed": executed,
        "rate": executed / elapsed,
        "published": sum(published),
        "timeouts": sum(timeouts),
        "latency_p50_ms": statistics.median(lat) if lat else None,
        "latency_p99_ms": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] if lat else None,
    }
    print(json.dumps(out), flush=True)
    sys.stdin.read()  # the bench closes it once it has read this process's CPU


if __name__ == "__main__":
    main()

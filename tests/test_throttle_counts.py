"""Throttles counted in the process and synced with a shared Redis counter
(mcptasks.protocol.throttle_counts): exact in one process, within the
documented bound across processes, and still limiting while Redis is down."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from mcptasks.protocol import limits
from mcptasks.protocol.throttle_counts import LocalCounts, Push
from tests.support.waiting import wait_until

REDIS_URL = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def shared() -> Iterator[tuple[redis.Redis, str]]:
    """A real Redis and a key prefix of this test's own, removed after it."""
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"mcptasks-test-counts-{uuid.uuid4().hex[:8]}"
    try:
        yield client, prefix
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()


def redis_pusher(target: list[redis.Redis], prefix: str) -> Any:
    """What a process pushes with: SET NX EX + INCRBY per counter, pipelined
    on ``target[0]`` (a test may swap it)."""

    def push(batch: Sequence[Push]) -> list[int]:
        pipe = target[0].pipeline(transaction=False)
        for key, added, timeout in batch:
            pipe.set(f"{prefix}:{key}", 0, ex=timeout, nx=True)
            pipe.incrby(f"{prefix}:{key}", added)
        return [int(total) for total in pipe.execute()[1::2]]

    return push


def window_end(seconds: float = 60.0) -> float:
    return time.time() + seconds


# One process -------------------------------------------------------------------------------


def test_one_process_admits_exactly_the_limit_under_concurrency(shared):
    client, prefix = shared
    counts = LocalCounts(redis_pusher([client], prefix), interval=0.05)
    ends = window_end()
    admitted: list[bool] = []
    start = threading.Barrier(16)

    def hammer() -> None:
        start.wait()
        results = [counts.admit("k", 50, ends, 61) for _ in range(20)]
        admitted.extend(results)

    threads = [threading.Thread(target=hammer) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert admitted.count(True) == 50, "320 attempts, a limit of 50"
        # Only admissions are pushed: the refused 270 are not counted.
        wait_until(lambda: client.get(f"{prefix}:k") == b"50", timeout=20, what="the sync to Redis")
        assert 0 < client.ttl(f"{prefix}:k") <= 61
    finally:
        counts.close()


@pytest.mark.django_db(transaction=True)
def test_the_endpoint_counts_in_the_process_without_a_round_trip(rpc, settings, shared):
    """Through the endpoint, with a Redis throttle cache: the limit holds at
    once (no request waits for a sync), and the counter reaches Redis."""
    client, prefix = shared
    settings.CACHES = {
        **settings.CACHES,
        "shared": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": prefix,
        },
    }
    settings.MCPTASKS = {**settings.MCPTASKS, "THROTTLE_CACHE": "shared", "THROTTLE_RATES": {"call": "3/m"}}
    assert [rpc.call_tool("greet", {"name": "a"}).ok for _ in range(3)] == [True] * 3
    refused = rpc.call_tool("greet", {"name": "a"})
    assert (refused.status, refused.error["code"]) == (429, -31000)
    assert 1 <= int(refused.headers["Retry-After"]) <= 60

    def synced() -> list[bytes | None]:
        return [client.get(key) for key in client.scan_iter(f"{prefix}:*throttle:call:*")]

    assert wait_until(lambda: synced() == [b"3"], timeout=20, what="the call counter in Redis")


# Across processes ----------------------------------------------------------------------------


def test_two_processes_stay_within_the_documented_bound(shared):
    """Two processes' counters on one Redis, driven in lockstep: each admits
    up to ``k`` requests per sync interval, then both sync. The window admits
    at most L + (N - 1) * 2k (docs/reliability.md), and once both have synced
    past the limit, neither admits more."""
    client, prefix = shared
    limit, k = 30, 4
    a = LocalCounts(redis_pusher([client], prefix), interval=3600)
    b = LocalCounts(redis_pusher([client], prefix), interval=3600)
    ends = window_end()
    admitted = 0
    for _ in range(20):
        admitted += sum(a.admit("k", limit, ends, 61) for _ in range(k))
        admitted += sum(b.admit("k", limit, ends, 61) for _ in range(k))
        assert a.sync() and b.sync()
    try:
        assert limit <= admitted <= limit + (2 - 1) * 2 * k, admitted
        assert int(client.get(f"{prefix}:k") or 0) == admitted
        assert not a.admit("k", limit, ends, 61) and not b.admit("k", limit, ends, 61)
    finally:
        a.close()
        b.close()


def test_the_worst_case_is_n_times_the_limit(shared):
    """A burst that reaches every process before any sync: each admits the
    whole limit on its own (the ceiling the docs give, N x L), no more."""
    client, prefix = shared
    ends = window_end()
    processes = [LocalCounts(redis_pusher([client], prefix), interval=3600) for _ in range(3)]
    try:
        admitted = [sum(p.admit("k", 10, ends, 61) for _ in range(25)) for p in processes]
        assert admitted == [10, 10, 10]
        assert all(p.sync() for p in processes)
        assert int(client.get(f"{prefix}:k") or 0) == 30
    finally:
        for p in processes:
            p.close()


def test_each_process_sees_the_others_within_its_sync_threads(shared):
    """With the sync threads running (100 ms), what one process admits
    reaches the other's view, and the other then refuses."""
    client, prefix = shared
    a = LocalCounts(redis_pusher([client], prefix), interval=0.1)
    b = LocalCounts(redis_pusher([client], prefix), interval=0.1)
    ends = window_end()
    try:
        assert b.admit("k", 10, ends, 61)
        assert sum(a.admit("k", 10, ends, 61) for _ in range(9)) == 9
        wait_until(lambda: b.seen("k") == 10, timeout=20, what="b seeing a's admissions")
        assert not b.admit("k", 10, ends, 61)
    finally:
        a.close()
        b.close()


# Redis down ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_while_redis_is_down_each_process_still_holds_the_limit(rpc, settings, caplog):
    """The sync fails: requests are neither refused for it nor let through
    uncounted; each process keeps the limit on its own, and says so once."""
    settings.CACHES = {
        **settings.CACHES,
        # Nothing listens on port 1: every sync fails to connect.
        "down": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
    }
    settings.MCPTASKS = {
        **settings.MCPTASKS,
        "THROTTLE_CACHE": "down",
        "THROTTLE_RATES": {"call": "2/m"},
        "THROTTLE_SYNC_MS": 20,
    }
    assert rpc.call_tool("greet", {"name": "a"}).ok
    assert rpc.call_tool("greet", {"name": "a"}).ok
    refused = rpc.call_tool("greet", {"name": "a"})
    assert (refused.status, refused.error["code"]) == (429, -31000)
    message = "throttle cache 'down' unavailable, throttles count in this process alone"
    wait_until(lambda: message in caplog.text, timeout=20, what="the warning")
    time.sleep(0.2)  # several more failed syncs
    assert caplog.text.count(message) == 1, "one warning per outage, not one per sync"


def test_counts_made_while_redis_was_down_are_pushed_when_it_is_back(shared, caplog):
    client, prefix = shared
    down = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    target = [down]
    counts = LocalCounts(redis_pusher(target, prefix), interval=3600)
    ends = window_end()
    try:
        assert sum(counts.admit("k", 5, ends, 61) for _ in range(3)) == 3
        assert not counts.sync()
        assert counts.seen("k") == 3, "nothing admitted is forgotten"
        target[0] = client
        client.set(f"{prefix}:k", 2)  # another process's admissions meanwhile
        assert counts.sync()
        assert int(client.get(f"{prefix}:k") or 0) == 5
        assert not counts.admit("k", 5, ends, 61)
        assert "reachable again" in caplog.text
    finally:
        counts.close()
        down.close()


# Windows and the event loop ------------------------------------------------------------------


def test_a_counter_is_dropped_when_its_window_ends_and_the_thread_stops(shared):
    client, prefix = shared
    counts = LocalCounts(redis_pusher([client], prefix), interval=0.05)
    assert counts.admit("k", 5, window_end(0.2), 2)
    wait_until(lambda: counts.live() == 0, timeout=20, what="the counter dropped")
    wait_until(lambda: counts._thread is None, timeout=20, what="the sync thread stopped")
    assert counts.admit("k", 5, window_end(0.2), 2), "a new window starts again from the shared total"
    counts.close()


def test_polls_are_throttled_on_the_loop_without_a_redis_client(settings):
    """Counted in memory, the loop's poll throttle needs no async Redis
    client: any throttle cache serves polls on the loop."""
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": 2, "THROTTLE_SYNC_MS": 100}

    async def polls() -> tuple[bool, list[str]]:
        outcomes = []
        for _ in range(3):
            try:
                await limits.athrottle_poll("owner", "task", 60_000)
                outcomes.append("ok")
            except limits.RateLimited:
                outcomes.append("429")
        return limits.poll_throttle_on_loop(), outcomes

    assert asyncio.run(polls()) == (True, ["ok", "ok", "429"])
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": 2, "THROTTLE_SYNC_MS": 0}

    async def on_loop() -> bool:
        return limits.poll_throttle_on_loop()

    assert asyncio.run(on_loop()) is False, "counted in a local-memory cache itself: polls go to a thread"


def test_a_forked_process_counts_on_its_own(settings):
    """A web server that forks its workers after the app counted (a preloaded
    app) gives each child counters of its own, with a sync thread of its own."""
    settings.MCPTASKS = {**settings.MCPTASKS, "THROTTLE_SYNC_MS": 50}
    parent = limits.local_counts()
    assert parent is not None and parent.admit("k", 1, window_end(), 61)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit
        try:
            child = limits.local_counts()
            fresh = child is not None and child is not parent and child.admit("k", 1, window_end(), 61)
            os.write(write, b"fresh" if fresh else b"inherited")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    assert said == b"fresh"
    assert not parent.admit("k", 1, window_end(), 61), "the parent's own count is unchanged"

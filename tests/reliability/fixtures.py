"""Fixtures for the reliability, fuzz and isolation tests.

Import them into a test module (``from tests.reliability.fixtures import
private_services, chaos_stack_factory``); ``tests/reliability/conftest.py``
does so for its directory.

Short and full forms: a test parametrized with ``FORMS`` runs its short form
by default; the full form is marked ``slow`` and runs only with
``MCPTASKS_CHAOS=full`` (``MCPTASKS_CHAOS=full bin/test -m slow``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.services import PrivatePostgres, PrivateRedis, ServiceUnavailable
from tests.reliability.stack import ChaosStack, start_chaos_stack
from tests.support.live import drop_database, with_database

FULL = os.environ.get("MCPTASKS_CHAOS", "").lower() == "full"

FORMS = [
    pytest.param("short", id="short"),
    pytest.param(
        "full",
        id="full",
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(not FULL, reason="the full form runs with MCPTASKS_CHAOS=full"),
        ],
    ),
]

#: Where each run appends its figures (one JSON object a line), for docs/reliability.md.
FIGURES_FILE = os.environ.get("MCPTASKS_CHAOS_FIGURES")


def record_figures(name: str, form: str, figures: dict[str, Any]) -> None:
    """Print a run's figures (``pytest -s`` shows them; ``-ra`` keeps them on
    failure) and append them to ``MCPTASKS_CHAOS_FIGURES`` when it is set."""
    line = json.dumps({"test": name, "form": form, **figures}, default=str, sort_keys=True)
    print(f"\nFIGURES {line}")
    if FIGURES_FILE:
        with open(FIGURES_FILE, "a") as out:
            out.write(line + "\n")


@dataclass
class Services:
    postgres: PrivatePostgres
    redis: PrivateRedis


# One pair of private servers per test process, however many modules use it.
_services: Services | None = None
_users = 0
_lock = threading.Lock()


def _acquire() -> Services:
    global _services, _users
    with _lock:
        if _services is None:
            postgres = PrivatePostgres()
            redis = PrivateRedis()
            try:
                postgres.init()
                postgres.start()
                redis.start()
            except BaseException:
                postgres.destroy()
                redis.stop()
                raise
            _services = Services(postgres, redis)
            atexit.register(_stop_at_exit, _services)
        _users += 1
        return _services


def _stop_at_exit(services: Services) -> None:
    """However the session ends, leave no server behind."""
    services.redis.stop()
    services.postgres.destroy()


def _release() -> None:
    global _services, _users
    with _lock:
        _users -= 1
        if _users == 0 and _services is not None:
            _services.redis.stop()
            _services.postgres.destroy()
            _services = None


@pytest.fixture(scope="session")
def private_services() -> Iterator[Services]:
    """A Postgres cluster and a Redis server of our own (stopped at the end)."""
    try:
        services = _acquire()
    except ServiceUnavailable as exc:
        pytest.skip(f"cannot run private services: {exc}")
    try:
        yield services
    finally:
        _release()


@pytest.fixture
def chaos_stack_factory(private_services: Services, tmp_path: Path) -> Iterator[Any]:
    """``make(**options) -> ChaosStack`` on the private services; every stack
    made is torn down (and its database dropped) after the test. The services
    are up again before anything is dropped."""
    made: list[ChaosStack] = []

    def make(**options: Any) -> ChaosStack:
        options.setdefault("database_url", private_services.postgres.url)
        options.setdefault("redis_url", private_services.redis.url)
        stack = start_chaos_stack(tmp_path / f"stack{len(made)}", **options)
        made.append(stack)
        return stack

    try:
        yield make
    finally:
        if not private_services.redis.is_running():
            private_services.redis.start()
        if not private_services.postgres.is_running():
            private_services.postgres.start()
        for stack in made:
            stack.stop()
            with contextlib.suppress(Exception):
                drop_database(with_database(stack.database_url, "postgres"), stack.db_name)


@pytest.fixture
def own_redis() -> Iterator[PrivateRedis]:
    """A Redis for one test alone (to stop at will). Request it before
    ``chaos_stack_factory`` so that it outlives the stacks."""
    try:
        redis = PrivateRedis()
        redis.start()
    except ServiceUnavailable as exc:
        pytest.skip(f"cannot run a private Redis: {exc}")
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture
def own_postgres() -> Iterator[PrivatePostgres]:
    """A Postgres cluster for one test alone (to restart at will). Request it
    before ``chaos_stack_factory`` so that it outlives the stacks."""
    try:
        postgres = PrivatePostgres()
        postgres.init()
        postgres.start()
    except ServiceUnavailable as exc:
        pytest.skip(f"cannot run a private Postgres: {exc}")
    try:
        yield postgres
    finally:
        postgres.destroy()

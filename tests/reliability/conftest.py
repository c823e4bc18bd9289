"""Fault tests (R1 workers, R2 broker, R3 database, R6 races) on a private
Postgres and Redis; see docs/reliability.md. ``private_services`` is in
tests/conftest.py (the fuzz, isolation and limits tests use it too)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.services import PrivatePostgres, PrivateRedis, Services, ServiceUnavailable
from tests.reliability.stack import ChaosStack, start_chaos_stack
from tests.support.live import drop_database, with_database


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

"""Fault tests (R1 workers, R2 broker, R3 database, R6 races) on a private
Postgres and Redis; see docs/reliability.md."""

from tests.reliability.fixtures import (  # noqa: F401 (fixtures)
    chaos_stack_factory,
    own_postgres,
    own_redis,
    private_services,
)

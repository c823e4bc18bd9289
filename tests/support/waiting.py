"""The one way a test waits for something another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.1,
    what: str = "condition",
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something true, and return that;
    past ``timeout`` seconds, fail, with ``explain()``'s account of why."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            why = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"{what} not reached within {timeout}s{why}")
        time.sleep(interval)

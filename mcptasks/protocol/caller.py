"""Who is calling, as the protocol handlers see it: the owner every task
method checks. The HTTP adapter (``mcptasks.web.identity``) finds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Caller:
    owner: str
    user: Any = None
    auth: Any = None
    authenticated: bool = False

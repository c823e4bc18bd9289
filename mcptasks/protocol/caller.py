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
    #: The scopes the caller's token grants (hierarchy expanded); ``None`` for
    #: credentials without scopes (sessions, static tokens, anonymous), which
    #: every scope check lets through. Set by mcptasks.web.authorization.
    scopes: frozenset[str] | None = None
    #: Where a challenge sent to this caller points (RFC 9728 metadata URL).
    resource_metadata: str | None = None

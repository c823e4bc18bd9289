"""Request size and shape limits: a body's size, JSON depth, storable values and ids."""

from __future__ import annotations

import json
import re
from typing import Any

from ..conf import settings
from ..errors import INVALID_REQUEST, InvalidParams, ProtocolError

#: ``\u0000`` as JSON writes a NUL (an odd run of backslashes before ``u0000``).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_UNSTORABLE_CHAR = re.compile(r"[\x00\ud800-\udfff]")


class RequestTooLarge(ProtocolError):
    def __init__(self, limit: int) -> None:
        super().__init__(INVALID_REQUEST, f"Request body too large (limit {limit} bytes)", http_status=413)


def check_depth(value: Any, limit: int | None = None) -> None:
    """Refuse JSON nested deeper than ``MAX_JSON_DEPTH``, iteratively (a deep document must not exhaust the stack)."""
    limit = limit if limit is not None else settings.MAX_JSON_DEPTH
    if limit is None:
        return
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise ProtocolError(INVALID_REQUEST, f"Invalid Request: JSON nested deeper than {limit} levels")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def check_size(value: Any, limit: int | None, what: str) -> None:
    """``value`` must fit ``limit`` once encoded and be storable in Postgres text (-32602 otherwise)."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise InvalidParams(f"{what} hold a number past double range (a JSON number must be finite)") from None
    if _ESCAPED_NUL.search(text):
        raise InvalidParams(f"{what} cannot contain NUL characters")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidParams(f"{what} contain a lone surrogate: not valid Unicode") from None
    if limit is not None and size > limit:
        raise InvalidParams(f"{what} too large (limit {limit} bytes)")


def storable_id(value: str, max_chars: int) -> bool:
    """Whether a caller's id could be a stored one (no stored id is too long, holds a NUL or a lone surrogate)."""
    return len(value) <= max_chars and not _UNSTORABLE_CHAR.search(value)

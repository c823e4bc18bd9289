"""Request state for multi-round-trip tool calls (MRTR): the answers a client
has given so far, signed and bound to the caller, the tool and its arguments."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from django.core import signing

from ...conf import settings
from ...errors import InvalidParams

_STATE_SALT = "mcptasks.request_state"


def _call_digest(owner: str, tool: str, arguments: Any) -> str:
    canonical = json.dumps([owner, tool, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def sign_request_state(owner: str, tool: str, arguments: Any, answers: Mapping[str, Any]) -> str:
    """Answers gathered so far, bound to the caller, the tool and its arguments."""
    payload = {"d": _call_digest(owner, tool, arguments), "a": dict(answers)}
    return signing.dumps(payload, salt=_STATE_SALT, compress=True)


def load_request_state(state: Any, owner: str, tool: str, arguments: Any) -> dict[str, Any]:
    """Verify a ``requestState`` and return the answers it carries.

    Tampered, expired or foreign state is rejected with -32602: it binds the
    caller, the tool and its arguments.
    """
    if not isinstance(state, str):
        raise InvalidParams("Invalid requestState: expected a string")
    try:
        payload = signing.loads(state, salt=_STATE_SALT, max_age=settings.REQUEST_STATE_MAX_AGE)
    except signing.SignatureExpired:
        raise InvalidParams("Invalid requestState: it has expired; retry the call without it") from None
    except signing.BadSignature:
        raise InvalidParams("Invalid requestState: verification failed") from None
    if not isinstance(payload, dict) or payload.get("d") != _call_digest(owner, tool, arguments):
        raise InvalidParams("Invalid requestState: it belongs to a different request")
    return dict(payload.get("a") or {})

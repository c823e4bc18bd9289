"""Multi-round-trip calls (MRTR), run within their request: each round runs
the tool or prompt again with the answers a client has given so far, carried
in ``requestState``, signed and bound to the caller, the call and its arguments."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from django.core import signing

from ...conf import settings
from ...errors import InputNeeded, InvalidParams
from ...tools.calls import tool_context
from ...tools.context import ToolContext
from .. import limits
from ..streaming import Deferred, Notify, Stream, threaded_call
from .headers import META_LOG_LEVEL
from .request import Request

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


def round_answers(params: Mapping[str, Any], owner: str, subject: str, arguments: Any) -> dict[str, Any]:
    """This round's answers: earlier rounds' from ``requestState``, this one's from ``inputResponses``."""
    answers: dict[str, Any] = {}
    if "requestState" in params:
        answers = load_request_state(params["requestState"], owner, subject, arguments)
    if "inputResponses" in params:
        responses = params["inputResponses"]
        if not isinstance(responses, dict):
            raise InvalidParams('"inputResponses" must be an object')
        limits.check_size(responses, settings.MAX_INPUT_RESPONSES_BYTES, "inputResponses")
        answers.update(responses)
    return answers


def inline_call(
    req: Request,
    subject: str,
    arguments: dict[str, Any],
    answers: Mapping[str, Any],
    run: Callable[[ToolContext], dict[str, Any]],
    *,
    can_hand_off: bool = False,
) -> Stream | Deferred:
    """Run ``run(ctx)`` within the request, off the web threads, streaming its
    notifications when the request asked for them; a hang-up cancels it. A
    question without an answer ends the round (``input_required``)."""

    def answer(notify: Notify | None = None, cancel: threading.Event | None = None) -> dict[str, Any]:
        ctx = tool_context(
            owner=req.caller.owner,
            user=req.caller.user,
            capabilities=req.capabilities,
            answers=answers,
            can_hand_off=can_hand_off,
            notify=notify,
            cancel_event=cancel,
            progress_token=req.meta.get("progressToken"),
            log_level=req.meta.get(META_LOG_LEVEL),
        )
        try:
            return run(ctx)
        except InputNeeded as need:  # the round ends: its questions, and the answers so far, signed
            state = sign_request_state(req.caller.owner, subject, arguments, answers)
            return {"resultType": "input_required", "inputRequests": need.requests, "requestState": state}

    if not req.wants_notifications:
        return Deferred(lambda cancel: answer(cancel=cancel), req.caller.owner)
    return threaded_call(req.message.id, answer, req.caller.owner)

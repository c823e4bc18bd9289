"""Calling a tool: its function with the validated arguments, its outcome as a
``CallToolResult``. Shared by inline calls (the protocol layer) and task runs
(the worker)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..errors import ProtocolError, ToolError, ToolRetry
from .awaiting import awaited
from .context import ToolContext
from .registry import Tool
from .results import error_result, to_call_result

logger = logging.getLogger("mcptasks.execution")


def invoke(
    tool: Tool, ctx: ToolContext, kwargs: Mapping[str, Any], *, retry_on: tuple[type[BaseException], ...] = ()
) -> dict[str, Any]:
    """Call the tool and return its ``CallToolResult``.

    ``ToolError`` and unexpected exceptions become ``isError`` results (the
    latter logged with its traceback); ``ProtocolError`` and the control-flow
    signals propagate, and an exception of ``retry_on`` comes out as
    ``ToolRetry`` (the caller may try again).
    """
    try:
        value = awaited(tool.fn(ctx, **kwargs) if tool.wants_context else tool.fn(**kwargs))
    except ToolError as exc:
        return error_result(exc.message, exc.content)
    except ProtocolError:
        raise
    except Exception as exc:
        if retry_on and isinstance(exc, retry_on):
            raise ToolRetry(exc) from exc
        logger.exception("tool %s raised", tool.name, extra={"tool": tool.name, "task_id": ctx.task_id})
        return error_result(f"Tool '{tool.name}' failed: {type(exc).__name__}: {exc}")
    return to_call_result(value)

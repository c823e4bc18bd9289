"""A tool's controls as its runs get them: its ``@tool(...)`` options with
the site's ``MCPTASKS["TOOL_CONTROLS"]`` over them. One home for that merge:
the dispatch, the worker, the gauges and the admin read them here."""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from typing import Any

from ..conf import get_settings, settings
from .controls import ToolControls, check, validate
from .registry import registry

logger = logging.getLogger("mcptasks.runtime")


def site_overrides(name: str) -> dict[str, Any]:
    """The options ``TOOL_CONTROLS`` sets for ``name``, validated. An invalid
    entry (system check E040) is left out with an error in the log, rather
    than failing the dispatch of a task that is already durable."""
    options = settings.TOOL_CONTROLS.get(name)
    if options is None:
        return {}
    try:
        given = validate(name, options)
    except ValueError as exc:
        logger.error("MCPTASKS TOOL_CONTROLS ignored: %s", exc)
        return {}
    return {f.name: getattr(given, f.name) for f in fields(ToolControls) if f.name in options}


def controls_for(name: str) -> ToolControls:
    """The controls of the tool ``name``: its own, with the site's overrides
    (the tool's own when the two together contradict themselves)."""
    tool = registry.get(name)
    own = tool.controls if tool is not None else ToolControls()
    overrides = site_overrides(name)
    if not overrides:
        return own
    try:
        return check(name, replace(own, **overrides))
    except ValueError as exc:
        logger.error("MCPTASKS TOOL_CONTROLS ignored: %s", exc)
        return own


def problems() -> list[str]:
    """What is wrong with ``TOOL_CONTROLS`` (for the system check)."""
    found: list[str] = []
    for name, options in settings.TOOL_CONTROLS.items():
        try:
            given = validate(name, options)
            tool = registry.get(name)
            if tool is not None:
                check(name, replace(tool.controls, **{k: getattr(given, k) for k in options}))
        except ValueError as exc:
            found.append(str(exc))
    return found


def queue_for(name: str) -> str | None:
    """The Celery queue of ``name``'s runs; ``None``: Celery's default queue."""
    return controls_for(name).queue or settings.CELERY_QUEUE or None


def configured_queues() -> list[str]:
    """Every queue a run may be sent to by the site's configuration: the
    site's run queue and each registered or configured tool's own."""
    names = [t.name for t in registry.all()] + [n for n in settings.TOOL_CONTROLS if n not in registry]
    return [q for q in dict.fromkeys([settings.CELERY_QUEUE, *(queue_for(n) for n in names)]) if q]


#: ``limited_tools``' answer, with the registry version and the settings it was worked out from.
_limited: tuple[int, object, frozenset[str]] | None = None


def limited_tools() -> frozenset[str]:
    """The tools with a ``concurrency`` limit (their runs take a slot); asked before each run,
    worked out again only once a tool is registered or removed, or the settings change."""
    global _limited
    version, current = registry.version, get_settings()
    if _limited is None or _limited[0] != version or _limited[1] is not current:
        names = [t.name for t in registry.all()] + [n for n in current.TOOL_CONTROLS if n not in registry]
        _limited = (version, current, frozenset(n for n in names if controls_for(n).concurrency))
    return _limited[2]

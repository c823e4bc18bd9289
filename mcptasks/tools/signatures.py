"""What a decorated function's signature says: whether it takes the
``ToolContext``, and a tool's arguments model and input schema (from its type
hints, through pydantic)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, get_type_hints

import pydantic

from .context import ToolContext


def clean_schema(node: Any) -> Any:
    """Drop pydantic's generated titles (they repeat the names); keep
    properties that happen to be called ``title``."""
    if isinstance(node, list):
        return [clean_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: clean_schema(sub) for name, sub in value.items()}
        else:
            out[key] = clean_schema(value)
    return out


_TCHAR = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def header_params(schema: dict[str, Any], tool_name: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The ``x-mcp-header`` annotations of an input schema, checked as the
    spec requires (token syntax, unique, primitive, reachable only through
    ``properties``)."""
    found: list[tuple[str, tuple[str, ...]]] = []

    def walk(node: Any, path: tuple[str, ...], reachable: bool) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, path, False)
            return
        if not isinstance(node, dict):
            return
        if "x-mcp-header" in node:
            suffix = node["x-mcp-header"]
            if not reachable or not path:
                raise ValueError(f"tool {tool_name!r}: x-mcp-header must sit on a property reached by properties only")
            if not isinstance(suffix, str) or not _TCHAR.match(suffix):
                raise ValueError(f"tool {tool_name!r}: x-mcp-header {suffix!r} is not an HTTP token")
            if node.get("type") not in ("string", "integer", "boolean"):
                raise ValueError(f"tool {tool_name!r}: x-mcp-header needs a string, integer or boolean property")
            found.append((suffix, path))
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    walk(sub, (*path, name), reachable)
            elif key != "x-mcp-header":
                walk(value, path, False)

    walk(schema, (), True)
    suffixes = [suffix.lower() for suffix, _ in found]
    if len(set(suffixes)) != len(suffixes):
        raise ValueError(f"tool {tool_name!r}: x-mcp-header values must be unique (case-insensitively)")
    return tuple(found)


def takes_context(func: Callable[..., Any], hints: dict[str, Any]) -> bool:
    """Whether ``func`` (a tool or a prompt) takes the ``ToolContext``: its first
    parameter is annotated ``ToolContext``, or is an unannotated ``ctx``."""
    params = list(inspect.signature(func).parameters.values())
    if not params:
        return False
    first = params[0]
    if first.name not in hints:
        return first.name == "ctx"
    if hints[first.name] is ToolContext:
        return True
    if first.name == "ctx":
        raise TypeError(
            f"{func.__qualname__}: a first parameter named ctx must be annotated ToolContext (or not annotated)"
        )
    return False


def build_input_model(fn: Callable[..., Any], name: str) -> tuple[type[pydantic.BaseModel], bool]:
    hints = get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())
    wants_context = takes_context(fn, hints)
    if wants_context:
        params = params[1:]
    fields: dict[str, Any] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs are not supported")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = pydantic.create_model(
        f"{name}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    return model, wants_context

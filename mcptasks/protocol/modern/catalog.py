"""What the server offers outside its tasks: ``server/discover``'s answer, the
lists of tools, prompts and resources, a prompt's messages, a resource's
contents, completion. Results are bare: each era shapes them (the
2026-07-28 handlers add ``resultType`` and caching hints)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from ...conf import settings
from ...errors import TASKS_EXTENSION, InvalidParams
from ...tools.context import ToolContext
from ...tools.registry import Prompt, registry
from .headers import supported_versions

Params = Mapping[str, Any]


def object_param(params: Params, name: str) -> dict[str, Any]:
    value = params.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidParams(f'"{name}" must be an object')
    return value


def _no_cursor(params: Params) -> None:
    if params.get("cursor") is not None:
        raise InvalidParams("Invalid cursor: every item is on the first page")


def discover(params: Params) -> dict[str, Any]:
    capabilities = {
        "tools": {"listChanged": True},
        "resources": {},
        "prompts": {"listChanged": True},
        "completions": {},
        "logging": {},
        "extensions": {TASKS_EXTENSION: {}},
    }
    result: dict[str, Any] = {"supportedVersions": supported_versions(), "capabilities": capabilities}
    if settings.INSTRUCTIONS:
        result["instructions"] = settings.INSTRUCTIONS
    return result


def list_tools(params: Params) -> dict[str, Any]:
    _no_cursor(params)
    return {"tools": [t.describe() for t in registry.all()]}


def list_prompts(params: Params) -> dict[str, Any]:
    _no_cursor(params)
    return {"prompts": [p.describe() for p in registry.prompts.values()]}


def list_resources(params: Params) -> dict[str, Any]:
    _no_cursor(params)
    return {"resources": [r.describe() for r in registry.resources.values()]}


def list_resource_templates(params: Params) -> dict[str, Any]:
    _no_cursor(params)
    return {"resourceTemplates": [t.describe() for t in registry.templates]}


def prompt_call(params: Params) -> tuple[Prompt, dict[str, Any]]:
    """The prompt a ``prompts/get`` names and its arguments, checked (-32602)."""
    name = params.get("name")
    prompt = registry.prompts.get(name) if isinstance(name, str) else None
    if prompt is None:
        raise InvalidParams(f"Unknown prompt: {name}")
    arguments = object_param(params, "arguments")
    missing = [a["name"] for a in prompt.arguments if a["required"] and a["name"] not in arguments]
    unknown = set(arguments) - {a["name"] for a in prompt.arguments}
    if missing or unknown:
        raise InvalidParams(
            f"Invalid arguments for prompt '{prompt.name}': missing {missing}, unknown {sorted(unknown)}"
        )
    if any(not isinstance(v, str) for v in arguments.values()):
        raise InvalidParams("Prompt arguments must be strings")
    return prompt, arguments


def prompt_result(prompt: Prompt, ctx: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """The prompt's messages (a string is one user message); raises ``InputNeeded``."""
    value = prompt.fn(ctx, **arguments) if prompt.wants_context else prompt.fn(**arguments)
    if isinstance(value, str):
        value = [{"role": "user", "content": {"type": "text", "text": value}}]
    result: dict[str, Any] = {"messages": list(value)}
    if prompt.description:
        result["description"] = prompt.description
    return result


def read_resource(params: Params) -> dict[str, Any]:
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise InvalidParams('resources/read needs "uri" (a string)')
    found = registry.find_resource(uri)
    if found is None:
        raise InvalidParams("Resource not found", {"uri": uri})
    fn, arguments, mime_type = found
    value = fn(**arguments)
    described = {"uri": uri, **({"mimeType": mime_type} if mime_type else {})}
    contents = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, dict):
            contents.append({**described, **item})
        elif isinstance(item, bytes):
            contents.append({**described, "blob": base64.b64encode(item).decode("ascii")})
        else:
            contents.append({**described, "text": str(item)})
    return {"contents": contents}


def complete_argument(params: Params) -> dict[str, Any]:
    ref = object_param(params, "ref")
    argument = object_param(params, "argument")
    if not isinstance(argument.get("name"), str) or not isinstance(argument.get("value", ""), str):
        raise InvalidParams('completion/complete needs "argument" with a string name and value')
    values: list[str] = []
    if ref.get("type") == "ref/prompt":
        prompt = registry.prompts.get(ref.get("name", ""))
        if prompt is None:
            raise InvalidParams(f"Unknown prompt: {ref.get('name')}")
        completer = prompt.completions.get(argument["name"])
        if completer is not None:
            values = [v for v in completer(argument.get("value", "")) if isinstance(v, str)]
    elif ref.get("type") != "ref/resource":
        raise InvalidParams('"ref.type" must be "ref/prompt" or "ref/resource"')
    return {"completion": {"values": values[:100], "total": len(values), "hasMore": len(values) > 100}}

"""The tool-author API: ``@tool`` registers a function as an MCP tool.

The input schema comes from the function's type hints (through pydantic), and
arguments are validated against them before the tool runs::

    from mcptasks import ToolContext, tool

    @tool(task="optional", description="Add two numbers slowly.")
    def slow_add(ctx: ToolContext, a: int, b: int = 1) -> str:
        ctx.sleep(5)
        return str(a + b)

Task modes:

* ``never``: always answered inline.
* ``optional``: a task when the client declares the tasks extension, inline
  otherwise.
* ``required``: always a task; a client without the extension gets -32021.
* ``auto``: a task when the client declares the extension, but its result is
  returned inline if the run finishes within ``AUTO_TASK_BUDGET_SECONDS``.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_type_hints, overload

import pydantic

from .. import signals
from ..errors import InvalidParams
from ..telemetry import bounds
from .awaiting import synchronous
from .controls import ToolControls, check
from .signatures import build_input_model, clean_schema, header_params, takes_context

TaskMode = Literal["never", "optional", "required", "auto"]
TASK_MODES: tuple[str, ...] = ("never", "optional", "required", "auto")

#: A decorated function: the decorators hand it back unchanged, type and all.
F = TypeVar("F", bound=Callable[..., Any])

#: A prompt argument's completion: the values for what the client typed so
#: far, from a plain or an ``async`` function.
Completer = Callable[[str], list[str] | Awaitable[list[str]]]


@dataclass
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    title: str | None
    task: TaskMode
    input_model: type[pydantic.BaseModel]
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: dict[str, Any] | None
    ttl_ms: int | None
    poll_interval_ms: int | None
    wants_context: bool
    #: ``x-mcp-header`` parameters: (header suffix, property path) pairs.
    header_params: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Runs inside tools/call until ``ctx.hand_off()`` (asking questions the
    #: MRTR way), then continues as a task.
    starts_inline: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    #: OAuth scopes a caller's token needs for this tool and its tasks
    #: (on top of ``MCPTASKS["SCOPES"]``; see mcptasks.protocol.authorization).
    scopes: tuple[str, ...] = ()
    #: Queue, time limits and retries of its task runs (``controls_for``
    #: adds the site's ``TOOL_CONTROLS`` over these).
    controls: ToolControls = field(default_factory=ToolControls)

    def validate_arguments(self, arguments: Any) -> dict[str, Any]:
        """Validated keyword arguments, or ``InvalidParams`` saying what is wrong."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise InvalidParams(f"Invalid arguments for tool '{self.name}': arguments must be an object")
        try:
            model = self.input_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
            )
            raise InvalidParams(
                f"Invalid arguments for tool '{self.name}': {problems}",
                {"errors": exc.errors(include_url=False, include_context=False, include_input=False)},
            ) from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    def describe(self) -> dict[str, Any]:
        """The Tool object for ``tools/list`` (era-neutral fields)."""
        data: dict[str, Any] = {"name": self.name, "description": self.description, "inputSchema": self.input_schema}
        if self.title:
            data["title"] = self.title
        if self.output_schema is not None:
            data["outputSchema"] = self.output_schema
        if self.annotations:
            data["annotations"] = self.annotations
        if self.meta:
            data["_meta"] = self.meta
        return data


@dataclass
class Resource:
    uri: str
    name: str
    description: str
    mime_type: str | None
    fn: Callable[..., Any]

    def describe(self) -> dict[str, Any]:
        data = {"uri": self.uri, "name": self.name, "description": self.description}
        if self.mime_type:
            data["mimeType"] = self.mime_type
        return data


@dataclass
class ResourceTemplate:
    uri_template: str
    name: str
    description: str
    mime_type: str | None
    fn: Callable[..., Any]
    pattern: re.Pattern[str]

    def describe(self) -> dict[str, Any]:
        data = {"uriTemplate": self.uri_template, "name": self.name, "description": self.description}
        if self.mime_type:
            data["mimeType"] = self.mime_type
        return data

    def match(self, uri: str) -> dict[str, str] | None:
        found = self.pattern.fullmatch(uri)
        return found.groupdict() if found else None


@dataclass
class Prompt:
    name: str
    description: str
    title: str | None
    arguments: list[dict[str, Any]]
    fn: Callable[..., Any]
    wants_context: bool
    completions: dict[str, Callable[[str], list[str]]]

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "description": self.description}
        if self.title:
            data["title"] = self.title
        if self.arguments:
            data["arguments"] = self.arguments
        return data


def _template_pattern(template: str) -> re.Pattern[str]:
    """A regex for a level-1 URI template: ``{name}`` matches one path segment."""
    parts = re.split(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", template)
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return re.compile(regex)


class Registry:
    """Every tool, resource and prompt the server offers, in registration order."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self.resources: dict[str, Resource] = {}
        self.templates: list[ResourceTemplate] = []
        self.prompts: dict[str, Prompt] = {}
        self._lock = threading.Lock()
        #: Bumped on every change to the tool list (list_changed uses it).
        self.version = 0

    def register(self, tool: Tool) -> Tool:
        with self._lock:
            if tool.name in self._tools and self._tools[tool.name].fn is not tool.fn:
                raise ValueError(f"A tool named {tool.name!r} is already registered")
            self._tools[tool.name] = tool
            self.version += 1
        signals.registry_changed.send(sender=Registry, kind="tools")
        return tool

    def unregister(self, name: str) -> None:
        with self._lock:
            removed = self._tools.pop(name, None) is not None
            if removed:
                self.version += 1
        if removed:
            signals.registry_changed.send(sender=Registry, kind="tools")

    def add_prompt(self, prompt: Prompt) -> Prompt:
        with self._lock:
            self.prompts[prompt.name] = prompt
        signals.registry_changed.send(sender=Registry, kind="prompts")
        return prompt

    def remove_prompt(self, name: str) -> None:
        with self._lock:
            removed = self.prompts.pop(name, None) is not None
        if removed:
            signals.registry_changed.send(sender=Registry, kind="prompts")

    def add_resource(self, resource: Resource) -> Resource:
        with self._lock:
            self.resources[resource.uri] = resource
        signals.registry_changed.send(sender=Registry, kind="resources")
        return resource

    def add_template(self, template: ResourceTemplate) -> ResourceTemplate:
        with self._lock:
            # Registering the same template again (a module imported twice) replaces it.
            kept = [t for t in self.templates if t.uri_template != template.uri_template]
            self.templates = [*kept, template]
        signals.registry_changed.send(sender=Registry, kind="resources")
        return template

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def all(self) -> list[Tool]:
        """Tools in registration order: stable, so clients can cache the list."""
        return list(self._tools.values())

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def find_resource(self, uri: str) -> tuple[Callable[..., Any], dict[str, str], str | None] | None:
        if uri in self.resources:
            res = self.resources[uri]
            return res.fn, {}, res.mime_type
        for template in self.templates:
            params = template.match(uri)
            if params is not None:
                return template.fn, params, template.mime_type
        return None


registry = Registry()


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    task: TaskMode = "never",
    ttl_ms: int | None = None,
    poll_interval_ms: int | None = None,
    annotations: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    input_schema: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    starts_inline: bool = False,
    scopes: Iterable[str] = (),
    queue: str | None = None,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    retries: int = 0,
    retry_on: Iterable[type[Exception]] = (),
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 600.0,
    concurrency: int | None = None,
    registry: Registry = registry,
) -> Callable[[F], F]: ...


def tool(
    fn: F | None = None,
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    task: TaskMode = "never",
    ttl_ms: int | None = None,
    poll_interval_ms: int | None = None,
    annotations: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    input_schema: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    starts_inline: bool = False,
    scopes: Iterable[str] = (),
    queue: str | None = None,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    retries: int = 0,
    retry_on: Iterable[type[Exception]] = (),
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 600.0,
    concurrency: int | None = None,
    registry: Registry = registry,
) -> F | Callable[[F], F]:
    """Register ``fn`` as a tool. Usable bare (``@tool``) or with options
    (``@tool(task="optional")``); either way the function comes back as it was.

    The tool takes the ``ToolContext`` when its first parameter is annotated
    ``ToolContext`` (or is an unannotated ``ctx``); every other parameter is an
    argument.

    ``starts_inline`` tools run within the ``tools/call`` request until they
    call ``ctx.hand_off()``, asking any questions there the MRTR way, and
    continue as a task from that point (without the extension, or in ``never``
    mode, they simply run to the end inline).

    ``scopes`` are the OAuth scopes a token needs to call the tool and to
    reach its tasks (403 ``insufficient_scope`` otherwise).

    ``input_schema`` replaces the schema derived from the type hints for
    display only (for example, to add ``x-mcp-header``); arguments are still
    validated against the hints.

    The execution controls apply to the tool's task runs (docs: "Writing
    tools"): ``queue`` sends them to a Celery queue of their own;
    ``soft_time_limit`` (seconds) tells the tool with ``SoftTimeLimitExceeded``
    (at ``ctx.sleep``, ``ctx.check_cancelled``; ``ctx.cancelled`` turns true)
    and ``time_limit`` stops the run, the task ending as a tool error naming
    the limit; ``retries`` more attempts follow an exception of ``retry_on``,
    after ``retry_backoff`` seconds doubling up to ``retry_backoff_max``,
    with jitter; ``concurrency`` caps the runs of the tool at once across
    every worker (a run over it waits without holding a worker process).
    """
    if task not in TASK_MODES:
        raise ValueError(f"task must be one of {TASK_MODES}, not {task!r}")
    controls = ToolControls(
        queue=queue,
        time_limit=time_limit,
        soft_time_limit=soft_time_limit,
        retries=retries,
        retry_on=tuple(retry_on),
        retry_backoff=retry_backoff,
        retry_backoff_max=retry_backoff_max,
        concurrency=concurrency,
    )

    def decorate(func: F) -> F:
        tool_name = name or func.__name__
        check(tool_name, controls)
        model, wants_context = build_input_model(func, tool_name)
        schema = input_schema or clean_schema(model.model_json_schema())
        schema.setdefault("type", "object")
        if not model.model_fields and input_schema is None:
            schema = {"type": "object", "additionalProperties": False}
        doc = inspect.getdoc(func) or ""
        registry.register(
            Tool(
                name=tool_name,
                fn=func,
                description=description if description is not None else doc,
                title=title,
                task=task,
                input_model=model,
                input_schema=schema,
                output_schema=output_schema,
                annotations=annotations,
                ttl_ms=ttl_ms,
                poll_interval_ms=poll_interval_ms,
                wants_context=wants_context,
                starts_inline=starts_inline,
                header_params=header_params(schema, tool_name),
                meta=dict(meta or {}),
                scopes=(scopes,) if isinstance(scopes, str) else tuple(scopes),
                controls=controls,
            )
        )
        return func

    if fn is not None:
        return decorate(fn)
    return decorate


def resource(
    uri: str,
    *,
    name: str | None = None,
    description: str | None = None,
    mime_type: str | None = "text/plain",
    registry: Registry = registry,
) -> Callable[[F], F]:
    """Register a static resource at ``uri``. The function (plain or
    ``async``) returns ``str`` (text), ``bytes`` (blob) or a full contents
    item (``dict``)."""

    def decorate(func: F) -> F:
        registry.add_resource(
            Resource(
                uri=uri,
                name=name or func.__name__,
                description=description or inspect.getdoc(func) or "",
                mime_type=mime_type,
                fn=synchronous(func),
            )
        )
        return func

    return decorate


def resource_template(
    uri_template: str,
    *,
    name: str | None = None,
    description: str | None = None,
    mime_type: str | None = "text/plain",
    registry: Registry = registry,
) -> Callable[[F], F]:
    """Register a resource template; ``{name}`` parts become keyword
    arguments. The function may be ``async``, like a static resource's."""

    def decorate(func: F) -> F:
        registry.add_template(
            ResourceTemplate(
                uri_template=uri_template,
                name=name or func.__name__,
                description=description or inspect.getdoc(func) or "",
                mime_type=mime_type,
                fn=synchronous(func),
                pattern=_template_pattern(uri_template),
            )
        )
        return func

    return decorate


@overload
def prompt(fn: F, /) -> F: ...


@overload
def prompt(
    fn: None = None,
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    completions: dict[str, Completer] | None = None,
    registry: Registry = registry,
) -> Callable[[F], F]: ...


def prompt(
    fn: F | None = None,
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    completions: dict[str, Completer] | None = None,
    registry: Registry = registry,
) -> F | Callable[[F], F]:
    """Register a prompt. Usable bare (``@prompt``) or with options. Its
    string parameters become the prompt's arguments (required unless they
    have a default). It returns a string (one user message) or a list of
    PromptMessage dicts. Like a tool, it may take the ``ToolContext`` first
    (found the same way), ask the client questions (MRTR) and be ``async``;
    so may its ``completions`` (argument name -> values for a prefix)."""

    def decorate(func: F) -> F:
        params = list(inspect.signature(func).parameters.values())
        wants_context = takes_context(func, get_type_hints(func))
        if wants_context:
            params = params[1:]
        arguments = [{"name": p.name, "required": p.default is inspect.Parameter.empty} for p in params]
        prompt_name = name or func.__name__
        registry.add_prompt(
            Prompt(
                name=prompt_name,
                title=title,
                description=description or inspect.getdoc(func) or "",
                arguments=arguments,
                fn=synchronous(func),
                wants_context=wants_context,
                completions={argument: synchronous(complete) for argument, complete in (completions or {}).items()},
            )
        )
        return func

    if fn is not None:
        return decorate(fn)
    return decorate


# Telemetry records a tool or prompt name only when the site registered it.
bounds.recognise(bounds.TOOL, registry.__contains__)
bounds.recognise(bounds.PROMPT, lambda name: name in registry.prompts)

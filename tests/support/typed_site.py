"""A site's tools module as a type checker sees it: every decorator of the
author API, bare and called. ``tests/test_author_api.py`` runs mypy on it with
``--disallow-any-decorated --disallow-untyped-decorators``; it is never
imported (importing it would register these in the global registry).

The ``assert_type`` lines and the ``type: ignore`` lines (checked with
``--warn-unused-ignores``) fail if a decorator loses the function's type.
"""

from __future__ import annotations

from typing import assert_type

from mcptasks import ToolContext, ToolResult, prompt, resource, resource_template, text, tool


@tool
def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b


@tool(task="optional", description="Wait, then echo.")
def echo_later(ctx: ToolContext, message: str, seconds: float = 1.0) -> str:
    ctx.sleep(seconds)
    return message


@tool
async def shout(message: str) -> ToolResult:
    return ToolResult([text(message.upper())])


@tool(
    task="required",
    queue="gpu",
    time_limit=60,
    soft_time_limit=50.5,
    retries=3,
    retry_on=(ConnectionError, TimeoutError),
    retry_backoff=2,
    retry_backoff_max=30.0,
    concurrency=2,
)
def render(ctx: ToolContext, scene: str) -> bytes:
    """Every execution control at once."""
    return scene.encode()


@tool(queue=None, time_limit=None, retries=0, concurrency=None)
def plain_defaults(n: int) -> int:
    return n


@prompt
def greet(name: str) -> str:
    return f"Say hello to {name}."


@prompt(title="Review code")
def review(ctx: ToolContext, code: str, language: str = "python") -> list[dict[str, object]]:
    return [{"role": "user", "content": {"type": "text", "text": f"Review this {language}: {code}"}}]


@resource("site://motd")
def motd() -> str:
    return "Hello."


@resource("site://logo", mime_type="image/png", description="The site's logo.")
def logo() -> bytes:
    return b"\x89PNG"


@resource_template("site://users/{user_id}")
def user_card(user_id: str) -> dict[str, str]:
    return {"uri": f"site://users/{user_id}", "text": user_id}


async def uses(ctx: ToolContext) -> None:
    assert_type(add(1), int)
    assert_type(echo_later(ctx, "hi"), str)
    assert_type(await shout("hi"), ToolResult)
    assert_type(render(ctx, "x"), bytes)
    assert_type(plain_defaults(2), int)
    assert_type(greet("Ada"), str)
    assert_type(review(ctx, "x = 1"), list[dict[str, object]])
    assert_type(motd(), str)
    assert_type(logo(), bytes)
    assert_type(user_card("7"), dict[str, str])
    add("one")  # type: ignore[arg-type]
    echo_later("hi")  # type: ignore[call-arg, arg-type]
    greet(name=3)  # type: ignore[arg-type]
    render(ctx, 3)  # type: ignore[arg-type]
    user_card()  # type: ignore[call-arg]

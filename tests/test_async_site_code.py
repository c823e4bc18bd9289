"""``async def`` prompts, resources, resource templates and completions, on
both eras' wire: the registry runs each to its value, as it does an async
tool's, so that the handlers get the value, never a coroutine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from mcptasks import ToolContext, prompt, resource, resource_template
from mcptasks.tools.registry import Registry, registry
from tests.support.factories import accept
from tests.support.legacy import DjangoLegacy

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "async_greeting"
ASKING = "async_asking"
RESOURCE = "site://async/motd"
TEMPLATE = "site://async/users/{user_id}"


async def complete_name(value: str) -> list[str]:
    await asyncio.sleep(0)
    return [name for name in ("Ada", "Alan", "Grace") if name.startswith(value)]


async def greeting(name: str) -> str:
    await asyncio.sleep(0)
    return f"Say hello to {name}."


async def asking(ctx: ToolContext) -> str:
    await asyncio.sleep(0)
    answer = ctx.elicit("Which topic?", {"type": "object", "properties": {"topic": {"type": "string"}}}, key="topic")
    return f"Talk about {answer['content']['topic']}."


async def motd() -> str:
    await asyncio.sleep(0)
    return "Async news."


async def user(user_id: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"text": f'{{"id": "{user_id}"}}'}


@pytest.fixture
def async_site() -> Iterator[None]:
    """The async site code above, in the registry the endpoint serves."""
    prompt(name=PROMPT, description="Greets, asynchronously.", completions={"name": complete_name})(greeting)
    prompt(name=ASKING, description="Asks first, asynchronously.")(asking)
    resource(RESOURCE, description="News, asynchronously.")(motd)
    resource_template(TEMPLATE, mime_type="application/json")(user)
    try:
        yield
    finally:
        registry.remove_prompt(PROMPT)
        registry.remove_prompt(ASKING)
        registry.resources.pop(RESOURCE, None)
        registry.templates = [t for t in registry.templates if t.uri_template != TEMPLATE]


def test_the_registry_keeps_a_plain_function_and_gives_an_async_ones_value():
    reg = Registry()

    def plain() -> str:
        return "plain"

    assert resource("site://plain", registry=reg)(plain) is plain
    assert resource("site://async", registry=reg)(motd) is motd  # the decorator hands the function back
    assert reg.find_resource("site://plain") == (plain, {}, "text/plain")
    fn, params, _ = reg.find_resource("site://async") or (None, None, None)
    assert fn is not None and fn(**params) == "Async news."
    prompt(registry=reg, completions={"name": complete_name})(greeting)
    assert reg.prompts["greeting"].fn(name="Ada") == "Say hello to Ada."
    assert reg.prompts["greeting"].completions["name"]("Gr") == ["Grace"]
    assert [a["name"] for a in reg.prompts["greeting"].arguments] == ["name"]


def test_async_prompts_resources_and_completions_on_the_2026_wire(rpc, async_site):
    got = rpc.request("prompts/get", {"name": PROMPT, "arguments": {"name": "Ada"}})
    assert got.status == 200, got
    assert got.result["messages"] == [{"role": "user", "content": {"type": "text", "text": "Say hello to Ada."}}]
    read = rpc.request("resources/read", {"uri": RESOURCE})
    assert read.status == 200, read
    assert read.result["contents"] == [{"uri": RESOURCE, "mimeType": "text/plain", "text": "Async news."}]
    templated = rpc.request("resources/read", {"uri": "site://async/users/7"}).result
    assert templated["contents"] == [
        {"uri": "site://async/users/7", "mimeType": "application/json", "text": '{"id": "7"}'}
    ]
    completion = rpc.request(
        "completion/complete",
        {"ref": {"type": "ref/prompt", "name": PROMPT}, "argument": {"name": "name", "value": "A"}},
    ).result
    assert completion["completion"]["values"] == ["Ada", "Alan"]


def test_an_async_prompt_asks_the_client_the_mrtr_way(rpc, async_site):
    first = rpc.request("prompts/get", {"name": ASKING, "arguments": {}})
    assert first.status == 200, first
    assert first.result["resultType"] == "input_required"
    assert list(first.result["inputRequests"]) == ["topic"]
    second = rpc.request(
        "prompts/get",
        {
            "name": ASKING,
            "arguments": {},
            "inputResponses": {"topic": accept(topic="tides")},
            "requestState": first.result["requestState"],
        },
    )
    assert second.status == 200, second
    assert second.result["messages"][0]["content"]["text"] == "Talk about tides."


def test_async_prompts_resources_and_completions_on_the_2025_wire(client, async_site):
    mcp = DjangoLegacy(client)
    mcp.initialize()
    got = mcp.request("prompts/get", {"name": PROMPT, "arguments": {"name": "Grace"}})
    assert got.result["messages"] == [{"role": "user", "content": {"type": "text", "text": "Say hello to Grace."}}]
    read = mcp.request("resources/read", {"uri": RESOURCE}).result
    assert read["contents"] == [{"uri": RESOURCE, "mimeType": "text/plain", "text": "Async news."}]
    templated = mcp.request("resources/read", {"uri": "site://async/users/9"}).result
    assert templated["contents"][0]["text"] == '{"id": "9"}'
    completion = mcp.request(
        "completion/complete",
        {"ref": {"type": "ref/prompt", "name": PROMPT}, "argument": {"name": "name", "value": "G"}},
    ).result
    assert completion["completion"]["values"] == ["Grace"]

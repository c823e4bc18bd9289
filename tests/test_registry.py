"""Tool registration: schemas from type hints, argument validation."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field

from mcptasks import ToolContext
from mcptasks.errors import INVALID_PARAMS, InvalidParams
from mcptasks.tools import registry as registry_module
from mcptasks.tools.registry import tool
from tests.support.schemas import assert_valid

RegistryClass = getattr(registry_module, "Registry", None) or registry_module.ToolRegistry


@pytest.fixture
def reg():
    return RegistryClass()


def test_schema_from_type_hints(reg):
    @tool(registry=reg, task="optional")
    def weigh(
        ctx: ToolContext,
        item: str,
        grams: int,
        factor: float = 1.5,
        tags: list[str] | None = None,
        unit: Literal["g", "kg"] = "g",
        note: Annotated[str, Field(description="Free text.")] = "",
    ) -> str:
        """Weigh an item."""
        return item

    t = reg.get("weigh")
    assert t.wants_context
    assert t.task == "optional"
    assert t.description == "Weigh an item."
    schema = t.input_schema
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"item", "grams", "factor", "tags", "unit", "note"}, "ctx is not an argument"
    assert sorted(schema["required"]) == ["grams", "item"]
    assert schema["properties"]["item"]["type"] == "string"
    assert schema["properties"]["grams"]["type"] == "integer"
    assert schema["properties"]["factor"] == {"type": "number", "default": 1.5}
    assert schema["properties"]["unit"]["enum"] == ["g", "kg"]
    assert schema["properties"]["note"]["description"] == "Free text."
    assert schema.get("additionalProperties") is False
    assert "title" not in schema and all("title" not in p for p in schema["properties"].values())
    assert_valid("2026-07-28.schema.json", "Tool", t.describe())


def test_a_property_called_title_survives(reg):
    @tool(registry=reg, description="d")
    def book(title: str) -> str:
        return title

    assert reg.get("book").input_schema["properties"]["title"]["type"] == "string"


def test_no_arguments_schema(reg):
    @tool(registry=reg, description="Nothing to give.")
    def ping_me() -> str:
        return "pong"

    t = reg.get("ping_me")
    assert t.input_schema == {"type": "object", "additionalProperties": False}
    assert not t.wants_context
    assert t.validate_arguments(None) == {}
    assert t.validate_arguments({}) == {}
    assert_valid("2026-07-28.schema.json", "Tool", t.describe())


def test_explicit_name_title_and_annotations(reg):
    @tool(registry=reg, name="renamed", title="Pretty", annotations={"readOnlyHint": True}, description="x")
    def ugly() -> str:
        return ""

    described = reg.get("renamed").describe()
    assert described["name"] == "renamed"
    assert described["title"] == "Pretty"
    assert described["annotations"] == {"readOnlyHint": True}
    assert "ugly" not in reg
    assert_valid("2026-07-28.schema.json", "Tool", described)


@pytest.fixture
def adder(reg):
    @tool(registry=reg, description="Add.")
    def add(a: int, b: int = 1) -> int:
        return a + b

    return reg.get("add")


def test_valid_arguments(adder):
    assert adder.validate_arguments({"a": 2}) == {"a": 2, "b": 1}
    assert adder.validate_arguments({"a": 2, "b": 5}) == {"a": 2, "b": 5}


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "a"),
        ({"a": "not a number"}, "a"),
        ({"a": 1, "c": 3}, "c"),
        ({"a": [1]}, "a"),
    ],
)
def test_invalid_arguments_are_invalid_params(adder, arguments, fragment):
    with pytest.raises(InvalidParams) as info:
        adder.validate_arguments(arguments)
    error = info.value.to_dict()
    assert error["code"] == INVALID_PARAMS == -32602
    assert "add" in error["message"]
    assert fragment in error["message"]
    locations = [e["loc"] for e in error["data"]["errors"]]
    assert any(fragment in map(str, loc) for loc in locations), locations


@pytest.mark.parametrize("arguments", [[1, 2], "a=1", 3])
def test_arguments_must_be_an_object(adder, arguments):
    with pytest.raises(InvalidParams, match="must be an object"):
        adder.validate_arguments(arguments)


def test_registration_errors(reg):
    with pytest.raises(ValueError, match="task must be one of"):
        tool(registry=reg, task="sometimes")

    def varargs(*names: str) -> str:
        return ""

    with pytest.raises(TypeError, match="args"):
        tool(varargs, registry=reg)

    @tool(registry=reg, description="first")
    def taken() -> str:
        return ""

    def other() -> str:
        return ""

    with pytest.raises(ValueError, match="already registered"):
        tool(other, name="taken", registry=reg)


def test_registration_bumps_the_version(reg):
    before = reg.version

    @tool(registry=reg, description="v")
    def versioned() -> str:
        return ""

    assert reg.version == before + 1
    reg.unregister("versioned")
    assert reg.version == before + 2
    assert reg.get("versioned") is None


def test_demo_tools_are_registered_with_their_task_modes():
    from mcptasks.tools.registry import registry

    modes = {name: registry.get(name).task for name in ("greet", "slow_compute", "failing_job", "protocol_error_job")}
    assert modes["greet"] == "never"
    assert modes["slow_compute"] == "optional"
    assert modes["failing_job"] == "required"
    assert modes["protocol_error_job"] in ("optional", "required")
    for name in ("confirm_delete", "multi_input", "test_tool_with_task"):
        assert registry.get(name) is not None, name
        assert registry.get(name).task in ("optional", "required")
    for t in registry.all():
        assert t.description, f"tool {t.name} has no description"
        assert_valid("2026-07-28.schema.json", "Tool", t.describe())


def _register(reg, schema):
    @tool(registry=reg, description="Mirrors a parameter.", input_schema=schema)
    def mirrored(region: str = "", count: int = 0, ratio: float = 0.0, tags: list[str] | None = None) -> str:
        return region

    return reg.get("mirrored")


def test_x_mcp_header_is_recorded(reg):
    t = _register(
        reg,
        {
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "count": {"type": "integer", "x-mcp-header": "Count"},
            },
        },
    )
    assert dict(t.header_params) == {"Region": ("region",), "Count": ("count",)}
    assert t.describe()["inputSchema"]["properties"]["region"]["x-mcp-header"] == "Region"


@pytest.mark.parametrize(
    "properties",
    [
        {"region": {"type": "string", "x-mcp-header": "Bad Name"}},
        {"region": {"type": "string", "x-mcp-header": ""}},
        {"region": {"type": "string", "x-mcp-header": "Line\nBreak"}},
        {"ratio": {"type": "number", "x-mcp-header": "Ratio"}},
        {"tags": {"type": "array", "items": {"type": "string", "x-mcp-header": "Tag"}}},
        {"region": {"anyOf": [{"type": "string", "x-mcp-header": "Region"}]}},
    ],
    ids=["space", "empty", "newline", "number", "under-items", "under-anyOf"],
)
def test_invalid_x_mcp_header_is_refused_at_registration(reg, properties):
    with pytest.raises((ValueError, TypeError)):
        _register(reg, {"type": "object", "properties": properties})
    assert reg.get("mirrored") is None


def test_duplicate_x_mcp_header_names_are_refused(reg):
    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "count": {"type": "integer", "x-mcp-header": "region"},
        },
    }
    with pytest.raises(ValueError):
        _register(reg, schema)

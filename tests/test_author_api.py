"""The author API as a site uses it: one import path, typed decorators, the
context found one way, and every registration under the registry's lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import mcptasks
from mcptasks import ToolContext, prompt, resource, resource_template, tool
from mcptasks.signals import registry_changed
from mcptasks.tools.registry import Registry

ROOT = Path(__file__).resolve().parent.parent
TYPED_SITE = ROOT / "tests" / "support" / "typed_site.py"


def test_the_package_exports_the_author_api():
    exported = {"tool", "prompt", "resource", "resource_template", "ToolContext", "ToolResult", "text", "image"}
    assert exported | {"audio", "elicitation", "sampling", "roots", "ToolError"} <= set(mcptasks.__all__)
    assert all(getattr(mcptasks, name) is not None for name in mcptasks.__all__)


def test_importing_the_package_needs_no_settings_and_loads_no_models():
    """Settings modules import from it (``mcptasks.worker.beat``), before Django is set up."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    probe = "import sys, mcptasks, mcptasks.worker.beat; print(sorted(m for m in sys.modules if m.endswith('.models')))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_site_module_type_checks_with_every_decorator_bare_and_called(tmp_path):
    """mypy keeps each decorated function's own type: the decorators are typed
    (no ``Any`` after decoration), calls have the function's return type, and a
    wrong call is an error (its ``type: ignore`` would be unused otherwise)."""
    config = tmp_path / "mypy.ini"
    config.write_text(
        "[mypy]\n"
        "disallow_any_decorated = True\n"
        "disallow_untyped_decorators = True\n"
        "warn_unused_ignores = True\n"
        "follow_imports = silent\n"
    )
    command = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(tmp_path / "cache")]
    out = subprocess.run([*command, str(TYPED_SITE)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues found" in out.stdout


def test_the_decorators_hand_back_the_function_itself():
    reg = Registry()

    def plain(a: int) -> int:
        return a

    assert tool(plain, registry=reg) is plain
    assert tool(name="other", registry=reg)(plain) is plain
    assert prompt(registry=reg)(plain) is plain
    assert resource("site://plain", registry=reg)(plain) is plain
    assert resource_template("site://plain/{a}", registry=reg)(plain) is plain


# The context: one rule for tools and prompts -------------------------------------------------


def test_a_prompt_takes_the_context_by_its_annotation_like_a_tool():
    reg = Registry()

    def summarize(context: ToolContext, topic: str) -> str:
        return topic

    tool(summarize, registry=reg)
    prompt(summarize, registry=reg)
    assert reg.get("summarize").wants_context is True
    assert reg.prompts["summarize"].wants_context is True
    assert [a["name"] for a in reg.prompts["summarize"].arguments] == ["topic"]


def test_an_unannotated_ctx_is_the_context_for_both():
    reg = Registry()

    def ask(ctx, topic: str) -> str:
        return topic

    tool(ask, registry=reg)
    prompt(ask, registry=reg)
    assert reg.get("ask").wants_context and reg.prompts["ask"].wants_context
    assert "ctx" not in reg.get("ask").input_schema["properties"]


def test_a_first_parameter_that_is_not_the_context_is_an_argument_for_both():
    reg = Registry()

    def echo(text: str) -> str:
        return text

    tool(echo, registry=reg)
    prompt(echo, registry=reg)
    assert not reg.get("echo").wants_context and not reg.prompts["echo"].wants_context
    assert [a["name"] for a in reg.prompts["echo"].arguments] == ["text"]


@pytest.mark.parametrize("decorator", [tool, prompt])
def test_a_ctx_annotated_as_something_else_is_refused(decorator):
    def odd(ctx: int) -> str:
        return str(ctx)

    with pytest.raises(TypeError, match="ctx must be annotated ToolContext"):
        decorator(odd, registry=Registry())


# Resources register like tools ------------------------------------------------------------------


@pytest.fixture
def changes() -> Any:
    kinds: list[str] = []

    def record(kind: str, **_: Any) -> None:
        kinds.append(kind)

    registry_changed.connect(record, dispatch_uid="test_author_api.changes")
    yield kinds
    registry_changed.disconnect(dispatch_uid="test_author_api.changes")


def test_resources_and_templates_signal_a_registry_change(changes):
    reg = Registry()

    def motd() -> str:
        return "hello"

    resource("site://motd", registry=reg)(motd)
    resource_template("site://users/{user_id}", registry=reg)(motd)
    assert changes == ["resources", "resources"]
    assert reg.find_resource("site://motd") == (motd, {}, "text/plain")
    assert reg.find_resource("site://users/7") == (motd, {"user_id": "7"}, "text/plain")


def test_a_template_registered_again_replaces_the_first():
    reg = Registry()

    def first(user_id: str) -> str:
        return "first"

    def second(user_id: str) -> str:
        return "second"

    resource_template("site://users/{user_id}", registry=reg)(first)
    resource_template("site://users/{user_id}", registry=reg)(second)
    assert [t.fn for t in reg.templates] == [second]


@pytest.mark.parametrize(
    "register",
    [
        lambda reg, fn: resource("site://locked", registry=reg)(fn),
        lambda reg, fn: resource_template("site://locked/{part}", registry=reg)(fn),
        lambda reg, fn: prompt(fn, registry=reg),
    ],
    ids=["resource", "resource_template", "prompt"],
)
def test_registrations_wait_for_the_registry_lock(register):
    """A registration from another thread waits while the lock is held, as a
    tool's does, so a reader holding it sees a list that does not change."""
    reg = Registry()

    def locked(part: str = "") -> str:
        return part

    with reg._lock:
        worker = threading.Thread(target=register, args=(reg, locked), daemon=True)
        worker.start()
        time.sleep(0.3)
        assert (reg.resources, reg.templates, reg.prompts) == ({}, [], {})
    worker.join(10)
    assert not worker.is_alive()
    assert len(reg.resources) + len(reg.templates) + len(reg.prompts) == 1


def test_tool_options_that_mypy_refuses(tmp_path):
    """The execution controls are typed: a queue that is not a string, retries
    or a concurrency that are not a count, retry_on that is not exception
    classes are errors."""
    site = tmp_path / "bad_controls.py"
    site.write_text(
        "from mcptasks import tool\n\n"
        "@tool(queue=3)  # type: ignore[call-overload]\n"
        "def a() -> int:\n    return 1\n\n"
        "@tool(retries='2')  # type: ignore[call-overload]\n"
        "def b() -> int:\n    return 1\n\n"
        "@tool(retry_on=(str,))  # type: ignore[arg-type]\n"
        "def c() -> int:\n    return 1\n\n"
        "@tool(concurrency='2')  # type: ignore[call-overload]\n"
        "def e() -> int:\n    return 1\n\n"
        "@tool(time_limit=1.5, soft_time_limit=1, retry_on=[ValueError], retries=1, concurrency=3)\n"
        "def d() -> int:\n    return 1\n\n"
        "reveal_type(d)\n"
    )
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nwarn_unused_ignores = True\nfollow_imports = silent\n")
    command = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(tmp_path / "cache")]
    out = subprocess.run([*command, str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert 'Revealed type is "def () -> builtins.int"' in out.stdout, out.stdout + out.stderr
    assert "error" not in out.stdout.replace("note:", ""), out.stdout

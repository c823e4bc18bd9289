"""The public surface a site writes against: the names ``mcptasks`` exports, the
modules the README documents for settings, URLconfs and tests, and the example
site and the test site importing nothing else."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What ``from mcptasks import ...`` gives a site (README, "The public surface").
PUBLIC_NAMES = {
    # writing tools
    "tool",
    "prompt",
    "resource",
    "resource_template",
    "registry",
    "ToolContext",
    "elicitation",
    "sampling",
    "roots",
    "ToolResult",
    "text",
    "image",
    "audio",
    # errors a tool raises or catches, and their codes
    "ToolError",
    "ProtocolError",
    "SoftTimeLimitExceeded",
    "MissingCapability",
    "TaskCancelled",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    # settings and asgi.py
    "BEAT_SCHEDULE",
    "mcp_router",
}

#: The other modules a site may import or name (README, "The public surface").
PUBLIC_MODULES = {
    "mcptasks",
    "mcptasks.conf",
    "mcptasks.signals",
    "mcptasks.tasks.lifecycle",
    "mcptasks.testing",
    "mcptasks.client",
    "mcptasks.urls",
    "mcptasks.web.identity",
    "mcptasks.telemetry.scrape",
    "mcptasks.oauth.authentication",
    "mcptasks.oauth.client_configuration",
    "mcptasks.oauth.registration",
    "mcptasks.oauth.urls",
    "mcptasks.oauth.validators",
    "mcptasks.oauth.views",
}


def test_the_package_exports_the_public_names():
    import mcptasks

    assert set(mcptasks.__all__) == PUBLIC_NAMES
    for name in PUBLIC_NAMES:
        assert getattr(mcptasks, name) is not None, name
    from mcptasks.web.asgi import mcp_router

    assert mcptasks.mcp_router is mcp_router
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = mcptasks.not_a_name


IMPORT_BEFORE_SETUP = """
import sys
import mcptasks
from mcptasks import BEAT_SCHEDULE, INTERNAL_ERROR, MissingCapability, ToolContext, tool
from django.conf import settings
assert not settings.configured
loaded = sorted(m for m in sys.modules if m.startswith("mcptasks.") and m.split(".")[1] in {"models", "web", "tasks"})
assert loaded == [], loaded
assert {entry["task"] for entry in BEAT_SCHEDULE.values()} == {"mcptasks.sweep", "mcptasks.prune_expired"}
print("ok")
"""


def test_the_package_imports_from_a_settings_module_before_django_is_set_up():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_BEFORE_SETUP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _mcptasks_imports(folder: Path, skip: str | None = None) -> list[tuple[str, str, str | None]]:
    """(file, module, name) for each import of mcptasks under ``folder``."""
    found: list[tuple[str, str, str | None]] = []
    for path in sorted(folder.rglob("*.py")):
        if skip and skip in path.relative_to(folder).parts:
            continue
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mcptasks":
                found += [(where, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(where, a.name, None) for a in node.names if a.name.split(".")[0] == "mcptasks"]
    return found


@pytest.mark.parametrize(("folder", "skip"), [("project", "tests"), ("tests/testapp", None)])
def test_the_sites_import_only_the_public_surface(folder, skip):
    imports = _mcptasks_imports(ROOT / folder, skip)
    assert imports, "the site imports mcptasks somewhere"
    outside = [(f, m) for f, m, _ in imports if m not in PUBLIC_MODULES]
    assert outside == []
    unknown = [(f, n) for f, m, n in imports if m == "mcptasks" and n not in PUBLIC_NAMES]
    assert unknown == []


def test_the_readme_names_only_the_public_surface():
    """Every ``from mcptasks... import`` in the README's code blocks."""
    readme = (ROOT / "README.md").read_text()
    blocks = [textwrap.dedent(b.split("```", 1)[0]) for b in readme.split("```python")[1:]]
    modules = set()
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mcptasks"):
                modules.add(node.module)
                if node.module == "mcptasks":
                    assert {a.name for a in node.names} <= PUBLIC_NAMES
    assert "mcptasks" in modules
    assert "mcptasks.worker.beat" not in modules
    assert modules <= PUBLIC_MODULES

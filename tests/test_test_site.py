"""The suite runs on a site of its own (tests/testapp/), never on the example
site: the pytest settings, the test site and the live stacks' processes
import nothing from ``project``. The example site's own tests, in
project/tests/, are the only ones that start a stack of it (as
tests/test_live_fresh_run.py starts it through ``bin/run``)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import live

REPO = Path(__file__).resolve().parents[1]
TEST_SITE = REPO / "tests" / "testapp"
#: Settings a live stack runs on beside the test site's, which build on it.
STACK_SETTINGS = [
    REPO / "tests" / "support" / "cimd_loopback_settings.py",
    REPO / "tests" / "support" / "cimd_loopback.py",
]
#: Where the tests are: the suite's, and the example site's own.
TEST_DIRS = [REPO / "tests", REPO / "project" / "tests"]

#: What a test process loads: the pytest settings, and every module of the
#: test site that the live stacks' web and worker processes import.
LOAD_THE_TEST_SITE = """
import importlib, json, os, pkgutil, sys
os.environ["DJANGO_SETTINGS_MODULE"] = sys.argv[1]
import django
django.setup()
import tests.testapp
for module in pkgutil.iter_modules(tests.testapp.__path__, "tests.testapp."):
    importlib.import_module(module.name)
importlib.import_module(sys.argv[2].partition(":")[0])
from django.urls import resolve
resolve("/mcp")
from mcptasks.tools.registry import registry
print(json.dumps({
    "modules": sorted(sys.modules),
    "tools": sorted(tool.name for tool in registry.all()),
}))
"""


def load_in_fresh_process(settings_module: str) -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", LOAD_THE_TEST_SITE, settings_module, live.SITE_ASGI],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    loaded: dict[str, list[str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def from_the_example_site(modules: list[str]) -> list[str]:
    return [name for name in modules if name == "project" or name.startswith("project.")]


def test_the_pytest_settings_and_the_test_site_load_nothing_from_the_example_site() -> None:
    for settings_module in ("tests.settings", live.SITE_SETTINGS):
        loaded = load_in_fresh_process(settings_module)
        assert "tests.testapp.mcp_tools" in loaded["modules"]
        assert "slow_compute" in loaded["tools"]
        assert from_the_example_site(loaded["modules"]) == [], settings_module


def imported_modules(path: Path) -> list[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names,
    wherever it stands (in a function too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_no_module_of_the_test_site_imports_the_example_site() -> None:
    sources = [REPO / "tests" / "settings.py", *sorted(TEST_SITE.rglob("*.py")), *STACK_SETTINGS]
    assert len(sources) > 5
    found = {str(path.relative_to(REPO)): from_the_example_site(imported_modules(path)) for path in sources}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_scan_sees_an_import_of_the_example_site(tmp_path: Path) -> None:
    module = tmp_path / "site_module.py"
    module.write_text("def tools():\n    from project.demo import mcp_tools\n    import project.settings\n")
    assert from_the_example_site(imported_modules(module)) == ["project.demo", "project.settings"]


def test_the_live_stacks_run_the_test_site() -> None:
    env = live.base_env()
    assert env["DJANGO_SETTINGS_MODULE"] == "tests.testapp.settings"
    assert live.uvicorn_argv(8000)[3] == "tests.testapp.asgi:application"
    assert live.celery_argv("worker")[3:5] == ["-A", "tests.testapp"]


def test_a_stack_of_the_example_site_runs_the_example_site(tmp_path: Path) -> None:
    site = live.EXAMPLE_SITE
    assert live.base_env(site=site)["DJANGO_SETTINGS_MODULE"] == "project.settings"
    stack = live.LiveStack(
        url="http://127.0.0.1:1/mcp",
        port=1,
        database_url="postgres://127.0.0.1/x",
        db_name="x",
        broker_url="redis://127.0.0.1/0",
        queue="q",
        env={},
        log_dir=tmp_path,
        site=site,
    )
    assert stack.web_argv()[3] == "project.asgi:application"
    assert stack.worker_argv(0)[3:5] == ["-A", "project"]


def test_only_the_example_sites_own_tests_start_a_stack_of_it() -> None:
    naming = [
        path.relative_to(REPO).as_posix()
        for directory in TEST_DIRS
        for path in sorted(directory.rglob("*.py"))
        if path not in (Path(__file__).resolve(), Path(live.__file__).resolve()) and "EXAMPLE_SITE" in path.read_text()
    ]
    assert "project/tests/test_live_authorization_server.py" in naming
    assert [path for path in naming if not path.startswith("project/tests/")] == []


def test_every_live_test_is_in_a_test_live_file() -> None:
    """File names match markers: a test module that uses the ``live`` marker
    is named ``test_live_*.py``, so ``-m "not live"`` and the names agree;
    in the example site's tests too."""
    marked = [
        path.relative_to(REPO).as_posix()
        for directory in TEST_DIRS
        for path in sorted(directory.rglob("test_*.py"))
        if path != Path(__file__).resolve() and "pytest.mark.live" in path.read_text()
    ]
    assert len(marked) > 10
    assert "project/tests/test_live_authorization_server.py" in marked
    assert [path for path in marked if not path.rpartition("/")[2].startswith("test_live_")] == []

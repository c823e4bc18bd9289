"""The official conformance suite's 2025-11-25 requirement set, on the
session wire, against both configurations of the example site (the
embedded default and the live services stack; fixtures from
tests/test_conformance.py).

``--requirements 2025-11-25`` runs every scenario that revision scores
(initialize, ping, logging, tools, elicitation, resources, prompts,
completion, multiple SSE streams, DNS rebinding) plus a few unscored ones
(the session lifecycle among them); all must pass.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.test_conformance import ANSI, Suite, embedded_server, node_env, server_url, suite  # noqa: F401

pytestmark = pytest.mark.conformance

SCORED = {
    "server-initialize",
    "logging-set-level",
    "ping",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "server-sse-multiple-streams",
    "elicitation-sep1330-enums",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
}
UNSCORED = {"server-session-lifecycle", "json-schema-2020-12", "server-sse-polling"}
RESULT_LINE = re.compile(r"^[✓✗] (\S+): (\d+) passed, (\d+) failed", re.MULTILINE)


def test_the_2025_11_25_requirements_pass(suite: Suite, server_url: str, tmp_path: Path) -> None:  # noqa: F811
    proc = subprocess.run(
        suite.command("server", "--url", server_url, "--requirements", "2025-11-25", "-o", str(tmp_path)),
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    output = ANSI.sub("", proc.stdout + proc.stderr)
    results = {name: (int(passed), int(failed)) for name, passed, failed in RESULT_LINE.findall(output)}
    assert set(results) == SCORED | UNSCORED, f"unexpected scenario set:\n{output[-3000:]}"
    failures = []
    for path in sorted(tmp_path.glob("server-*/checks.json")):
        for check in json.loads(path.read_text()):
            if check.get("status") == "FAILURE":
                failures.append(f"{path.parent.name}: [{check.get('id')}] {check.get('errorMessage', '')[:500]}")
    assert not failures, "\n".join(failures)
    assert all(failed == 0 for _, failed in results.values()), results
    assert proc.returncode == 0, output[-3000:]
    assert sum(passed for passed, _ in results.values()) >= 80

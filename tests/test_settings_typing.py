"""``mcptasks.conf.settings``: the settings class to a type checker, the live
proxy at run time.

A type checker sees ``settings`` as ``MCPTasksSettings``, so a read has its
field's type and a misspelt name is an error where it is written. At run time
it stays the proxy that rebuilds the settings when ``MCPTASKS`` changes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.test import override_settings

from mcptasks import conf
from mcptasks.conf import MCPTasksSettings, settings

REPO = Path(__file__).resolve().parents[1]


def run_mypy(tmp_path: Path, source: str) -> list[str]:
    """mypy's lines for ``source``, checked as bin/test checks mcptasks/ (the
    ``[tool.mypy]`` configuration: strict, django-stubs' plugin). It runs in
    its own process: the plugin sets Django up with settings of its own."""
    snippet = tmp_path / "settings_reader.py"
    snippet.write_text(textwrap.dedent(source))
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), str(snippet)],
        cwd=REPO,  # the plugin imports its settings module from the repository root
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in completed.stderr, completed.stderr
    return [line.replace(str(snippet), "snippet.py") for line in completed.stdout.splitlines()]


def test_settings_reads_have_their_fields_types_and_a_misspelt_name_is_a_type_error(tmp_path: Path) -> None:
    lines = run_mypy(
        tmp_path,
        """
        from mcptasks.conf import settings

        reveal_type(settings.MAX_TTL_MS)
        reveal_type(settings.ALLOWED_ORIGINS)
        settings.MAX_TLL_MS
        settings.MAX_TTL_MS = 5
        """,
    )
    assert lines == [
        'snippet.py:4: note: Revealed type is "builtins.int"',
        'snippet.py:5: note: Revealed type is "builtins.tuple[builtins.str, ...] | None"',
        'snippet.py:6: error: "MCPTasksSettings" has no attribute "MAX_TLL_MS"; maybe "MAX_TTL_MS"?  [attr-defined]',
        'snippet.py:7: error: Property "MAX_TTL_MS" defined in "MCPTasksSettings" is read-only  [misc]',
        "Found 2 errors in 1 file (checked 1 source file)",
    ]


def test_correct_settings_reads_pass_the_strict_check(tmp_path: Path) -> None:
    lines = run_mypy(
        tmp_path,
        """
        from mcptasks.conf import settings


        def ttl_seconds() -> float:
            return settings.MAX_TTL_MS / 1000


        def origins() -> tuple[str, ...]:
            return settings.ALLOWED_ORIGINS or ()
        """,
    )
    assert lines == ["Success: no issues found in 1 source file"]


def test_at_run_time_settings_is_the_proxy_that_follows_setting_changes() -> None:
    assert type(settings) is conf._SettingsProxy
    default = MCPTasksSettings().MAX_TTL_MS
    with override_settings(MCPTASKS={"MAX_TTL_MS": 1234, "ALLOWED_ORIGINS": ["https://a.example"]}):
        assert settings.MAX_TTL_MS == 1234
        assert settings.ALLOWED_ORIGINS == ("https://a.example",)
        assert conf.get_settings() is conf.get_settings()  # read once per change, not per access
    assert default == settings.MAX_TTL_MS


def test_at_run_time_a_misspelt_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="MAX_TLL_MS"):
        settings.MAX_TLL_MS  # noqa: B018


def test_an_unknown_mcptasks_key_is_refused() -> None:
    with (
        override_settings(MCPTASKS={"MAX_TLL_MS": 5}),
        pytest.raises(ValueError, match=r"Unknown MCPTASKS settings: \['MAX_TLL_MS'\]"),
    ):
        settings.MAX_TTL_MS  # noqa: B018

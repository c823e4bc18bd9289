"""The package's own metadata: one version, classifiers that say what CI tests."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from mcptasks.conf import MCPTasksSettings

REPO = Path(__file__).resolve().parents[1]


def test_server_version_is_the_package_version() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert MCPTasksSettings().SERVER_VERSION == version("mcptasks") == pyproject["project"]["version"]


def test_django_classifiers_are_the_versions_ci_tests() -> None:
    """bin/test runs the suite on requirements/test.txt's Django (through
    base.txt) and again on django6.txt's: the classifiers name exactly those."""
    tested = set()
    for name in ("base.txt", "django6.txt"):
        pin = re.search(r"^Django==(\d+\.\d+)", (REPO / "requirements" / name).read_text(), re.MULTILINE)
        assert pin, f"requirements/{name} pins no Django"
        tested.add(pin.group(1))
    classifiers = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["classifiers"]
    declared = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Framework :: Django :: \d+\.\d+", c)}
    assert declared == tested


def test_the_package_says_it_is_typed() -> None:
    assert (REPO / "mcptasks" / "py.typed").is_file()
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["mcptasks"]


def test_every_data_file_of_the_package_goes_into_the_wheel() -> None:
    """Files the app reads at run time (templates, static files, the named SQL
    statements) must match a package-data pattern, or a site installed from
    the wheel fails where a checkout works."""
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["mcptasks"]
    package = REPO / "mcptasks"
    data = [
        path.relative_to(package)
        for path in package.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    ]
    assert data, "the package has data files (templates, queries.sql)"
    packaged = {path.relative_to(package) for pattern in patterns for path in package.glob(pattern)}
    assert [str(path) for path in data if path not in packaged] == []

"""How ``manage.py mcptasks run`` finds the site's ASGI application, its
Celery app and beat's schedule file (mcptasks.worker.discovery, mcptasks.worker.runner).

The test site (``tests.testapp``) is the site under discovery here: it has
the ``asgi.py`` startproject makes and the ``celery.py`` + ``__init__.py``
import of Celery's "First steps with Django". ``tests`` is a package with
neither.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from celery import Celery
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import tests
import tests.testapp
import tests.testapp.asgi
import tests.testapp.celery
from mcptasks.worker.discovery import find_asgi_application, find_celery_app, settings_packages, split_object_path
from mcptasks.worker.runner import beat_schedule_file, broker_is_in_process, child_environment


@pytest.fixture(autouse=True)
def no_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASGI_APPLICATION_PATH", raising=False)
    monkeypatch.delenv("MCPTASKS_CELERY_APP", raising=False)


# ASGI ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["tests.testapp.asgi:application", "tests.testapp.asgi.application"])
def test_the_asgi_flag_takes_both_spellings(path: str):
    found = find_asgi_application(path)
    assert found.name == "tests.testapp.asgi:application"
    assert found.source == "--asgi"
    assert found.obj is tests.testapp.asgi.application


def test_the_environment_variable_comes_before_the_settings(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ASGI_APPLICATION_PATH", "tests.testapp.asgi:django_application")
    found = find_asgi_application()
    assert (found.name, found.source) == ("tests.testapp.asgi:django_application", "ASGI_APPLICATION_PATH")
    assert found.obj is tests.testapp.asgi.django_application


@override_settings(
    ASGI_APPLICATION="tests.testapp.asgi.django_application", WSGI_APPLICATION="nowhere.wsgi.application"
)
def test_settings_asgi_application_is_used_when_set():
    found = find_asgi_application()
    assert (found.name, found.source) == ("tests.testapp.asgi:django_application", "settings.ASGI_APPLICATION")
    assert found.obj is tests.testapp.asgi.django_application


@override_settings(ASGI_APPLICATION=None, WSGI_APPLICATION="tests.testapp.wsgi.application")
def test_without_asgi_application_the_asgi_module_beside_wsgi_is_used():
    found = find_asgi_application()
    assert found.name == "tests.testapp.asgi:application"
    assert found.source == "the asgi module beside WSGI_APPLICATION (tests.testapp.wsgi.application)"
    assert found.obj is tests.testapp.asgi.application


@override_settings(ASGI_APPLICATION=None, WSGI_APPLICATION="tests.wsgi.application", SETTINGS_MODULE="tests.settings")
def test_no_asgi_module_anywhere_says_what_to_set():
    with pytest.raises(CommandError) as info:
        find_asgi_application()
    message = str(info.value)
    assert "settings.ASGI_APPLICATION is not set" in message
    assert "tests.wsgi.application" in message
    assert 'ASGI_APPLICATION = "tests.asgi.application"' in message
    assert "--asgi tests.asgi:application" in message


@override_settings(ASGI_APPLICATION=None, WSGI_APPLICATION=None)
def test_neither_setting_says_what_to_set():
    with pytest.raises(CommandError, match=r"WSGI_APPLICATION \(not set\)\. Set ASGI_APPLICATION = "):
        find_asgi_application()


@override_settings(ASGI_APPLICATION="tests.testapp.nothere.application")
def test_a_named_application_that_does_not_import_is_an_error_not_a_fallback():
    with pytest.raises(CommandError) as info:
        find_asgi_application()
    assert "settings.ASGI_APPLICATION names 'tests.testapp.nothere.application'" in str(info.value)
    assert "'tests.testapp.nothere' cannot be imported" in str(info.value)


def test_a_module_without_that_attribute_is_an_error():
    with pytest.raises(CommandError, match=re.escape("'tests.testapp.asgi' has no ASGI application 'missing'")):
        find_asgi_application("tests.testapp.asgi:missing")


def test_a_path_without_a_dot_is_an_error():
    with pytest.raises(CommandError, match="not a dotted path"):
        find_asgi_application("application")
    with pytest.raises(ValueError):
        split_object_path("mysite.asgi:")


# Celery --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tests.testapp", "tests.testapp.celery", "tests.testapp.celery:app"])
def test_the_celery_flag_takes_what_celery_a_takes(name: str):
    found = find_celery_app(name)
    assert (found.name, found.source) == (name, "--celery-app")
    assert found.obj is tests.testapp.celery.app


def test_the_celery_environment_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MCPTASKS_CELERY_APP", "tests.testapp.celery:app")
    found = find_celery_app()
    assert (found.source, found.obj) == ("MCPTASKS_CELERY_APP", tests.testapp.celery.app)


def test_the_celery_app_setting(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "CELERY_APP": "tests.testapp.celery:app"}
    settings.SETTINGS_MODULE = "tests.settings"  # which has no app: the setting must win
    found = find_celery_app()
    assert (found.name, found.source) == ("tests.testapp.celery:app", 'MCPTASKS["CELERY_APP"]')
    assert found.obj is tests.testapp.celery.app


@override_settings(SETTINGS_MODULE="tests.testapp.settings")
def test_the_settings_package_is_looked_up_like_celery_a():
    found = find_celery_app()
    assert found.name == "tests.testapp"
    assert found.source == "the package of the settings module tests.testapp.settings"
    assert found.obj is tests.testapp.celery.app


@override_settings(SETTINGS_MODULE="tests.testapp.demo.settings")
def test_a_nested_settings_module_finds_the_app_in_an_enclosing_package():
    assert settings_packages() == ["tests.testapp.demo", "tests.testapp", "tests"]
    found = find_celery_app()
    assert (found.name, found.obj) == ("tests.testapp", tests.testapp.celery.app)


@override_settings(SETTINGS_MODULE="tests.settings")
def test_no_celery_app_anywhere_says_what_to_create_or_set():
    with pytest.raises(CommandError) as info:
        find_celery_app()
    message = str(info.value)
    assert "No Celery app found (looked in tests, the way `celery -A` does)" in message
    assert "Create tests/celery.py" in message
    assert '"First steps with Django"' in message
    assert 'MCPTASKS = {"CELERY_APP": "tests.celery:app"}' in message
    assert "--celery-app tests.celery:app" in message


def test_a_named_celery_app_that_does_not_load_is_an_error():
    with pytest.raises(CommandError, match=re.escape("--celery-app names the Celery app 'nowhere.celery:app'")):
        find_celery_app("nowhere.celery:app")
    with pytest.raises(CommandError, match=re.escape("'tests.testapp.settings:DEBUG', which is not a Celery app")):
        find_celery_app("tests.testapp.settings:DEBUG")


@override_settings(SETTINGS_MODULE="tests.settings")
def test_run_stops_with_the_error_before_starting_anything():
    with pytest.raises(CommandError, match="No Celery app found"):
        call_command("mcptasks", "run", "--port", "1")


def test_run_without_uvicorn_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # how Python marks a module as not importable
    with pytest.raises(CommandError, match=re.escape('pip install "mcptasks[server]" (or uvicorn)')):
        call_command("mcptasks", "run", "--port", "1")


# Beat schedule and broker --------------------------------------------------------------------------


def test_beat_schedule_file_is_celerys_setting_and_its_folder_is_made(tmp_path: Path):
    app = Celery("discovery-test", set_as_current=False)
    assert beat_schedule_file(app) == "celerybeat-schedule"  # Celery's default: the current directory
    app.conf.beat_schedule_filename = str(tmp_path / "state" / "beat")
    assert beat_schedule_file(app) == str(tmp_path / "state" / "beat")
    assert (tmp_path / "state").is_dir()


def test_the_in_process_broker_is_read_from_the_app():
    app = Celery("discovery-test", set_as_current=False)
    app.conf.broker_url = "memory://"
    assert broker_is_in_process(app)
    app.conf.broker_url = "redis://127.0.0.1:6379/0"
    assert not broker_is_in_process(app)


@pytest.mark.parametrize("name", ["tests.testapp", "tests.testapp.celery:app"])
def test_celery_children_import_the_app_from_the_sites_folder_whatever_the_current_one(
    name: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    site_folder = str(Path(tests.__file__).resolve().parent.parent)
    assert child_environment(name)["PYTHONPATH"].split(os.pathsep) == [site_folder, "/elsewhere"]

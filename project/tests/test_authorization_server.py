"""The example site's authorization server at its edges, in-process: only the
endpoints it serves are mounted, introspection is for the resource servers it
names, and failed sign-ins (login page, admin and token endpoint) are
throttled per address and per account by django-axes.

These run on the example site, so each test runs in a process of its own on
``project.settings`` (as the other tests of project/tests/ do), with a SQLite
database of its own (a copy of one migrated once): that process calls the
scenario of the test's name below with Django's test client, and the
scenario's assertions fail it, and the test with it.

project/tests/test_live_authorization_server.py shows the same against a live
server of the example site.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from oauth2_provider.models import (
    get_access_token_model,
    get_application_model,
    get_refresh_token_model,
    set_token_value,
)

REPO = Path(__file__).resolve().parents[2]
#: This module as the example site's process imports it.
MODULE = f"project.tests.{Path(__file__).stem}"
#: Services and settings of the calling environment that the site must not see.
SCRUB = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SECRET_KEY")
SITE_SETTINGS = ("SIGN_IN_FAILURE_LIMIT", "SIGN_IN_COOLOFF_SECONDS", "OAUTH_INTROSPECTION_CLIENTS")

PASSWORD = "correct horse battery staple"
#: The sign-in failures allowed (``SIGN_IN_FAILURE_LIMIT``) in these tests.
LIMIT = 3
#: The resource server the introspection tests name (``OAUTH_INTROSPECTION_CLIENTS``).
RESOURCE_SERVER = "resource-server"

RUN_SCENARIO = """
import importlib, json, sys
import django
django.setup()
from django.test.utils import setup_test_environment
setup_test_environment()
getattr(importlib.import_module(sys.argv[1]), sys.argv[2])(**json.loads(sys.argv[3]))
"""


def site_env(database: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in SCRUB and k not in SITE_SETTINGS and not k.startswith("MCP_")
    }
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": f"sqlite:///{database}",
        "SIGN_IN_FAILURE_LIMIT": str(LIMIT),
        **extra,
    }


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example site's database, migrated once for the module's tests."""
    database = tmp_path_factory.mktemp("example-site") / "db.sqlite3"
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=REPO,
        env=site_env(database, {}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return database


Scenario = Callable[..., None]


@pytest.fixture
def example_site(migrated: Path, tmp_path: Path) -> Callable[..., None]:
    """Runs a scenario of this module on the example site, on a fresh copy of
    the migrated database; ``env`` adds to the site's environment."""

    def run(scenario: Scenario, env: dict[str, str] | None = None, **arguments: Any) -> None:
        database = tmp_path / "db.sqlite3"
        shutil.copyfile(migrated, database)
        done = subprocess.run(
            [sys.executable, "-c", RUN_SCENARIO, MODULE, scenario.__name__, json.dumps(arguments)],
            cwd=REPO,
            env=site_env(database, env or {}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr

    return run


def basic(client_id: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()


def confidential_client(client_id: str, secret: str, **fields: Any) -> Any:
    return get_application_model().objects.create(
        name=client_id,
        client_id=client_id,
        client_secret=secret,
        client_type="confidential",
        authorization_grant_type="authorization-code",
        redirect_uris="https://client.example/callback",
        **fields,
    )


def access_token(user: Any, scope: str = "mcp") -> str:
    app = get_application_model().objects.create(
        name="Desktop assistant",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://127.0.0.1:7777/callback",
    )
    raw = secrets.token_urlsafe(24)
    token = get_access_token_model()(
        user=user, application=app, expires=timezone.now() + timedelta(hours=1), scope=scope
    )
    set_token_value(token, raw)
    token.save()
    return raw


# Routes (g) ---------------------------------------------------------------------------------


def routes_the_site_does_not_serve_are_not_mounted(path: str) -> None:
    client = Client()
    assert client.get(path).status_code == 404
    assert client.post(path, {"client_id": "x", "token": "y"}).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/o/device-authorization/",
        "/o/device/",
        "/o/device-confirm/client/code",
        "/o/device-grant-status/client/code",
        "/o/introspect/",
        "/o/applications/",
        "/o/authorized_tokens/",
        "/o/userinfo/",
    ],
)
def test_routes_the_site_does_not_serve_are_not_mounted(example_site, path):
    example_site(routes_the_site_does_not_serve_are_not_mounted, path=path)


def metadata_advertises_only_the_endpoints_served() -> None:
    document = Client().get("/.well-known/oauth-authorization-server").json()
    assert document["token_endpoint"] == "http://testserver/o/token/"
    assert document["revocation_endpoint"] == "http://testserver/o/revoke_token/"
    assert document["registration_endpoint"] == "http://testserver/o/register/"
    assert "device_authorization_endpoint" not in document
    assert "introspection_endpoint" not in document


def test_metadata_advertises_only_the_endpoints_served(example_site):
    example_site(metadata_advertises_only_the_endpoints_served)


# Introspection (e) ----------------------------------------------------------------------------

#: ``/o/introspect/`` mounted for one named resource server (its client id).
INTROSPECTION_FOR = {"OAUTH_INTROSPECTION_CLIENTS": RESOURCE_SERVER}


def a_named_resource_server_introspects() -> None:
    client = Client()
    confidential_client(RESOURCE_SERVER, "rs-secret")
    token = access_token(get_user_model().objects.create_user("alice"))
    document = client.get("/.well-known/oauth-authorization-server").json()
    assert document["introspection_endpoint"] == "http://testserver/o/introspect/"
    answer = client.post(
        "/o/introspect/", {"token": token}, headers={"Authorization": basic(RESOURCE_SERVER, "rs-secret")}
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["active"] is True and answer.json()["username"] == "alice"


def test_a_named_resource_server_introspects(example_site):
    example_site(a_named_resource_server_introspects, env=INTROSPECTION_FOR)


def nobody_else_introspects() -> None:
    client = Client()
    confidential_client(RESOURCE_SERVER, "rs-secret")
    user = get_user_model().objects.create_user("alice")
    token = access_token(user)
    # A client anyone can register, confidential, with its own secret.
    registered = client.post(
        "/o/register/",
        data=json.dumps(
            {
                "client_name": "curious",
                "redirect_uris": ["https://curious.example/cb"],
                "token_endpoint_auth_method": "client_secret_basic",
            }
        ),
        content_type="application/json",
    ).json()
    assert registered.get("client_secret"), registered
    attempts = {
        "registered client": {"Authorization": basic(registered["client_id"], registered["client_secret"])},
        "wrong secret": {"Authorization": basic(RESOURCE_SERVER, "guess")},
        "bearer token": {"Authorization": f"Bearer {access_token(user, scope='mcp introspection')}"},
        "nothing": {},
    }
    for what, headers in attempts.items():
        answer = client.post("/o/introspect/", {"token": token}, headers=headers)
        assert answer.status_code == 401, (what, answer.content)
        assert answer.json()["error"] == "invalid_client", what
        assert "username" not in answer.json() and "active" not in answer.json(), what


def test_nobody_else_introspects(example_site):
    example_site(nobody_else_introspects, env=INTROSPECTION_FOR)


# Registration (f) ----------------------------------------------------------------------------


def registration_body_nested_too_deeply_is_400() -> None:
    deep_json = b"[" * 100_000 + b"]" * 100_000
    answer = Client().post("/o/register/", data=deep_json, content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "invalid_client_metadata"
    assert not get_application_model().objects.exists()


def test_registration_body_nested_too_deeply_is_400(example_site):
    example_site(registration_body_nested_too_deeply_is_400)


# Sign-in limits (i) ----------------------------------------------------------------------------


def login(client: Any, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def login_is_throttled_per_account() -> None:
    client = Client()
    users = get_user_model().objects
    users.create_user("alice", password=PASSWORD)
    # One guess from each of many addresses: the account is what counts. The
    # form comes back with its error until the last failure allowed.
    statuses = [login(client, "alice", "guess", f"10.0.1.{n}").status_code for n in range(LIMIT)]
    assert statuses == [200] * (LIMIT - 1) + [429]
    locked = login(client, "alice", PASSWORD, "10.0.2.1")
    assert locked.status_code == 429
    assert b"Too many failed sign-in attempts" in locked.content
    assert "_auth_user_id" not in client.session
    # Another account from another address is not affected.
    users.create_user("bob", password=PASSWORD)
    assert login(client, "bob", PASSWORD, "10.0.3.1").status_code == 302


def test_login_is_throttled_per_account(example_site):
    example_site(login_is_throttled_per_account)


def login_is_throttled_per_address() -> None:
    client = Client()
    get_user_model().objects.create_user("carol", password=PASSWORD)
    statuses = [login(client, f"nobody{n}", "guess", "10.0.4.1").status_code for n in range(LIMIT)]
    assert statuses == [200] * (LIMIT - 1) + [429]
    assert login(client, "carol", PASSWORD, "10.0.4.1").status_code == 429
    assert login(client, "carol", PASSWORD, "10.0.4.2").status_code == 302


def test_login_is_throttled_per_address(example_site):
    example_site(login_is_throttled_per_address)


def admin_login_is_throttled() -> None:
    client = Client()
    get_user_model().objects.create_superuser("root", password=PASSWORD)
    statuses = [
        client.post("/admin/login/", {"username": "root", "password": "guess"}, REMOTE_ADDR="10.0.5.1").status_code
        for _ in range(LIMIT)
    ]
    assert statuses == [200] * (LIMIT - 1) + [429]
    answer = client.post("/admin/login/", {"username": "root", "password": PASSWORD}, REMOTE_ADDR="10.0.5.9")
    assert answer.status_code == 429


def test_admin_login_is_throttled(example_site):
    example_site(admin_login_is_throttled)


def token_request(client: Any, data: dict[str, str], address: str, headers: dict[str, str] | None = None) -> Any:
    return client.post("/o/token/", data, REMOTE_ADDR=address, headers=headers or {})


def assert_throttled(answer: Any) -> None:
    assert answer.status_code == 429, answer.content
    body = answer.json()
    assert body["error"] == "temporarily_unavailable"
    assert "Too many failed attempts" in body["error_description"]
    assert int(answer["Retry-After"]) > 0


def token_endpoint_is_throttled_per_client() -> None:
    client = Client()
    confidential_client("service", "right-secret")
    code_grant = {
        "grant_type": "authorization_code",
        "code": "guess",
        "redirect_uri": "https://client.example/callback",
    }
    for n in range(LIMIT - 1):
        answer = token_request(client, code_grant, f"10.0.6.{n}", {"Authorization": basic("service", f"guess{n}")})
        assert answer.status_code == 401 and answer.json()["error"] == "invalid_client"
    assert_throttled(token_request(client, code_grant, "10.0.6.9", {"Authorization": basic("service", "guess")}))
    # Even the right secret now waits, from any address.
    assert_throttled(token_request(client, code_grant, "10.0.7.1", {"Authorization": basic("service", "right-secret")}))


def test_token_endpoint_is_throttled_per_client(example_site):
    example_site(token_endpoint_is_throttled_per_client)


def token_endpoint_is_throttled_per_address() -> None:
    """Guessed codes (or refresh tokens) for public clients, one client id each."""
    client = Client()
    for n in range(LIMIT - 1):
        answer = token_request(
            client, {"grant_type": "refresh_token", "refresh_token": f"guess{n}", "client_id": f"c{n}"}, "10.0.8.1"
        )
        assert answer.status_code in (400, 401), answer.content
    assert_throttled(
        token_request(client, {"grant_type": "refresh_token", "refresh_token": "g", "client_id": "c"}, "10.0.8.1")
    )
    assert_throttled(token_request(client, {"grant_type": "refresh_token", "refresh_token": "x"}, "10.0.8.1"))
    answer = token_request(client, {"grant_type": "refresh_token", "refresh_token": "x"}, "10.0.8.2")
    assert answer.status_code != 429


def test_token_endpoint_is_throttled_per_address(example_site):
    example_site(token_endpoint_is_throttled_per_address)


def a_public_client_is_not_locked_for_other_addresses() -> None:
    """A public client's id is no secret: failures naming it from one address
    lock that address, never the client for its users elsewhere (issue 26)."""
    client = Client()
    user = get_user_model().objects.create_user("victim", password=PASSWORD)
    app = get_application_model().objects.create(
        name="Desktop assistant",
        client_id="public-desktop",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://127.0.0.1:7777/callback",
    )
    access = get_access_token_model()(
        user=user, application=app, expires=timezone.now() + timedelta(hours=1), scope="mcp"
    )
    set_token_value(access, secrets.token_urlsafe(24))
    access.save()
    refresh = get_refresh_token_model()(user=user, application=app, access_token=access)
    raw_refresh = secrets.token_urlsafe(24)
    set_token_value(refresh, raw_refresh)
    refresh.save()
    guess = {
        "grant_type": "authorization_code",
        "code": "guess",
        "redirect_uri": "http://127.0.0.1:7777/callback",
        "client_id": "public-desktop",
    }
    for _ in range(LIMIT):
        token_request(client, guess, "10.0.11.1")
    assert_throttled(token_request(client, guess, "10.0.11.1"))  # the guessing address waits
    answer = token_request(
        client,
        {"grant_type": "refresh_token", "refresh_token": raw_refresh, "client_id": "public-desktop"},
        "10.0.12.1",
    )
    assert answer.status_code == 200, answer.content
    # An id no client registered (a CIMD URL, say) is no secret either.
    cimd = {**guess, "client_id": "https://client.example/metadata.json"}
    for _ in range(LIMIT):
        token_request(client, cimd, "10.0.13.1")
    assert token_request(client, cimd, "10.0.14.1").status_code != 429


def test_a_public_client_is_not_locked_for_other_addresses(example_site):
    example_site(a_public_client_is_not_locked_for_other_addresses)


def a_failed_login_and_a_failed_token_request_count_apart_per_account() -> None:
    """A client id never counts against the user of the same name."""
    client = Client()
    get_user_model().objects.create_user("service", password=PASSWORD)
    confidential_client("service", "right-secret")
    grant = {"grant_type": "authorization_code", "code": "guess", "redirect_uri": "https://client.example/callback"}
    for n in range(LIMIT):
        token_request(client, grant, f"10.0.9.{n}", {"Authorization": basic("service", "guess")})
    assert login(client, "service", PASSWORD, "10.0.10.1").status_code == 302


def test_a_failed_login_and_a_failed_token_request_count_apart_per_account(example_site):
    example_site(a_failed_login_and_a_failed_token_request_count_apart_per_account)


def test_a_failing_scenario_fails_its_test(example_site):
    """The process's assertions reach the test: a scenario that cannot hold fails it."""
    with pytest.raises(AssertionError, match="AssertionError"):
        example_site(routes_the_site_does_not_serve_are_not_mounted, path="/o/token/")

"""The example site's authorization server at its edges, in-process: only the
endpoints it serves are mounted, introspection is for the resource servers it
names, a registration body nested too deeply is a 400, and failed sign-ins
(login page and token endpoint) are throttled per address and per account.

tests/test_live_authorization_server.py shows the same against a live server.
"""

from __future__ import annotations

import base64
import importlib
import json
import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.urls import clear_url_caches
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model, set_token_value

import project.urls

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000


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
def test_routes_the_site_does_not_serve_are_not_mounted(client, path):
    assert client.get(path).status_code == 404
    assert client.post(path, {"client_id": "x", "token": "y"}).status_code == 404


def test_metadata_advertises_only_the_endpoints_served(client):
    document = client.get("/.well-known/oauth-authorization-server").json()
    assert document["token_endpoint"] == "http://testserver/o/token/"
    assert document["revocation_endpoint"] == "http://testserver/o/revoke_token/"
    assert document["registration_endpoint"] == "http://testserver/o/register/"
    assert "device_authorization_endpoint" not in document
    assert "introspection_endpoint" not in document


# Introspection (e) ----------------------------------------------------------------------------


@pytest.fixture
def introspection_for(settings) -> Iterator[str]:
    """``/o/introspect/`` mounted for one named resource server (its client id)."""
    settings.OAUTH_INTROSPECTION_CLIENTS = ["resource-server"]
    importlib.reload(project.urls)
    clear_url_caches()
    try:
        yield "resource-server"
    finally:
        settings.OAUTH_INTROSPECTION_CLIENTS = []
        importlib.reload(project.urls)
        clear_url_caches()


def test_a_named_resource_server_introspects(client, introspection_for, django_user_model):
    confidential_client(introspection_for, "rs-secret")
    token = access_token(django_user_model.objects.create_user("alice"))
    document = client.get("/.well-known/oauth-authorization-server").json()
    assert document["introspection_endpoint"] == "http://testserver/o/introspect/"
    answer = client.post(
        "/o/introspect/", {"token": token}, headers={"Authorization": basic(introspection_for, "rs-secret")}
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["active"] is True and answer.json()["username"] == "alice"


def test_nobody_else_introspects(client, introspection_for, django_user_model):
    confidential_client(introspection_for, "rs-secret")
    user = django_user_model.objects.create_user("alice")
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
        "wrong secret": {"Authorization": basic(introspection_for, "guess")},
        "bearer token": {"Authorization": f"Bearer {access_token(user, scope='mcp introspection')}"},
        "nothing": {},
    }
    for what, headers in attempts.items():
        answer = client.post("/o/introspect/", {"token": token}, headers=headers)
        assert answer.status_code == 401, (what, answer.content)
        assert answer.json()["error"] == "invalid_client", what
        assert "username" not in answer.json() and "active" not in answer.json(), what


# Registration (f) ----------------------------------------------------------------------------


def test_registration_body_nested_too_deeply_is_400(client):
    answer = client.post("/o/register/", data=DEEP_JSON, content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "invalid_client_metadata"
    assert not get_application_model().objects.exists()


# Sign-in limits (i) ----------------------------------------------------------------------------


@pytest.fixture
def limit(settings) -> int:
    settings.AXES_FAILURE_LIMIT = 3
    return 3


def login(client: Any, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_login_is_throttled_per_account(client, django_user_model, limit):
    django_user_model.objects.create_user("alice", password=PASSWORD)
    # One guess from each of many addresses: the account is what counts. The
    # form comes back with its error until the last failure allowed.
    statuses = [login(client, "alice", "guess", f"10.0.1.{n}").status_code for n in range(limit)]
    assert statuses == [200] * (limit - 1) + [429]
    locked = login(client, "alice", PASSWORD, "10.0.2.1")
    assert locked.status_code == 429
    assert b"Too many failed sign-in attempts" in locked.content
    assert "_auth_user_id" not in client.session
    # Another account from another address is not affected.
    django_user_model.objects.create_user("bob", password=PASSWORD)
    assert login(client, "bob", PASSWORD, "10.0.3.1").status_code == 302


def test_login_is_throttled_per_address(client, django_user_model, limit):
    django_user_model.objects.create_user("carol", password=PASSWORD)
    statuses = [login(client, f"nobody{n}", "guess", "10.0.4.1").status_code for n in range(limit)]
    assert statuses == [200] * (limit - 1) + [429]
    assert login(client, "carol", PASSWORD, "10.0.4.1").status_code == 429
    assert login(client, "carol", PASSWORD, "10.0.4.2").status_code == 302


def test_admin_login_is_throttled(client, django_user_model, limit):
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    statuses = [
        client.post("/admin/login/", {"username": "root", "password": "guess"}, REMOTE_ADDR="10.0.5.1").status_code
        for _ in range(limit)
    ]
    assert statuses == [200] * (limit - 1) + [429]
    answer = client.post("/admin/login/", {"username": "root", "password": PASSWORD}, REMOTE_ADDR="10.0.5.9")
    assert answer.status_code == 429


def token_request(client: Any, data: dict[str, str], address: str, headers: dict[str, str] | None = None) -> Any:
    return client.post("/o/token/", data, REMOTE_ADDR=address, headers=headers or {})


def assert_throttled(answer: Any) -> None:
    assert answer.status_code == 429, answer.content
    body = answer.json()
    assert body["error"] == "temporarily_unavailable"
    assert "Too many failed attempts" in body["error_description"]
    assert int(answer["Retry-After"]) > 0


def test_token_endpoint_is_throttled_per_client(client, limit):
    confidential_client("service", "right-secret")
    code_grant = {
        "grant_type": "authorization_code",
        "code": "guess",
        "redirect_uri": "https://client.example/callback",
    }
    for n in range(limit - 1):
        answer = token_request(client, code_grant, f"10.0.6.{n}", {"Authorization": basic("service", f"guess{n}")})
        assert answer.status_code == 401 and answer.json()["error"] == "invalid_client"
    assert_throttled(token_request(client, code_grant, "10.0.6.9", {"Authorization": basic("service", "guess")}))
    # Even the right secret now waits, from any address.
    assert_throttled(token_request(client, code_grant, "10.0.7.1", {"Authorization": basic("service", "right-secret")}))


def test_token_endpoint_is_throttled_per_address(client, limit):
    """Guessed codes (or refresh tokens) for public clients, one client id each."""
    for n in range(limit - 1):
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


def test_a_failed_login_and_a_failed_token_request_count_apart_per_account(client, django_user_model, limit):
    """A client id never counts against the user of the same name."""
    django_user_model.objects.create_user("service", password=PASSWORD)
    confidential_client("service", "right-secret")
    grant = {"grant_type": "authorization_code", "code": "guess", "redirect_uri": "https://client.example/callback"}
    for n in range(limit):
        token_request(client, grant, f"10.0.9.{n}", {"Authorization": basic("service", "guess")})
    assert login(client, "service", PASSWORD, "10.0.10.1").status_code == 302

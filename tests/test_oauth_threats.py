"""Sign-in pushed on from outside, in-process: a deactivated user, a client
that updates itself past the registration rules, and client metadata
documents that are slow or ask for too much. The same threats against a live
server are in tests/test_live_oauth_threats.py; docs/authorization.md
("Threats") lists them.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from oauth2_provider import cimd
from oauth2_provider.models import (
    get_access_token_model,
    get_application_model,
    get_refresh_token_model,
    set_token_value,
)
from oauth2_provider.settings import oauth2_settings

from mcptasks.oauth import cimd_rules
from tests.support import postgres_only
from tests.support.cimd_loopback import allow_loopback
from tests.support.cimd_server import document_server
from tests.support.legacy import DjangoLegacy
from tests.support.rpc import TASKS_CAPS, DjangoRpc

pytestmark = pytest.mark.django_db(transaction=True)

RESOURCE = "http://testserver/mcp"
CALLBACK = "http://127.0.0.1:33418/callback"
OAUTH_VALIDATORS = [
    "mcptasks.oauth.validators.ActiveUserOAuth2Validator",
    # The endpoint's own check holds without it, for any authentication class.
    "oauth2_provider.oauth2_validators.OAuth2Validator",
]


@pytest.fixture
def signed_in_only(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "ALLOW_ANONYMOUS": False}


@pytest.fixture
def client_app() -> Any:
    return get_application_model().objects.create(
        name="Desktop assistant",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris=CALLBACK,
    )


@pytest.fixture
def issue(django_user_model: Any, client_app: Any) -> Any:
    """``issue(username)``: (raw access token, raw refresh token) of a sign-in."""

    def make(username: str = "alice") -> tuple[str, str]:
        user, _ = django_user_model.objects.get_or_create(username=username)
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        token = get_access_token_model()(
            user=user,
            application=client_app,
            expires=timezone.now() + timedelta(hours=1),
            scope="mcp",
            resource=[RESOURCE],
        )
        set_token_value(token, access)
        token.save()
        refresh_token = get_refresh_token_model()(user=user, application=client_app, access_token=token)
        set_token_value(refresh_token, refresh)
        refresh_token.save()
        return access, refresh

    return make


def assert_invalid_token(reply: Any) -> None:
    assert reply.status == 401, reply
    header = reply.headers.get("WWW-Authenticate") or reply.headers.get("www-authenticate") or ""
    assert header.startswith("Bearer ") and 'error="invalid_token"' in header, header


def refresh(client: Any, client_app: Any, refresh_token: str) -> Any:
    return client.post(
        "/o/token/",
        {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_app.client_id},
    )


# (a) A deactivated user ----------------------------------------------------------------------


@pytest.mark.parametrize("validator", OAUTH_VALIDATORS)
def test_an_inactive_users_token_is_refused_in_both_eras(
    client, settings, issue, signed_in_only, django_user_model, validator
):
    settings.OAUTH2_PROVIDER = {**settings.OAUTH2_PROVIDER, "OAUTH2_VALIDATOR_CLASS": validator}
    access, _ = issue("alice")
    modern = DjangoRpc(client, token=access, capabilities=TASKS_CAPS)
    assert modern.request("tools/list").status == 200
    assert DjangoLegacy(client, token=access, validate=False).initialize().status == 200

    # A bulk update sends no signal: the checks themselves must refuse.
    django_user_model.objects.filter(username="alice").update(is_active=False)
    assert_invalid_token(modern.request("tools/list"))
    assert_invalid_token(modern.call_tool("greet", {"name": "alice"}))
    legacy = DjangoLegacy(client, token=access, validate=False)
    assert_invalid_token(
        legacy.post(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}},
            session=False,
        )
    )


def test_an_inactive_users_refresh_token_is_refused(client, issue, client_app, django_user_model):
    _, bobs = issue("bob")
    assert refresh(client, client_app, bobs).status_code == 200, "refreshing works for an active user"
    _, alices = issue("alice")
    django_user_model.objects.filter(username="alice").update(is_active=False)  # no signal
    refused = refresh(client, client_app, alices)
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"] == "invalid_grant"


def test_deactivating_a_user_revokes_their_tokens(issue, django_user_model):
    issue("alice")
    issue("alice")
    issue("bob")
    alice = django_user_model.objects.get(username="alice")
    alice.is_active = False
    alice.save()
    access_tokens, refresh_tokens = get_access_token_model().objects, get_refresh_token_model().objects
    assert not access_tokens.filter(user=alice).exists()
    assert refresh_tokens.filter(user=alice).count() == 2
    assert not refresh_tokens.filter(user=alice, revoked__isnull=True).exists()
    assert access_tokens.filter(user__username="bob").count() == 1
    assert refresh_tokens.filter(user__username="bob", revoked__isnull=True).count() == 1


@pytest.fixture
def loop_polls(settings, redis_poll_throttle, request) -> list[int]:
    """Statuses of the polls the event loop served; skipped off Postgres."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip(postgres_only.LOOP_POLLS_REASON)
    return request.getfixturevalue("loop_served")


def test_an_inactive_user_is_forgotten_by_the_identity_cache(
    issue, settings, signed_in_only, loop_polls, django_user_model, identifications
):
    from tests.support.asgi import AsgiRpc

    settings.MCPTASKS = {**settings.MCPTASKS, "IDENTITY_CACHE_SECONDS": 60}
    poller = AsgiRpc(token=issue("alice")[0], capabilities=TASKS_CAPS)
    task_id = poller.create_task("slow_compute", {"seconds": 30})
    assert poller.tasks_get(task_id).status == 200
    assert loop_polls and set(loop_polls) == {200}, "the caller is in the cache"
    identified = len(identifications)
    alice = django_user_model.objects.get(username="alice")
    alice.is_active = False
    alice.save()
    assert_invalid_token(poller.tasks_get(task_id))
    assert identifications[identified:] == ["401"], "identified again and refused, not served from the cache"


def test_an_inactive_user_lasts_in_the_identity_cache_no_longer_than_a_revoked_token(
    issue, settings, signed_in_only, loop_polls, django_user_model
):
    from tests.support.asgi import AsgiRpc

    settings.MCPTASKS = {**settings.MCPTASKS, "IDENTITY_CACHE_SECONDS": 1.0}
    poller = AsgiRpc(token=issue("alice")[0], capabilities=TASKS_CAPS)
    task_id = poller.create_task("slow_compute", {"seconds": 30})
    assert poller.tasks_get(task_id).status == 200
    assert loop_polls, "the caller is in the cache"
    django_user_model.objects.filter(username="alice").update(is_active=False)  # no signal, no forgetting
    time.sleep(1.1)
    assert_invalid_token(poller.tasks_get(task_id))


# (b) RFC 7592 client updates -------------------------------------------------------------------


def register(client: Any) -> dict[str, Any]:
    body = {
        "client_name": "an MCP client",
        "redirect_uris": [CALLBACK],
        "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "none",
    }
    response = client.post("/o/register/", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


def update(client: Any, registered: dict[str, Any], token: str | None = None, **metadata: Any) -> Any:
    body = {
        "client_id": registered["client_id"],
        "client_name": "an MCP client",
        "redirect_uris": [CALLBACK],
        "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "none",
        **metadata,
    }
    token = registered["registration_access_token"] if token is None else token
    return client.put(
        f"/o/register/{registered['client_id']}/",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )


@pytest.mark.parametrize(
    "metadata",
    [
        {"grant_types": ["client_credentials"]},
        {"grant_types": ["urn:ietf:params:oauth:grant-type:device_code"]},
        {"grant_types": ["implicit"]},
        {"grant_types": ["password"]},
        {"grant_types": [{"not": "a string"}]},
        {"redirect_uris": ["http://evil.example/cb"]},
        {"redirect_uris": ["javascript:alert(1)"]},
        {"redirect_uris": []},
    ],
)
def test_a_client_update_is_held_to_the_registration_rules(client, metadata):
    registered = register(client)
    refused = update(client, registered, **metadata)
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"] == "invalid_client_metadata"
    app = get_application_model().objects.get(client_id=registered["client_id"])
    assert (app.authorization_grant_type, app.redirect_uris, app.client_type) == (
        "authorization-code",
        CALLBACK,
        "public",
    )


def test_a_client_update_within_the_rules_is_saved(client):
    registered = register(client)
    moved = update(client, registered, redirect_uris=["https://app.example/callback"])
    assert moved.status_code == 200, moved.content
    app = get_application_model().objects.get(client_id=registered["client_id"])
    assert app.redirect_uris == "https://app.example/callback"


@pytest.mark.parametrize("token", ["", "not-the-registration-token"])
def test_a_client_update_without_its_registration_token_is_401(client, token):
    registered = register(client)
    refused = update(client, registered, token=token, grant_types=["client_credentials"])
    assert refused.status_code == 401, refused.content
    assert get_application_model().objects.get(client_id=registered["client_id"]).authorization_grant_type == (
        "authorization-code"
    )


def test_an_update_body_nested_too_deep_is_400(client):
    registered = register(client)
    response = client.put(
        f"/o/register/{registered['client_id']}/",
        data="[" * 100_000 + "]" * 100_000,
        content_type="application/json",
        headers={"Authorization": f"Bearer {registered['registration_access_token']}"},
    )
    assert response.status_code == 400, response.content


# (c), (d) Client ID Metadata Documents -------------------------------------------------------


@pytest.fixture
def documents(tmp_path, monkeypatch) -> Any:
    """A document server on loopback that this process's fetches trust and reach."""
    with document_server(tmp_path) as server:
        monkeypatch.setenv("SSL_CERT_FILE", str(server.cert_file))
        monkeypatch.setattr(cimd_rules, "address_allowed", allow_loopback(cimd_rules.address_public))
        yield server


MCP_CLIENT = {
    "client_name": "a CIMD client",
    "redirect_uris": [CALLBACK],
    "grant_types": ["authorization_code", "refresh_token"],
    "token_endpoint_auth_method": "none",
}


def test_a_cimd_client_within_the_rules_is_saved(documents):
    url = documents.add("/good.json", MCP_CLIENT)
    app = cimd.resolve_cimd_application(url, request=None)
    assert app is not None and app.authorization_grant_type == "authorization-code"


@pytest.mark.parametrize(
    "metadata",
    [
        {"redirect_uris": ["http://evil.example/cb"]},
        {"redirect_uris": ["https://app.example/cb", "http://evil.example/cb"]},
        {"grant_types": ["implicit"]},
        {"grant_types": ["implicit"], "response_types": ["token"]},
    ],
)
def test_a_cimd_document_is_held_to_the_registration_rules(documents, metadata):
    url = documents.add("/asks-too-much.json", {**MCP_CLIENT, **metadata})
    assert cimd.resolve_cimd_application(url, request=None) is None
    assert documents.requests_for("/asks-too-much.json"), "the document was fetched, then refused"
    assert not get_application_model().objects.filter(client_id=url).exists()


def test_a_cimd_fetch_has_one_deadline_over_a_slow_document(documents, settings):
    settings.OAUTH2_PROVIDER = {**settings.OAUTH2_PROVIDER, "CIMD_FETCH_TIMEOUT_SECONDS": 1}
    url = documents.add("/slow.json", MCP_CLIENT, drip=0.2)  # about 40 s at this pace
    started = time.monotonic()
    with pytest.raises(cimd.CIMDError, match="within 1 s"):
        oauth2_settings.CIMD_METADATA_FETCHER().fetch(url)
    assert time.monotonic() - started < 3
    (served,) = documents.requests_for("/slow.json")
    assert served.ended is None or served.ended - served.started < 3


def test_a_cimd_fetch_deadline_covers_name_resolution(settings, monkeypatch):
    settings.OAUTH2_PROVIDER = {**settings.OAUTH2_PROVIDER, "CIMD_FETCH_TIMEOUT_SECONDS": 0.5}
    resolve = socket.getaddrinfo

    def slow_resolver(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "slow-dns.example":
            time.sleep(3)
            raise socket.gaierror("no such host")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)
    started = time.monotonic()
    with pytest.raises(cimd.CIMDError):
        oauth2_settings.CIMD_METADATA_FETCHER().fetch("https://slow-dns.example/client.json")
    assert time.monotonic() - started < 2

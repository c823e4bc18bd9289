"""The OAuth resource server on the MCP endpoint (mcptasks.web.authorization and
mcptasks.protocol.authorization), in-process.

Tokens are real django-oauth-toolkit rows in the test database; requests go
through Django's test client (the ``mcptasks.urls`` route, both eras) and
through the ASGI fast path (``mcptasks.web.asgi``, where no middleware runs).
The full sign-in with the SDK's OAuth client is tests/test_live_oauth.py.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model, set_token_value

from mcptasks.protocol import authorization as scope_rules
from mcptasks.tools.registry import Registry, tool
from mcptasks.web import authorization
from tests.support import postgres_only
from tests.support.asgi import serve_asgi
from tests.support.legacy import DjangoLegacy
from tests.support.rpc import TASKS_CAPS, DjangoRpc

pytestmark = pytest.mark.django_db(transaction=True)

RESOURCE = "http://testserver/mcp"
METADATA = "http://testserver/.well-known/oauth-protected-resource/mcp"


def challenge_params(header: str) -> dict[str, str]:
    """The auth-params of a ``Bearer`` challenge, unquoted."""
    assert header.startswith("Bearer "), header
    pairs = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', header)
    return {name: re.sub(r"\\(.)", r"\1", value) for name, value in pairs}


@pytest.fixture
def signed_in_only(settings) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "ALLOW_ANONYMOUS": False}


@pytest.fixture
def client_app() -> Any:
    return get_application_model().objects.create(
        name="Desktop assistant",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://127.0.0.1:7777/callback",
    )


@pytest.fixture
def issue(django_user_model, client_app) -> Any:
    """``issue(username, scope=..., resource=..., expires_in=...)``: a raw access token."""

    def make(username: str = "alice", scope: str = "mcp", resource: Any = (RESOURCE,), expires_in: float = 3600) -> str:
        user, _ = django_user_model.objects.get_or_create(username=username)
        raw = secrets.token_urlsafe(24)
        token = get_access_token_model()(
            user=user,
            application=client_app,
            expires=timezone.now() + timedelta(seconds=expires_in),
            scope=scope,
            resource=list(resource),
        )
        set_token_value(token, raw)
        token.save()
        return raw

    return make


def rpc_for(client: Any, token: str | None) -> DjangoRpc:
    return DjangoRpc(client, token=token, capabilities=TASKS_CAPS)


# Metadata ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"])
def test_protected_resource_metadata_both_forms(client, path):
    response = client.get(path)
    assert response.status_code == 200
    document = response.json()
    assert document["resource"] == RESOURCE
    assert document["authorization_servers"] == ["http://testserver"]
    assert document["scopes_supported"][0] == "mcp"
    assert "mcp:delete" in document["scopes_supported"], "a tool's own scope is listed"
    assert document["bearer_methods_supported"] == ["header"]


def test_metadata_for_another_path_is_404(client):
    assert client.get("/.well-known/oauth-protected-resource/elsewhere").status_code == 404


def test_metadata_follows_resource_url(client, settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "RESOURCE_URL": "https://mcp.example.org/mcp"}
    document = client.get("/.well-known/oauth-protected-resource/mcp").json()
    assert document["resource"] == "https://mcp.example.org/mcp"
    assert document["authorization_servers"] == ["https://mcp.example.org"]


def test_authorization_server_metadata(client):
    """django-oauth-toolkit's RFC 8414 document, as the example site configures it."""
    document = client.get("/.well-known/oauth-authorization-server").json()
    assert document["issuer"] == "http://testserver"
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert document["response_types_supported"] == ["code"]
    assert document["authorization_response_iss_parameter_supported"] is True
    assert document["registration_endpoint"] == "http://testserver/o/register/"
    assert document["client_id_metadata_document_supported"] is True
    assert "none" in document["token_endpoint_auth_methods_supported"]


# The 401 challenge ---------------------------------------------------------------------------


def assert_challenge(reply: Any, *, error: str | None = None, status: int = 401, scope: str = "mcp") -> dict:
    assert reply.status == status, reply
    params = challenge_params(reply.headers["WWW-Authenticate"])
    assert params["resource_metadata"] == METADATA
    assert params["scope"] == scope
    assert params.get("error") == error
    return params


@pytest.mark.parametrize("method", ["server/discover", "tools/list", "tools/call", "tasks/get"])
def test_modern_requests_without_a_token_get_the_challenge(client, signed_in_only, method):
    params = {"name": "greet", "arguments": {"name": "x"}} if method == "tools/call" else {"taskId": "t"}
    reply = rpc_for(client, None).request(method, params if method in ("tools/call", "tasks/get") else None)
    assert_challenge(reply)
    assert reply.body["error"]["code"] == -32600


def test_listen_without_a_token_gets_the_challenge(client, signed_in_only):
    reply = rpc_for(client, None).request("subscriptions/listen", {"notifications": {"taskIds": []}})
    assert_challenge(reply)


def test_legacy_initialize_and_stream_without_a_token_get_the_challenge(client, signed_in_only):
    legacy = DjangoLegacy(client, validate=False)
    reply = legacy.post(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}},
        session=False,
    )
    assert_challenge(reply)
    stream = legacy._send("GET", {"Mcp-Session-Id": "whatever", "MCP-Protocol-Version": "2025-11-25"})
    assert_challenge(stream)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data"])
def test_any_content_type_gets_the_challenge_not_a_crash(client, signed_in_only, content_type):
    """django-oauth-toolkit's class reads ``request.POST``: a body it cannot
    parse as a form (the body is JSON-RPC) must not break authentication."""
    assert_challenge(rpc_for(client, None).request("tools/list", headers={"Content-Type": content_type}))


@pytest.mark.parametrize("anonymous", [False, True])
def test_garbage_token_is_401_even_when_anonymous_is_allowed(client, settings, anonymous):
    settings.MCPTASKS = {**settings.MCPTASKS, "ALLOW_ANONYMOUS": anonymous}
    assert_challenge(rpc_for(client, "garbage").request("tools/list"), error="invalid_token")


def test_expired_token_is_401(client, issue, signed_in_only):
    token = issue(expires_in=-5)
    assert_challenge(rpc_for(client, token).request("tools/list"), error="invalid_token")


def test_revoked_token_is_401(client, issue, signed_in_only):
    token = issue()
    assert rpc_for(client, token).request("tools/list").status == 200
    get_access_token_model().objects.get(user__username="alice").revoke()
    assert_challenge(rpc_for(client, token).request("tools/list"), error="invalid_token")


@pytest.mark.parametrize(
    "resource", [("http://testserver/api",), ("https://other.example/mcp",), ("http://testserver:8080/mcp",), ()]
)
def test_token_for_another_resource_is_401(client, issue, resource):
    token = issue(resource=resource)
    assert_challenge(rpc_for(client, token).request("tools/list"), error="invalid_token")


def test_token_for_a_parent_of_the_endpoint_is_accepted(client, issue):
    token = issue(resource=("http://testserver/",))
    assert rpc_for(client, token).request("tools/list").status == 200


def test_token_without_the_baseline_scope_is_403(client, issue):
    token = issue(scope="read")
    assert_challenge(rpc_for(client, token).request("tools/list"), error="insufficient_scope", status=403)


# Tool scopes ---------------------------------------------------------------------------------


def test_tool_scope_is_checked_at_tools_call(client, issue, signed_in_only):
    plain = rpc_for(client, issue(scope="mcp"))
    assert plain.call_tool("greet", {"name": "a"}).result["content"][0]["text"] == "Hello, a!"
    refused = plain.call_tool("confirm_delete", {"filename": "f"})
    assert_challenge(refused, error="insufficient_scope", status=403, scope="mcp mcp:delete")
    stepped_up = rpc_for(client, issue(scope="mcp mcp:delete"))
    assert stepped_up.call_tool("confirm_delete", {"filename": "f"}).result["resultType"] == "task"


def test_scope_hierarchy_is_honoured(client, issue):
    admin = rpc_for(client, issue(scope="mcp:admin"))
    assert admin.call_tool("confirm_delete", {"filename": "f"}).result["resultType"] == "task"
    assert admin.request("tools/list").status == 200, "mcp:admin implies the baseline mcp"


def test_tool_scope_is_checked_on_every_task_request_of_that_tool(client, issue):
    owner = rpc_for(client, issue("alice", scope="mcp:admin"))
    task_id = owner.call_tool("confirm_delete", {"filename": "f"}).result["taskId"]
    assert owner.tasks_get(task_id).status == 200

    narrow = rpc_for(client, issue("alice", scope="mcp"))  # the same user, another client's token
    for method, params in [
        ("tasks/get", {"taskId": task_id}),
        ("tasks/update", {"taskId": task_id, "inputResponses": {}}),
        ("tasks/cancel", {"taskId": task_id}),
        ("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}),
    ]:
        reply = narrow.request(method, params)
        assert_challenge(reply, error="insufficient_scope", status=403, scope="mcp mcp:delete")


def test_another_users_task_is_not_found_before_any_scope_check(client, issue):
    owner = rpc_for(client, issue("alice", scope="mcp:admin"))
    task_id = owner.call_tool("confirm_delete", {"filename": "f"}).result["taskId"]
    for scope in ("mcp", "mcp:admin"):
        other = rpc_for(client, issue("bob", scope=scope))
        theirs = other.tasks_get(task_id)
        unknown = other.tasks_get("no-such-task")
        assert theirs.status == unknown.status == 200
        assert theirs.body["error"] == unknown.body["error"]


def test_legacy_era_checks_tool_scopes(client, issue):
    admin = DjangoLegacy(client, token=issue("alice", scope="mcp:admin"))
    admin.initialize()
    task_id = admin.create_task("confirm_delete", {"filename": "f"})
    narrow = DjangoLegacy(client, token=issue("alice", scope="mcp"))
    narrow.initialize()
    refused = narrow.call_tool("confirm_delete", {"filename": "g"}, task={"ttl": 60_000})
    assert_challenge(refused, error="insufficient_scope", status=403, scope="mcp mcp:delete")
    assert_challenge(
        narrow.request("tasks/get", {"taskId": task_id}), error="insufficient_scope", status=403, scope="mcp mcp:delete"
    )
    listed = narrow.request("tasks/list")
    assert task_id not in {t["taskId"] for t in listed.result["tasks"]}
    assert task_id in {t["taskId"] for t in admin.request("tasks/list").result["tasks"]}


def test_one_user_two_clients_share_the_users_tasks(client, issue, django_user_model):
    """A task is bound to the user, not the OAuth client (docs/authorization.md)."""
    first = rpc_for(client, issue("alice", scope="mcp"))
    task_id = first.call_tool("slow_compute", {"seconds": 0}, extra={"task": {}}).result["taskId"]
    other_app = get_application_model().objects.create(
        name="IDE",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://127.0.0.1:8888/cb",
    )
    raw = secrets.token_urlsafe(24)
    token = get_access_token_model()(
        user=django_user_model.objects.get(username="alice"),
        application=other_app,
        scope="mcp",
        resource=[RESOURCE],
        expires=timezone.now() + timedelta(hours=1),
    )
    set_token_value(token, raw)
    token.save()
    assert rpc_for(client, raw).tasks_get(task_id).result["taskId"] == task_id


def test_without_authorization_servers_bad_tokens_are_still_refused(client, settings, issue):
    settings.MCPTASKS = {**settings.MCPTASKS, "AUTHORIZATION_SERVERS": None, "ALLOW_ANONYMOUS": True}
    reply = rpc_for(client, "garbage").request("tools/list")
    assert reply.status == 401 and reply.headers["WWW-Authenticate"].startswith("Bearer")
    anonymous = rpc_for(client, None).call_tool("confirm_delete", {"filename": "f"})
    assert anonymous.result["resultType"] == "task", "anonymous callers are not limited by scopes"
    narrow = rpc_for(client, issue(scope="mcp")).call_tool("confirm_delete", {"filename": "f"})
    assert narrow.status == 403, "a token's scopes are enforced either way"
    assert challenge_params(narrow.headers["WWW-Authenticate"]) == {
        "error": "insufficient_scope",
        "error_description": "This request needs the scope 'mcp mcp:delete'.",
        "scope": "mcp mcp:delete",
    }


def test_static_tokens_keep_working_without_scopes(client, django_user_model, signed_in_only):
    from rest_framework.authtoken.models import Token

    user = django_user_model.objects.create(username="script")
    key = Token.objects.create(user=user).key
    script = rpc_for(client, key)
    assert script.call_tool("confirm_delete", {"filename": "f"}).result["resultType"] == "task"


# The ASGI fast path -------------------------------------------------------------------------


def asgi_request(method: str, params: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    return serve_asgi(method, params, headers)


def test_fast_path_challenges_and_checks_scopes(issue, signed_in_only):
    status, headers, _ = asgi_request("tools/list", {}, {})
    assert status == 401
    assert challenge_params(headers["www-authenticate"]) == {"resource_metadata": METADATA, "scope": "mcp"}

    status, headers, _ = asgi_request("tools/list", {}, {"authorization": "Bearer nope"})
    assert status == 401 and challenge_params(headers["www-authenticate"])["error"] == "invalid_token"

    token = issue(scope="mcp")
    call = {"name": "confirm_delete", "arguments": {"filename": "f"}}
    status, headers, body = asgi_request("tools/call", call, {"authorization": f"Bearer {token}"})
    assert status == 403, body
    params = challenge_params(headers["www-authenticate"])
    assert (params["error"], params["scope"]) == ("insufficient_scope", "mcp mcp:delete")

    status, _, body = asgi_request("tools/list", {}, {"authorization": f"Bearer {token}"})
    assert status == 200 and "tools" in body["result"]


# Pieces -----------------------------------------------------------------------------------


def test_challenge_quotes_values():
    header = scope_rules.challenge('https://h/x"y', ["a", "b", "a"], "invalid_token", "bad\r\n token")
    assert header == (
        'Bearer error="invalid_token", error_description="bad token", resource_metadata="https://h/x\\"y", scope="a b"'
    )
    assert scope_rules.challenge(None) == "Bearer"


@pytest.mark.parametrize(
    ("audiences", "ok"),
    [
        (["http://testserver/mcp"], True),
        (["HTTP://TESTSERVER:80/mcp/"], True),
        (["http://testserver"], True),
        (["http://testserver/mc"], False),
        (["http://testserver/mcp/deeper"], False),
        (["https://testserver/mcp"], False),
        (["http://user@testserver/mcp"], False),
        (["not a url", 5], False),
        ([], False),
    ],
)
def test_audience_matching(audiences, ok):
    assert authorization.audience_matches(audiences, RESOURCE) is ok


def test_scope_hierarchy_is_transitive(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "SCOPE_HIERARCHY": {"a": ["b"], "b": ["c"], "c": ["a"]}}
    assert scope_rules.expand(["a"]) == {"a", "b", "c"}
    assert authorization.token_scopes({"scope": "b"}) == {"a", "b", "c"}
    assert authorization.token_scopes(object()) is None
    assert authorization.token_audiences({"scope": "b"}) == [], "a JWT without aud is for no resource"
    assert authorization.token_audiences({"aud": "https://x/mcp"}) == ["https://x/mcp"]


def test_tool_scopes_on_a_registry():
    local = Registry()

    @tool(scopes="files:write", registry=local)
    def write() -> str:
        return "ok"

    assert local.get("write").scopes == ("files:write",)


# System checks ----------------------------------------------------------------------------


def ids(settings_override: dict[str, Any], settings) -> set[str]:
    settings.MCPTASKS = {**settings.MCPTASKS, **settings_override}
    return {message.id for message in run_checks(tags=["mcptasks"])}


def test_checks_accept_the_example_site(settings):
    assert not {i for i in ids({}, settings) if i.startswith("mcptasks.") and i[-3:-1] == "02"}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"AUTHORIZATION_SERVERS": []}, "mcptasks.E020"),
        ({"AUTHORIZATION_SERVERS": ["issuer.example"]}, "mcptasks.E020"),
        ({"RESOURCE_URL": "/mcp"}, "mcptasks.E021"),
        ({"AUTHORIZATION_SERVERS": None}, "mcptasks.W020"),
    ],
)
def test_checks_find_half_configured_setups(settings, override, expected):
    assert expected in ids(override, settings)


def test_checks_find_missing_metadata_routes(settings):
    settings.ROOT_URLCONF = "tests.urls_without_metadata"
    assert {"mcptasks.W021", "mcptasks.W022"} <= ids({}, settings)


# Dynamic client registration ---------------------------------------------------------------


def register(client: Any, **metadata: Any) -> Any:
    body = {
        "client_name": "an MCP client",
        "redirect_uris": ["http://127.0.0.1:33418/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "none",
        **metadata,
    }
    return client.post("/o/register/", data=json.dumps(body), content_type="application/json")


def test_an_mcp_client_registers_without_signing_in(client):
    response = register(client)
    assert response.status_code == 201, response.content
    registered = response.json()
    assert registered["client_id"] and "client_secret" not in registered
    app = get_application_model().objects.get(client_id=registered["client_id"])
    assert (app.client_type, app.authorization_grant_type, app.skip_authorization) == (
        "public",
        "authorization-code",
        False,
    ), "a registered client still needs the user's consent"


@pytest.mark.parametrize(
    "metadata",
    [
        {"grant_types": ["client_credentials"]},
        {"grant_types": ["password"]},
        {"redirect_uris": ["http://attacker.example/callback"]},
        {"redirect_uris": ["javascript:alert(1)"]},
        {"redirect_uris": []},
    ],
)
def test_registration_is_open_only_for_what_an_mcp_client_needs(client, metadata):
    response = register(client, **metadata)
    assert response.status_code == 401, response.content  # the toolkit refuses with 401
    assert not get_application_model().objects.exists()


def test_registrations_per_address_are_bounded(client, settings):
    from django.core.cache import cache

    cache.clear()
    settings.MCPTASKS_REGISTRATIONS_PER_HOUR = 2
    assert [register(client).status_code for _ in range(3)] == [201, 201, 401]
    cache.clear()


def test_mcptasks_works_without_django_oauth_toolkit(tmp_path):
    """The app imports the toolkit only in mcptasks.oauth: a site without it
    still starts, passes its checks and serves the challenge."""
    import subprocess
    import sys

    script = tmp_path / "without_toolkit.py"
    script.write_text(
        "import sys\n"
        "sys.modules['oauth2_provider'] = None  # as if it were not installed\n"
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(\n"
        "    INSTALLED_APPS=['django.contrib.contenttypes', 'django.contrib.auth', 'rest_framework', 'mcptasks'],\n"
        "    DATABASES={'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}},\n"
        "    ROOT_URLCONF='tests.urls_without_metadata', ALLOWED_HOSTS=['testserver'],\n"
        "    MCPTASKS={'AUTHORIZATION_SERVERS': ['https://login.example.org'], 'SCOPES': ['mcp'],\n"
        "              'AUTHENTICATION_CLASSES': ['mcptasks.web.identity.BearerTokenAuthentication']},\n"
        "    CELERY_BROKER_URL='memory://',\n"
        ")\n"
        "django.setup()\n"
        "from django.core.checks import run_checks\n"
        "from django.test import RequestFactory\n"
        "from mcptasks.web import authorization\n"
        "ids = sorted(m.id for m in run_checks(tags=['mcptasks']))\n"
        "request = RequestFactory().post('/mcp')\n"
        "try:\n"
        "    authorization.authenticate(request)\n"
        "except Exception as exc:\n"
        "    print(ids, exc.status, exc.www_authenticate)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, str(script)], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "mcptasks.W021" in done.stdout, "the metadata route is missing there, and the check says so"
    assert (
        '401 Bearer resource_metadata="http://testserver/.well-known/oauth-protected-resource/mcp", scope="mcp"'
        in done.stdout
    )


@pytest.mark.parametrize("method", ["plain", None])
def test_authorization_requests_need_pkce_s256(client, django_user_model, client_app, method):
    client.force_login(django_user_model.objects.create(username="carol"))
    query = {
        "response_type": "code",
        "client_id": client_app.client_id,
        "redirect_uri": "http://127.0.0.1:7777/callback",
        "scope": "mcp",
        "state": "s",
        "resource": RESOURCE,
    }
    if method:
        query.update(code_challenge="a" * 43, code_challenge_method=method)
    # Approving anyway (the consent form's own fields) gets no code.
    approved = client.post("/o/authorize/", {**query, "allow": "Authorize"})
    location = approved.get("Location", "")
    assert "code=" not in location, location
    assert approved.status_code == 400 or "error=invalid_request" in location, (approved.status_code, location)
    query.update(code_challenge="a" * 43, code_challenge_method="S256")
    consent = client.get("/o/authorize/", query)
    assert consent.status_code == 200 and b"authorizationForm" in consent.content
    assert b"<code>mcp</code>" in consent.content and b"Desktop assistant" in consent.content
    granted = client.post("/o/authorize/", {**query, "allow": "Authorize"})["Location"]
    assert "code=" in granted and "iss=http%3A%2F%2Ftestserver" in granted, granted


# OAuth tokens through the identity cache (polls on the event loop) ------------------------


@pytest.fixture
def loop_polls(settings, redis_poll_throttle, request) -> list[int]:
    """Statuses of the polls the event loop served; skipped off Postgres."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip(postgres_only.LOOP_POLLS_REASON)
    return request.getfixturevalue("loop_served")


def test_cached_oauth_callers_keep_their_scope_checks(issue, signed_in_only, loop_polls, identifications):
    """What the cache holds is a whole authenticate(): a cached caller's tool
    scopes are still checked on the loop, and refusals are never cached."""
    from tests.support.asgi import AsgiRpc

    admin = AsgiRpc(token=issue("alice", scope="mcp:admin"), capabilities=TASKS_CAPS)
    task_id = admin.call_tool("confirm_delete", {"filename": "f"}).result["taskId"]
    assert admin.tasks_get(task_id).status == 200
    assert loop_polls == [200]

    narrow = AsgiRpc(token=issue("alice", scope="mcp"), capabilities=TASKS_CAPS)
    identifications.clear()
    for _ in range(2):  # identified on a thread, then from the cache; the tool's scopes checked on the loop
        assert_challenge(narrow.tasks_get(task_id), error="insufficient_scope", status=403, scope="mcp mcp:delete")
    assert loop_polls == [200, 403, 403] and identifications == ["caller"]

    for token in (issue("alice", scope="email"), issue("alice", resource=("https://elsewhere.example/mcp",))):
        refused = AsgiRpc(token=token, capabilities=TASKS_CAPS)
        identifications.clear()
        for _ in range(2):  # never cached: identified, and refused, each time
            reply = refused.tasks_get(task_id)
            assert reply.status in (401, 403) and reply.headers.get("www-authenticate")
        assert len(identifications) == 2 and "caller" not in identifications


def test_each_outcome_read_of_a_cached_oauth_caller_logs_one_audit_line(
    issue, settings, signed_in_only, loop_polls, caplog, django_user_model
):
    """A caller with scopes: its reads on the loop (the first one marked only
    once its scopes allowed it) each log one ``mcptasks.audit`` line."""
    import logging

    from mcptasks.models import TaskEvent
    from tests.support.asgi import AsgiRpc
    from tests.support.factories import completed_task

    settings.LOGGING_CONFIG = None  # each in-process ASGI request sets Django up: keep the level set here
    caplog.set_level(logging.INFO, logger="mcptasks.audit")
    admin = AsgiRpc(token=issue("alice", scope="mcp:admin"), capabilities=TASKS_CAPS)
    admin.request("server/discover")  # identified on a thread
    task = completed_task(owner=f"user:{django_user_model.objects.get(username='alice').pk}")
    for _ in range(5):
        assert admin.tasks_get(task.id).result["status"] == "completed"
    assert loop_polls == [200] * 5
    lines = [r for r in caplog.records if r.name == "mcptasks.audit" and getattr(r, "task_id", None) == task.id]
    assert len(lines) == 5
    assert TaskEvent.objects.filter(task=task, kind="result_retrieved").count() == 1


def test_a_cached_oauth_caller_lasts_no_longer_than_its_token(
    issue, settings, signed_in_only, loop_polls, identifications
):
    import time

    from tests.support.asgi import AsgiRpc

    settings.MCPTASKS = {**settings.MCPTASKS, "IDENTITY_CACHE_SECONDS": 60}
    owner = AsgiRpc(token=issue("alice", scope="mcp"), capabilities=TASKS_CAPS)
    task_id = owner.create_task("slow_compute", {"seconds": 30})
    short = AsgiRpc(token=issue("alice", scope="mcp", expires_in=1.0), capabilities=TASKS_CAPS)
    identifications.clear()
    assert short.tasks_get(task_id).status == 200  # identified on a thread
    assert short.tasks_get(task_id).status == 200  # from the cache
    assert loop_polls == [200, 200] and identifications == ["caller"]
    time.sleep(1.1)
    assert_challenge(short.tasks_get(task_id), error="invalid_token")
    assert identifications == ["caller", "401"], "the cached caller went with its token: identified again"

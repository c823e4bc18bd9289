"""A real MCP client signs in: the official SDK's OAuth support against the live stack.

The stack (uvicorn + a separate Celery worker, Postgres and Redis) runs the
example site with anonymous access off, so every MCP request needs a token.
The SDK client is given nothing but the MCP URL: it reads the 401 challenge,
finds the protected resource metadata and django-oauth-toolkit's metadata,
registers itself, and sends the user to the authorization endpoint. Here the
"user" is an HTTP client with a cookie jar that signs in on the site's login
page and presses Allow on the consent page, as a person in a browser would.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from mcptasks.client import CreateTaskResult, DetailedTask, TasksExtension
from tests.support import live, postgres_only
from tests.support.rpc import TASKS_CAPS, HttpRpc

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

PASSWORD = "correct horse battery staple"
CALLBACK = "http://127.0.0.1:9/callback"  # never served: the test reads the redirect itself


@pytest.fixture(scope="module")
def oauth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[live.LiveStack]:
    stack = live.start_stack(tmp_path_factory.mktemp("oauth-stack"), settings={"MCP_ALLOW_ANONYMOUS": "false"})
    try:
        stack.shell(
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            "for name in ('alice', 'bob'):\n"
            f"    get_user_model().objects.create_user(name, password={PASSWORD!r})\n"
            "print(json.dumps(True))\n"
        )
        yield stack
    finally:
        live.teardown_stack(stack)


def base_url(stack: live.LiveStack) -> str:
    return f"http://127.0.0.1:{stack.port}"


class Browser:
    """A person at a browser: signs in on the login page when sent there and
    approves the consent page; remembers its session between visits."""

    def __init__(self, stack: live.LiveStack, username: str) -> None:
        self.http = httpx.Client(base_url=base_url(stack), timeout=30)
        self.username = username
        self.consent_pages: list[str] = []

    def close(self) -> None:
        self.http.close()

    def approve(self, authorization_url: str) -> dict[str, str]:
        """Follow ``authorization_url`` to the redirect back to the client;
        the parameters of that redirect (``code``, ``state``, ``iss``)."""
        response = self.http.get(authorization_url)
        if response.status_code == 302 and "/accounts/login/" in response.headers["location"]:
            login_page = self.http.get(response.headers["location"])
            assert login_page.status_code == 200, login_page.text
            fields = hidden_fields(login_page.text)
            fields.update({"username": self.username, "password": PASSWORD})
            signed_in = self.http.post("/accounts/login/", data=fields)
            assert signed_in.status_code == 302, f"login failed: {signed_in.text[:500]}"
            response = self.http.get(signed_in.headers["location"])
        assert response.status_code == 200, f"no consent page: {response.status_code} {response.text[:500]}"
        self.consent_pages.append(response.text)
        fields = hidden_fields(response.text)
        fields["allow"] = "Authorize"
        approved = self.http.post(str(response.url), data=fields)
        assert approved.status_code == 302, approved.text[:500]
        location = approved.headers["location"]
        assert location.startswith(CALLBACK), location
        return {name: values[0] for name, values in parse_qs(urlsplit(location).query).items()}


def hidden_fields(page: str) -> dict[str, str]:
    fields = {}
    for tag in re.findall(r"<input[^>]*>", page):
        name = re.search(r'name="([^"]*)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name and 'type="hidden"' in tag:
            fields[html.unescape(name.group(1))] = html.unescape(value.group(1)) if value else ""
    return fields


class MemoryStorage:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def sdk_oauth(stack: live.LiveStack, browser: Browser, storage: MemoryStorage) -> OAuthClientProvider:
    redirects: list[dict[str, str]] = []

    async def open_browser(url: str) -> None:
        redirects.append(await anyio.to_thread.run_sync(browser.approve, url))

    async def callback() -> AuthorizationCodeResult:
        answer = redirects.pop()
        return AuthorizationCodeResult(code=answer["code"], state=answer.get("state"), iss=answer.get("iss"))

    metadata = OAuthClientMetadata(
        client_name="mcptasks live test client",
        redirect_uris=[CALLBACK],
        token_endpoint_auth_method="none",
        grant_types=["authorization_code", "refresh_token"],
    )
    return OAuthClientProvider(stack.url, metadata, storage, redirect_handler=open_browser, callback_handler=callback)


def texts(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


def pkce_pair() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def sign_in(stack: live.LiveStack, username: str, *, scope: str = "mcp", resource: str | None = None) -> dict:
    """The same flow by hand (register, authorize with PKCE, exchange), for
    tokens the tests need with a given user, scope or resource."""
    root = base_url(stack)
    registered = httpx.post(
        f"{root}/o/register/",
        json={
            "client_name": f"hand-driven client of {username}",
            "redirect_uris": [CALLBACK],
            "grant_types": ["authorization_code", "refresh_token"],
            "token_endpoint_auth_method": "none",
        },
    )
    assert registered.status_code == 201, registered.text
    client_id = registered.json()["client_id"]
    verifier, challenge = pkce_pair()
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": CALLBACK,
        "scope": scope,
        "state": secrets.token_urlsafe(8),
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": resource or stack.url,
    }
    browser = Browser(stack, username)
    try:
        answer = browser.approve(f"{root}/o/authorize/?{urlencode(query)}")
    finally:
        browser.close()
    assert answer["state"] == query["state"]
    assert answer["iss"] == root, "RFC 9207: the authorization response names its issuer"
    token = httpx.post(
        f"{root}/o/token/",
        data={
            "grant_type": "authorization_code",
            "code": answer["code"],
            "redirect_uri": CALLBACK,
            "client_id": client_id,
            "code_verifier": verifier,
            "resource": query["resource"],
        },
    )
    assert token.status_code == 200, token.text
    return {**token.json(), "client_id": client_id}


def challenge_of(reply: Any) -> dict[str, str]:
    header = reply.headers.get("www-authenticate", "")
    assert header.startswith("Bearer "), header
    return {name: value for name, value in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', header)}


def rpc(stack: live.LiveStack, token: str | None) -> HttpRpc:
    return HttpRpc(stack.url, token=token, capabilities=TASKS_CAPS)


# The whole sign-in with the SDK --------------------------------------------------------------


@pytest.fixture(scope="module")
def signed_in(oauth_stack: live.LiveStack) -> dict[str, Any]:
    """Alice's client signs in with nothing but the MCP URL, runs a task to
    ``completed``, then steps up to a tool that needs more scope."""
    browser = Browser(oauth_stack, "alice")
    storage = MemoryStorage()
    created: list[CreateTaskResult] = []
    states: list[DetailedTask] = []
    tasks = TasksExtension(on_created=created.append, on_status=states.append, timeout=60)
    confirming = TasksExtension(on_input=lambda key, request: {"action": "accept", "content": {"confirm": True}})
    outcome: dict[str, Any] = {}

    async def confirm(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def main() -> None:
        auth = sdk_oauth(oauth_stack, browser, storage)
        async with httpx2.AsyncClient(auth=auth, timeout=60) as http:
            transport = streamable_http_client(oauth_stack.url, http_client=http)
            async with Client(transport, extensions=[tasks]) as client:
                outcome["protocol"] = client.protocol_version
                outcome["granted_first"] = storage.tokens.scope if storage.tokens else None
                result = await client.call_tool("slow_compute", {"seconds": 0.3, "label": "signed-in"})
                outcome["slow_compute"] = texts(result)
        async with httpx2.AsyncClient(auth=auth, timeout=60) as http:
            transport = streamable_http_client(oauth_stack.url, http_client=http)
            async with Client(transport, extensions=[confirming], elicitation_callback=confirm) as client:
                result = await client.call_tool("confirm_delete", {"filename": "notes.txt"})
                outcome["confirm_delete"] = texts(result)
                outcome["granted_after_step_up"] = storage.tokens.scope if storage.tokens else None

    try:
        anyio.run(main)
    finally:
        browser.close()
    outcome.update(created=created, states=states, storage=storage, consent_pages=list(browser.consent_pages))
    return outcome


def test_sdk_client_signs_in_and_runs_a_task_to_completed(oauth_stack, signed_in):
    assert signed_in["protocol"] == "2026-07-28"
    assert signed_in["granted_first"] == "mcp"
    assert "signed-in" in signed_in["slow_compute"]
    created, states = signed_in["created"], signed_in["states"]
    assert len(created) == 1 and states[-1].status == "completed"
    row = oauth_stack.task_row(created[0].task_id)
    alice_id = oauth_stack.query("SELECT id FROM auth_user WHERE username = 'alice'")[0]["id"]
    assert row["owner"] == f"user:{alice_id}", "the task is bound to the user who signed in"
    registered = signed_in["storage"].client_info
    assert registered is not None and registered.client_id, "the client registered dynamically"
    first_consent = signed_in["consent_pages"][0]
    assert "mcptasks live test client" in first_consent and "<code>mcp</code>" in first_consent


def test_step_up_to_a_tools_scope(oauth_stack, signed_in):
    assert signed_in["confirm_delete"] == "Deleted notes.txt"
    assert set(signed_in["granted_after_step_up"].split()) == {"mcp", "mcp:delete"}
    step_up_consent = signed_in["consent_pages"][-1]
    assert "<code>mcp:delete</code>" in step_up_consent
    assert len(signed_in["consent_pages"]) == 2, "signed in once; the step-up went straight to consent"


# What a token cannot do ------------------------------------------------------------------------


def test_another_users_token_finds_no_task(oauth_stack, signed_in):
    task_id = signed_in["created"][0].task_id
    bob = rpc(oauth_stack, sign_in(oauth_stack, "bob")["access_token"])
    alice = rpc(oauth_stack, signed_in["storage"].tokens.access_token)
    try:
        assert alice.tasks_get(task_id).result["status"] == "completed"
        theirs, unknown = bob.tasks_get(task_id), bob.tasks_get("0" * 32)
        assert theirs.status == unknown.status
        assert theirs.body["error"] == unknown.body["error"]
        assert theirs.body["error"]["code"] == -32602
    finally:
        bob.close()
        alice.close()


def assert_401_challenge(oauth_stack: live.LiveStack, reply: Any, *, error: str | None = "invalid_token") -> None:
    assert reply.status == 401, reply
    challenge = challenge_of(reply)
    assert challenge["resource_metadata"] == (f"{base_url(oauth_stack)}/.well-known/oauth-protected-resource/mcp")
    assert challenge["scope"] == "mcp"
    assert challenge.get("error") == error


def test_no_token_and_a_garbage_token_get_the_challenge(oauth_stack):
    for token, error in [(None, None), ("garbage-token", "invalid_token")]:
        client = rpc(oauth_stack, token)
        try:
            assert_401_challenge(oauth_stack, client.request("server/discover"), error=error)
        finally:
            client.close()


def test_expired_token_is_401(oauth_stack):
    token = sign_in(oauth_stack, "bob")["access_token"]
    client = rpc(oauth_stack, token)
    try:
        assert client.request("tools/list").status == 200
        checksum = hashlib.sha256(token.encode()).hexdigest()
        oauth_stack.query(
            "UPDATE oauth2_provider_accesstoken SET expires = now() - interval '1 minute' "
            "WHERE token_checksum = %s RETURNING id",
            (checksum,),
        )
        assert_401_challenge(oauth_stack, client.request("tools/list"))
    finally:
        client.close()


def test_revoked_token_is_401(oauth_stack):
    issued = sign_in(oauth_stack, "bob")
    client = rpc(oauth_stack, issued["access_token"])
    try:
        assert client.request("tools/list").status == 200
        revoked = httpx.post(
            f"{base_url(oauth_stack)}/o/revoke_token/",
            data={"token": issued["access_token"], "client_id": issued["client_id"]},
        )
        assert revoked.status_code == 200, revoked.text
        assert_401_challenge(oauth_stack, client.request("tools/list"))
    finally:
        client.close()


def test_token_for_another_resource_is_401(oauth_stack):
    other = f"{base_url(oauth_stack)}/api"
    issued = sign_in(oauth_stack, "bob", resource=other)
    client = rpc(oauth_stack, issued["access_token"])
    try:
        assert_401_challenge(oauth_stack, client.request("tools/list"))
    finally:
        client.close()


def test_token_without_a_tools_scope_is_403_insufficient_scope(oauth_stack):
    issued = sign_in(oauth_stack, "bob", scope="mcp")
    client = rpc(oauth_stack, issued["access_token"])
    try:
        assert client.call_tool("greet", {"name": "bob"}).status == 200
        refused = client.call_tool("confirm_delete", {"filename": "x"})
        assert refused.status == 403, refused
        challenge = challenge_of(refused)
        assert challenge["error"] == "insufficient_scope"
        assert challenge["scope"] == "mcp mcp:delete"
        assert challenge["resource_metadata"].endswith("/.well-known/oauth-protected-resource/mcp")
    finally:
        client.close()

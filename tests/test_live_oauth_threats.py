"""Sign-in pushed on from outside, against a live server (uvicorn + Celery,
Postgres, Redis) running the example site with anonymous access off: a
deactivated user, a client that updates itself past the registration rules,
and client metadata documents that are slow or ask for too much. The
in-process side of each is tests/test_oauth_threats.py; docs/authorization.md
("Threats") lists them.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import live, postgres_only
from tests.support.cimd_server import DocumentServer, document_server
from tests.support.legacy import HttpLegacy
from tests.support.waiting import wait_until
from tests.test_live_oauth import CALLBACK, PASSWORD, assert_401_challenge, base_url, pkce_pair, rpc, sign_in

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

USERS = ("carol", "dave", "erin")


@pytest.fixture(scope="module")
def oauth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[live.LiveStack]:
    stack = live.start_stack(tmp_path_factory.mktemp("oauth-threats"), settings={"MCP_ALLOW_ANONYMOUS": "false"})
    try:
        stack.shell(
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            f"for name in {USERS!r}:\n"
            f"    get_user_model().objects.create_user(name, password={PASSWORD!r})\n"
            "print(json.dumps(True))\n"
        )
        yield stack
    finally:
        live.teardown_stack(stack)


def refresh(stack: live.LiveStack, issued: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{base_url(stack)}/o/token/",
        data={
            "grant_type": "refresh_token",
            "refresh_token": issued["refresh_token"],
            "client_id": issued["client_id"],
        },
        timeout=30,
    )


def legacy_initialize(stack: live.LiveStack, token: str) -> Any:
    client = HttpLegacy(stack.url, token=token, validate=False)
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
        return client.post(body, session=False)
    finally:
        client.close()


def assert_refused_everywhere(stack: live.LiveStack, issued: dict[str, Any], task_id: str) -> None:
    client = rpc(stack, issued["access_token"])
    try:
        assert_401_challenge(stack, client.request("tools/list"))
        assert_401_challenge(stack, client.call_tool("greet", {"name": "x"}))
        # The event-loop poll path: refused once the identity cache lets go
        # (IDENTITY_CACHE_SECONDS, 5 s here), as for a revoked token.
        wait_until(lambda: client.tasks_get(task_id).status == 401, timeout=15, what="the poll refused")
        assert_401_challenge(stack, client.tasks_get(task_id))
    finally:
        client.close()
    assert legacy_initialize(stack, issued["access_token"]).status == 401
    refused = refresh(stack, issued)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == "invalid_grant"


def signed_in_with_a_task(stack: live.LiveStack, username: str) -> tuple[dict[str, Any], str]:
    issued = sign_in(stack, username)
    client = rpc(stack, issued["access_token"])
    try:
        assert client.request("tools/list").status == 200
        task_id = client.create_task("slow_compute", {"seconds": 60})
        for _ in range(3):  # the first fills the identity cache; the next are served from it
            assert client.tasks_get(task_id).status == 200
    finally:
        client.close()
    assert legacy_initialize(stack, issued["access_token"]).status == 200
    return issued, task_id


# (a) A deactivated user ----------------------------------------------------------------------


def test_a_user_deactivated_in_the_admin_loses_access_and_their_tokens(oauth_stack):
    issued, task_id = signed_in_with_a_task(oauth_stack, "carol")
    oauth_stack.shell(
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "user = get_user_model().objects.get(username='carol')\n"
        "user.is_active = False\n"
        "user.save()\n"
        "print(json.dumps(True))\n"
    )
    rows = oauth_stack.query(
        "SELECT count(*) AS n FROM oauth2_provider_accesstoken t JOIN auth_user u ON u.id = t.user_id "
        "WHERE u.username = 'carol'"
    )
    assert rows[0]["n"] == 0, "deactivating the user revoked their access tokens"
    assert_refused_everywhere(oauth_stack, issued, task_id)


def test_a_user_deactivated_without_a_signal_is_refused_all_the_same(oauth_stack):
    """A bulk update sends no signal: the checks themselves refuse."""
    issued, task_id = signed_in_with_a_task(oauth_stack, "dave")
    oauth_stack.query("UPDATE auth_user SET is_active = false WHERE username = 'dave' RETURNING id")
    checksum = hashlib.sha256(issued["access_token"].encode()).hexdigest()
    assert oauth_stack.query("SELECT id FROM oauth2_provider_accesstoken WHERE token_checksum = %s", (checksum,)), (
        "the token itself is still there"
    )
    assert_refused_everywhere(oauth_stack, issued, task_id)


# (b) RFC 7592 client updates -------------------------------------------------------------------


def test_a_client_cannot_update_itself_past_the_registration_rules(oauth_stack):
    root = base_url(oauth_stack)
    metadata = {
        "client_name": "updating client",
        "redirect_uris": [CALLBACK],
        "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "none",
    }
    registered = httpx.post(f"{root}/o/register/", json=metadata).json()
    client_id, token = registered["client_id"], registered["registration_access_token"]
    configuration = f"{root}/o/register/{client_id}/"
    headers = {"Authorization": f"Bearer {token}"}
    for change in (
        {"grant_types": ["client_credentials"], "token_endpoint_auth_method": "client_secret_basic"},
        {"grant_types": ["urn:ietf:params:oauth:grant-type:device_code"]},
        {"redirect_uris": ["http://evil.example/cb"]},
    ):
        refused = httpx.put(configuration, json={**metadata, "client_id": client_id, **change}, headers=headers)
        assert refused.status_code == 400, (change, refused.text)
        assert refused.json()["error"] == "invalid_client_metadata"
    current = httpx.get(configuration, headers=headers)
    assert current.status_code == 200, current.text
    assert current.json()["grant_types"] == ["authorization_code", "refresh_token"]
    assert current.json()["redirect_uris"] == [CALLBACK]
    no_user = httpx.post(
        f"{root}/o/token/", data={"grant_type": "client_credentials", "client_id": client_id, "scope": "mcp mcp:admin"}
    )
    assert no_user.status_code in (400, 401) and "access_token" not in no_user.text

    moved = httpx.put(
        configuration,
        json={**metadata, "client_id": client_id, "redirect_uris": ["http://127.0.0.1:4567/cb"]},
        headers=headers,
    )
    assert moved.status_code == 200, moved.text
    assert moved.json()["redirect_uris"] == ["http://127.0.0.1:4567/cb"]


# (c), (d) Client ID Metadata Documents ---------------------------------------------------------


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocumentServer]:
    with document_server(tmp_path_factory.mktemp("cimd-documents")) as server:
        yield server


@pytest.fixture(scope="module")
def cimd_stack(tmp_path_factory: pytest.TempPathFactory, documents: DocumentServer) -> Iterator[live.LiveStack]:
    """The example site, trusting the document server's certificate and
    allowed to fetch from loopback (these tests only)."""
    settings = {
        "DJANGO_SETTINGS_MODULE": "tests.support.cimd_loopback_settings",
        "SSL_CERT_FILE": str(documents.cert_file),
    }
    stack = live.start_stack(tmp_path_factory.mktemp("cimd-stack"), settings=settings)
    try:
        yield stack
    finally:
        live.teardown_stack(stack)


MCP_CLIENT = {
    "client_name": "a CIMD client",
    "redirect_uris": [CALLBACK],
    "grant_types": ["authorization_code", "refresh_token"],
    "token_endpoint_auth_method": "none",
}


def token_request(stack: live.LiveStack, client_id: str) -> httpx.Response:
    """An unauthenticated token request naming a CIMD client: it starts the fetch."""
    verifier, _ = pkce_pair()
    return httpx.post(
        f"{base_url(stack)}/o/token/",
        data={
            "grant_type": "authorization_code",
            "code": "no-such-code",
            "redirect_uri": CALLBACK,
            "client_id": client_id,
            "code_verifier": verifier,
        },
        timeout=120,
    )


def saved_client(stack: live.LiveStack, client_id: str) -> list[dict[str, Any]]:
    return stack.query("SELECT * FROM oauth2_provider_application WHERE client_id = %s", (client_id,))


def test_a_cimd_client_within_the_rules_is_fetched_and_saved(cimd_stack, documents):
    url = documents.add("/good.json", MCP_CLIENT)
    answer = token_request(cimd_stack, url)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant", answer.text
    (row,) = saved_client(cimd_stack, url)
    assert (row["registration_source"], row["authorization_grant_type"]) == ("cimd", "authorization-code")


def test_slow_cimd_documents_are_given_up_at_one_deadline(cimd_stack, documents):
    """Each byte comes within the per-read timeout; the document would take
    about 100 s. Several at once, more than the concurrent fetches allowed:
    each answer comes within CIMD_FETCH_TIMEOUT_SECONDS (5 s), the slow
    connections are cut, and a good client then signs in."""
    slow = [documents.add(f"/slow-{index}.json", MCP_CLIENT, drip=0.5) for index in range(12)]
    answers: list[tuple[float, int, str]] = []

    def fetch(url: str) -> None:
        started = time.monotonic()
        answer = token_request(cimd_stack, url)
        answers.append((time.monotonic() - started, answer.status_code, answer.json().get("error", "")))

    threads = [threading.Thread(target=fetch, args=(url,)) for url in slow]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(answers) == len(slow), "every slow request answered"
    assert {(status, error) for _, status, error in answers} == {(401, "invalid_client")}, answers
    elapsed = [seconds for seconds, _, _ in answers]
    assert max(elapsed) < 15, elapsed
    served = [entry for index in range(12) for entry in documents.requests_for(f"/slow-{index}.json")]
    assert served, "the slow documents were fetched"
    wait_until(lambda: all(entry.ended is not None for entry in served), timeout=10, what="slow connections cut")
    assert all(entry.cut_off for entry in served)
    assert all(entry.ended - entry.started < 15 for entry in served if entry.ended is not None)
    assert not any(saved_client(cimd_stack, url) for url in slow)

    url = documents.add("/good-after-slow.json", MCP_CLIENT)
    assert token_request(cimd_stack, url).json()["error"] == "invalid_grant"
    assert saved_client(cimd_stack, url), "the fetch slots are free again"


@pytest.mark.parametrize(
    "name, change",
    [("evil-redirect", {"redirect_uris": ["http://evil.example/cb"]}), ("implicit", {"grant_types": ["implicit"]})],
)
def test_a_cimd_document_asking_for_too_much_is_refused(cimd_stack, documents, name, change):
    url = documents.add(f"/{name}.json", {**MCP_CLIENT, **change})
    answer = token_request(cimd_stack, url)
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_client", answer.text
    assert documents.requests_for(f"/{name}.json"), "fetched, then refused"
    assert not saved_client(cimd_stack, url)

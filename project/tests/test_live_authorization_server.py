"""The example site's authorization server pushed on from outside, against a
live stack of the example site (uvicorn + Celery on ``project.settings``,
Postgres, Redis) with anonymous access off: a registration body nested too
deeply, and guessing on the login page and the token endpoint. Every request
here comes from 127.0.0.1, so the guesses that lock the address come last.
In-process details: project/tests/test_authorization_server.py.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from tests.support import live, postgres_only

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

PASSWORD = "correct horse battery staple"
LIMIT = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[live.LiveStack]:
    stack = live.start_stack(
        tmp_path_factory.mktemp("as-stack"),
        settings={"MCP_ALLOW_ANONYMOUS": "false", "SIGN_IN_FAILURE_LIMIT": str(LIMIT)},
        site=live.EXAMPLE_SITE,
    )
    try:
        stack.shell(
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            "from oauth2_provider.models import get_application_model\n"
            f"get_user_model().objects.create_user('alice', password={PASSWORD!r})\n"
            "get_application_model().objects.create(name='service', client_id='service', client_secret='right',"
            " client_type='confidential', authorization_grant_type='authorization-code',"
            " redirect_uris='https://client.example/cb')\n"
            "print(json.dumps(True))\n"
        )
        yield stack
    finally:
        live.teardown_stack(stack)


@pytest.fixture
def http(stack: live.LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as client:
        yield client


def test_registration_nested_too_deeply_is_400_on_a_live_server(stack: live.LiveStack, http: httpx.Client):
    body = b"[" * 100_000 + b"]" * 100_000
    answer = http.post("/o/register/", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, (answer.text[:300], stack.logs())
    assert answer.json()["error"] == "invalid_client_metadata"
    assert "RecursionError" not in stack.log_text("web"), stack.log_text("web")[-2000:]
    # Registration itself still works.
    registered = http.post(
        "/o/register/",
        json={"client_name": "ok", "redirect_uris": ["http://127.0.0.1:9/cb"], "token_endpoint_auth_method": "none"},
    )
    assert registered.status_code == 201, registered.text


def login_form(http: httpx.Client) -> dict[str, str]:
    page = http.get("/accounts/login/")
    assert page.status_code == 200
    return {"csrfmiddlewaretoken": http.cookies["csrftoken"]}


def test_guessing_is_throttled_on_a_live_server(http: httpx.Client):
    secret_guess = "Basic " + base64.b64encode(b"service:guess").decode()
    grant = {"grant_type": "authorization_code", "code": "guess", "redirect_uri": "https://client.example/cb"}
    # The client's secret: the limit-th wrong one locks the client.
    answers = [http.post("/o/token/", data=grant, headers={"Authorization": secret_guess}) for _ in range(LIMIT)]
    assert [a.status_code for a in answers] == [401] * (LIMIT - 1) + [429], [a.text for a in answers]
    assert answers[-1].json()["error"] == "temporarily_unavailable"
    assert int(answers[-1].headers["Retry-After"]) > 0
    # That locked the address too (every guess came from it): alice's right
    # password is refused with a page that says why, and she is not signed in.
    form = login_form(http)
    answer = http.post("/accounts/login/", data={**form, "username": "alice", "password": PASSWORD})
    assert answer.status_code == 429, answer.text[:300]
    assert "Too many failed sign-in attempts" in answer.text
    assert "sessionid" not in http.cookies

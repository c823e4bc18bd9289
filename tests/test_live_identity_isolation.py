"""R5: a task is bound to the identity that created it.

On a live server with three identities (two bearer tokens and the anonymous
caller), every task method aimed at another identity's task must answer
exactly as it answers for a task id that does not exist (or no longer
exists): same HTTP status, same headers that matter, the same error object
(code, message, data) byte for byte, and no side effect. Response times are
compared too (roughly: a difference a caller could measure would let it
enumerate ids).

Then the ids themselves: collected from the server, their character
distribution must carry about 6 bits per character over 32 characters
(192 bits), every position uniform, no repeats, no shared prefixes.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import secrets
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.reliability.forms import record_figures
from tests.reliability.stack import ChaosStack, running_chaos_stack
from tests.support import postgres_only
from tests.support.rpc import TASKS_CAPS, HttpRpc, build_headers, build_meta
from tests.support.waiting import wait_until

pytestmark = pytest.mark.live

ID_CHARS = re.compile(r"^[A-Za-z0-9_-]{32}$")
#: Ids gathered from the server for the entropy measurement.
SERVER_IDS = 1000


@pytest.fixture(scope="module")
def iso_stack(private_services, tmp_path_factory) -> Iterator[ChaosStack]:
    with running_chaos_stack(
        private_services,
        tmp_path_factory.mktemp("isolation"),
        workers=1,
        concurrency=4,
        sweeper=False,
        settings={"MCP_POLL_BURST": "0"},
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def identities(iso_stack: ChaosStack) -> dict[str, str | None]:
    tokens = iso_stack.create_tokens(["iso-alice", "iso-bob", "iso-carol", "iso-dave"])
    return {"alice": tokens["iso-alice"], "bob": tokens["iso-bob"], "anonymous": None, **tokens}


@pytest.fixture(scope="module")
def alices_tasks(iso_stack: ChaosStack, identities) -> dict[str, str]:
    """One task of alice's in each status, and one that was pruned."""
    alice = HttpRpc(iso_stack.url, token=identities["alice"], validate=False)
    try:
        tasks = {
            "working": alice.create_task("slow_compute", {"seconds": 3600, "label": "iso"}),
            "input_required": alice.create_task("confirm_delete", {"filename": "secret.txt"}),
            "completed": alice.create_task("slow_compute", {"seconds": 0, "label": "iso"}),
            "failed": alice.create_task("protocol_error_job", {}),
            "cancelled": alice.create_task("slow_compute", {"seconds": 3600, "label": "iso"}),
        }
        alice.tasks_cancel(tasks["cancelled"])
        for status in ("input_required", "completed", "failed", "cancelled"):
            assert alice.wait_for(tasks[status], {status}, timeout=60)["status"] == status
        # The long task is running (its status message set) before anyone compares it.
        wait_until(lambda: (iso_stack.task_row(tasks["working"]) or {}).get("status_message"), 60, what="running")
        pruned = alice.create_task("slow_compute", {"seconds": 0, "label": "iso"})
        alice.wait_for(pruned, timeout=60)
        iso_stack.query("DELETE FROM mcptasks_taskevent WHERE task_id = %s RETURNING id", (pruned,))
        iso_stack.query("DELETE FROM mcptasks_task WHERE id = %s RETURNING id", (pruned,))
        tasks["pruned"] = pruned
    finally:
        alice.close()
    return tasks


def unknown_id() -> str:
    """An id of the same shape as a real one, that nobody has."""
    return secrets.token_urlsafe(24)


def send(url: str, token: str | None, method: str, params: dict[str, Any], request_id: int = 9) -> httpx.Response:
    params = {**params, "_meta": build_meta(TASKS_CAPS)}
    headers = {"Content-Type": "application/json", **build_headers(method, params)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return httpx.post(url, content=json.dumps(body), headers=headers, timeout=30)


#: Every task method, with params for a given task id.
METHODS = {
    "tasks/get": lambda task_id: {"taskId": task_id},
    "tasks/update": lambda task_id: {
        "taskId": task_id,
        "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": True}}},
    },
    "tasks/cancel": lambda task_id: {"taskId": task_id},
}
RELEVANT_HEADERS = ("content-type", "retry-after", "www-authenticate", "cache-control")


def fingerprint(response: httpx.Response) -> tuple[Any, ...]:
    """Everything a caller sees, less what varies by time."""
    headers = tuple((name, response.headers.get(name)) for name in RELEVANT_HEADERS)
    return response.status_code, headers, response.content


def task_state(stack: ChaosStack, task_id: str) -> tuple[Any, ...]:
    row = stack.task_row(task_id)
    if row is None:
        return (None,)
    inputs = stack.query(
        "SELECT key, state, response FROM mcptasks_inputrequest WHERE task_id = %s ORDER BY key", (task_id,)
    )
    events = stack.query("SELECT count(*) AS n FROM mcptasks_taskevent WHERE task_id = %s", (task_id,))
    return row["status"], row["updated_at"], row["cancel_requested_at"], json.dumps(inputs, default=str), events[0]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("intruder", ["bob", "anonymous"])
@postgres_only.CHAOS
def test_foreign_task_is_refused_exactly_like_an_unknown_one(iso_stack, identities, alices_tasks, method, intruder):
    token = identities[intruder]
    for status, task_id in alices_tasks.items():
        before = task_state(iso_stack, task_id)
        unknown = unknown_id()
        theirs = send(iso_stack.url, token, method, METHODS[method](task_id))
        nobodys = send(iso_stack.url, token, method, METHODS[method](unknown))
        # The Mcp-Name header echoes the id the caller sent: the only byte that differs is in it.
        assert fingerprint(theirs) == fingerprint(nobodys), (status, theirs.content, nobodys.content)
        error = theirs.json()["error"]
        assert theirs.status_code == 200 and error["code"] == -32602, (status, theirs.text)
        assert task_id not in theirs.text and unknown not in nobodys.text, "the id is not echoed in the error"
        assert task_state(iso_stack, task_id) == before, f"{intruder}'s {method} changed alice's {status} task"


@postgres_only.CHAOS
def test_owner_still_sees_the_tasks(iso_stack, identities, alices_tasks):
    for status, task_id in alices_tasks.items():
        reply = send(iso_stack.url, identities["alice"], "tasks/get", {"taskId": task_id})
        if status == "pruned":
            assert reply.json()["error"]["code"] == -32602
        else:
            assert reply.json()["result"]["status"] == status, reply.text


def read_events(url: str, token: str | None, task_ids: list[str], seconds: float = 1.0) -> list[dict[str, Any]]:
    """The messages a subscriptions/listen stream sends within ``seconds``."""
    params = {"notifications": {"taskIds": task_ids}, "_meta": build_meta(TASKS_CAPS)}
    headers = {"Content-Type": "application/json", **build_headers("subscriptions/listen", params)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 5, "method": "subscriptions/listen", "params": params}
    messages: list[dict[str, Any]] = []
    timeout = httpx.Timeout(30, read=seconds)  # an idle stream ends our reading, not the test
    with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        try:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    messages.append(json.loads(line[5:]))
        except httpx.ReadTimeout:
            pass
    return messages


@postgres_only.CHAOS
def test_listen_leaves_out_foreign_tasks_like_unknown_ones(iso_stack, identities, alices_tasks):
    theirs = [alices_tasks["working"], alices_tasks["input_required"]]
    foreign = read_events(iso_stack.url, identities["bob"], theirs)
    unknown = read_events(iso_stack.url, identities["bob"], [unknown_id(), unknown_id()])
    assert foreign == unknown, (foreign, unknown)
    assert foreign and foreign[0]["params"]["notifications"] == {"taskIds": []}
    own = read_events(iso_stack.url, identities["alice"], theirs)
    assert own[0]["params"]["notifications"] == {"taskIds": theirs}


@postgres_only.CHAOS
def test_refusals_take_as_long_for_foreign_and_unknown_ids(iso_stack, identities, alices_tasks):
    """A rough timing check: interleaved polls of alice's task and of unknown
    ids by bob; the medians must be close (an index lookup either way)."""
    client = httpx.Client(timeout=30)
    token = identities["bob"]

    def timed(task_id: str) -> float:
        params = {"taskId": task_id, "_meta": build_meta(TASKS_CAPS)}
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
            **build_headers("tasks/get", params),
        }
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": params})
        started = time.perf_counter()
        client.post(iso_stack.url, content=body, headers=headers)
        return time.perf_counter() - started

    try:
        for _ in range(20):  # warm up
            timed(unknown_id())
        foreign, unknown = [], []
        for _ in range(300):
            foreign.append(timed(alices_tasks["completed"]))
            unknown.append(timed(unknown_id()))
    finally:
        client.close()
    medians = statistics.median(foreign) * 1000, statistics.median(unknown) * 1000
    record_figures(
        "R5 timing",
        "short",
        {"median_ms_foreign": round(medians[0], 2), "median_ms_unknown": round(medians[1], 2), "samples": 300},
    )
    assert 0.5 < medians[0] / medians[1] < 2.0, medians


# Task ids ---------------------------------------------------------------------------------------


def shannon(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(n / total * math.log2(n / total) for n in counts.values())


def miller_madow(counts: Counter) -> float:
    """Shannon entropy with the Miller-Madow bias correction (bits)."""
    total = sum(counts.values())
    return shannon(counts) + (len(counts) - 1) / (2 * total * math.log(2))


def chi_square_uniform(counts: Counter, bins: int = 64) -> float:
    total = sum(counts.values())
    expected = total / bins
    return sum((counts.get(i, 0) - expected) ** 2 / expected for i in range(bins))


ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
#: chi-square, 63 degrees of freedom: P(X > 130) is about 2e-6, so the 66
#: checks of a run (32 positions and the pool, twice) flake about once in 7,000 runs.
CHI2_LIMIT = 130.0


def entropy_report(ids: list[str]) -> dict[str, Any]:
    positions = [Counter(ALPHABET.index(i[p]) for i in ids) for p in range(32)]
    pooled = Counter(ALPHABET.index(ch) for i in ids for ch in i)
    per_position = [miller_madow(c) for c in positions]
    ordered = sorted(ids)
    longest_prefix = 0
    for a, b in itertools.pairwise(ordered):
        shared = next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        longest_prefix = max(longest_prefix, shared)
    return {
        "ids": len(ids),
        "distinct": len(set(ids)),
        "bits_per_char": round(miller_madow(pooled), 4),
        "bits_total_estimate": round(sum(per_position), 1),
        "min_position_bits": round(min(per_position), 3),
        "max_chi2_position": round(max(chi_square_uniform(c) for c in positions), 1),
        "chi2_pooled": round(chi_square_uniform(pooled), 1),
        "longest_shared_prefix": longest_prefix,
    }


@postgres_only.CHAOS
def test_server_task_ids_carry_192_random_bits(iso_stack, identities):
    """Ids made by the running server (four identities in parallel)."""
    callers = [identities[name] for name in ("iso-carol", "iso-dave", "bob", "anonymous")] * 2

    def create(token: str | None) -> list[str]:
        client = HttpRpc(iso_stack.url, token=token, validate=False)
        made: list[str] = []
        try:
            while len(made) < SERVER_IDS // len(callers):
                reply = client.call_tool("slow_compute", {"seconds": 0, "label": "id"})
                if reply.status == 200:
                    made.append(reply.result["taskId"])
                else:
                    assert reply.status == 429, reply  # 100 calls a second per owner
                    time.sleep(0.2)
        finally:
            client.close()
        return made

    with ThreadPoolExecutor(len(callers)) as pool:
        ids = [task_id for made in pool.map(create, callers) for task_id in made]
    report = entropy_report(ids)
    record_figures("R5 task ids (server)", "short", report)
    assert all(ID_CHARS.match(i) for i in ids), [i for i in ids if not ID_CHARS.match(i)][:5]
    assert report["distinct"] == len(ids)
    assert report["bits_per_char"] > 5.98, report
    # 1,000 samples over 64 symbols bias each position's estimate a little low.
    assert report["bits_total_estimate"] > 186, report
    assert report["max_chi2_position"] < CHI2_LIMIT and report["chi2_pooled"] < CHI2_LIMIT, report
    assert report["longest_shared_prefix"] <= 5, report


def test_generated_task_ids_carry_192_random_bits():
    """The same measurement on 20,000 ids from the model's generator."""
    from mcptasks.models import new_task_id

    ids = [new_task_id() for _ in range(20_000)]
    report = entropy_report(ids)
    record_figures("R5 task ids (generator)", "short", report)
    assert all(ID_CHARS.match(i) for i in ids)
    assert report["distinct"] == len(ids)
    assert report["bits_per_char"] > 5.999, report
    assert report["bits_total_estimate"] > 191.5, report
    assert report["max_chi2_position"] < CHI2_LIMIT and report["chi2_pooled"] < CHI2_LIMIT, report

"""R4: fuzz the live endpoint with generated requests.

Hypothesis generates the requests (``tests/reliability/fuzzing.py`` says
how); they go to a real server (uvicorn, two processes, on a private
Postgres and Redis) over keep-alive connections, many at once. Every answer
is checked against the oracle: never a 5xx, always JSON-RPC, the right code
with the right status, ids echoed. Afterwards the server's log must hold no
traceback. Failures are grouped by kind and reported with samples, not
stopped at the first, so one run shows every distinct problem.

Short form (CI): 100,000 requests. Full form: ``MCPTASKS_CHAOS=full``
(300,000 requests, or ``MCPTASKS_FUZZ_REQUESTS``).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.reliability.forms import FORMS, record_figures
from tests.reliability.fuzzing import Case, Expected, Variants, category, check, expect
from tests.reliability.rawhttp import Connection, ProtocolFailure
from tests.reliability.stack import ChaosStack, running_chaos_stack
from tests.support import postgres_only
from tests.support.rpc import HttpRpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.CHAOS]

REQUESTS = {"short": 100_000, "full": 300_000}
#: Requests made from one hypothesis example.
FANOUT = 20
#: Connections kept open to the server.
CONNECTIONS = 24


@pytest.fixture(scope="module")
def fuzz_stack(private_services, tmp_path_factory) -> Iterator[ChaosStack]:
    """The example site with its default limits (poll burst 10, 1000 active
    tasks, 100 calls a second per owner), two web processes, one worker."""
    with running_chaos_stack(
        private_services,
        tmp_path_factory.mktemp("fuzz"),
        workers=1,
        concurrency=2,
        web_workers=2,
        sweeper=False,
        settings={"MCP_POLL_BURST": "10", "MCP_MAX_ACTIVE_TASKS": "1000", "MCP_POLL_INTERVAL_MS": "1000"},
    ) as stack:
        yield stack


def seed_tasks(stack: ChaosStack) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Tasks the fuzzer can aim at: the anonymous caller's own (waiting for
    input, and running) and another identity's; and the tokens it may use."""
    tokens = stack.create_tokens(["fuzz-alice", "fuzz-bob"])
    anonymous = HttpRpc(stack.url, validate=False)
    bob = HttpRpc(stack.url, token=tokens["fuzz-bob"], validate=False)
    try:
        waiting = [anonymous.create_task("confirm_delete", {"filename": f"f{i}"}) for i in range(3)]
        own = [anonymous.create_task("slow_compute", {"seconds": 3600, "label": "fuzz"})]
        other = [bob.create_task("confirm_delete", {"filename": "b"}) for _ in range(2)]
        for task_id in waiting:
            anonymous.wait_for(task_id, {"input_required"}, timeout=60)
    finally:
        anonymous.close()
        bob.close()
    return {"own": own + waiting, "waiting": waiting, "other": other}, {"alice": tokens["fuzz-alice"]}


@dataclass
class Findings:
    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    transport: Counter = field(default_factory=Counter)

    def fail(self, key: str, case: Case, status: Any, body: bytes, problems: list[str]) -> None:
        self.failures[key] += 1
        kept = self.samples.setdefault(key, [])
        if len(kept) < 3:
            kept.append(
                {
                    "problems": problems,
                    "recipe": case.recipe,
                    "request": f"{case.http_method} headers={case.headers!r} body={case.body[:400]!r}",
                    "status": status,
                    "response": body[:400].decode("utf-8", "replace"),
                }
            )

    def report(self) -> str:
        lines = [f"{sum(self.failures.values())} of {self.sent} answers broke the rules:"]
        for key, count in self.failures.most_common():
            lines.append(f"\n[{count}x] {key}")
            for sample in self.samples[key]:
                lines.append("  " + json.dumps(sample, ensure_ascii=True)[:1500])
        return "\n".join(lines)


class Sender:
    """An asyncio loop on its own thread that sends the batches it is given
    over ``CONNECTIONS`` keep-alive connections and checks each answer."""

    def __init__(self, stack: ChaosStack, valid_tokens: set[str], findings: Findings) -> None:
        self.port = stack.port
        self.valid_tokens = valid_tokens
        self.findings = findings
        self.batches: queue.Queue[list[Case] | None] = queue.Queue(maxsize=CONNECTIONS * 4)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.main()), name="fuzz-sender", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, batch: list[Case]) -> None:
        self.batches.put(batch)

    def finish(self) -> None:
        for _ in range(CONNECTIONS):
            self.batches.put(None)
        self.thread.join()

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(self.worker(loop) for _ in range(CONNECTIONS)))

    async def worker(self, loop: asyncio.AbstractEventLoop) -> None:
        connection = Connection("127.0.0.1", self.port)
        try:
            while True:
                batch = await loop.run_in_executor(None, self.batches.get)
                if batch is None:
                    return
                for case in batch:
                    await self.one(connection, case)
        finally:
            await connection.close()

    async def one(self, connection: Connection, case: Case) -> None:
        findings = self.findings
        expected: Expected = expect(case, self.valid_tokens, self.port)
        findings.sent += 1
        findings.kinds[expected.why] += 1
        try:
            response = await connection.request(case.http_method, "/mcp", case.headers, case.body, stream_timeout=0.5)
        except ProtocolFailure as exc:
            findings.transport[str(exc)[:80]] += 1
            findings.fail(f"{expected.why}: no HTTP answer", case, None, str(exc).encode(), [str(exc)])
            return
        findings.statuses[response.status] += 1
        problems = check(case, expected, response)
        if problems:
            findings.fail(category(expected, problems), case, response.status, response.body, problems)


TRACEBACK = re.compile(r"^(Traceback \(most recent call last\)|.*\b(ERROR|CRITICAL)\b.*)$", re.MULTILINE)


@pytest.mark.parametrize("form", FORMS)
def test_fuzz_live_endpoint(fuzz_stack: ChaosStack, form: str) -> None:
    total = int(os.environ.get("MCPTASKS_FUZZ_REQUESTS") or REQUESTS[form])
    known, tokens = seed_tasks(fuzz_stack)
    variants = Variants(known, tokens)
    findings = Findings()
    sender = Sender(fuzz_stack, set(tokens.values()), findings)
    log_before = len(fuzz_stack.log_text("web"))
    started = time.monotonic()
    sender.start()

    @settings(
        max_examples=-(-total // FANOUT),
        database=None,
        deadline=None,
        derandomize=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(variants.strategy(FANOUT))
    def generate(batch: list[Case]) -> None:
        sender.put(batch)

    try:
        generate()
    finally:
        sender.finish()
    elapsed = time.monotonic() - started
    # The server is still serving after all that.
    probe = HttpRpc(fuzz_stack.url, validate=False)
    try:
        wait_until(lambda: probe.request("server/discover").status == 200, 30, what="server answers")
    finally:
        probe.close()
    log = fuzz_stack.log_text("web")[log_before:]
    tracebacks = TRACEBACK.findall(log)
    record_figures(
        "R4 fuzz",
        form,
        {
            "requests": findings.sent,
            "seconds": round(elapsed, 1),
            "per_second": round(findings.sent / elapsed),
            "statuses": dict(sorted(findings.statuses.items())),
            "failures": sum(findings.failures.values()),
            "distinct_failures": len(findings.failures),
            "server_log_errors": len(tracebacks),
            "checks": len(findings.kinds),
        },
    )
    assert findings.sent >= total
    problems = []
    if findings.failures:
        problems.append(findings.report())
    if tracebacks:
        excerpt = "\n".join(log.splitlines()[:80])
        problems.append(f"the server logged {len(tracebacks)} errors/tracebacks; the first lines:\n{excerpt}")
    assert not problems, "\n\n".join(problems)

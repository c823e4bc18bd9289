"""Client load for fault runs: threads that create tasks and poll them over
HTTP, and a tally of every answer they got.

A creator records each ``taskId`` it was given (the server's promise) and
goes on until ``target`` tasks were promised. When the connection breaks
mid-call (a web restart) it cannot know whether the task exists; it counts
the call as ``unknown`` and tries again: the database checks cover such
orphans, since every row must finish.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.rpc import TASKS_CAPS, build_headers, build_meta

Outcome = tuple[str, int, int | None]  # (method, HTTP status, JSON-RPC error code or None)


def rpc_body(method: str, params: dict[str, Any], request_id: int) -> tuple[bytes, dict[str, str]]:
    params = {**params, "_meta": build_meta(TASKS_CAPS)}
    headers = {"Content-Type": "application/json", **build_headers(method, params)}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode(), headers


@dataclass
class Tally:
    """Every answer, counted; the odd ones kept as samples."""

    outcomes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    #: (owner index, task id) for every CreateTaskResult.
    created: list[tuple[int, str]] = field(default_factory=list)
    unknown_creates: int = 0
    #: Answers no client may ever get: a 5xx that is not a clean -32603, a
    #: body that is not JSON-RPC.
    bad: list[dict[str, Any]] = field(default_factory=list)
    #: (monotonic time, method, status, code, seconds taken)
    timeline: list[tuple[float, str, int, int | None, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, method: str, status: int, code: int | None, elapsed: float, bad: dict[str, Any] | None) -> None:
        with self.lock:
            self.outcomes[(method, status, code)] += 1
            self.timeline.append((time.monotonic(), method, status, code, elapsed))
            if bad is not None and len(self.bad) < 50:
                self.bad.append(bad)

    def error(self, method: str, exc: BaseException) -> None:
        with self.lock:
            self.errors[(method, type(exc).__name__)] += 1
            self.timeline.append((time.monotonic(), method, -1, None, 0.0))

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return {
                "answers": {f"{m} {s} {c}": n for (m, s, c), n in sorted(self.outcomes.items(), key=str)},
                "transport_errors": {f"{m} {e}": n for (m, e), n in sorted(self.errors.items())},
                "created": len(self.created),
                "unknown_creates": self.unknown_creates,
                "bad": len(self.bad),
            }

    def during(self, start: float, end: float) -> Counter:
        with self.lock:
            return Counter((m, s, c) for t, m, s, c, _ in self.timeline if start <= t <= end)


def classify(status: int, raw: bytes) -> tuple[Any, int | None, dict[str, Any] | None]:
    """Decode an answer: (body, error code, a problem report or ``None``).

    Allowed: 200 with a result or error, 4xx with a JSON-RPC error, 503 with
    -32603 (the task store is down). Anything else is a problem.
    """
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        return None, None, {"status": status, "why": "body is not JSON", "raw": raw[:300].decode(errors="replace")}
    code = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
        if not isinstance(code, int) or not isinstance(body["error"].get("message"), str):
            return body, None, {"status": status, "why": "malformed error object", "body": body}
    elif not (isinstance(body, dict) and "result" in body):
        return body, None, {"status": status, "why": "neither result nor error", "body": body}
    if status >= 500 and not (status == 503 and code == -32603):
        return body, code, {"status": status, "why": "server error", "body": body}
    return body, code, None


class Load:
    """Creator and poller threads against ``url``.

    ``tokens`` are the identities (``None`` is anonymous); creator ``i`` uses
    ``tokens[i % len(tokens)]``. ``arguments`` makes each call's arguments.
    Creation stops at ``target`` tasks (or when stopped); ``rate`` caps the
    creations per second over all creators.
    """

    def __init__(
        self,
        url: str,
        tokens: list[str | None],
        *,
        tool: str = "slow_compute",
        arguments: Callable[[random.Random], dict[str, Any]] | None = None,
        target: int | None = None,
        rate: float = 50.0,
        creators: int = 4,
        pollers: int = 2,
        seed: int = 0,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.tokens = tokens
        self.tool = tool
        self.arguments = arguments or (lambda rng: {"seconds": round(rng.uniform(0, 0.5), 3), "label": "load"})
        self.target = target
        self.rate = rate
        self.n_creators = creators
        self.n_pollers = pollers
        self.seed = seed
        self.timeout = timeout
        self.tally = Tally()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self._ids = iter(range(1, 1 << 62))
        self._id_lock = threading.Lock()
        self._issued = 0

    def _next_id(self) -> int:
        with self._id_lock:
            return next(self._ids)

    def _claim_slot(self) -> bool:
        with self._id_lock:
            if self.target is not None and self._issued >= self.target:
                return False
            self._issued += 1
            return True

    def _post(self, http: httpx.Client, token: str | None, method: str, params: dict[str, Any]) -> Any:
        body, headers = rpc_body(method, params, self._next_id())
        if token:
            headers["Authorization"] = f"Bearer {token}"
        started = time.monotonic()
        try:
            response = http.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self.tally.error(method, exc)
            raise
        payload, code, bad = classify(response.status_code, response.content)
        if bad is not None:
            bad["method"] = method
        self.tally.add(method, response.status_code, code, time.monotonic() - started, bad)
        return payload

    def _creator(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        owner = index % len(self.tokens)
        token = self.tokens[owner]
        pause = self.n_creators / self.rate if self.rate else 0.0
        with httpx.Client(timeout=self.timeout) as http:
            while not self.stop_event.is_set() and self._claim_slot():
                started = time.monotonic()
                try:
                    payload = self._post(
                        http, token, "tools/call", {"name": self.tool, "arguments": self.arguments(rng)}
                    )
                except httpx.HTTPError as exc:
                    # Refused connections never reached the server; anything
                    # else may have created a task we will never hear of.
                    with self._id_lock:
                        self._issued -= 1
                    if not isinstance(exc, httpx.ConnectError):
                        with self.tally.lock:
                            self.tally.unknown_creates += 1
                    time.sleep(0.2)
                    continue
                result = payload.get("result") if isinstance(payload, dict) else None
                if isinstance(result, dict) and result.get("resultType") == "task":
                    with self.tally.lock:
                        self.tally.created.append((owner, result["taskId"]))
                elif isinstance(payload, dict) and "error" in payload:
                    with self._id_lock:  # the slot was not used: try again
                        self._issued -= 1
                    time.sleep(0.1)
                self.stop_event.wait(max(0.0, pause - (time.monotonic() - started)))

    def _poller(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + 500 + index)
        with httpx.Client(timeout=self.timeout) as http:
            while not self.stop_event.is_set():
                with self.tally.lock:
                    known = self.tally.created[-200:]
                if not known:
                    self.stop_event.wait(0.05)
                    continue
                owner, task_id = rng.choice(known)
                try:
                    self._post(http, self.tokens[owner], "tasks/get", {"taskId": task_id})
                except httpx.HTTPError:
                    self.stop_event.wait(0.2)
                self.stop_event.wait(0.02)

    def start(self) -> Load:
        for i in range(self.n_creators):
            self.threads.append(threading.Thread(target=self._creator, args=(i,), name=f"creator{i}", daemon=True))
        for i in range(self.n_pollers):
            self.threads.append(threading.Thread(target=self._poller, args=(i,), name=f"poller{i}", daemon=True))
        for thread in self.threads:
            thread.start()
        return self

    def creators_done(self) -> bool:
        return not any(t.is_alive() for t in self.threads if t.name.startswith("creator"))

    def wait_created(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            if thread.name.startswith("creator"):
                thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(self.timeout + 5)

    def created_ids(self) -> list[str]:
        with self.tally.lock:
            return [task_id for _, task_id in self.tally.created]

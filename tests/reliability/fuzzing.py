"""R4: generated HTTP requests for the MCP endpoint, and what each must get back.

Two halves, kept apart on purpose:

* ``Variants(...).strategy(fanout)`` is a hypothesis strategy. Each example
  is a well-formed 2026-07-28 request for some method, a pool of values
  (odd unicode, wrong types, junk bytes) and a seed, all drawn by
  hypothesis; it expands into ``fanout`` requests: the request itself, then
  variants made with a ``random.Random`` seeded by the example (wrong types,
  missing fields, huge values, batches, notifications, deep nesting, wrong
  or missing headers, foreign origins and hosts, bad credentials, bodies
  that are not JSON, other HTTP methods). Drawing each request through
  hypothesis costs milliseconds; the fan-out is what lets one CI run send
  100,000 of them in a few minutes.
* ``expect()`` is the oracle: from the bytes and headers alone (not from how
  they were made) it decides what the spec requires, following the order in
  which a server must check a request. Where the answer depends on the
  handler (a tool's own validation, say), it says which codes are allowed.
  ``check()`` applies it and the rules every answer obeys (no 5xx, valid
  JSON-RPC, status and code agree, ids echoed, Retry-After on 429).
"""

from __future__ import annotations

import base64
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hypothesis import strategies as st

from tests.reliability.rawhttp import RawResponse

PROTOCOL_VERSION = "2026-07-28"
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
TASKS_EXT = "io.modelcontextprotocol/tasks"

#: The site's limits (project.settings defaults, which the fuzz stack keeps).
MAX_BODY_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 64
MAX_ARGUMENTS_BYTES = 256 * 1024
MAX_INPUT_RESPONSES_BYTES = 256 * 1024
ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]", "testserver")
LOOPBACK = ("localhost", "127.0.0.1", "[::1]", "::1")

MODERN_METHODS = (
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "completion/complete",
    "subscriptions/listen",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
)
OTHER_METHODS = ("tasks/result", "tasks/list", "initialize", "ping", "logging/setLevel", "notifications/initialized")
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
#: Methods whose ``Mcp-Name`` header mirrors a body field.
NAME_FIELD = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

#: Tools that finish at once whatever their arguments (the fuzzer must not
#: tie the server up with a tool told to sleep for a day).
QUICK_TOOLS = (
    "greet",
    "test_simple_text",
    "test_error_handling",
    "test_image_content",
    "regional_query",
    "json_schema_2020_12_tool",
    "test_streaming_elicitation",
    "test_input_required_result_elicitation",
    "test_missing_capability",
    "test_tool_with_progress",
    "test_logging_tool",
    "failing_job",
    "protocol_error_job",
    "confirm_delete",
    "multi_input",
)
PROMPTS = ("test_simple_prompt", "test_prompt_with_arguments", "test_input_required_result_prompt")
RESOURCES = ("test://static-text", "test://static-binary", "test://template/7/data", "test://nope")


@dataclass
class Case:
    """One HTTP request as sent."""

    http_method: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    #: How it was made (for reports only; the oracle never reads it).
    recipe: list[str] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """The last value of a header, decoded as the server decodes it (latin-1)."""
        found = None
        for key, value in self.headers:
            if key.decode("latin-1").lower() == name:
                found = value.decode("latin-1")
        return found


# Values drawn by hypothesis ---------------------------------------------------------------

ODD = (
    "\x00",
    "\ud800",
    "\udfff",
    "\ufeff",
    "\u202e",
    "\u0301",
    "\uffff",
    "\U0001f600",
    "\U0001d518",
    "\n",
    "\\",
    '"',
    "\u2028",
    "=?base64?",
    "?=",
    " ",
    "\t",
)

odd_text = st.one_of(
    st.text(max_size=12),
    st.lists(st.sampled_from(ODD) | st.text(max_size=3), max_size=6).map("".join),
    st.sampled_from(["", "tools/call", "2026-07-28", "null", "0", "__proto__", "../../etc/passwd", "%00"]),
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**31), max_value=2**31),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    odd_text,
)

json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(odd_text, children, max_size=4),
    max_leaves=10,
)

task_ids = st.one_of(
    st.sampled_from(["", "x", "0" * 32, "a" * 64, "a" * 300, "not-a-task", "a\x00b", "\ud800"]),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-", min_size=32, max_size=32),
    odd_text,
)

capabilities = st.one_of(
    st.sampled_from(
        [
            {"extensions": {TASKS_EXT: {}}},
            {"elicitation": {}, "sampling": {}, "extensions": {TASKS_EXT: {}}},
            {"elicitation": {}, "sampling": {}, "roots": {}, "extensions": {TASKS_EXT: {}}},
            {},
        ]
    ),
    st.dictionaries(odd_text, json_values, max_size=3),
)

raw_bodies = st.binary(max_size=64) | st.sampled_from(
    [b"", b"{", b'{"jsonrpc":"2.0"', b"\xef\xbb\xbf{}", b"\xff\xfe{}", b"[]", b"null", b"NaN", b'"\\ud800"', b"{}" * 3]
)


def meta(caps: Any, version: Any = PROTOCOL_VERSION) -> dict[str, Any]:
    return {META_VERSION: version, META_CAPABILITIES: caps, "io.modelcontextprotocol/clientInfo": {"name": "fuzz"}}


def _answers(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    elicit = st.fixed_dictionaries(
        {"action": st.sampled_from(["accept", "decline", "cancel", "maybe"])},
        optional={"content": st.dictionaries(odd_text, json_values, max_size=2)},
    )
    return st.dictionaries(st.sampled_from(keys) | odd_text, elicit | json_values, max_size=3)


def _params(known: Mapping[str, list[str]]) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    """Plausible params for each method (``known``: task ids by kind)."""
    some_task = st.one_of(
        st.sampled_from(known.get("own") or ["none"]),
        st.sampled_from(known.get("waiting") or known.get("own") or ["none"]),
        st.sampled_from(known.get("other") or ["none"]),
        task_ids,
    )
    arguments = st.one_of(
        st.fixed_dictionaries({"name": odd_text}),
        st.fixed_dictionaries({"region": odd_text, "query": odd_text}),
        st.fixed_dictionaries({"filename": odd_text}),
        st.dictionaries(odd_text, json_values, max_size=4),
        json_values,
    )
    listing = st.fixed_dictionaries({}, optional={"cursor": json_values})
    return {
        "tools/call": st.fixed_dictionaries(
            {"name": st.sampled_from(QUICK_TOOLS) | odd_text},
            optional={
                "arguments": arguments,
                "inputResponses": _answers(["user_name", "confirm"]),
                "requestState": odd_text,
            },
        ),
        "tasks/get": st.fixed_dictionaries({"taskId": some_task}),
        "tasks/cancel": st.fixed_dictionaries({"taskId": some_task}),
        "tasks/update": st.fixed_dictionaries(
            {"taskId": some_task, "inputResponses": _answers(["confirm", "first", "second"]) | json_values}
        ),
        "prompts/get": st.fixed_dictionaries(
            {"name": st.sampled_from(PROMPTS) | odd_text},
            optional={"arguments": st.dictionaries(st.sampled_from(["arg1", "arg2"]) | odd_text, json_values)},
        ),
        "resources/read": st.fixed_dictionaries({"uri": st.sampled_from(RESOURCES) | odd_text}),
        "completion/complete": st.fixed_dictionaries(
            {
                "ref": st.fixed_dictionaries(
                    {"type": st.sampled_from(["ref/prompt", "ref/resource"]) | odd_text, "name": odd_text}
                )
                | json_values,
                "argument": st.fixed_dictionaries({"name": odd_text, "value": odd_text}) | json_values,
            }
        ),
        "subscriptions/listen": st.fixed_dictionaries(
            {"notifications": st.fixed_dictionaries({}, optional={"taskIds": st.lists(some_task, max_size=3)})}
        ),
        **{m: listing for m in (*MODERN_METHODS, *OTHER_METHODS) if m not in NAME_FIELD and "/" in m},
    }


def encode_header(value: str) -> bytes:
    """As a conforming client sends ``value`` in an ``Mcp-*`` header: plain
    when it is safe printable ASCII, else in the ``=?base64?...?=`` form."""
    if value.isascii() and value.isprintable() and value == value.strip():
        return value.encode()
    return b"=?base64?" + base64.b64encode(value.encode("utf-8", "surrogatepass")) + b"?="


@dataclass
class Pool:
    """Values hypothesis drew for one example; the variants take their
    wrong types, odd strings and junk bodies from here."""

    texts: list[str]
    values: list[Any]
    raws: list[bytes]


pools = st.builds(
    Pool,
    texts=st.lists(odd_text, min_size=3, max_size=3),
    values=st.lists(json_values, min_size=3, max_size=3),
    raws=st.lists(raw_bodies, min_size=2, max_size=2),
)


# Variants (cheap, from a seed hypothesis drew) ---------------------------------------------------

#: How a variant differs from the example's request, and how often.
SHAPES = ("valid", "body", "headers", "both", "raw", "json", "http")
SHAPE_WEIGHTS = (25, 35, 15, 10, 5, 5, 5)
ENVELOPE_KEYS = ("jsonrpc", "id", "method", "params")
BODY_MUTATIONS = (
    "drop-envelope",
    "replace-envelope",
    "drop-param",
    "replace-param",
    "drop-meta",
    "replace-meta",
    "version",
    "caps",
    "method",
    "notification",
    "batch",
    "huge-string",
    "big-arguments",
    "big-answers",
    "deep",
    "odd-id",
    "non-standard-number",
)
HEADER_MUTATIONS = (
    "drop",
    "drop",
    "replace",
    "replace",
    "case",
    "origin",
    "host",
    "auth",
    "content-type",
    "sentinel",
)
ORIGINS = (
    b"http://127.0.0.1:8000",
    b"http://localhost",
    b"https://evil.example",
    b"null",
    b"http://127.0.0.1.evil.example",
    b"http://[::1]:3000",
    b"file://",
    b"",
    b"http://testserver",
    b"http://localhost.:80",
    b"http://[::1",
    b"HTTP://LOCALHOST:1",
)
HOSTS = (b"evil.example", b"127.0.0.1", b"localhost:1", b"[::1]:99", b"", b"attacker.localhost", b"10.0.0.1")
HEADER_VALUES = (b"", b"2026-07-28", b"2025-11-25", b" 2026-07-28 ", b"tools/call", b"\xff\xfe", b"\xc3\xa9", b"a\tb")
SENTINELS = (b"=?base64?", b"=?base64?!!!?=", b"=?base64?/w==?=", b"=?base64??=", b"=?BASE64?dG9vbHMvY2FsbA==?=")
ODD_IDS = (None, True, 1.5, -0.0, [], {}, 2**63, -(2**63), 2**70, "", "\ud800", "\x00", "1")


def nested(depth: int) -> Any:
    """A value whose deepest container is ``depth - 1`` levels down."""
    value: Any = 0
    for i in range(depth - 1):
        value = [value] if i % 2 else {"k": value}
    return value


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _header_safe(value: bytes) -> bool:
    """A legal HTTP field value (RFC 9110 5.5): no control characters but tab.
    (Anything else is refused by the HTTP server before the app sees it.)"""
    return all(ch == 9 or 32 <= ch != 127 for ch in value)


class Variants:
    """Requests made from one hypothesis example: a well-formed request and
    the values it drew, varied with a seeded ``random.Random``."""

    def __init__(self, known: Mapping[str, list[str]], tokens: Mapping[str, str]) -> None:
        self.known = known
        self.tokens = dict(tokens)
        self.params = _params(known)
        self.methods = st.sampled_from((*MODERN_METHODS, *MODERN_METHODS, *OTHER_METHODS))

    def strategy(self, fanout: int) -> st.SearchStrategy[list[Case]]:
        """One example: ``fanout`` requests."""
        return st.builds(
            self.expand,
            st.just(fanout),
            self.well_formed(),
            pools,
            st.integers(min_value=0, max_value=2**64 - 1),
        )

    def well_formed(self) -> st.SearchStrategy[dict[str, Any]]:
        @st.composite
        def build(draw: Any) -> dict[str, Any]:
            method = draw(self.methods)
            if method == "subscriptions/listen" and draw(st.integers(0, 9)):
                method = "tasks/get"  # streams are slow to fuzz: keep them rare
            params = dict(draw(self.params.get(method, st.just({}))))
            params["_meta"] = meta(draw(capabilities))
            request_id = draw(st.integers(0, 2**31) | odd_text)
            return {"body": {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}}

        return build()

    def headers_for(self, body: Any, rnd: random.Random) -> dict[str, bytes]:
        """What a conforming client sends with ``body``."""
        headers: dict[str, bytes] = {
            "Content-Type": b"application/json",
            "Accept": b"application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL_VERSION.encode(),
        }
        if not isinstance(body, dict):
            return headers
        method = body.get("method")
        params = body.get("params") if isinstance(body.get("params"), dict) else {}
        if not isinstance(method, str):
            return headers
        headers["Mcp-Method"] = encode_header(method)
        source = NAME_FIELD.get(method) or ("taskId" if method in TASK_METHODS else None)
        if source and isinstance(params.get(source), str):
            headers["Mcp-Name"] = encode_header(params[source])
        arguments = params.get("arguments")
        if method == "tools/call" and isinstance(arguments, dict) and isinstance(arguments.get("region"), str):
            headers["Mcp-Param-Region"] = encode_header(arguments["region"])
        who = rnd.choice(["anonymous", "anonymous", *sorted(self.tokens)])
        if who != "anonymous":
            headers["Authorization"] = b"Bearer " + self.tokens[who].encode()
        return headers

    def expand(self, fanout: int, made: dict[str, Any], pool: Pool, seed: int) -> list[Case]:
        rnd = random.Random(seed)
        cases = [self.variant(made["body"], pool, rnd, keep=True)]
        cases.extend(self.variant(made["body"], pool, rnd) for _ in range(fanout - 1))
        return cases

    def variant(self, base: dict[str, Any], pool: Pool, rnd: random.Random, keep: bool = False) -> Case:
        shape = "valid" if keep else rnd.choices(SHAPES, SHAPE_WEIGHTS)[0]
        recipe = [shape]
        if shape == "raw":
            headers = {"Content-Type": b"application/json", "MCP-Protocol-Version": PROTOCOL_VERSION.encode()}
            return Case("POST", _pairs(headers), rnd.choice(pool.raws), recipe)
        if shape == "json":
            value = rnd.choice([*pool.values, *pool.texts])
            headers = {"Content-Type": b"application/json"}
            if rnd.random() < 0.5:
                headers["MCP-Protocol-Version"] = PROTOCOL_VERSION.encode()
            return Case("POST", _pairs(headers), encode_json(value, rnd.random() < 0.5), recipe)
        body: Any = _copy(base)
        if shape != "valid":
            body["id"] = rnd.choice([rnd.randrange(2**31), rnd.choice(pool.texts), body["id"]])
        if shape in ("body", "both"):
            for _ in range(rnd.choice((1, 1, 2))):
                if isinstance(body, dict):
                    body = self.mutate_body(body, pool, rnd, recipe)
        headers = self.headers_for(body if shape != "both" or rnd.random() < 0.5 else base, rnd)
        if shape in ("headers", "both", "http"):
            self.mutate_headers(headers, pool, rnd, recipe)
        payload = encode_json(body, rnd.random() < 0.5)
        if "non-standard-number" in recipe and payload.startswith(b"{"):
            constant = rnd.choice([b"NaN", b"Infinity", b"-Infinity"])
            if b'"arguments": {' in payload and rnd.random() < 0.5:  # where a task would store it
                payload = re.sub(
                    rb'"arguments": \{(\}?)',
                    lambda m: b'"arguments": {"n": ' + constant + (b"}" if m.group(1) else b", "),
                    payload,
                    count=1,
                )
            else:
                payload = b'{"x": ' + constant + b", " + payload[1:]
        http_method = "POST"
        if shape == "http":
            http_method = rnd.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "POST"])
            if rnd.random() < 0.5:
                headers["Mcp-Session-Id"] = rnd.choice([b"nope", b"0" * 32])
        return Case(http_method, _pairs(headers), payload, recipe)

    def mutate_body(self, body: dict[str, Any], pool: Pool, rnd: random.Random, recipe: list[str]) -> Any:
        kind = rnd.choice(BODY_MUTATIONS)
        recipe.append(kind)
        junk = _copy(rnd.choice([*pool.values, *pool.texts]))  # a copy: never a cycle through a shared value
        params = body.get("params") if isinstance(body.get("params"), dict) else {}
        meta_ = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        if kind == "drop-envelope":
            body.pop(rnd.choice(ENVELOPE_KEYS), None)
        elif kind == "replace-envelope":
            body[rnd.choice(ENVELOPE_KEYS)] = junk
        elif kind == "drop-param" and params:
            params.pop(rnd.choice(sorted(params)), None)
        elif kind == "replace-param":
            keys = sorted(params) + pool.texts
            params[rnd.choice(keys)] = junk
        elif kind == "drop-meta" and meta_:
            meta_.pop(rnd.choice(sorted(meta_)), None)
        elif kind == "replace-meta":
            if rnd.random() < 0.3:
                params["_meta"] = junk
            elif meta_:
                meta_[rnd.choice(sorted(meta_))] = junk
        elif kind == "version":
            meta_[META_VERSION] = rnd.choice([*LEGACY_VERSIONS, "2026-07-29", "", "2026-07-28 ", *pool.texts])
        elif kind == "caps":
            meta_[META_CAPABILITIES] = rnd.choice(
                [{}, {"extensions": {TASKS_EXT: {}}}, {"extensions": {TASKS_EXT: True}}, {"extensions": []}, junk]
            )
        elif kind == "method":
            body["method"] = rnd.choice([*MODERN_METHODS, *OTHER_METHODS, *pool.texts])
        elif kind == "notification":
            body.pop("id", None)
        elif kind == "batch":
            return [_copy(body) for _ in range(rnd.choice((0, 1, 2, 3)))]
        elif kind == "huge-string":
            text = rnd.choice(["x", "\U0001f600", "\\", "\x00", "\u00e9"]) * rnd.choice([10_000, 100_000, 300_000])
            target = rnd.choice(["method", "id", "param", "param"])
            if target == "param":
                params[rnd.choice(["name", "taskId", "uri", "cursor", "requestState"])] = text
            else:
                body[target] = text
        elif kind == "big-arguments":
            size = rnd.choice([MAX_ARGUMENTS_BYTES - 64, MAX_ARGUMENTS_BYTES + 1024, 2 * MAX_ARGUMENTS_BYTES])
            params["arguments"] = {"name": "y" * size}
        elif kind == "big-answers":
            size = rnd.choice([MAX_INPUT_RESPONSES_BYTES + 1024, MAX_BODY_BYTES + 1024])
            params["inputResponses"] = {"confirm": {"action": "accept", "content": {"blob": "z" * size}}}
        elif kind == "deep":
            depth = rnd.choice([MAX_JSON_DEPTH - 4, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH + 10, 500])
            params[rnd.choice(["arguments", "cursor", "inputResponses", "_extra"])] = nested(depth)
        elif kind == "odd-id":
            body["id"] = rnd.choice(ODD_IDS)
        return body

    def mutate_headers(self, headers: dict[str, bytes], pool: Pool, rnd: random.Random, recipe: list[str]) -> None:
        kind = rnd.choice(HEADER_MUTATIONS)
        recipe.append(f"header-{kind}")
        if kind == "drop" and headers:
            headers.pop(rnd.choice(sorted(headers)))
        elif kind == "replace":
            name = rnd.choice(["MCP-Protocol-Version", "Mcp-Method", "Mcp-Name", "Mcp-Param-Region"])
            candidates = [*HEADER_VALUES, *(t.encode("utf-8", "surrogatepass") for t in pool.texts), *pool.raws]
            headers[name] = rnd.choice([v for v in candidates if _header_safe(v)])
        elif kind == "case":
            for name in list(headers):
                headers[name.upper() if rnd.random() < 0.5 else name.lower()] = headers.pop(name)
        elif kind == "origin":
            headers["Origin"] = rnd.choice(ORIGINS)
        elif kind == "host":
            headers["Host"] = rnd.choice(HOSTS)
        elif kind == "auth":
            valid = next(iter(self.tokens.values()), "x").encode()
            headers["Authorization"] = rnd.choice(
                [
                    b"Bearer",
                    b"Bearer ",
                    b"Bearer 0123456789abcdef0123456789abcdef01234567",
                    b"Bearer a b",
                    b"bearer " + valid,
                    b"BEARER  " + valid,
                    b"Token nope",
                    b"Token " + valid,
                    b"Basic dXNlcjpwYXNz",
                    b"Bearer \xc3\xa9\xc3\xa9",
                    b"Digest x",
                ]
            )
        elif kind == "content-type":
            headers["Content-Type"] = rnd.choice([b"text/plain", b"application/x-www-form-urlencoded", b""])
        elif kind == "sentinel":
            headers[rnd.choice(["Mcp-Method", "Mcp-Name"])] = rnd.choice(SENTINELS)


def _pairs(headers: Mapping[str, bytes]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value) for name, value in headers.items()]


def encode_json(body: Any, ascii_only: bool) -> bytes:
    return json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


# The oracle ------------------------------------------------------------------------------------


@dataclass
class Expected:
    """What the answer must be: an exact (status, code) or allowed sets."""

    statuses: frozenset[int]
    codes: frozenset[int | None] | None  # None: any code the status allows
    why: str
    #: The id the answer must carry (``NO_ID`` when none can be required).
    request_id: Any = None
    modern: bool = True


NO_ID = object()


def _exact(status: int, code: int | None, why: str, request_id: Any = NO_ID) -> Expected:
    return Expected(frozenset({status}), frozenset({code}), why, request_id)


def _strict_json(raw: bytes) -> Any:
    """Decode as RFC 8259 JSON: UTF-8, no NaN or Infinity."""

    def reject(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    text = raw.decode("utf-8").removeprefix("\ufeff")  # a BOM may be ignored (RFC 8259 8.1)
    return json.loads(text, parse_constant=reject)


def _depth(value: Any) -> int:
    best = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            best = max(best, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return best


def _host_ok(host: str | None, port: int) -> bool:
    if host is None:
        return True  # the client adds a valid one
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower()
    if host.count(":") == 1 and not host.rsplit(":", 1)[1].isdigit():
        return False
    return name in ALLOWED_HOSTS


def _origin_ok(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    if not host:
        return False
    if host in LOOPBACK:
        return True
    return host in ALLOWED_HOSTS


def _valid_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


UNDECODABLE = object()


def _decode_sentinel(raw: str) -> Any:
    value = raw.strip()
    if value.startswith("=?base64?") and value.endswith("?=") and len(value) >= len("=?base64?") + 2:
        try:
            return base64.b64decode(value[len("=?base64?") : -2], validate=True).decode("utf-8")
        except ValueError:
            return UNDECODABLE
    return value


def _lone_surrogates(value: Any) -> bool:
    """Whether any string (or key) in ``value`` holds an unpaired surrogate:
    legal JSON syntax whose meaning RFC 8259 (8.2) leaves open."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _may_refuse(expected: Expected) -> Expected:
    """Widen ``expected``: the server may also refuse the text as unreadable."""
    codes = None if expected.codes is None else expected.codes | {-32700, -32600}
    return Expected(
        expected.statuses | {400}, codes, f"{expected.why} (lone surrogates)", expected.request_id, expected.modern
    )


def expect(case: Case, valid_tokens: set[str], port: int) -> Expected:
    """What the spec requires for ``case`` (see the module docstring)."""
    expected = _expect(case, valid_tokens, port)
    if expected.codes != frozenset({-32700}) and case.body and _surrogates_in(case.body):
        return _may_refuse(expected)
    return expected


_SURROGATE = re.compile("[\ud800-\udfff]")
#: A surrogate escape (``\ud800``) or a surrogate encoded as if UTF-8 (ED A0..BF).
_SURROGATE_BYTES = re.compile(rb"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


def _surrogates_in(body: bytes) -> bool:
    if not _SURROGATE_BYTES.search(body):
        return False
    try:
        return _lone_surrogates(json.loads(body))
    except (ValueError, RecursionError):
        return False


def _expect(case: Case, valid_tokens: set[str], port: int) -> Expected:
    host = case.header("host")
    origin = case.header("origin")
    refusal = None
    if not _host_ok(host, port):
        refusal = _exact(400, -32600, "Host not allowed (DNS rebinding)")
    elif origin is not None and not _origin_ok(origin):
        refusal = _exact(403, -32600, "Origin not allowed (DNS rebinding)")
    if refusal is not None:
        if len(case.body) > MAX_BODY_BYTES:  # either refusal may come first
            return Expected(refusal.statuses | {413}, refusal.codes, f"{refusal.why} or too large", NO_ID)
        return refusal
    if case.http_method != "POST":
        if case.http_method in ("GET", "DELETE") and case.header("mcp-session-id"):
            return Expected(frozenset({200, 202, 400, 401, 404, 405}), None, "legacy session request", NO_ID, False)
        return _exact(405, -32600, "only POST")
    if len(case.body) > MAX_BODY_BYTES:
        return _exact(413, -32600, "body too large")
    try:
        data = _strict_json(case.body)
    except UnicodeDecodeError:
        try:
            json.loads(case.body)
        except (ValueError, RecursionError):
            return _exact(400, -32700, "not JSON (RFC 8259)")
        # UTF-16 or UTF-32: not JSON on the wire, but a server may read it.
        return Expected(frozenset({200, 202, 400, 401, 404, 429}), None, "JSON not in UTF-8", NO_ID, False)
    except (ValueError, RecursionError):
        return _exact(400, -32700, "not JSON (RFC 8259)")
    if _depth(data) > MAX_JSON_DEPTH:
        return _exact(400, -32600, "nested too deep")
    header_version = case.header("mcp-protocol-version")
    params = data.get("params") if isinstance(data, dict) else None
    body_meta = params.get("_meta") if isinstance(params, dict) else None
    if (header_version is not None and header_version.strip() in LEGACY_VERSIONS) or (
        header_version is None and not (isinstance(body_meta, dict) and META_VERSION in body_meta)
    ):
        # The 2025 session wire: its rules are its own; only the universal ones apply.
        request_id = data.get("id") if isinstance(data, dict) and _valid_id(data.get("id")) else NO_ID
        return Expected(frozenset({200, 202, 400, 401, 404, 413, 429}), None, "legacy wire", request_id, False)
    # The envelope.
    if isinstance(data, list):
        return _exact(400, -32600, "batch")
    if not isinstance(data, dict):
        return _exact(400, -32600, "not an object")
    if data.get("jsonrpc") != "2.0":
        return _exact(400, -32600, "jsonrpc must be 2.0")
    if "method" not in data:
        return _exact(400, -32600, "no method")
    method = data["method"]
    if not isinstance(method, str) or not method:
        return _exact(400, -32600, "method not a non-empty string")
    if "params" in data and data["params"] is not None and not isinstance(data["params"], dict):
        return _exact(400, -32600, "params not an object")
    notification = "id" not in data
    if not notification and not _valid_id(data["id"]):
        return _exact(400, -32600, "id not a string or integer")
    request_id = NO_ID if notification else data["id"]
    # Credentials.
    auth = case.header("authorization")
    if auth is not None:
        parts = auth.encode("latin-1").split()
        if parts and parts[0].lower() in (b"bearer", b"token"):
            token = parts[1].decode("latin-1") if len(parts) == 2 else None
            if token is None or token not in valid_tokens:
                return _exact(401, -32600, "bad credentials", request_id)
    if notification:
        return _exact(202, None, "notification")
    params = data.get("params") or {}
    meta_ = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    if META_VERSION not in meta_ or META_CAPABILITIES not in meta_:
        return _exact(400, -32602, "missing _meta field", request_id)
    if not isinstance(meta_[META_VERSION], str) or not isinstance(meta_[META_CAPABILITIES], dict):
        return _exact(400, -32602, "_meta field of the wrong type", request_id)
    version = meta_[META_VERSION]
    if header_version is None or header_version.strip() != version:
        return _exact(400, -32020, "MCP-Protocol-Version header must match _meta", request_id)
    if version != PROTOCOL_VERSION:
        return _exact(400, -32022, "unsupported version", request_id)
    mcp_method = case.header("mcp-method")
    if mcp_method is None or _decode_sentinel(mcp_method) != method:
        return _exact(400, -32020, "Mcp-Method header must match", request_id)
    name_header = case.header("mcp-name")
    if method in NAME_FIELD:
        if name_header is None or _decode_sentinel(name_header) != params.get(NAME_FIELD[method]):
            return _exact(400, -32020, "Mcp-Name header must match", request_id)
    elif method in TASK_METHODS and name_header is not None:
        decoded = _decode_sentinel(name_header)
        if decoded is UNDECODABLE or decoded != params.get("taskId"):
            return _exact(400, -32020, "Mcp-Name header must match taskId", request_id)
    if method not in MODERN_METHODS:
        return _exact(404, -32601, "unknown method", request_id)
    caps = meta_[META_CAPABILITIES]
    tasks_on = isinstance(caps.get("extensions"), dict) and isinstance(caps["extensions"].get(TASKS_EXT), dict)
    if method in TASK_METHODS:
        if not tasks_on:
            return _exact(400, -32021, "tasks methods need the tasks extension", request_id)
        task_id = params.get("taskId")
        if not isinstance(task_id, str) or not task_id:
            return _exact(200, -32602, "taskId required", request_id)
    if method == "tools/call":
        arguments = params.get("arguments")
        size = len(json.dumps(arguments, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if isinstance(arguments, dict) and size > MAX_ARGUMENTS_BYTES:
            # Past the throttle (which may answer first).
            return Expected(frozenset({200, 429}), frozenset({-32602, -31000}), "arguments too large", request_id)
    # Handler level: the method's own rules.
    return Expected(frozenset({200, 400, 429}), None, f"{method} handler", request_id)


#: What each status may carry on the modern wire (``None``: no body).
STATUS_CODES: dict[int, frozenset[int | None]] = {
    200: frozenset(),  # a result, or any error the table below does not place elsewhere
    202: frozenset({None}),
    400: frozenset({-32700, -32600, -32602, -32020, -32021, -32022}),
    401: frozenset({-32600}),
    403: frozenset({-32600}),
    404: frozenset({-32601}),
    405: frozenset({-32600}),
    413: frozenset({-32600}),
    429: frozenset({-31000}),
}
#: Codes that may only travel with one status.
CODE_STATUS = {-32700: 400, -32601: 404, -32020: 400, -32021: 400, -32022: 400, -31000: 429}


def check(case: Case, expected: Expected, response: RawResponse) -> list[str]:
    """Every way ``response`` breaks the rules (empty when it is right)."""
    problems: list[str] = []
    status = response.status
    if status >= 500:
        problems.append(f"HTTP {status}")
    if status not in expected.statuses:
        problems.append(f"status {status}, expected {sorted(expected.statuses)} ({expected.why})")
    if status == 202 or (status in (204,) and not response.body):
        if response.body.strip():
            problems.append("a 202 with a body")
        return problems
    content_type = response.headers.get("content-type", "")
    body: Any = None
    if content_type.startswith("text/event-stream"):
        from tests.support.rpc import parse_sse

        try:
            messages = [m for m in parse_sse(response.body) if isinstance(m, dict)]
        except ValueError:
            return [*problems, "an SSE event that is not JSON"]
        finals = [m for m in messages if "id" in m and ("result" in m or "error" in m)]
        if not finals:
            return problems  # a stream we stopped reading (subscriptions/listen)
        body = finals[-1]
    else:
        if not content_type.startswith("application/json"):
            problems.append(f"content type {content_type!r}")
        try:
            body = _strict_json(response.body)
        except (ValueError, UnicodeDecodeError):
            return [*problems, f"body is not JSON: {response.body[:200]!r}"]
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        return [*problems, f"not a JSON-RPC response: {str(body)[:200]}"]
    if ("result" in body) == ("error" in body):
        problems.append("needs exactly one of result and error")
    code = None
    if "error" in body:
        error = body["error"]
        if not isinstance(error, dict) or not isinstance(error.get("code"), int) or isinstance(error.get("code"), bool):
            return [*problems, f"malformed error {error!r}"]
        if not isinstance(error.get("message"), str):
            problems.append("error message is not a string")
        code = error["code"]
    elif status != 200:
        problems.append(f"a result with status {status}")
    if expected.codes is not None and code not in expected.codes:
        problems.append(f"code {code}, expected {sorted(expected.codes, key=str)} ({expected.why})")
    if expected.modern and code is not None:
        allowed = STATUS_CODES.get(status)
        if allowed and code not in allowed:
            problems.append(f"code {code} with status {status}")
        if code in CODE_STATUS and CODE_STATUS[code] != status:
            problems.append(f"code {code} must travel with {CODE_STATUS[code]}, not {status}")
        if status == 200 and code in (-32700, -32600, -32601):
            problems.append(f"code {code} with status 200")
        if status == 400 and code == -32602 and -32602 not in (expected.codes or ()):
            problems.append("-32602 with status 400 is only for a missing or malformed _meta")
    if (status == 429) != (code == -31000):
        problems.append(f"429 and -31000 go together (status {status}, code {code})")
    if status == 429:
        retry = response.headers.get("retry-after", "")
        if not retry.isdigit() or int(retry) < 1:
            problems.append(f"429 without a valid Retry-After ({retry!r})")
    if status == 405 and "allow" not in response.headers:
        problems.append("405 without Allow")
    if expected.request_id is not NO_ID:
        if "id" not in body or body["id"] != expected.request_id or type(body["id"]) is not type(expected.request_id):
            problems.append(f"id {body.get('id', '(none)')!r} does not echo {expected.request_id!r}")
    elif "id" in body and body["id"] is not None and not _valid_id(body["id"]):
        problems.append(f"id {body['id']!r} is not a request id")
    return problems


def category(expected: Expected, problems: list[str]) -> str:
    """A short key to group failures by in the report."""
    first = problems[0] if problems else "ok"
    return f"{expected.why}: {first.split(':')[0][:80]}"

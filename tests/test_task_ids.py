"""Task ids are bearer-like secrets: unguessable and safe in an HTTP header."""

from __future__ import annotations

import base64
import math
import re
from collections import Counter

import pytest

from mcptasks.models import new_task_id
from tests.support.factories import make_task

#: RFC 7230 token characters that need no encoding in ``Mcp-Name``; a task id
#: uses the URL-safe base64 subset of them.
HEADER_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def test_ids_are_header_and_url_safe():
    for _ in range(2000):
        task_id = new_task_id()
        assert HEADER_SAFE.match(task_id), task_id
        assert len(task_id) <= 64, "must fit Task.id (max_length=64)"


def test_ids_carry_at_least_128_random_bits():
    task_id = new_task_id()
    raw = base64.urlsafe_b64decode(task_id + "=" * (-len(task_id) % 4))
    assert len(raw) * 8 >= 128
    assert len(task_id) * math.log2(64) >= 128


def test_ids_do_not_repeat_and_look_random():
    ids = [new_task_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    # No shared prefix (not a counter or a timestamp): the first character
    # spreads over the alphabet.
    first = Counter(i[0] for i in ids)
    assert len(first) > 50
    assert max(first.values()) < len(ids) / 20
    # Every position varies.
    for position in range(len(ids[0])):
        assert len({i[position] for i in ids[:500]}) > 20, position


@pytest.mark.django_db
def test_created_tasks_use_such_ids():
    ids = {make_task().id for _ in range(20)}
    assert len(ids) == 20
    assert all(HEADER_SAFE.match(i) and len(i) >= 22 for i in ids)

"""The operators' cockpit in the Django admin: the change list, the read-only
detail page and the three actions, on Postgres."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from mcptasks.admin import COUNT_CAP
from mcptasks.models import Era, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle
from mcptasks.tools.registry import registry, tool
from mcptasks.worker import execution
from tests.support import postgres_only
from tests.support.factories import (
    accept,
    cancelled_task,
    completed_task,
    failed_task,
    make_task,
    running_task,
    waiting_task,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:mcptasks_task_changelist")


def change_url(task: Task | str) -> str:
    return reverse("admin:mcptasks_task_change", args=[quote(getattr(task, "id", task))])


def run_action(client: Any, action: str, *tasks: Task, follow: bool = True, **extra: str) -> Any:
    data = {"action": action, "index": "0", ACTION_CHECKBOX_NAME: [t.id for t in tasks], **extra}
    return client.post(CHANGELIST, data, follow=follow)


def page_messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def reload(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


@pytest.fixture
def idempotent_tool():
    """A tool whose annotations make a retry safe (registered for one test)."""

    @tool(name="admin_test_idempotent", task="optional", annotations={"idempotentHint": True})
    def fn(n: int = 1) -> str:
        return f"n={n}"

    try:
        yield registry.get("admin_test_idempotent")
    finally:
        registry.unregister("admin_test_idempotent")


@pytest.fixture
def operator(django_user_model: Any, client: Any):
    """A staff user with only the permissions a test grants it."""
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)

    def grant(*codenames: str) -> Any:
        user.user_permissions.add(
            *Permission.objects.filter(content_type__app_label="mcptasks", codename__in=codenames)
        )
        client.force_login(user)
        return client

    return grant


# The change list ---------------------------------------------------------------------------


def test_change_list_shows_every_column_with_a_status_badge(admin_client):
    running = running_task(arguments={"seconds": 5})
    waiting = waiting_task(owner="bob")
    done = completed_task(tool="greet")
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    html = response.content.decode()
    start = html.index('<table id="result_list">')
    thead = html[start : html.index("</thead>", start)]
    headers = re.findall(r'<div class="text">(?:<a [^>]*>|<span>)([^<]+)<', thead)
    assert [h.strip().lower() for h in headers] == [
        "id",
        "tool name",
        "status",
        "owner",
        "era",
        "created",
        "updated",
        "expires",
    ]
    assert re.search(r'<td class="field-created"><span title="[^"]+">20\d\d-\d\d-\d\d \d\d:\d\d:\d\d</span>', html)
    for task in (running, waiting, done):
        assert f'title="{task.id}">{task.id[:8]}</code>' in html
    assert 'class="mcptasks-badge mcptasks-working">working<' in html
    assert 'class="mcptasks-badge mcptasks-input_required">input required<' in html
    assert 'class="mcptasks-badge mcptasks-completed">completed<' in html
    assert "mcptasks/admin.css" in html
    assert "3 tasks" in html


def test_filters_status_tool_era_and_date(admin_client):
    running = running_task()
    done = completed_task(tool="greet")
    legacy = make_task(era=Era.LEGACY)

    def ids(query: str) -> set[str]:
        response = admin_client.get(CHANGELIST + query)
        assert response.status_code == 200, response.content[:500]
        return {t.id for t in response.context["cl"].result_list}

    assert ids("?status__exact=working") == {running.id, legacy.id}
    assert ids("?status__exact=completed") == {done.id}
    assert ids("?tool=greet") == {done.id}
    assert ids(f"?era__exact={Era.LEGACY.value}") == {legacy.id}
    # The tool filter lists the registry's tools (no query over the table).
    response = admin_client.get(CHANGELIST)
    date_filter = next(f for f in response.context["cl"].filter_specs if f.title == "created at")
    today = next(c["query_string"] for c in date_filter.choices(response.context["cl"]) if c["display"] == "Today")
    assert ids(today) == {running.id, done.id, legacy.id}
    tool_filter = next(f for f in response.context["cl"].filter_specs if f.title == "tool")
    assert ("slow_compute", "slow_compute") in tool_filter.lookup_choices


def test_search_matches_an_exact_id_tool_or_owner(admin_client):
    mine = make_task(owner="carol", tool="greet")
    other = make_task(owner="dave")

    def ids(term: str) -> set[str]:
        return {t.id for t in admin_client.get(CHANGELIST, {"q": term}).context["cl"].result_list}

    assert ids(mine.id) == {mine.id}
    assert ids("carol") == {mine.id}
    assert ids("greet") == {mine.id}
    assert ids("slow_compute") == {other.id}
    assert ids("car") == set()  # exact only: every term is an index lookup


def test_change_list_never_counts_the_whole_table(admin_client):
    for _ in range(3):
        make_task()
    for query in ("", "?status__exact=working", "?q=alice"):
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(CHANGELIST + query).status_code == 200
        counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
        assert counts, "the paginator counts (capped)"
        for sql in counts:
            assert f"LIMIT {COUNT_CAP + 1}" in sql, sql
        # The list loads no JSON columns.
        selects = [q["sql"] for q in ctx.captured_queries if 'FROM "mcptasks_task"' in q["sql"] and "LIMIT" in q["sql"]]
        assert selects and all('"result"' not in sql and '"arguments"' not in sql for sql in selects)


def bulk_insert(count: int) -> None:
    """``count`` tasks over five statuses, three tools, two eras and many
    owners, in a single statement; then ANALYZE so that estimates exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO mcptasks_task (id, owner, tool_name, arguments, era, client_capabilities, status,
                status_message, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms,
                attempts, lease_owner, cancelled_by)
            SELECT 'bulk-' || g, 'owner-' || (g %% 500),
                (ARRAY['slow_compute', 'greet', 'failing_job'])[1 + g %% 3], '{}',
                CASE WHEN g %% 100 = 0 THEN '2025-11-25' ELSE '2026-07-28' END, '{}',
                (ARRAY['working', 'input_required', 'completed', 'failed', 'cancelled'])[1 + g %% 5], '',
                now() - (g || ' seconds')::interval, now(), 3600000, now() + interval '1 hour', 1000, 0, '', ''
            FROM generate_series(1, %s) AS g
            """,
            [count],
        )
        cursor.execute("ANALYZE mcptasks_task")


@postgres_only.PLANNER
def test_a_large_table_shows_an_estimate_and_a_capped_filtered_count(admin_client):
    bulk_insert(COUNT_CAP + 2_000)
    response = admin_client.get(CHANGELIST)
    html = response.content.decode()
    paginator = response.context["cl"].paginator
    assert paginator.kind == "estimate"
    assert re.search(r"about 1[12],\d{3} tasks", html), re.findall(r"about [\d,]+", html)
    assert len(response.context["cl"].result_list) == 50
    response = admin_client.get(CHANGELIST + "?era__exact=2026-07-28")
    assert response.context["cl"].paginator.kind == "capped"
    assert "more than 10,000 tasks" in response.content.decode()
    response = admin_client.get(CHANGELIST + "?status__exact=failed")
    assert response.context["cl"].paginator.kind == "exact"
    assert f"{(COUNT_CAP + 2_000) // 5} tasks" in response.content.decode()


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?status__exact=working",
        "?tool=greet",
        "?era__exact=2025-11-25",
        "?era__exact=2026-07-28",
        "?created_at__gte=2026-01-01+00:00:00%2B00:00&created_at__lt=2026-01-02+00:00:00%2B00:00",
        "?status__exact=failed&tool=greet",
        "?outcome=tool_error",
        "?outcome=success",
        "?outcome=tool_error&tool=greet",
        "?q=owner-7",
        "?q=bulk-77",
        "?q=greet",
        "?p=3",
    ],
)
@postgres_only.PLANNER
def test_every_change_list_query_can_use_an_index(admin_client, query):
    """With sequential scans priced out, each query the change list runs must
    still find an index to use, so none reads the whole table. The one scan
    allowed is a LIMIT-ed one that keeps nearly every row it reads (counting
    the tasks of the common era stops after ``COUNT_CAP + 1`` of them)."""
    bulk_insert(3_000)
    with CaptureQueriesContext(connection) as ctx:
        assert admin_client.get(CHANGELIST + query).status_code == 200
    queries = [q["sql"] for q in ctx.captured_queries if 'FROM "mcptasks_task"' in q["sql"]]
    assert queries
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in queries:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0][0]["Plan"]
            for node, parent in plan_nodes(plan):
                if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "mcptasks_task":
                    assert parent is not None and parent["Node Type"] == "Limit", f"{sql}\n{plan}"
                    assert node.get("Rows Removed by Filter", 0) <= 0.1 * node["Actual Rows"], f"{sql}\n{plan}"
                assert node.get("Sort Space Type") != "Disk", f"{sql}\n{plan}"


def plan_nodes(node: dict, parent: dict | None = None):
    yield node, parent
    for child in node.get("Plans", []):
        yield from plan_nodes(child, node)


# The detail page ------------------------------------------------------------------------------


def test_detail_page_is_read_only_with_pretty_json_inputs_and_timeline(admin_client):
    task = waiting_task(keys=["first", "second"], arguments={"seconds": 3, "label": "pi"})
    lifecycle.submit_input(task.id, {"first": accept(confirm=True)}, actor="client:alice")
    response = admin_client.get(change_url(task))
    assert response.status_code == 200
    html = response.content.decode()
    # Read-only: no inputs for the fields, no save buttons.
    assert 'name="owner"' not in html and 'name="_save"' not in html
    assert "Close" in html
    # Pretty-printed arguments.
    assert (
        '<pre class="mcptasks-json">{\n  &quot;label&quot;: &quot;pi&quot;,\n  &quot;seconds&quot;: 3\n}</pre>' in html
    )
    # Input requests with their answers.
    assert "Input requests (questions to the client, with their answers)" in html
    assert "answered" in html and "pending" in html
    assert "&quot;confirm&quot;: true" in html
    # The timeline, in order, with actors.
    assert "Timeline (every transition, with who caused it)" in html
    timeline = html[html.index("Timeline (every") :]
    assert re.findall(r'field-kind">\s*<p>(\w+)</p>', timeline) == ["created", "run_started", "transition", "input"]
    assert re.findall(r'field-transition">\s*<p>([^<]+)</p>', timeline) == [
        "· → working",
        "-",
        "working → input_required",
        "-",
    ]
    actors = re.findall(r'field-actor">\s*<p>([^<]+)</p>', timeline)
    assert actors[0] == actors[3] == "client:alice" and actors[1].startswith("worker:")


def test_an_id_the_admin_must_escape_opens_its_own_page(admin_client):
    """Ids are URL-safe base64: "_" followed by two hex digits is the admin's
    escape sequence, so links must be built with ``quote``."""
    task = completed_task()
    tricky = "ab_5Fcd_2F" + task.id[10:]
    TaskEvent.objects.filter(task_id=task.id).update(task_id=tricky)
    Task.objects.filter(pk=task.id).update(id=tricky)
    response = admin_client.get(change_url(tricky))
    assert response.status_code == 200
    assert response.context["original"].id == tricky
    assert 'name="mcptasks_expire_tasks"' in response.content.decode()


def test_detail_page_shows_result_and_error(admin_client):
    done = completed_task()
    failed = failed_task()
    assert "&quot;isError&quot;: false" in admin_client.get(change_url(done)).content.decode()
    assert "&quot;message&quot;: &quot;boom&quot;" in admin_client.get(change_url(failed)).content.decode()


def test_detail_page_offers_the_actions_legal_for_the_task(admin_client, idempotent_tool):
    def buttons(task: Task) -> set[str]:
        return set(re.findall(r'name="mcptasks_(\w+)"', admin_client.get(change_url(task)).content.decode()))

    assert buttons(running_task()) == {"cancel_tasks"}
    assert buttons(waiting_task()) == {"cancel_tasks"}
    assert buttons(completed_task()) == {"expire_tasks"}
    assert buttons(failed_task(tool="admin_test_idempotent")) == {"expire_tasks", "retry_tasks"}
    assert buttons(failed_task(tool="slow_compute")) == {"expire_tasks"}  # not safe to retry


def test_nothing_can_be_added_changed_or_deleted(admin_client):
    task = completed_task()
    assert admin_client.get(reverse("admin:mcptasks_task_add")).status_code == 403
    assert admin_client.get(reverse("admin:mcptasks_task_delete", args=[task.id])).status_code == 403
    response = admin_client.post(change_url(task), {"owner": "mallory", "_save": "Save"})
    assert response.status_code == 403
    assert reload(task).owner == "alice"
    actions = [name for name, _ in admin_client.get(CHANGELIST).context["action_form"].fields["action"].choices]
    assert "delete_selected" not in actions
    assert {"cancel_tasks", "expire_tasks", "retry_tasks"} <= set(actions)


# Cancel ---------------------------------------------------------------------------------------


def test_cancel_action_cancels_active_tasks_and_skips_the_rest(admin_client, admin_user):
    running = running_task()
    waiting = waiting_task()
    done = completed_task()
    response = run_action(admin_client, "cancel_tasks", running, waiting, done)
    assert page_messages(response) == [
        "Cancelled 2 tasks.",
        "Skipped 1 task: only working or input_required tasks can be cancelled.",
    ]
    for task in (running, waiting):
        task = reload(task)
        assert task.status == TaskStatus.CANCELLED
        assert task.cancelled_by == f"operator:{admin_user.username}"
        assert (task.lease_owner, task.lease_expires_at) == ("", None)
        event = TaskEvent.objects.filter(task=task, to_status=TaskStatus.CANCELLED).get()
        assert event.actor == f"operator:{admin_user.username}"
    assert reload(done).status == TaskStatus.COMPLETED


@pytest.mark.django_db(transaction=True)  # /mcp does its database work on its own threads
def test_cancelled_task_is_cancelled_for_its_client_too(admin_client, rpc):
    reply = rpc.call_tool("slow_compute", {"seconds": 30}, extra={"task": {}})
    task_id = reply.result["taskId"]
    run_action(admin_client, "cancel_tasks", Task.objects.get(pk=task_id))
    result = rpc.tasks_get(task_id).result
    assert result["status"] == "cancelled"
    assert result["statusMessage"] == "Cancelled by an operator."


def test_cancel_from_the_detail_page_comes_back_to_it(admin_client):
    task = running_task()
    response = run_action(admin_client, "cancel_tasks", task, follow=False, _back=change_url(task))
    assert response.status_code == 302 and response["Location"] == change_url(task)
    response = admin_client.get(change_url(task))
    assert "Cancelled 1 task." in page_messages(response)
    # An off-site _back is ignored.
    other = running_task()
    response = run_action(admin_client, "cancel_tasks", other, follow=False, _back="https://evil.example/")
    assert response["Location"] == CHANGELIST


def test_cancel_on_nothing_legal_says_so(admin_client):
    response = run_action(admin_client, "cancel_tasks", completed_task())
    assert page_messages(response) == ["Skipped 1 task: only working or input_required tasks can be cancelled."]


def test_cancel_of_every_matching_task_across_pages(admin_client):
    tasks = [running_task(worker=f"w{i}") for i in range(3)]
    done = completed_task()
    response = admin_client.post(
        CHANGELIST,
        {"action": "cancel_tasks", "index": "0", "select_across": "1", ACTION_CHECKBOX_NAME: [tasks[0].id]},
        follow=True,
    )
    assert page_messages(response) == ["Cancelled 3 tasks."]
    assert reload(done).status == TaskStatus.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_an_admin_cancel_stops_the_running_tool_like_a_client_cancel(admin_client, settings):
    """The run's lease monitor sees the cancelled row and the tool's
    ``ctx.sleep`` stops: the same path a client's tasks/cancel takes."""
    settings.MCPTASKS = {**settings.MCPTASKS, "CANCEL_POLL_SECONDS": 0.05}
    task = make_task(arguments={"seconds": 60})
    outcome: list[str] = []
    runner = threading.Thread(target=lambda: outcome.append(execution.run_task(task.id)))
    started = time.monotonic()
    runner.start()
    wait_until(lambda: reload(task).lease_owner, 10, interval=0.02, what="the run claiming the task")
    run_action(admin_client, "cancel_tasks", task)
    runner.join(timeout=10)
    assert not runner.is_alive(), "the tool kept running after the cancel"
    assert outcome == ["cancelled"]
    assert time.monotonic() - started < 10
    assert reload(task).status == TaskStatus.CANCELLED
    assert [e.kind for e in TaskEvent.objects.filter(task=task).order_by("at", "id")] == [
        "created",
        "run_started",
        "transition",
    ]


# Expire ---------------------------------------------------------------------------------------------


def test_expire_action_makes_finished_tasks_prunable_and_skips_active_ones(admin_client, admin_user):
    done = completed_task()
    cancelled = cancelled_task()
    running = running_task()
    response = run_action(admin_client, "expire_tasks", done, cancelled, running)
    assert page_messages(response) == [
        "Expired 2 tasks.",
        "Skipped 1 task: only finished tasks can be expired (cancel running ones first).",
    ]
    assert reload(running).status == TaskStatus.WORKING
    actor = f"operator:{admin_user.username}"
    assert TaskEvent.objects.filter(kind="expired", actor=actor).count() == 2
    assert lifecycle.prune_expired() == 2
    assert set(Task.objects.values_list("id", flat=True)) == {running.id}


# Retry ----------------------------------------------------------------------------------------------


def test_retry_starts_a_new_task_and_links_both(
    admin_client, admin_user, idempotent_tool, published, django_capture_on_commit_callbacks
):
    old = failed_task(tool="admin_test_idempotent", arguments={"n": 7}, owner="erin")
    with django_capture_on_commit_callbacks(execute=True):
        response = run_action(admin_client, "retry_tasks", old)
    old = reload(old)
    assert old.status == TaskStatus.FAILED  # terminal is final
    retried = TaskEvent.objects.get(task=old, kind="retried")
    new = Task.objects.get(pk=retried.detail["new_task_id"])
    assert (new.status, new.owner, new.tool_name, new.arguments, new.era) == (
        TaskStatus.WORKING,
        "erin",
        "admin_test_idempotent",
        {"n": 7},
        old.era,
    )
    actor = f"operator:{admin_user.username}"
    assert retried.actor == actor
    link = TaskEvent.objects.get(task=new, kind="retry_of")
    assert (link.actor, link.detail) == (actor, {"task_id": old.id})
    assert [m["args"] for m in published if m["task"] == "mcptasks.run_task"] == [[new.id]]
    (message,) = page_messages(response)
    assert message.startswith("Retried 1 task as new tasks:") and new.id[:8] in message
    # The old task's timeline links to the new one.
    assert f'href="{change_url(new)}"' in admin_client.get(change_url(old)).content.decode()


def test_retry_refuses_what_is_not_safe(admin_client, idempotent_tool):
    done = completed_task(tool="admin_test_idempotent")
    running = running_task(tool="admin_test_idempotent")
    unsafe = failed_task(tool="slow_compute")
    gone = cancelled_task(tool="no_such_tool")
    response = run_action(admin_client, "retry_tasks", done, running, unsafe, gone)
    assert sorted(page_messages(response)) == [
        "Skipped 1 task: tool 'no_such_tool' is no longer offered.",
        "Skipped 1 task: tool 'slow_compute' is not marked read-only or idempotent.",
        "Skipped 2 tasks: only failed or cancelled tasks can be retried.",
    ]
    assert Task.objects.count() == 4
    assert not TaskEvent.objects.filter(kind="retried").exists()


def test_retry_twice_starts_one_new_task(admin_client, idempotent_tool):
    old = cancelled_task(tool="admin_test_idempotent")
    run_action(admin_client, "retry_tasks", old)
    response = run_action(admin_client, "retry_tasks", old)
    assert page_messages(response) == ["Skipped 1 task: it was retried already."]
    assert Task.objects.filter(tool_name="admin_test_idempotent").count() == 2


# Permissions ------------------------------------------------------------------------------------------


def test_each_action_needs_its_own_permission(operator):
    client = operator("view_task")
    response = client.get(CHANGELIST)
    assert response.status_code == 200
    assert (
        "action_form" not in response.context
        or response.context["action_form"] is None
        or not [c for c, _ in response.context["action_form"].fields["action"].choices if c]
    )
    task = running_task()
    client.post(CHANGELIST, {"action": "cancel_tasks", "index": "0", ACTION_CHECKBOX_NAME: [task.id]})
    assert reload(task).status == TaskStatus.WORKING

    client = operator("view_task", "cancel_task")
    choices = [c for c, _ in client.get(CHANGELIST).context["action_form"].fields["action"].choices if c]
    assert choices == ["cancel_tasks"]
    done = completed_task()
    client.post(CHANGELIST, {"action": "expire_tasks", "index": "0", ACTION_CHECKBOX_NAME: [done.id]})
    assert not TaskEvent.objects.filter(kind="expired").exists()
    run_action(client, "cancel_tasks", task)
    assert reload(task).status == TaskStatus.CANCELLED
    assert reload(task).cancelled_by == "operator:ops"


def test_a_viewer_sees_inputs_and_timeline_without_their_model_permissions(operator):
    client = operator("view_task")
    task = waiting_task()
    html = client.get(change_url(task)).content.decode()
    assert "Timeline (every transition" in html and "Input requests (" in html
    assert 'name="mcptasks_cancel_tasks"' not in html


def test_detail_page_shows_the_tools_controls_the_queue_and_the_tools_attempt(admin_client):
    @tool(
        name="admin_test_controlled",
        task="required",
        queue="partner-api",
        time_limit=30,
        retries=2,
        retry_on=(ConnectionError,),
        retry_backoff=0,
        concurrency=2,
    )
    def fn() -> str:
        raise ConnectionError("down")

    try:
        task = make_task(tool="admin_test_controlled")
        page = admin_client.get(change_url(task)).content.decode()
        assert "partner-api" in page and "so far (not started)" in page and "1 of at most 3" in page
        assert "limit 30 s; 2 retries on ConnectionError" in page and "at most 2 at once (0 running)" in page
        assert execution.run_task(task.id) == "retrying"
        page = admin_client.get(change_url(task)).content.decode()
        assert "2 of at most 3" in page and "tool_retry" in page
    finally:
        registry.unregister("admin_test_controlled")

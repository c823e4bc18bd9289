"""An operator cancels a running task from the admin, in a real browser.

Headless Debian Chromium drives the admin of a live stack: it logs in, finds
the running task (its run holds a lease on a real Celery worker), ticks it,
runs the cancel action and sees the row turn ``cancelled``. The client's
``tasks/get`` agrees, and the worker's run stops (its pool slot is free
again). Screenshots of the change list and the detail page are saved to
``artifacts/``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.conftest import ADMIN_PASSWORD, ADMIN_USER, VIEWPORT_WIDTH, AdminSite, admin_styles, artifacts_dir
from tests.support import postgres_only
from tests.support.rpc import HttpRpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]


def test_operator_cancels_a_running_task_in_the_admin(admin_site: AdminSite, page: Any) -> None:
    stack = admin_site.stack
    client = HttpRpc(admin_site.mcp_url)
    try:
        # Some history, so the change list shows every status.
        done = client.create_task("slow_compute", {"seconds": 0.1, "label": "warm-up"})
        tool_error = client.create_task("failing_job")
        failed = client.create_task("protocol_error_job")
        waiting = client.create_task("confirm_delete", {"filename": "report.pdf"})
        for task_id in (done, tool_error, failed):
            client.wait_for(task_id, timeout=60)
        client.wait_for(waiting, ["input_required"], timeout=60)

        # The task the operator will cancel: running on the worker, under a lease.
        target = client.create_task("slow_compute", {"seconds": 60, "label": "runaway"})
        row = wait_until(
            lambda: (r := stack.task_row(target)) and r["lease_owner"] and r,
            timeout=60,
            what="the worker to claim the task",
        )
        assert row["status"] == "working"
        assert client.tasks_get(target).result["status"] == "working"

        # Log in.
        page.goto(f"{admin_site.base_url}/admin/login/?next=/admin/mcptasks/task/")
        page.fill("#id_username", ADMIN_USER)
        page.fill("#id_password", ADMIN_PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(re.compile(r"/admin/mcptasks/task/$"))

        # Find the running task and screenshot the change list.
        target_row = page.locator(f'#result_list tbody tr:has(code[title="{target}"])')
        assert target_row.count() == 1
        assert target_row.locator(".mcptasks-badge").inner_text() == "working"
        assert target_row.locator("td.field-tool_name").inner_text() == "slow_compute"
        badges = set(page.locator("#result_list .mcptasks-badge").all_inner_texts())
        assert {"working", "input required", "completed", "failed", "completed · tool error"} <= badges
        assert page.locator(f'#result_list tbody tr:has(code[title="{tool_error}"]) .mcptasks-badge').inner_text() == (
            "completed · tool error"
        )
        # Styled as bin/run serves it (static files by `mcptasks run`): the
        # stylesheets applied, read from the computed styles.
        styles = admin_styles(page)
        assert styles == {
            "header_display": "flex",
            "header_background": "rgb(65, 118, 144)",  # Django's --header-bg
            "badge_radius": "10px",  # mcptasks/admin.css
            "base_css": True,
        }, styles
        # At 1,400 px every column fits (Expires included: the results scroll
        # sideways in their own box, so nothing may overflow it) and no cell wraps.
        fits = page.evaluate(
            """() => {
                const results = document.querySelector('#changelist .results');
                const box = results.getBoundingClientRect();
                const cell = name => [...document.querySelectorAll(`#result_list td.field-${name}`)]
                    .map(td => td.getBoundingClientRect().height);
                return {
                    page: document.documentElement.scrollWidth,
                    overflow: results.scrollWidth - results.clientWidth,
                    box_right: box.right,
                    expires_right: document.querySelector('#result_list th.column-expires')
                        .getBoundingClientRect().right,
                    era: cell('era_version'),
                    tool: cell('tool_name'),
                };
            }"""
        )
        assert fits["page"] <= VIEWPORT_WIDTH and fits["overflow"] <= 0, fits
        assert fits["expires_right"] <= fits["box_right"], fits
        assert fits["era"] == fits["tool"], fits  # one line each, as tall as the row's other cells
        shots = artifacts_dir()
        page.screenshot(path=str(shots / "admin-change-list.png"), full_page=True)

        # Tick it and run the cancel action.
        target_row.locator("input.action-select").check()
        page.select_option("select[name=action]", "cancel_tasks")
        page.click("button[name=index]")
        page.wait_for_selector("ul.messagelist li.success")
        assert page.locator("ul.messagelist li.success").inner_text() == "Cancelled 1 task."
        target_row = page.locator(f'#result_list tbody tr:has(code[title="{target}"])')
        assert target_row.locator(".mcptasks-badge").inner_text() == "cancelled"

        # The client sees it cancelled.
        result = client.tasks_get(target).result
        assert result["status"] == "cancelled"
        assert result["statusMessage"] == "Cancelled by an operator."

        # The detail page: read-only, with the timeline naming the operator.
        target_row.locator("th.field-short_id a").click()
        page.wait_for_selector("text=Timeline (every transition, with who caused it)")
        assert page.locator(".field-status_badge .mcptasks-badge").inner_text() == "cancelled"
        assert page.locator("input[name=_save]").count() == 0
        # A finished task offers "expire now" (slow_compute is not safe to retry).
        assert page.locator("button[name=mcptasks_expire_tasks]").is_visible()
        assert page.locator("button[name=mcptasks_retry_tasks]").count() == 0
        # Times to the second; the timeline to the millisecond, with no caption above each row.
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page.locator(".field-started .readonly").inner_text())
        stamps = page.locator("td.field-at_ms").all_inner_texts()
        assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", s) for s in stamps), stamps
        assert not any(p.is_visible() for p in page.locator(".mcptasks-readonly-inline td.original p").all())
        kinds = page.locator("td.field-kind").all_inner_texts()
        actors = page.locator("td.field-actor").all_inner_texts()
        assert kinds[:3] == ["created", "run_started", "transition"]
        assert actors[2] == f"operator:{ADMIN_USER}"
        page.screenshot(path=str(shots / "admin-detail.png"), full_page=True)

        # The worker's run stopped as it does on a client's cancel: the task
        # never completes, and both pool slots run new work at once.
        quick = [client.create_task("slow_compute", {"seconds": 2, "label": f"after-{i}"}) for i in range(2)]
        for task_id in quick:
            assert client.wait_for(task_id, timeout=20)["status"] == "completed"
        assert stack.task_row(target)["status"] == "cancelled"
        assert [e["kind"] for e in stack.events(target)][:3] == ["created", "run_started", "transition"]
        assert not [e for e in stack.events(target) if e["to_status"] == "completed"]
    finally:
        client.close()


def test_an_operator_without_the_cancel_permission_gets_no_cancel_action(admin_site: AdminSite, page: Any) -> None:
    admin_site.stack.shell(
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "from django.contrib.auth.models import Permission\n"
        "user = get_user_model().objects.create_user('viewer', password='viewer-pw', is_staff=True)\n"
        "user.user_permissions.add(Permission.objects.get(codename='view_task'))\n"
        "print(json.dumps(True))\n"
    )
    page.goto(f"{admin_site.base_url}/admin/login/?next=/admin/mcptasks/task/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", "viewer-pw")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/mcptasks/task/$"))
    assert page.locator("#result_list").count() == 1
    assert page.locator("select[name=action] option[value=cancel_tasks]").count() == 0

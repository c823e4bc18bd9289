"""An operator opens the overview from the site's admin index, in a real browser.

Headless Debian Chromium on a live stack (Postgres, uvicorn, a Celery
worker): real tasks run on the worker (finished, failed, one running, one
waiting for input), beside a day of earlier history inserted as rows, so
that every chart has a shape. The page's gauges and failures agree with the
database counted directly, each chart is an inline SVG, and a full-page
screenshot is saved to ``artifacts/admin-overview.png`` (docs/img keeps one).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.conftest import ADMIN_PASSWORD, ADMIN_USER, AdminSite, artifacts_dir
from tests.support import postgres_only
from tests.support.rpc import HttpRpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

#: A day of finished tasks, one every 20 seconds, busier in the last hours:
#: waits and run times vary with the time of day, a few tools fail now and then.
HISTORY = """
INSERT INTO mcptasks_task (id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
    created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts, lease_owner, cancelled_by,
    started_at, finished_at, tool_error)
SELECT 'history-' || g, 'history', t.tool, '{}', '2026-07-28', '{}', s.status, '', c.created, c.finished,
    86400000 * 2, c.created + interval '2 days', 1000, 1, '', '', c.created + c.wait, c.finished,
    s.status = 'completed' AND t.tool = 'build_report' AND g % 23 = 0
FROM generate_series(1, 4320 + 1800) AS g
CROSS JOIN LATERAL (SELECT
    CASE WHEN g <= 4320 THEN now() - interval '1 day' + g * interval '20 seconds'
         ELSE now() - interval '3 hours' + (g - 4320) * interval '6 seconds' END - interval '2 minutes' AS created,
    (0.2 + 3 * (1 + sin(g / 300.0)) * random()) * interval '1 second' AS wait,
    (1 + 20 * power(random(), 3)) * interval '1 second' AS run) AS w
CROSS JOIN LATERAL (SELECT w.created AS created, w.wait AS wait, w.created + w.wait + w.run AS finished) AS c
CROSS JOIN LATERAL (SELECT (ARRAY['build_report', 'slow_compute', 'greet', 'fetch_feed', 'resize_image'])[1 + g % 5]
    AS tool) AS t
CROSS JOIN LATERAL (SELECT CASE
    WHEN t.tool = 'fetch_feed' AND random() < 0.12 THEN 'failed'
    WHEN t.tool = 'resize_image' AND random() < 0.05 THEN 'failed'
    WHEN random() < 0.01 THEN 'failed'
    WHEN random() < 0.02 THEN 'cancelled'
    ELSE 'completed' END AS status) AS s
WHERE c.finished < now()
"""


def test_an_operator_reads_the_overview(admin_site: AdminSite, page: Any) -> None:
    stack = admin_site.stack
    client = HttpRpc(admin_site.mcp_url)
    try:
        stack.query(HISTORY + " RETURNING 1")
        done = [client.create_task("slow_compute", {"seconds": 0.2, "label": f"quick-{i}"}) for i in range(3)]
        failed = [client.create_task("protocol_error_job") for _ in range(2)]
        failed.append(client.create_task("failing_job"))  # a tool error: completed on the wire
        waiting = client.create_task("confirm_delete", {"filename": "report.pdf"})
        for task_id in done + failed:
            client.wait_for(task_id, timeout=60)
        client.wait_for(waiting, ["input_required"], timeout=60)
        running = client.create_task("slow_compute", {"seconds": 120, "label": "long"})
        wait_until(
            lambda: (r := stack.task_row(running)) and r["lease_owner"], timeout=60, what="the long run to start"
        )

        # From the site's admin index, where a newcomer looks first, to the overview.
        page.goto(f"{admin_site.base_url}/admin/login/?next=/admin/")
        page.fill("#id_username", ADMIN_USER)
        page.fill("#id_password", ADMIN_PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(re.compile(r"/admin/$"))
        page.click("#content-main a:text-is('Overview')")
        page.wait_for_url(re.compile(r"/admin/mcptasks/task/overview/$"))

        assert page.locator(".breadcrumbs a").all_inner_texts() == ["Home", "MCP tasks"]
        assert page.locator(".breadcrumbs").inner_text().endswith("Overview")
        assert page.locator("#gauge-working .mcptasks-gauge-value").inner_text() == "1"
        assert page.locator("#gauge-input-required .mcptasks-gauge-value").inner_text() == "1"
        charts = page.locator("#content-main svg[role=img]")
        assert charts.count() == 8
        for i in range(8):
            box = charts.nth(i).bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 90
        # Bars and points carry their figures for the pointer.
        assert page.locator("#window-day svg rect title").count() > 50
        assert page.locator("#window-hour svg circle title").count() > 0

        # The failures match the database counted directly: protocol failures
        # and tool errors apart. A window starts on a whole bucket: these spans
        # reach at least as far back.
        for window, span in (("hour", "61 minutes"), ("day", "1 day 15 minutes")):
            for table, where in (
                ("mcptasks-protocol-failures", "status = 'failed' AND NOT tool_error"),
                ("mcptasks-tool-errors", "tool_error"),
            ):
                shown = {
                    row.locator("th").inner_text(): int(row.locator("td.mcptasks-failure-count").inner_text())
                    for row in page.locator(f"#window-{window} table.{table} tr").all()
                }
                counted = stack.query(
                    f"SELECT tool_name, COUNT(*) AS n FROM mcptasks_task WHERE {where}"
                    f" AND finished_at >= now() - interval '{span}' GROUP BY 1"
                )
                expected = {row["tool_name"]: row["n"] for row in counted}
                assert shown and set(shown) <= set(expected) | {"other tools"}, (table, shown, expected)
                assert all(shown[tool] <= expected[tool] for tool in shown if tool != "other tools"), (shown, expected)
                # The tasks of this test (finished a moment ago) are counted exactly.
                live_tool = "protocol_error_job" if table == "mcptasks-protocol-failures" else "failing_job"
                assert shown.get(live_tool) == expected[live_tool] == (2 if live_tool == "protocol_error_job" else 1)
        assert page.locator("#window-day .mcptasks-failures th").first.inner_text() == "fetch_feed"

        page.screenshot(path=str(artifacts_dir() / "admin-overview.png"), full_page=True)
    finally:
        client.close()


def test_a_staff_user_without_the_view_permission_is_refused(admin_site: AdminSite, page: Any) -> None:
    admin_site.stack.shell(
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "get_user_model().objects.create_user('bystander', password='bystander-pw', is_staff=True)\n"
        "print(json.dumps(True))\n"
    )
    page.goto(f"{admin_site.base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", "bystander")
    page.fill("#id_password", "bystander-pw")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/$"))
    response = page.goto(f"{admin_site.base_url}/admin/mcptasks/task/overview/")
    assert response is not None and response.status == 403
    assert page.locator("svg[role=img]").count() == 0

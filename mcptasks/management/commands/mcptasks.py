"""``manage.py mcptasks <sub-command>``: run the system and look after tasks.

Sub-commands: ``run``, ``sweep``, ``prune``, ``inspect <id>``, ``cancel <id>``,
``expire <id>``, ``retry <id>``, ``stats``. Those that change data take
``--dry-run``; each reports what it did (or would do) with counts. Operator
actions are recorded as ``operator:<name>`` (``--by``, default: the OS user).
"""

from __future__ import annotations

import getpass
import json
import os
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count, Min
from django.utils import timezone

from mcptasks.conf import settings
from mcptasks.models import ACTIVE_STATUSES, TERMINAL_STATUSES, InputRequestState, Task, TaskStatus
from mcptasks.protocol.shapes import detailed_task
from mcptasks.tasks import lifecycle

#: Task ids are URL-safe base64 and so may start with "-", which argparse
#: would take for an option.
ID_HELP = 'The task id (put it after "--" when it starts with "-").'


class Command(BaseCommand):
    help = "Run mcptasks (web, worker, beat) and maintain its tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True)

        run = sub.add_parser("run", help="Serve /mcp with a worker and beat (the embedded default or real services).")
        run.add_argument(
            "--host", default=os.environ.get("HOST", "127.0.0.1"), help="Address to serve on (env HOST; 127.0.0.1)."
        )
        run.add_argument(
            "--port", type=int, default=int(os.environ.get("PORT", "8000")), help="Port to serve on (env PORT; 8000)."
        )
        run.add_argument(
            "--forwarded-allow-ips",
            metavar="ADDRESSES",
            default=os.environ.get("FORWARDED_ALLOW_IPS"),
            help="Comma-separated addresses or networks of the reverse proxies whose X-Forwarded-For and "
            "X-Forwarded-Proto headers are believed ('*': any peer). Default: the FORWARDED_ALLOW_IPS environment "
            "variable, else none: the headers are ignored.",
        )
        run.add_argument(
            "--concurrency",
            type=int,
            default=int(os.environ.get("WORKER_CONCURRENCY", "4")),
            help="Worker slots (env WORKER_CONCURRENCY; 4).",
        )
        run.add_argument(
            "--pool",
            choices=["prefork", "threads"],
            default=os.environ.get("WORKER_POOL", "prefork"),
            help="Celery pool of the worker process with a real broker (env WORKER_POOL): prefork (a child per "
            "slot, for tools that compute; the default) or threads (slots in one process, for tools that mostly "
            "wait).",
        )
        run.add_argument(
            "--queues",
            metavar="QUEUE,...",
            default=os.environ.get("WORKER_QUEUES"),
            help="Comma-separated Celery queues the worker consumes (env WORKER_QUEUES). Default: every queue the "
            "site sends runs to (CELERY_QUEUE and each tool's own queue) and Celery's default queue (the sweeper). "
            "A host for chosen tools starts its own worker: celery -A mysite worker -Q gpu.",
        )
        run.add_argument(
            "--asgi",
            metavar="MODULE:ATTR",
            help="The site's ASGI application (mysite.asgi:application or mysite.asgi.application). Default: the "
            "ASGI_APPLICATION_PATH environment variable, else settings.ASGI_APPLICATION, else the asgi module "
            "beside settings.WSGI_APPLICATION.",
        )
        run.add_argument(
            "--celery-app",
            metavar="APP",
            help="The site's Celery app, as `celery -A` takes it (mysite or mysite.celery:app). Default: the "
            'MCPTASKS_CELERY_APP environment variable, else MCPTASKS["CELERY_APP"], else found from the '
            "settings module's package the way `celery -A mysite` does.",
        )

        sweep = sub.add_parser("sweep", help="Re-run or fail tasks whose worker died or whose message was lost.")
        sweep.add_argument("--dry-run", action="store_true")
        sweep.add_argument("--limit", type=int, default=500, help="Most tasks of each kind looked at (default 500).")

        prune = sub.add_parser("prune", help="Delete terminal tasks past their TTL, in batches.")
        prune.add_argument("--dry-run", action="store_true")
        prune.add_argument("--batch-size", type=int, default=None)
        prune.add_argument("--max-batches", type=int, default=None, help="Stop after this many batches.")

        inspect = sub.add_parser("inspect", help="Show one task, its input requests and its events (JSON).")
        inspect.add_argument("task_id", help=ID_HELP)

        by = os.environ.get("MCPTASKS_OPERATOR") or _os_user()
        cancel = sub.add_parser("cancel", help="Cancel a working or input_required task.")
        cancel.add_argument("task_id", help=ID_HELP)
        cancel.add_argument("--dry-run", action="store_true")
        cancel.add_argument("--reason", default="Cancelled by an operator.", help="The task's status message.")
        cancel.add_argument("--by", default=by, help="Operator name for the audit trail.")

        expire = sub.add_parser("expire", help="Expire a finished task now (the next prune deletes it).")
        expire.add_argument("task_id", help=ID_HELP)
        expire.add_argument("--dry-run", action="store_true")
        expire.add_argument("--by", default=by, help="Operator name for the audit trail.")

        retry = sub.add_parser("retry", help="Start a new task repeating a failed or cancelled one (safe tools only).")
        retry.add_argument("task_id", help=ID_HELP)
        retry.add_argument("--dry-run", action="store_true")
        retry.add_argument("--by", default=by, help="Operator name for the audit trail.")

        sub.add_parser("stats", help="Count tasks by status and tool, and what needs looking after.")
        sub.add_parser("queues", help="Each tool's queue, time limits and retries (what workers must consume).")

    def handle(self, *args: Any, subcommand: str, **options: Any) -> None:
        getattr(self, f"do_{subcommand}")(**options)

    def _task(self, task_id: str) -> Task:
        task = Task.objects.filter(pk=task_id).first()
        if task is None:
            raise CommandError(f"No task {task_id!r}")
        return task

    def do_run(
        self,
        *,
        host: str,
        port: int,
        concurrency: int,
        pool: str,
        asgi: str | None,
        celery_app: str | None,
        forwarded_allow_ips: str | None,
        queues: str | None = None,
        **_: Any,
    ) -> None:
        from mcptasks.worker.discovery import find_asgi_application, find_celery_app, module_exists
        from mcptasks.worker.runner import run

        if not module_exists("uvicorn"):
            raise CommandError(
                "manage.py mcptasks run serves the site with uvicorn, which is not installed: pip install "
                '"mcptasks[server]" (or uvicorn).'
            )
        # Both are found (and imported) before anything starts, so a site that
        # names neither gets one clear error and no half-started processes.
        celery = find_celery_app(celery_app)
        application = find_asgi_application(asgi)
        run(
            host=host,
            port=port,
            concurrency=concurrency,
            pool=pool,
            asgi=application,
            celery=celery,
            forwarded_allow_ips=forwarded_allow_ips,
            queues=queues.split(",") if queues else None,
        )

    def do_queues(self, **_: Any) -> None:
        from celery import current_app

        from mcptasks.tools.effective import controls_for, queue_for
        from mcptasks.tools.registry import registry

        default = current_app.conf.task_default_queue
        for tool in registry.all():
            controls = controls_for(tool.name)
            limits = ", ".join(
                f"{label} {value:g} s"
                for label, value in (("soft limit", controls.soft_time_limit), ("limit", controls.time_limit))
                if value
            )
            notes = [n for n in (limits, f"{controls.retries} retries" if controls.retries else "") if n]
            extra = f" ({'; '.join(notes)})" if notes else ""
            self.stdout.write(f"{tool.name}: {queue_for(tool.name) or default}{extra}")

    def do_sweep(self, *, dry_run: bool, limit: int, **_: Any) -> None:
        report = lifecycle.sweep(dry_run=dry_run, limit=limit)
        verb = "would re-enqueue" if dry_run else "re-enqueued"
        fail_verb = "would fail" if dry_run else "failed"
        self.stdout.write(f"sweep: {verb} {report.redispatched}, {fail_verb} {report.failed}")

    def do_prune(self, *, dry_run: bool, batch_size: int | None, max_batches: int | None, **_: Any) -> None:
        count = lifecycle.prune_expired(batch_size=batch_size, dry_run=dry_run, max_batches=max_batches)
        self.stdout.write(f"prune: {'would delete' if dry_run else 'deleted'} {count} expired task(s)")

    def do_inspect(self, *, task_id: str, **_: Any) -> None:
        task = self._task(task_id)
        data = {
            "task": detailed_task(task),
            "owner": task.owner,
            "tool": task.tool_name,
            "era": task.era,
            "arguments": task.arguments,
            "attempts": task.attempts,
            "lease_owner": task.lease_owner,
            "lease_expires_at": task.lease_expires_at.isoformat() if task.lease_expires_at else None,
            "input_requests": [
                {"key": r.key, "method": r.method, "state": r.state, "response": r.response}
                for r in task.input_requests.all()
            ],
            "events": [
                {
                    "at": e.at.isoformat(),
                    "kind": e.kind,
                    "from": e.from_status,
                    "to": e.to_status,
                    "actor": e.actor,
                    "detail": e.detail,
                }
                for e in task.events.all()
            ],
        }
        self.stdout.write(json.dumps(data, indent=2, default=str))

    def do_cancel(self, *, task_id: str, dry_run: bool, reason: str, by: str, **_: Any) -> None:
        task = self._task(task_id)
        if task.status not in ACTIVE_STATUSES:
            raise CommandError(f"Task {task_id} is already {task.status}")
        if dry_run:
            self.stdout.write(f"cancel: would cancel 1 task ({task.status})")
            return
        moved = lifecycle.cancel(task_id, actor=lifecycle.operator_actor(by), reason=reason)
        self.stdout.write(f"cancel: cancelled {int(moved)} task(s)")

    def do_expire(self, *, task_id: str, dry_run: bool, by: str, **_: Any) -> None:
        task = self._task(task_id)
        if task.status not in TERMINAL_STATUSES:
            raise CommandError(f"Task {task_id} is {task.status}: cancel it first")
        if dry_run:
            self.stdout.write(f"expire: would expire 1 task ({task.status})")
            return
        moved = lifecycle.expire_now(task_id, actor=lifecycle.operator_actor(by))
        self.stdout.write(f"expire: expired {int(moved)} task(s); the next prune deletes them")

    def do_retry(self, *, task_id: str, dry_run: bool, by: str, **_: Any) -> None:
        task = self._task(task_id)
        why = lifecycle.retry_refusal(task)
        if why is not None:
            raise CommandError(f"Task {task_id} cannot be retried: {why}")
        if dry_run:
            self.stdout.write(f"retry: would start 1 new task ({task.tool_name})")
            return
        new = lifecycle.retry(task_id, actor=lifecycle.operator_actor(by))
        if new is None:
            raise CommandError(f"Task {task_id} cannot be retried: it was retried already")
        self.stdout.write(f"retry: started 1 new task {new.id}")

    def do_stats(self, **_: Any) -> None:
        by_status = dict(Task.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
        by_tool = list(Task.objects.values("tool_name").annotate(n=Count("id")).order_by("-n")[:20])
        pending = Task.objects.filter(input_requests__state=InputRequestState.PENDING).distinct().count()
        self.stdout.write("status counts:")
        for status in (*ACTIVE_STATUSES, *TERMINAL_STATUSES):
            self.stdout.write(f"  {status:15} {by_status.get(status, 0)}")
        self.stdout.write(f"tasks waiting on input requests: {pending}")
        now = timezone.now()
        working = Task.objects.filter(status=TaskStatus.WORKING)
        lapsed = working.filter(lease_expires_at__lt=now).count()
        grace = now - timedelta(seconds=settings.DISPATCH_GRACE_SECONDS)
        unclaimed = working.filter(lease_expires_at__isnull=True, dispatched_at__lt=grace).count()
        prunable = Task.objects.filter(status__in=TERMINAL_STATUSES, expires_at__lt=now).count()
        oldest = Task.objects.filter(status__in=ACTIVE_STATUSES).aggregate(oldest=Min("created_at"))["oldest"]
        self.stdout.write(f"running with a lapsed lease (the next sweep re-runs them): {lapsed}")
        self.stdout.write(f"unclaimed past the dispatch grace (the next sweep re-enqueues them): {unclaimed}")
        self.stdout.write(f"finished and expired (the next prune deletes them): {prunable}")
        self.stdout.write(f"oldest active task created: {oldest.isoformat() if oldest else '-'}")
        self.stdout.write("busiest tools:")
        for row in by_tool:
            self.stdout.write(f"  {row['tool_name']:30} {row['n']}")


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "cli"

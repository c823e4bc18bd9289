"""Concurrent lifecycle calls on the same tasks, from many threads, on Postgres.

Each thread has its own database connection, so these are real concurrent
transactions. Whatever interleaving happens, the recorded history must obey
the lifecycle: one terminal transition per task, nothing after it, every
answer applied at most once and none lost.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from mcptasks.models import TERMINAL_STATUSES, InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle
from tests.support import postgres_only
from tests.support.factories import WORKER, accept, running_task, waiting_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("transition_paths")]

TASKS = 40


def run_threads(workers: dict[str, Callable[[], None]], timeout: float = 60) -> None:
    """Start every worker at the same moment; re-raise the first failure."""
    barrier = threading.Barrier(len(workers))
    errors: list[tuple[str, BaseException]] = []

    def wrap(name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait()
                fn()
            except BaseException as exc:
                errors.append((name, exc))
            finally:
                connection.close()

        return run

    threads = [threading.Thread(target=wrap(n, f), name=n, daemon=True) for n, f in workers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"thread {t.name} is stuck (deadlock?)"
    assert not errors, f"threads raised: {errors!r}"


def shuffled(ids: list[str], seed: int) -> list[str]:
    order = list(ids)
    random.Random(seed).shuffle(order)
    return order


def check_history(task_id: str) -> list[tuple[str, str]]:
    """The task's transitions form one chain that starts at creation, never
    leaves a terminal status, and ends at the row's status."""
    events = list(TaskEvent.objects.filter(task_id=task_id).exclude(to_status="").order_by("at", "id"))
    chain = [(e.from_status, e.to_status) for e in events]
    assert chain and chain[0] == ("", "working"), chain
    for (_, previous_to), (next_from, _) in itertools.pairwise(chain):
        assert previous_to == next_from, f"{task_id}: broken chain {chain}"
        assert previous_to not in TERMINAL_STATUSES, f"{task_id}: transition out of a terminal status: {chain}"
    terminal = [t for t in chain if t[1] in TERMINAL_STATUSES]
    assert len(terminal) <= 1, f"{task_id}: {len(terminal)} terminal transitions: {chain}"
    assert Task.objects.get(pk=task_id).status == chain[-1][1]
    return chain


def test_exactly_one_claim_wins():
    tasks = [lifecycle.create_task(owner="o", tool_name="t", arguments={}, enqueue=False).id for _ in range(TASKS)]
    wins: dict[str, list[str]] = defaultdict(list)
    lock = threading.Lock()

    def claimer(name: str, seed: int) -> Callable[[], None]:
        def run() -> None:
            for task_id in shuffled(tasks, seed):
                if lifecycle.claim(task_id, worker=name) is not None:
                    with lock:
                        wins[task_id].append(name)

        return run

    run_threads({f"w{i}": claimer(f"w{i}", i) for i in range(8)})
    assert sorted(wins) == sorted(tasks)
    assert all(len(names) == 1 for names in wins.values()), wins
    for task_id, (winner,) in wins.items():
        task = Task.objects.get(pk=task_id)
        assert (task.lease_owner, task.attempts) == (winner, 1)
        assert TaskEvent.objects.filter(task_id=task_id, kind="run_started").count() == 1


def test_cancel_complete_fail_and_sweep_race():
    tasks = [running_task().id for _ in range(TASKS)]
    # Half the leases have lapsed, so the sweeper takes them from the worker.
    lapsed = tasks[::2]
    Task.objects.filter(pk__in=lapsed).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    outcomes: dict[str, Counter] = defaultdict(Counter)
    lock = threading.Lock()

    def note(who: str, task_id: str, ok: bool) -> None:
        if ok:
            with lock:
                outcomes[task_id][who] += 1

    def completer() -> None:
        for task_id in shuffled(tasks, 1):
            note("complete", task_id, lifecycle.complete(task_id, {"content": [], "isError": False}, worker=WORKER))

    def canceller() -> None:
        for task_id in shuffled(tasks, 2):
            note("cancel", task_id, lifecycle.cancel(task_id, actor="client:alice"))

    def failer() -> None:
        for task_id in shuffled(tasks, 3):
            note(
                "fail",
                task_id,
                lifecycle.fail(task_id, {"code": -32603, "message": "x"}, actor="worker:w", worker=WORKER),
            )

    def sweeper() -> None:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            lifecycle.sweep()

    run_threads({"complete": completer, "cancel": canceller, "fail": failer, "sweep": sweeper})
    print("winners:", Counter(next(iter(c)) for c in outcomes.values()))

    for task_id in tasks:
        chain = check_history(task_id)
        task = Task.objects.get(pk=task_id)
        winners = outcomes[task_id]
        assert sum(winners.values()) == 1, f"{task_id}: {winners}"
        assert task.status in TERMINAL_STATUSES, "the canceller reaches every task"
        (winner,) = winners
        expected = {"complete": "completed", "cancel": "cancelled", "fail": "failed"}[winner]
        assert task.status == expected == chain[-1][1]
        if task.status == TaskStatus.COMPLETED:
            assert task.result is not None and task.error is None
        elif task.status == TaskStatus.FAILED:
            assert task.error is not None and task.result is None
        else:
            assert task.result is None and task.error is None


def test_answers_race_with_cancel_sweep_and_runs(published, settings):
    # No grace: the sweeper re-enqueues resumed tasks the worker has not claimed yet.
    settings.MCPTASKS = {**settings.MCPTASKS, "DISPATCH_GRACE_SECONDS": 0}
    keys = ["k1", "k2", "k3"]
    tasks = [waiting_task(keys=keys).id for _ in range(TASKS)]
    to_cancel = set(random.Random(7).sample(tasks, TASKS // 2))
    accepted: dict[tuple[str, str], list[str]] = defaultdict(list)
    completions: Counter = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def submitter(name: str, seed: int) -> Callable[[], None]:
        rng = random.Random(seed)

        def run() -> None:
            for _ in range(3):
                for task_id in shuffled(tasks, rng.random()):
                    chosen = rng.sample(keys, rng.randint(1, 3))
                    answers = {k: accept(by=name, key=k) for k in chosen}
                    answers["never-asked"] = accept(by=name)
                    got = lifecycle.submit_input(task_id, answers, actor=f"client:{name}")
                    assert "never-asked" not in got
                    with lock:
                        for key in got:
                            accepted[(task_id, key)].append(name)

        return run

    def canceller() -> None:
        for task_id in shuffled(sorted(to_cancel), 11):
            lifecycle.cancel(task_id, actor="client:alice")
            time.sleep(0.001)

    def worker() -> None:
        # Plays the worker: runs whatever was resumed and finishes it.
        while not stop.is_set():
            resumed = list(Task.objects.filter(pk__in=tasks, status=TaskStatus.WORKING).values_list("id", flat=True))
            for task_id in resumed:
                if lifecycle.claim(task_id, worker="racer") is not None and lifecycle.complete(
                    task_id, {"content": [], "isError": False}, worker="racer"
                ):
                    with lock:
                        completions[task_id] += 1
            time.sleep(0.005)

    def sweeper() -> None:
        while not stop.is_set():
            lifecycle.sweep()
            time.sleep(0.01)

    def submitters_then_stop() -> None:
        try:
            run_threads({f"s{i}": submitter(f"s{i}", i) for i in range(4)} | {"cancel": canceller})
            # Let the worker finish what was resumed.
            deadline = time.monotonic() + 10
            while Task.objects.filter(pk__in=tasks, status=TaskStatus.WORKING).exists():
                assert time.monotonic() < deadline, "resumed tasks were never finished"
                time.sleep(0.02)
        finally:
            stop.set()

    run_threads({"driver": submitters_then_stop, "worker": worker, "sweeper": sweeper})

    runs = Counter(m["args"][0] for m in published if m["task"] == "mcptasks.run_task")
    for task_id in tasks:
        chain = check_history(task_id)
        resumes = chain.count(("input_required", "working"))
        assert resumes <= 1, f"{task_id} resumed {resumes} times: {chain}"
        redispatches = TaskEvent.objects.filter(task_id=task_id, kind="redispatched").count()
        assert runs[task_id] == resumes + redispatches, f"{task_id}: {runs[task_id]} runs enqueued"
        assert completions[task_id] <= 1
        rows = {r.key: r for r in InputRequest.objects.filter(task_id=task_id)}
        assert set(rows) == set(keys), "no answer may create a request"
        for key in keys:
            winners = accepted[(task_id, key)]
            row = rows[key]
            assert len(winners) <= 1, f"{task_id}/{key} applied {len(winners)} times"
            if winners:
                assert row.state == InputRequestState.ANSWERED, f"{task_id}/{key}: accepted answer lost"
                assert row.response == accept(by=winners[0], key=key), "the stored answer is the accepted one"
            else:
                assert row.state != InputRequestState.ANSWERED, f"{task_id}/{key}: answered but nobody was told"
            if row.state == InputRequestState.PENDING:
                assert Task.objects.get(pk=task_id).status == TaskStatus.INPUT_REQUIRED
        answered = all(rows[k].state == InputRequestState.ANSWERED for k in keys)
        assert (resumes == 1) == answered, f"{task_id}: resumed={resumes} but all answered={answered}"
        status = Task.objects.get(pk=task_id).status
        if task_id in to_cancel:
            assert status in (TaskStatus.CANCELLED, TaskStatus.COMPLETED)
        else:
            assert status == TaskStatus.COMPLETED, "every answer was given, so it must have run to the end"
        if status == TaskStatus.CANCELLED:
            assert not InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING).exists()


def test_one_key_answered_from_many_threads_is_applied_once():
    tasks = [waiting_task(keys=["only"]).id for _ in range(10)]
    accepted: dict[str, list[str]] = defaultdict(list)
    lock = threading.Lock()

    def submitter(name: str) -> Callable[[], None]:
        def run() -> None:
            for task_id in tasks:
                if lifecycle.submit_input(task_id, {"only": accept(by=name)}, actor=name):
                    with lock:
                        accepted[task_id].append(name)

        return run

    run_threads({f"s{i}": submitter(f"s{i}") for i in range(8)})
    for task_id in tasks:
        assert len(accepted[task_id]) == 1, accepted[task_id]
        row = InputRequest.objects.get(task_id=task_id, key="only")
        assert row.response == accept(by=accepted[task_id][0])
        assert TaskEvent.objects.filter(task_id=task_id, kind="input").count() == 1
        assert check_history(task_id)[-1] == ("input_required", "working")


@postgres_only.ROW_LOCKS
def test_sweeper_does_not_fail_a_run_whose_lease_was_renewed_meanwhile(settings):
    """The sweeper decides from a snapshot (lease lapsed, attempts used up),
    then fails the task. If the run's heartbeat lands in between, the run is
    alive: like the re-enqueue path, the fail must re-check the lease under
    the row lock and leave the task alone."""
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ATTEMPTS": 1}
    task = running_task()
    Task.objects.filter(pk=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    locked = threading.Event()
    renew = threading.Event()

    def heartbeat_late() -> None:
        # Holds the row lock while the sweeper looks, then renews the lease
        # (what lifecycle.heartbeat does) and commits.
        from django.db import transaction

        with transaction.atomic():
            list(Task.objects.select_for_update().filter(pk=task.id))
            locked.set()
            assert renew.wait(10)
            Task.objects.filter(pk=task.id, lease_owner=WORKER).update(
                lease_expires_at=timezone.now() + timedelta(seconds=30)
            )

    def sweeper() -> None:
        assert locked.wait(10)
        lifecycle.sweep()

    def release_when_sweeper_waits() -> None:
        assert locked.wait(10)
        deadline = time.monotonic() + 10
        while not waiting_on_a_lock():
            assert time.monotonic() < deadline, "the sweeper never reached the row lock"
            time.sleep(0.02)
        renew.set()

    run_threads({"heartbeat": heartbeat_late, "sweeper": sweeper, "release": release_when_sweeper_waits})
    task = Task.objects.get(pk=task.id)
    assert task.status == TaskStatus.WORKING, f"a run with a live lease was failed: {task.error}"
    assert task.lease_owner == WORKER
    assert task.lease_expires_at > timezone.now(), "the lease was renewed"


def waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0

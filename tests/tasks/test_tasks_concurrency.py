"""Per-key concurrency limits (``policy(concurrency_key=..., concurrency_limit=N)``): no
claim starts a task whose key already has N running, across every worker; a task stops
counting when it stops running, however it stops.

The store's claims on one connection, then many claims at once on real connections,
then real ``jobstate_worker`` processes, some SIGKILLed mid-task, each task recording
its start and end: afterwards no key ever had more than its limit running. On SQLite,
PostgreSQL and MariaDB."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from jobstate.console.job_search import parse_search
from jobstate.console.queue_stats import KeyAtLimit, keys_at_limit
from jobstate.core.states import ClaimReport, JobStatus
from jobstate.exceptions import InvalidPayload
from jobstate.models import Job, Worker
from jobstate.stores import get_state_store
from jobstate.tasks.worker.task_claims import KeyedPace, TaskClaim
from tests.support.policy_tasks import one_at_a_time, two_at_a_time
from tests.support.task_functions import add
from tests.support.tasks_kit import start_worker, stop, use_options, wait_for
from tests.support.threads import in_parallel

pytestmark = pytest.mark.mysql

TARGET = "tasks:default"
LEASE = timedelta(minutes=1)


def claim(keyed: bool, worker: str = "w-1", limit: int = 10) -> list[Job]:
    store = get_state_store()
    method = store.claim_keyed_tasks if keyed else store.claim_tasks
    return method(target=TARGET, queues=None, worker_id=worker, lease=LEASE, limit=limit)


@pytest.mark.django_db
def test_a_keyed_task_is_claimed_only_under_its_limit(settings: Any, tmp_path: Path) -> None:
    use_options(settings)
    notes = str(tmp_path / "notes")
    a = [two_at_a_time.enqueue("a", notes, 0).id for _ in range(3)]
    b = two_at_a_time.enqueue("b", notes, 0).id
    job = Job.objects.get(id=a[0])
    assert (job.concurrency_limit, job.policy["concurrency_key"]) == (2, "a")

    # The ordinary claim leaves keyed tasks to the keyed one.
    assert claim(keyed=False) == []
    first = claim(keyed=True)
    assert sorted(str(j.id) for j in first) == sorted([a[0], a[1], b])
    assert claim(keyed=True) == []  # "a" has its two running

    # A task stops counting once it stops running: reported, or put back by recovery.
    done = Job.objects.get(id=a[0])
    assert done.claim_token is not None
    get_state_store().complete_claimed_job(done.id, done.claim_token, JobStatus.DONE)
    assert [str(j.id) for j in claim(keyed=True)] == [a[2]]


@pytest.mark.django_db
def test_a_worker_asks_for_keyed_tasks_after_the_others_only_while_some_are_about(
    settings: Any, tmp_path: Path
) -> None:
    use_options(settings)
    store = get_state_store()
    pace = KeyedPace(interval=60)

    def worker_claim() -> tuple[list[Job], int]:
        request = TaskClaim(
            target=TARGET, queues=None, worker_id="w-1", lease=LEASE, limit=4, pace=pace
        )
        with CaptureQueriesContext(connection) as captured:
            jobs = request.claim(store)
        return jobs, len(captured.captured_queries)

    def ordinary_claim() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert claim(keyed=False) == []
        return len(captured.captured_queries)

    add.enqueue(1, 2)
    # The first claim takes the keyed tasks first (none), then the others.
    jobs, _ = worker_claim()
    assert len(jobs) == 1
    # Slots are left free, but the last look at the keyed tasks found none: the worker's
    # next claims send only the ordinary claim's statements until its pace is due again.
    alone = ordinary_claim()
    jobs, sent = worker_claim()
    assert (jobs, sent) == ([], alone)
    # A keyed task enqueued meanwhile waits for the pace (a second at most) ...
    keyed = two_at_a_time.enqueue("a", str(tmp_path / "notes"), 0)
    assert worker_claim()[0] == []
    # ... or for a keyed task of this worker to end: its key may let another start.
    pace.ended(Job.objects.get(id=keyed.id))
    jobs, sent = worker_claim()
    assert [str(job.id) for job in jobs] == [keyed.id] and sent > alone
    # It found some: the next claim that leaves slots free looks again.
    two_at_a_time.enqueue("b", str(tmp_path / "notes"), 0)
    assert len(worker_claim()[0]) == 1


@pytest.mark.django_db
def test_a_look_for_keyed_tasks_that_finds_none_costs_one_statement(settings: Any) -> None:
    """Every worker looks once a second; with none ready that look was a transaction of
    three round trips (and, on SQLite, a writer's lock)."""
    use_options(settings)
    add.enqueue(1, 2)
    with CaptureQueriesContext(connection) as captured:
        assert claim(keyed=True) == []
    assert len(captured.captured_queries) == 1


@pytest.mark.django_db
def test_the_look_for_keyed_tasks_answers_for_its_own_queues_and_pauses(
    settings: Any, tmp_path: Path
) -> None:
    """The look's statement is kept per target and queues: a look over other queues, or
    over a paused queue, made before or after, must not answer for this one."""
    use_options(settings)
    two_at_a_time.using(queue_name="reports").enqueue("a", str(tmp_path / "notes"), 0)
    store = get_state_store()

    def look(queues: list[str] | None) -> int:
        found = store.claim_keyed_tasks(
            target=TARGET, queues=queues, worker_id="w-1", lease=LEASE, limit=1
        )
        for job in found:  # hand it back for the next look
            Job.objects.filter(id=job.id).update(
                status=JobStatus.QUEUED, claim_token=None, lease_until=None
            )
        return len(found)

    assert look(["emails"]) == 0
    assert look([]) == 0
    assert look(["reports"]) == 1
    assert look(["emails"]) == 0
    assert look(None) == 1
    store.pause_queue(target=TARGET, queue="reports", by="test")
    assert (look(["reports"]), look(None)) == (0, 0)


def worker_round(pace: KeyedPace, ending: Job) -> tuple[list[Job], int]:
    """A worker's round of one slot: the report of ``ending`` and the next claim; the
    tasks claimed and the statements sent."""
    request = TaskClaim(
        target=TARGET, queues=None, worker_id="w-1", lease=LEASE, limit=1, pace=pace
    )
    report = ClaimReport(job_id=ending.id, claim_token=ending.claim_token or "", status="done")
    with CaptureQueriesContext(connection) as captured:
        results, jobs = request.complete_and_claim(get_state_store(), [report], keyed_ending=False)
    assert [result.completed for result in results] == [True]
    return jobs, len(captured.captured_queries)


@pytest.mark.django_db
def test_a_round_that_looks_for_keyed_tasks_first_costs_one_statement_more(
    settings: Any, tmp_path: Path
) -> None:
    """Once a second each worker's round looks for keyed tasks first; its reports went
    alone then, so with none ready the round cost the report, the look (a transaction)
    and the claim apart."""
    use_options(settings)
    pace = KeyedPace(interval=60)
    for n in range(3):
        add.enqueue(n, n)
    (ending,) = claim(keyed=False, limit=1)
    looking, looked = worker_round(pace, ending)
    ordinary, plain = worker_round(pace, looking[0])  # the pace is not due again
    assert len(ordinary) == 1 and len(looking) == 1
    assert looked == plain + 1

    # A keyed task ready takes the slot ahead of the ordinary task queued before it.
    keyed = two_at_a_time.enqueue("a", str(tmp_path / "notes"), 0)
    jobs, _sent = worker_round(KeyedPace(interval=60), ordinary[0])
    assert [str(job.id) for job in jobs] == [keyed.id]


@pytest.mark.django_db
def test_a_lost_workers_tasks_free_their_key_when_recovered(settings: Any, tmp_path: Path) -> None:
    use_options(settings)
    queued = [one_at_a_time.enqueue().id for _ in range(2)]
    (held,) = claim(keyed=True, worker="w-dead")
    assert claim(keyed=True) == []
    # The worker died: its lease runs out and a recovery puts the task back.
    Job.objects.filter(id=held.id).update(lease_until=Now() - timedelta(seconds=1))
    recovered = get_state_store().recover_expired_tasks()
    assert recovered.total == 1
    assert {str(j.id) for j in claim(keyed=True, worker="w-2")} <= set(queued)


@pytest.mark.django_db
def test_a_key_a_job_cannot_hold_is_refused_and_nothing_is_written(
    settings: Any, tmp_path: Path
) -> None:
    use_options(settings)
    with pytest.raises(InvalidPayload, match="NUL"):
        two_at_a_time.enqueue("a\x00", str(tmp_path), 0)
    with pytest.raises(InvalidPayload, match="limit is 500"):
        two_at_a_time.enqueue("k" * 501, str(tmp_path), 0)
    assert not Job.objects.exists()


@pytest.mark.concurrent
@pytest.mark.django_db(transaction=True)
def test_claims_at_once_never_start_more_than_the_limit(settings: Any, tmp_path: Path) -> None:
    use_options(settings)
    for key in ("a", "b", "c"):
        for _ in range(6):
            two_at_a_time.enqueue(key, str(tmp_path / "notes"), 0)

    taken = in_parallel(12, lambda i: len(claim(keyed=True, worker=f"w-{i}", limit=3)))

    running = Job.objects.filter(status=JobStatus.RUNNING)
    counts = [running.filter(policy__concurrency_key=key).count() for key in "abc"]
    assert sum(taken) == sum(counts) and max(counts) <= 2, (taken, counts)
    # A claim passes over a key whose gate another claim holds; afterwards a claim
    # finds what is left under each limit, and no more.
    claim(keyed=True, worker="w-last")
    assert [running.filter(policy__concurrency_key=key).count() for key in "abc"] == [2, 2, 2]


def overlaps(lines: list[str], killed: dict[int, float]) -> dict[str, int]:
    """The most runs of each key at once, from the notes: a run of a killed process
    ends when it was killed, if it noted no end."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    open_runs: dict[tuple[str, int], float] = {}
    for line in lines:
        what, key, pid, at = line.split()
        if what == "start":
            open_runs[key, int(pid)] = float(at)
            events[key].append((float(at), 1))
        else:
            del open_runs[key, int(pid)]
            events[key].append((float(at), -1))
    for (key, pid), _started in open_runs.items():
        events[key].append((killed[pid], -1))
    most = {}
    for key, marks in events.items():
        level = peak = 0
        for _at, step in sorted(marks, key=lambda mark: (mark[0], mark[1])):
            level += step
            peak = max(peak, level)
        most[key] = peak
    return most


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_workers_never_run_three_of_a_key_at_once_even_when_killed(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings, LEASE=2.0, MAX_ATTEMPTS=5)
    notes = tmp_path / "notes"
    workers: list[subprocess.Popen[str]] = []
    killed: dict[int, float] = {}
    try:
        for number in range(8):
            workers.append(
                start_worker("--worker-id", f"limit-{number}", "--interval", "0.1", options=options)
            )
        # Every worker is up before the tasks come: eight free slots for three keys, so
        # without the limit some key would run three or more at once.
        wait_for(lambda: Worker.objects.count() == 8, what="eight workers registered")
        for _ in range(8):
            for key in ("a", "b", "c"):
                two_at_a_time.enqueue(key, str(notes), 0.5)
        # Kill two workers while they run a task, then start two in their place.
        by_pid = {worker.pid: worker for worker in workers}
        busy = wait_for(
            lambda: (
                [pid for pid in _running_now(_lines(notes)) if pid in by_pid][:2]
                if len(_running_now(_lines(notes))) >= 2
                else None
            ),
            what="two workers running a task",
        )
        for pid in busy:
            by_pid[pid].send_signal(signal.SIGKILL)
            killed[pid] = time.time()
            by_pid[pid].wait()
        for number in range(8, 10):
            workers.append(
                start_worker("--worker-id", f"limit-{number}", "--interval", "0.1", options=options)
            )
        wait_for(
            lambda: not Job.objects.exclude(status=JobStatus.DONE).exists(),
            timeout=90,
            what="every task done",
        )
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                stop(worker)
    most = overlaps(_lines(notes), killed)
    assert set(most) == {"a", "b", "c"}
    assert max(most.values()) == 2, most  # the limit was reached, never passed
    # Every task ran to its end at least once, and a task ran to its end twice only
    # because it was claimed again, which its attempts count: after a kill (its worker
    # held one task whose end its report did not carry to the database, either cut
    # short, or ended between the test reading the notes and the kill), or, on a
    # starved machine, after a live worker's renewal missed the 2 s lease.
    ends = [line for line in _lines(notes) if line.startswith("end ")]
    attempts = sum(Job.objects.values_list("attempts", flat=True))
    assert 24 <= len(ends) <= attempts, (ends, attempts)
    assert Job.objects.filter(status=JobStatus.DONE).count() == 24


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


@pytest.mark.django_db
def test_the_queues_page_shows_the_keys_at_their_limit(
    settings: Any, tmp_path: Path, admin_client: Any
) -> None:
    use_options(settings)
    for _ in range(3):
        two_at_a_time.enqueue("acme <b>", str(tmp_path / "notes"), 0)
    two_at_a_time.enqueue("quiet", str(tmp_path / "notes"), 0)
    claim(keyed=True, limit=3)  # two of "acme <b>", one of "quiet"

    assert keys_at_limit() == [
        KeyAtLimit(target=TARGET, key="acme <b>", running=2, limit=2, waiting=1)
    ]
    page = admin_client.get("/admin/jobstate/queuepause/").content.decode()
    assert "Concurrency keys at their limit" in page
    assert "<code>acme &lt;b&gt;</code>" in page and "2 / 2" in page
    found = parse_search('key:"acme <b>"').apply(Job.objects.all())
    assert found.count() == 3


def _running_now(lines: list[str]) -> list[int]:
    """The processes whose notes show a run started and not ended."""
    started: dict[int, int] = defaultdict(int)
    for line in lines:
        what, _key, pid, _at = line.split()
        started[int(pid)] += 1 if what == "start" else -1
    return [pid for pid, runs in started.items() if runs > 0]

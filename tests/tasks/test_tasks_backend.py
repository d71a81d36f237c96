"""``JobStateBackend`` through Django's task API: what ``enqueue`` stores and returns,
``get_result`` from anywhere, transactional enqueue, the checks of bad tasks and bad
options, and the ``NOTIFY`` an enqueue sends on PostgreSQL."""

from __future__ import annotations

import math
import re
import threading
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.utils import timezone

from jobstate.checks import JOBSTATE_CHECKS
from jobstate.core.states import JobStatus, NewTask
from jobstate.exceptions import InvalidPayload, StoreError
from jobstate.models import Job
from jobstate.stores import get_state_store
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
)
from jobstate.tasks.options import parse_task_options
from jobstate.tasks.results import task_of
from tests.support.task_functions import add, async_add, echo, nested
from tests.support.tasks_kit import use_options

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True)]


def backend() -> JobStateBackend:
    found = task_backends["default"]
    assert isinstance(found, JobStateBackend)
    return found


def test_the_backend_supports_defer_results_priority_and_async_tasks() -> None:
    assert backend().supports_defer
    assert backend().supports_get_result
    assert backend().supports_priority
    assert backend().supports_async_task


def test_enqueue_returns_a_ready_result_and_get_result_reads_it_back(settings: Any) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    before = timezone.now()
    result = echo.enqueue(1, (2, 3), key={"a": (4,)})

    assert result.status == TaskResultStatus.READY
    assert result.args == [1, [2, 3]] and result.kwargs == {"key": {"a": [4]}}
    assert (result.worker_ids, result.errors, result.attempts) == ([], [], 0)
    assert result.enqueued_at is not None and result.enqueued_at >= before - timedelta(seconds=5)
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    assert result.backend == "default" and result.task.func is echo.func
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    again = echo.get_result(result.id)
    assert (again.id, again.status, again.args, again.kwargs) == (
        result.id,
        TaskResultStatus.READY,
        [1, [2, 3]],
        {"key": {"a": [4]}},
    )
    job = Job.objects.get(id=result.id)
    assert (job.target, job.task_path, job.queue_name, job.priority, job.max_attempts) == (
        "tasks:default",
        "tests.support.task_functions.echo",
        "default",
        0,
        3,
    )
    assert job.status == JobStatus.QUEUED and job.attempts == 0 and job.attempt_log == []
    assert job.input == {"args": [1, [2, 3]], "kwargs": {"key": {"a": [4]}}}


def test_priority_queue_and_run_after_are_kept() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = add.using(priority=7, queue_name="emails", run_after=later).enqueue(1, 2)
    job = Job.objects.get(id=result.id)
    assert (job.priority, job.queue_name, job.run_after) == (7, "emails", later)
    read = add.get_result(result.id)
    assert (read.task.priority, read.task.queue_name, read.task.run_after) == (7, "emails", later)


def test_enqueue_is_part_of_the_callers_transaction() -> None:
    seen_elsewhere: list[bool] = []

    def look(result_id: str) -> None:
        seen_elsewhere.append(Job.objects.filter(id=result_id).exists())
        connection.close()

    with transaction.atomic():
        kept = add.enqueue(1, 1)
        assert add.get_result(kept.id).status == TaskResultStatus.READY  # same transaction
        other = threading.Thread(target=look, args=(kept.id,))
        other.start()
        other.join()
    with transaction.atomic():
        dropped = add.enqueue(2, 2)
        transaction.set_rollback(True)

    assert seen_elsewhere == [False]  # nobody sees a task before its transaction commits
    assert add.get_result(kept.id).status == TaskResultStatus.READY
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(dropped.id)
    assert Job.objects.count() == 1


def test_get_result_of_an_unknown_malformed_or_foreign_id_raises(settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "other": {"BACKEND": "jobstate.tasks.JobStateBackend"},
    }
    foreign = add.using(backend="other").enqueue(1, 2)
    hub_job = get_state_store().create_job(request_id="not-a-task", target="t")
    for unknown in (str(uuid.uuid4()), "not-a-uuid", "", str(hub_job.id), foreign.id):
        with pytest.raises(TaskResultDoesNotExist):
            backend().get_result(unknown)
    assert task_backends["other"].get_result(foreign.id).status == TaskResultStatus.READY


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: add.using(priority=101).enqueue(1, 2), InvalidTask),
        (lambda: add.using(queue_name="nowhere").enqueue(1, 2), InvalidTask),
        (
            lambda: add.using(run_after=timezone.now().replace(tzinfo=None)).enqueue(1, 2),
            InvalidTask,
        ),
        (lambda: echo.enqueue(object()), TypeError),
        (lambda: echo.enqueue(math.nan), InvalidPayload),
        (lambda: echo.enqueue(payload="x" * (1024 * 1024)), InvalidPayload),
        # 32 levels inside the job's input {"args": [...]}: MariaDB's JSON check refused
        # it inside the database (a StoreError); now every database refuses it by name.
        (lambda: echo.enqueue(nested(30)), InvalidPayload),
    ],
)
def test_a_task_that_cannot_be_queued_raises_and_writes_nothing(make: Any, error: type) -> None:
    with pytest.raises(error):
        make()
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ((nested(30),), {}, "args[0] is nested more than 29 levels deep"),
        ((1, {"a": nested(29)}), {}, "args[1] is nested more than 29 levels deep"),
        ((), {"payload": nested(30)}, "kwargs['payload'] is nested more than 29 levels deep"),
    ],
)
def test_an_argument_nested_too_deeply_is_named_with_the_depth_it_may_have(
    args: Any, kwargs: Any, says: str
) -> None:
    # The arguments are stored two levels down, inside the job's input {"args": [...]}:
    # the message names the argument and its own limit, not the input's 31 levels.
    with pytest.raises(InvalidPayload, match=re.escape(says)):
        echo.enqueue(*args, **kwargs)
    assert not Job.objects.exists()
    # The deepest an argument may be is stored.
    echo.enqueue(nested(29))
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        (("a", "b\x00c"), {}, "args[1] contains a NUL character, which cannot be stored."),
        (({"key\x00": 1},), {}, "args[0] contains a NUL character, which cannot be stored."),
        (
            (),
            {"name": "x\ud800"},
            "kwargs['name'] contains text that is not valid Unicode: a lone surrogate "
            "('\\ud800'), which no database can store.",
        ),
        (
            ({1: "a"},),
            {},
            "args[0] does not survive a JSON round trip unchanged: it has the key 1 (int), "
            "which comes back as a string.",
        ),
    ],
)
def test_an_argument_no_database_stores_is_named(args: Any, kwargs: Any, says: str) -> None:
    # The message said "input ...", the job's field, which the caller never wrote.
    with pytest.raises(InvalidPayload) as refused:
        echo.enqueue(*args, **kwargs)
    assert str(refused.value) == says
    assert not Job.objects.exists()


def refusal(kind: type[Exception], args: Any, kwargs: Any) -> str:
    """The message of the ``kind`` (exactly that class) that enqueuing ``echo`` with
    ``args`` and ``kwargs`` raises; nothing was written."""
    with pytest.raises(kind) as refused:
        echo.enqueue(*args, **kwargs)
    assert type(refused.value) is kind
    assert not Job.objects.exists()
    return str(refused.value)


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        (
            ({1, 2},),
            {},
            "args[0] is a set, which is not JSON: pass a list (sorted, so that equal sets "
            "are equal lists).",
        ),
        (
            (),
            {"when": datetime(2027, 1, 1, tzinfo=UTC)},
            "kwargs['when'] is a datetime, which is not JSON: pass its .isoformat() text, "
            "and datetime.fromisoformat() reads it back in the task.",
        ),
        (
            ([1, {"due": date(2027, 1, 1)}],),
            {},
            "args[0][1]['due'] is a date, which is not JSON: pass its .isoformat() text, "
            "and date.fromisoformat() reads it back in the task.",
        ),
        (
            (),
            {"users": {frozenset({1}): "a"}},
            "kwargs['users'] has a key that is a frozenset, frozenset({1}), which is not "
            "JSON: an object's keys are text.",
        ),
        (
            (),
            {"amount": Decimal("1.50")},
            "kwargs['amount'] is a Decimal, which is not JSON: pass str, int, float, bool, "
            "None, or lists and dicts of them.",
        ),
    ],
)
def test_an_argument_of_a_type_json_lacks_is_named_with_what_to_pass(
    args: Any, kwargs: Any, says: str
) -> None:
    # Django's normalize_json said only "Unsupported type: <class 'set'>". A host that
    # catches TypeError, as Django's own backends raise it here, still does.
    assert refusal(TypeError, args, kwargs) == says


#: What the message says to pass for bytes that are not UTF-8 text.
_BYTES_INSTEAD = (
    "which is not JSON: pass text (.decode() them with their encoding) or, for binary "
    "data, base64.b64encode(data).decode(), which base64.b64decode() reads back in the task."
)


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ((b"\xff",), {}, f"args[0] is bytes that are not UTF-8, {_BYTES_INSTEAD}"),
        ((), {"png": b"\x89PNG"}, f"kwargs['png'] is bytes that are not UTF-8, {_BYTES_INSTEAD}"),
        (
            (["a", {"raw": b"\xff"}],),
            {},
            f"args[0][1]['raw'] is bytes that are not UTF-8, {_BYTES_INSTEAD}",
        ),
        (
            ({b"\xff": 1},),
            {},
            "args[0] has a key that is bytes that are not UTF-8, b'\\xff', which is not "
            "JSON: an object's keys are text.",
        ),
        # Refused in the order Django's normalize_json meets them, with its class.
        (
            ({"a": b"\xff", "b": {1}},),
            {},
            f"args[0]['a'] is bytes that are not UTF-8, {_BYTES_INSTEAD}",
        ),
    ],
)
def test_bytes_that_are_not_utf8_are_named_with_what_to_pass(
    args: Any, kwargs: Any, says: str
) -> None:
    # Django's normalize_json said only "Unsupported value: <class 'bytes'>"; it decodes
    # the bytes it can, and raises ValueError for the rest, which a host may catch.
    assert refusal(ValueError, args, kwargs) == says


def test_bytes_of_utf8_text_are_stored_as_that_text() -> None:
    # As Django's own backends store them.
    queued = echo.enqueue(b"caf\xc3\xa9", key={"k": b"v"})
    assert (queued.args, queued.kwargs) == (["caf\u00e9"], {"key": {"k": "v"}})


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"run_after": timedelta(days=1)}, "run_after must be an aware datetime, got timedelta."),
        ({"run_after": "2027-01-01"}, "run_after must be an aware datetime, got str."),
        ({"priority": "5"}, "priority must be a whole number, got str."),
        ({"priority": True}, "priority must be a whole number, got bool."),
    ],
)
def test_a_run_after_or_priority_of_the_wrong_type_is_refused_by_name(
    options: dict[str, Any], says: str
) -> None:
    # Django's own checks failed on these with a bare AttributeError or TypeError.
    with pytest.raises(InvalidTask) as refused:
        add.using(**options).enqueue(1, 2)
    assert str(refused.value) == says
    assert not Job.objects.exists()


@pytest.mark.parametrize("module", ["django.core.management.commands.shell", "__main__"])
def test_a_task_no_worker_can_import_is_refused_at_enqueue(module: str) -> None:
    """A task defined in ``manage.py shell`` (or a script run as ``__main__``) was
    queued under a path no worker can import: each worker handed it back, advising a
    restart, for an hour. Found by a newcomer's pass."""
    namespace: dict[str, Any] = {"__name__": module, "task": task}
    exec("@task\ndef defined_in_a_shell(x):\n    return x\n", namespace)
    with pytest.raises(InvalidTask) as refused:
        namespace["defined_in_a_shell"].enqueue(1)
    assert str(refused.value) == (
        f"{module}.defined_in_a_shell cannot be imported by a worker, so no worker could "
        "run it: define the task in a module of your project (its tasks.py, say) and "
        "import it from there."
    )
    assert not Job.objects.exists()


def test_an_enqueue_on_a_database_jobstate_is_not_migrated_on_says_to_migrate(
    settings: Any,
) -> None:
    use_options(settings)
    table = Job._meta.db_table
    with connection.schema_editor() as editor:
        editor.alter_db_table(Job, table, f"{table}_away")
    try:
        with pytest.raises(StoreError, match=r"missing: .* Run manage\.py migrate"):
            echo.enqueue(1)
    finally:
        with connection.schema_editor() as editor:
            editor.alter_db_table(Job, f"{table}_away", table)


def test_aenqueue_and_aget_result_work() -> None:
    async def enqueue_and_read() -> tuple[Any, Any]:
        queued = await async_add.aenqueue(2, 3)
        return queued, await async_add.aget_result(queued.id)

    queued, read = async_to_sync(enqueue_and_read)()
    assert read.id == queued.id and read.status == TaskResultStatus.READY
    assert read.args == [2, 3]


def test_the_result_follows_the_job_through_a_claim_and_a_report() -> None:
    store = get_state_store()
    queued = add.enqueue(2, 2)
    (claimed,) = store.claim_tasks(
        target="tasks:default",
        queues=["default"],
        worker_id="w-1",
        lease=timedelta(minutes=1),
        limit=5,
    )
    running = add.get_result(queued.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.worker_ids == ["w-1"] and running.attempts == 1
    assert running.started_at == claimed.claimed_at == running.last_attempted_at
    assert claimed.claim_token is not None
    log = [
        {
            "worker_id": "w-1",
            "started_at": claimed.claimed_at.isoformat(),
            "finished_at": timezone.now().isoformat(),
            "outcome": "successful",
        }
    ]
    store.complete_claimed_job(claimed.id, claimed.claim_token, "done", result=4, attempt_log=log)
    done = add.get_result(queued.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 4
    assert done.finished_at is not None and done.worker_ids == ["w-1"]


def test_the_result_of_a_task_this_process_cannot_import_reads_all_the_same() -> None:
    """A web process reading the results of another service's tasks."""
    store = get_state_store()
    enqueued = store.enqueue_task(
        NewTask(
            target="tasks:default",
            task_path="elsewhere.billing.tasks.close_day",
            queue_name="default",
            priority=3,
            args=[7],
            kwargs={"day": "2026-01-02"},
            max_attempts=1,
        )
    )
    queued = backend().get_result(str(enqueued.id))
    assert queued.status == TaskResultStatus.READY and queued.args == [7]
    assert queued.task.module_path == "elsewhere.billing.tasks.close_day"
    assert queued.task.priority == 3 and queued.task.queue_name == "default"
    (claimed,) = store.claim_tasks(
        target="tasks:default", queues=["default"], worker_id="w-1", lease=timedelta(1), limit=1
    )
    assert claimed.claim_token is not None
    log = [
        {
            "worker_id": "w-1",
            "started_at": claimed.claimed_at.isoformat() if claimed.claimed_at else None,
            "finished_at": timezone.now().isoformat(),
            "outcome": "successful",
        }
    ]
    store.complete_claimed_job(
        claimed.id, claimed.claim_token, "done", result={"closed": 7}, attempt_log=log
    )
    done = backend().get_result(str(enqueued.id))
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == {"closed": 7}
    assert done.worker_ids == ["w-1"] and done.kwargs == {"day": "2026-01-02"}
    with pytest.raises(ImportError, match="cannot be imported in this process"):
        done.task.call(7)


@pytest.mark.parametrize(
    ("task_path", "why"),
    [
        ("tests.support.raises_on_import.close_day", "needs a setting"),
        # A deploy dropped ``@task`` from the function (or put something else under its
        # name): ``get_result`` raised ``InvalidJobState``, for the tasks queued before it
        # and for every finished one, whose results could no longer be read.
        ("tests.support.task_functions.nested", "is not a task"),
    ],
    ids=["module-raises-on-import", "path-no-longer-a-task"],
)
def test_the_result_of_a_task_this_process_cannot_load_reads_all_the_same(
    task_path: str, why: str
) -> None:
    enqueued = get_state_store().enqueue_task(
        NewTask(
            target="tasks:default",
            task_path=task_path,
            queue_name="default",
            priority=0,
            args=[7],
            kwargs={},
            max_attempts=1,
        )
    )
    result = backend().get_result(str(enqueued.id))
    assert result.status == TaskResultStatus.READY and result.args == [7]
    assert result.task.module_path == task_path
    with pytest.raises(ImportError, match=rf"cannot be imported in this process.*{why}"):
        result.task.call(7)


@pytest.mark.parametrize(
    ("task_path", "queue_name", "priority"),
    [
        ("tests.support.task_functions.add", "reports", 0),
        ("elsewhere.billing.tasks.close_day", "reports", 0),
        # Not a priority Django's checks take: a row another writer stored.
        ("tests.support.task_functions.add", "default", 500),
    ],
    ids=["queue-removed", "queue-removed-and-no-import", "priority-refused"],
)
def test_the_result_of_a_task_the_backend_would_refuse_now_reads_all_the_same(
    settings: Any, task_path: str, queue_name: str, priority: int
) -> None:
    """An operator removed the task's queue from QUEUES after it ran: its result is data
    in the database all the same, and ``get_result`` raised ``InvalidTask``."""
    enqueued = get_state_store().enqueue_task(
        NewTask(
            target="tasks:default",
            task_path=task_path,
            queue_name=queue_name,
            priority=priority,
            args=[1, 2],
            kwargs={},
            max_attempts=1,
        )
    )
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": ["default"]}}
    result = backend().get_result(str(enqueued.id))
    assert result.status == TaskResultStatus.READY and result.args == [1, 2]
    assert result.task.module_path == task_path
    assert (result.task.queue_name, result.task.priority) == (queue_name, priority)
    if task_path == add.module_path:
        assert add.get_result(str(enqueued.id)).task.func is add.func
    # What it was enqueued with is read, not accepted anew: it cannot be queued again.
    with pytest.raises(InvalidTask):
        result.task.using(run_after=timezone.now())


def test_a_cancelled_task_reads_as_failed() -> None:
    queued = add.enqueue(1, 2)
    assert get_state_store().reject_queued_job(queued.id, by="ops", reason="not needed")
    cancelled = add.get_result(queued.id)
    assert cancelled.status == TaskResultStatus.FAILED and cancelled.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        _ = cancelled.return_value


def test_the_system_check_names_every_bad_option_and_queue(settings: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "jobstate.tasks.JobStateBackend",
            "QUEUES": ["default", "a,b", "*"],
            "OPTIONS": {
                "MAX_ATTEMPTS": 0,
                "RETRY_BACKOFF": -timedelta(seconds=1),
                "LEASE": timedelta(milliseconds=10),
                "TIMEOUT": 30,
                "UNKNOWN_TASK_TIMEOUT": 3600,
                "RETRIES": 3,
            },
        }
    }
    messages = [m for m in checks.run_checks() if m.id and m.id.startswith("jobstate.E02")]
    text = "\n".join(message.msg for message in messages)
    assert sorted(m.id for m in messages) == ["jobstate.E020"] * 6 + ["jobstate.E021"] * 2
    for fragment in (
        "unknown key(s) RETRIES",
        "'MAX_ATTEMPTS'] must be an int from 1",
        "'RETRY_BACKOFF'] must be a datetime.timedelta of zero or more",
        "'LEASE'] must be a datetime.timedelta of at least 1 second",
        "'TIMEOUT'] must be None or a positive datetime.timedelta, got 30",
        "'UNKNOWN_TASK_TIMEOUT'] must be None or a datetime.timedelta of zero or more",
        "QUEUES holds 'a,b'",
        "QUEUES holds '*'",
    ):
        assert fragment in text
    assert all(message.msg.startswith("TASKS['default']: ") for message in messages)


def test_queues_given_as_one_string_fail_the_check(settings: Any) -> None:
    """Django makes a set of whatever QUEUES holds: a string became its letters, and the
    worker then refused 'default' as not among (a, d, e, f, l, t, u)."""
    settings.TASKS = {"default": {"BACKEND": "jobstate.tasks.JobStateBackend", "QUEUES": "default"}}
    messages = [m for m in checks.run_checks(tags=JOBSTATE_CHECKS) if m.id == "jobstate.E021"]
    assert [m.msg for m in messages] == [
        "TASKS['default']: QUEUES is the string 'default'; it must be a list of queue "
        "names, such as ['default']."
    ]


def test_a_misspelt_jobstate_backend_fails_jobstates_own_check(settings: Any) -> None:
    """Django's own check of TASKS does not run in the readiness probe, which then said
    ready while no worker could start."""
    settings.TASKS = {"default": {"BACKEND": "jobstate.tasks.JobStateBackned"}}
    messages = [m for m in checks.run_checks(tags=JOBSTATE_CHECKS) if m.id == "jobstate.E025"]
    assert len(messages) == 1, messages
    assert "TASKS['default']['BACKEND'] names 'jobstate.tasks.JobStateBackned'" in messages[0].msg
    assert messages[0].hint == "Did you mean 'jobstate.tasks.JobStateBackend'?"


def test_a_state_store_without_tasks_fails_the_check(settings: Any) -> None:
    settings.JOBSTATE = {
        **getattr(settings, "JOBSTATE", {}),
        "STATE_STORE": "tests.support.stores.NoTasksStore",
    }
    messages = [m for m in checks.run_checks() if m.id == "jobstate.E024"]
    assert len(messages) == 1 and "NoTasksStore" in messages[0].msg


def test_good_options_pass_the_check(settings: Any) -> None:
    use_options(settings, MAX_ATTEMPTS=5, TIMEOUT=60, UNKNOWN_TASK_TIMEOUT=None)
    assert not [m for m in checks.run_checks() if m.id and m.id.startswith("jobstate.E02")]
    assert backend().task_options.unknown_task_timeout is None


def test_a_task_no_worker_can_import_fails_after_an_hour_by_default() -> None:
    assert parse_task_options({}).unknown_task_timeout == timedelta(hours=1)


def test_an_enqueue_on_bad_options_names_the_backend_alias(settings: Any) -> None:
    use_options(settings, MAX_ATTEMPTS=0)
    with pytest.raises(
        ImproperlyConfigured, match=r"^TASKS\['default'\]: OPTIONS\['MAX_ATTEMPTS'\]"
    ):
        add.enqueue(1, 2)
    assert not Job.objects.exists()


# --- waking workers: NOTIFY at commit -------------------------------------------------------


def _listener() -> Any:
    import psycopg

    params = connection.get_connection_params()
    params = {
        k: v
        for k, v in params.items()
        if k not in {"cursor_factory", "context", "prepare_threshold"}
    }
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute("LISTEN jobstate_tasks")
    return listener


@pytest.mark.slow
@pytest.mark.postgres
def test_enqueue_notifies_once_per_queue_when_its_transaction_commits() -> None:
    listener = _listener()
    try:
        with transaction.atomic():
            for n in range(3):
                add.enqueue(n, n)
            add.using(queue_name="emails").enqueue(1, 1)
            assert not list(listener.notifies(timeout=0.2))  # nothing before the commit
        received = [n.payload for n in listener.notifies(timeout=1.0)]
        assert sorted(received) == ['["tasks:default", "default"]', '["tasks:default", "emails"]']

        with transaction.atomic():
            add.enqueue(9, 9)
            transaction.set_rollback(True)
        assert not list(listener.notifies(timeout=0.3))  # a rolled-back task announces nothing
    finally:
        listener.close()


@pytest.mark.postgres
def test_listen_notify_off_sends_nothing(settings: Any) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "LISTEN_NOTIFY": False}
    listener = _listener()
    try:
        add.enqueue(1, 1)
        assert not list(listener.notifies(timeout=0.3))
    finally:
        listener.close()


@pytest.mark.postgres
def test_the_workers_listening_connection_prepares_no_statement() -> None:
    # Behind a pooler in transaction mode a statement prepared on one server connection is
    # missing (or already present) on the next: the listener's keep-alive must stay unprepared
    # however often it runs, whatever psycopg's default threshold.
    from jobstate.tasks.worker.waiter import NotificationListener

    listener = NotificationListener("default", accepts=lambda payload: True, wake=lambda: None)
    with listener._connect() as conn:
        for _ in range(12):
            conn.execute("SELECT 1")
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert prepared == (0,)


def test_a_tasks_queue_is_checked_again_by_a_backend_the_settings_replaced(settings: Any) -> None:
    # The worker makes one Task per kind of job and keeps it; a backend made anew from
    # changed settings checks it again.
    queued = Job.objects.get(id=add.using(queue_name="emails").enqueue(1, 2).id)
    first = task_of(queued, "default")
    assert task_of(queued, "default") is first and first.queue_name == "emails"
    settings.TASKS = {
        "default": {**settings.TASKS["default"], "QUEUES": ["default"]},
    }
    with pytest.raises(InvalidTask):
        task_of(queued, "default")

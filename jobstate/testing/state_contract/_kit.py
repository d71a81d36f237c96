"""What every state-store contract case is built from: the case type and its error, the
per-call namespace, the per-area registry, and the checks the cases share."""

from __future__ import annotations

import functools
import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from jobstate.stores.base import JobStatus, StateStore
from jobstate.stores.contracts.validation import JOB_CLAIM_FIELDS

#: The age cases ask about, and how long they let an instant age on the store's clock
#: past it. A case writes a row, lets it age, writes a second one and asks for rows
#: older than ``AGE``: the second must not be among them, so the few calls between its
#: write and the question must take less than ``AGE``, even on a loaded machine (at
#: 100 ms they once took longer on a 2-core machine running four test passes).
AGE = timedelta(seconds=1)
SETTLE = 1.1
HOUR = timedelta(hours=1)

_T = TypeVar("_T")


class StateStoreContractViolation(AssertionError):
    """A state store broke a guarantee of the contract."""


@dataclass(frozen=True)
class StateStoreContractCase:
    """One contract case. ``run()`` raises :class:`StateStoreContractViolation` when the
    store breaks the guarantee the case names."""

    name: str
    area: str
    run: Callable[[], None]

    def __str__(self) -> str:
        return self.name


StoreSource = StateStore | Callable[[], StateStore]


class Kit:
    """What every case of one call shares: the store source and the namespace."""

    def __init__(self, source: StoreSource, concurrency: int) -> None:
        self._source = source
        self.concurrency = concurrency
        self.ns = f"contract-{uuid.uuid4().hex[:12]}"
        # Thread ids are integers; a random 40-bit base keeps them apart per call.
        self._thread_base = secrets.randbits(40) << 16
        self._counter = 0
        self._count_lock = threading.Lock()

    def run(self, body: Body) -> None:
        # A factory is called once per case: every step of the case uses that store.
        store = self._source if isinstance(self._source, StateStore) else self._source()
        body(self, store)

    def name(self, label: str) -> str:
        with self._count_lock:
            self._counter += 1
            return f"{self.ns}.{label}.{self._counter}"

    def thread(self) -> int:
        with self._count_lock:
            self._counter += 1
            return self._thread_base + self._counter


Body = Callable[[Kit, StateStore], None]


class CaseTable:
    """The cases of one area, in the order their module declares them. Each area's
    module fills one table; the package lists the tables, so the order of the cases is
    written down once and does not hang on the order modules happen to be imported in."""

    def __init__(self, area: str) -> None:
        self.area = area
        self.entries: list[tuple[str, Body]] = []

    def case(self, name: str) -> Callable[[Body], Body]:
        def register(body: Body) -> Body:
            self.entries.append((f"{self.area}: {name}", body))
            return body

        return register

    def build(self, kit: Kit) -> list[StateStoreContractCase]:
        # ``{n}`` in a name is the burst size, so a report says how hard the case pushed.
        return [
            StateStoreContractCase(
                name=name.format(n=kit.concurrency),
                area=self.area,
                run=functools.partial(kit.run, body),
            )
            for name, body in self.entries
        ]


# --- checks --------------------------------------------------------------------------


def fail(area: str, message: str) -> StateStoreContractViolation:
    return StateStoreContractViolation(f"[StateStore {area}] {message}")


def check(condition: bool, area: str, message: str) -> None:
    if not condition:
        raise fail(area, message)


def raises(
    area: str, error: type[BaseException], call: Callable[[], Any], what: str
) -> BaseException:
    try:
        call()
    except error as exc:
        return exc
    except Exception as exc:
        raise fail(
            area, f"{what} raised {type(exc).__name__}: {exc}; expected {error.__name__}."
        ) from exc
    raise fail(area, f"{what} did not raise {error.__name__}.")


def present(area: str, value: _T | None, what: str) -> _T:
    if value is None:
        raise fail(area, f"{what} returned None.")
    return value


def reread(area: str, store: StateStore, job_id: Any) -> Any:
    """The job as the store holds it now; a case that wrote it expects it to exist."""
    return present(area, store.get_job(job_id), "get_job")


def check_status(
    area: str, store: StateStore, job_id: Any, status: JobStatus, message: str
) -> None:
    check(reread(area, store, job_id).status == status, area, message)


def token_of(job: Any) -> uuid.UUID:
    token = job.claim_token
    if not isinstance(token, uuid.UUID):
        raise fail("claims", f"a claimed job must carry a UUID claim_token, got {token!r}.")
    return token


def claim_fields(job: Any) -> dict[str, Any]:
    return {name: getattr(job, name) for name in JOB_CLAIM_FIELDS}


def unclaimed(job: Any) -> bool:
    return all(value is None for value in claim_fields(job).values())


# --- rows ----------------------------------------------------------------------------


def queue_jobs(
    kit: Kit, store: StateStore, target: str, count: int = 1, **fields: Any
) -> list[Any]:
    return [
        store.create_job(request_id=kit.name("job"), target=target, **fields) for _ in range(count)
    ]


def job_in(kit: Kit, store: StateStore, target: str, status: JobStatus, **fields: Any) -> Any:
    return store.create_job(request_id=kit.name(status), target=target, status=status, **fields)

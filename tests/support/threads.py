"""Threads released together, each with its own database connection, for the race tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections

T = TypeVar("T")

WORKERS = 8


def in_parallel(count: int, work: Callable[[int], T], *, timeout: float = 60) -> list[T]:
    """Run ``work(i)`` on ``count`` threads started together; re-raise the first error."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            barrier.wait(timeout=timeout)
            results[index] = work(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"
    if errors:
        raise errors[0]
    return results

"""What a piece of code sends a MariaDB or MySQL server, counted in the driver."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["round_trips"]


def round_trips(action: Callable[[], Any]) -> tuple[int, Any]:
    """What ``action`` sends the MariaDB/MySQL server, counted in the driver: each
    statement, commit and rollback, and each switch of autocommit (a round trip of its
    own, which Django's ``atomic`` sends on entering and leaving)."""
    from MySQLdb.connections import Connection

    sent = 0
    names = ("query", "commit", "rollback", "autocommit")
    originals = {name: getattr(Connection, name) for name in names}

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def send(self: Any, *args: Any) -> Any:
            nonlocal sent
            sent += 1
            return original(self, *args)

        return send

    for name in names:
        setattr(Connection, name, counted(originals[name]))
    try:
        outcome = action()
    finally:
        for name, original in originals.items():
            setattr(Connection, name, original)
    return sent, outcome

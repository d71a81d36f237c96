"""Importing a dotted path a setting or a schedule names.

Importing runs the module's own code, which may raise anything: a ``SyntaxError``, a
setting read at import, a task decorated for a queue its backend does not list. Every
such failure means the same to a caller (the path does not import), so each one becomes
:class:`NotImportable` with a reason that names the error, and each caller turns that
into its own error: a check message, a failed delivery, a broken schedule.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from jobstate.core.attempt_log import exception_message

__all__ = ["NotImportable", "import_path"]


class NotImportable(Exception):
    """``path`` does not import; ``reason`` says why, as text a message can repeat."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path!r} does not import: {reason}")
        self.path = path
        self.reason = reason


def import_path(path: str) -> Any:
    """The object at the dotted ``path`` (as :func:`~django.utils.module_loading.import_string`
    finds it); :class:`NotImportable` when it does not import, for whatever reason. An
    ``ImportError``'s reason is its message; any other error's is its class name and
    message. Errors that end a process (``SystemExit``, ``KeyboardInterrupt``) pass."""
    try:
        return import_string(path)
    except ImportError as exc:
        raise NotImportable(path, exception_message(exc)) from exc
    except Exception as exc:
        raise NotImportable(path, f"{type(exc).__name__}: {exception_message(exc)}") from exc

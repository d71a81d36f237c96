"""The signals that stop jobstate's long-running commands (a task worker, its reload
supervisor, the outbox relay), and which of them a process may take over.

A process started with a signal ignored keeps ignoring it. A background job of a shell
script (``manage.py jobstate_worker &`` in a script: a shell without job control) starts
with SIGINT ignored: the terminal's Ctrl-C reaches it together with the script, which
then stops it in its own way (usually SIGTERM). Handling that SIGINT anyway would make the
script's SIGTERM a second signal, the one that exits at once and abandons the running
tasks. Python itself leaves an inherited ignored SIGINT alone, for the same reason.
"""

from __future__ import annotations

import signal

__all__ = ["STOP_SIGNALS", "StopAtOnce", "handled_stop_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopAtOnce(SystemExit):
    """Raised by a stop-signal handler on the second signal: the operator does not want
    to wait. It ends the process wherever it interrupts it, inside the host's code too
    (a channel's send), which must let it pass where it takes a ``SystemExit`` of the
    host's own code for a bug."""


def handled_stop_signals() -> tuple[signal.Signals, ...]:
    """:data:`STOP_SIGNALS` less those this process ignores (see the module's
    docstring)."""
    return tuple(sig for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN)

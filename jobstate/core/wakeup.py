"""A wake-up flag that threads and signal handlers may set: :class:`Wakeup`.

A process's control loop sleeps until it has something to do, and a stop signal must
end that sleep at once. ``threading.Event`` cannot be set from a signal handler: Python
runs the handler on the main thread between two bytecodes, and when that thread is
inside ``Event.wait`` at that moment, holding the event's lock, the handler's
``Event.set`` waits for that same lock for ever. The process hangs: it neither works
nor stops. :class:`Wakeup` keeps no lock: setting it writes a byte into a socket pair,
waiting selects on the other end.
"""

from __future__ import annotations

import selectors
import socket
import time

__all__ = ["Wakeup"]

#: The longest single wait handed to the selector (its timeout is converted to whole
#: milliseconds of a C int); a longer wait is made of several.
_LONGEST_SELECT = 3600.0
#: Bytes :meth:`Wakeup.clear` reads at a time (one byte per wake-up).
_DRAIN = 4096


class Wakeup:
    """``set``, ``clear``, ``is_set`` and ``wait`` as ``threading.Event`` has them, safe
    from any thread and from a signal handler. :meth:`close` frees its sockets; once
    closed it is never set again."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._reader, selectors.EVENT_READ)
        self._closed = False

    def set(self) -> None:
        """Wake the waiter (now, or at its next :meth:`wait`)."""
        if self._closed:
            return
        try:
            self._writer.send(b"\0")
        except BlockingIOError:
            pass  # A full buffer of wake-ups: it is set already.
        except OSError:
            # Closed by another thread since the check above (a worker's abandoned task
            # thread ending after the worker stopped): there is nobody left to wake.
            if not self._closed:
                raise

    def clear(self) -> None:
        """Forget the wake-ups sent so far."""
        while True:
            try:
                # A short read took every byte waiting: no second call (a system call
                # and an exception) to find the socket empty.
                if len(self._reader.recv(_DRAIN)) < _DRAIN:
                    return
            except BlockingIOError:
                return

    def is_set(self) -> bool:
        return bool(self._selector.select(0))

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until set or for ``timeout`` seconds (``None``: until set); whether it
        was set. It stays set: :meth:`clear` clears it."""
        if timeout is None:
            while not self._selector.select(_LONGEST_SELECT):
                pass
            return True
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if self._selector.select(min(max(left, 0.0), _LONGEST_SELECT)):
                return True
            if left <= _LONGEST_SELECT:
                return False

    def close(self) -> None:
        self._closed = True
        self._selector.close()
        self._reader.close()
        self._writer.close()

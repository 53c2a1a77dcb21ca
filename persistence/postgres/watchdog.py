"""The client side of "every call returns within a bound": one watchdog thread per store.

It aborts a call's connection when the call outlives its deadline (``call_timeout`` plus a margin, so the
server's own timeouts normally answer first) or when the call's ``cancel`` event is set. Aborting shuts the
connection's socket down; the caller then gets a connection error at once and discards the connection.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

CANCEL_POLL = timedelta(milliseconds=5)
"""How often the watchdog looks at the ``cancel`` events of waiting calls while any are registered."""


class Watch:
    """One call under the watchdog: its connection (or None), deadline (``time.monotonic()`` seconds), cancel
    event and the event to set when it is aborted. ``reason`` is why it was aborted, if it was."""

    __slots__ = ("cancel", "conn", "deadline", "reason", "wake")

    def __init__(self, conn: Any, deadline: float, cancel: threading.Event | None, wake: threading.Event | None):
        self.conn = conn
        self.deadline = deadline
        self.cancel = cancel
        self.wake = wake
        self.reason: str | None = None


def abort_connection(conn: Any) -> None:
    """Aborts the call running on ``conn`` from another thread by shutting its socket down.

    Shutting the socket down (not closing the descriptor, which the calling thread still owns) wakes the thread
    blocked on it at once with a connection error, whatever the network does. No cancel request is sent: libpq's
    blocking cancel would stall on the same network, and the server already bounds the backend's work with the
    transaction's own ``statement_timeout``/``lock_timeout``; the backend ends when it finds the socket closed.
    """
    try:
        fd = conn.pgconn.socket
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
    except Exception:  # already closed: the caller's call has ended anyway
        pass


class Watchdog:
    """One daemon thread per store that aborts calls past their deadline or whose ``cancel`` was set.

    :meth:`enter` and :meth:`leave` are called by the calling threads; the checks run on the watchdog's own
    thread. A call's end and its abort are decided under one lock, so exactly one of them wins.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._calls: set[Watch] = set()
        self._wake_at = math.inf
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"threadloom-pg-watchdog[{name}]", daemon=True)
        self._thread.start()

    def enter(
        self,
        conn: Any,
        deadline: float,
        cancel: threading.Event | None = None,
        wake: threading.Event | None = None,
    ) -> Watch:
        """Watches a call on ``conn`` (None: a wait holding no connection) until :meth:`leave`."""
        call = Watch(conn, deadline, cancel, wake)
        with self._cond:
            self._calls.add(call)
            first_look = time.monotonic() + CANCEL_POLL.total_seconds() if cancel is not None else deadline
            if first_look < self._wake_at:
                self._cond.notify()
        return call

    def leave(self, call: Watch) -> str | None:
        """Ends the call's watch; returns why it was aborted (``"timeout"``, ``"cancel"``) or None."""
        with self._cond:
            self._calls.discard(call)
            return call.reason

    def stop(self) -> None:
        """Stops the watchdog thread (calls still watched are no longer aborted)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                wake_at = math.inf
                for call in list(self._calls):
                    if call.cancel is not None and call.cancel.is_set():
                        self._fire(call, "cancel")
                    elif now >= call.deadline:
                        self._fire(call, "timeout")
                    else:
                        wake_at = min(wake_at, call.deadline)
                        if call.cancel is not None:
                            wake_at = min(wake_at, now + CANCEL_POLL.total_seconds())
                self._wake_at = wake_at
                self._cond.wait(None if wake_at == math.inf else max(0.0, wake_at - now))
            self._wake_at = math.inf

    def _fire(self, call: Watch, reason: str) -> None:  # lock held: the caller cannot close the connection now
        call.reason = reason
        self._calls.discard(call)
        if call.conn is not None:
            abort_connection(call.conn)
        if call.wake is not None:
            call.wake.set()


__all__ = ["CANCEL_POLL", "Watch", "Watchdog", "abort_connection"]

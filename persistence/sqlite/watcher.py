"""One ``PRAGMA data_version`` watcher per SQLite store: wakes ``await_events_after`` when the file changes.

``PRAGMA data_version`` on a connection changes whenever *another* connection - of this process or any other -
committed to the file; reading it looks at the WAL index in shared memory and costs no disk read. The watcher
owns one connection that never writes, polls it every :data:`WATCH_INTERVAL` while anyone waits, and wakes
every waiter when it changes; the thread and its connection end as soon as nobody waits (the next waiter starts
them again, and everyone re-reads once the new connection has read the version). A wake makes each waiter re-read
its thread's events: the version does not say which thread changed, so a commit on another thread costs each
waiter one indexed read.

Should the watcher's connection fail, it logs ``store.watcher_lost`` and reconnects after a pause; meanwhile
``listening`` is False and waiters re-read every ``poll_interval`` as before.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from datetime import timedelta

from threadloom.persistence.logs import get_logger
from threadloom.persistence.wakeups import Waiters, Wakeups

log = get_logger("threadloom.persistence.sqlite.watcher")

WATCH_INTERVAL = timedelta(milliseconds=5)
"""How often the watcher reads ``PRAGMA data_version`` while anyone waits: the most a wake lags a commit
(plus the waiter's re-read). About 4 µs a read: 200 reads a second cost well under 0.1% of a core."""


class DataVersionWatcher:
    """Polls ``PRAGMA data_version`` on a connection of its own (made by ``connect``) on a daemon thread that runs
    while anyone waits; :meth:`stop` (the store's ``close``) ends it for good and wakes every waiter."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str) -> None:
        self.waiters = Waiters()
        self._connect = connect
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._listening = False

    def wakeups(self) -> Wakeups:
        """The registry, :meth:`start` and :attr:`listening` as one :class:`Wakeups`."""
        return Wakeups(self.waiters, start=self.start, listening=self.listening)

    def listening(self) -> bool:
        """True while the watcher's connection reads the version (wakes can be trusted)."""
        return self._listening

    def start(self) -> None:
        """Starts the watcher thread unless it runs or was stopped. Call it after registering a wake. Cheap."""
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=f"threadloom-sqlite-watcher[{self._name}]", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Stops the thread (waits at most 2 s for it) and wakes every waiter."""
        self._stopped.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        self._listening = False
        self.waiters.wake_all()

    def _run(self) -> None:
        backoff = 0.05
        while not self._stopped.is_set():
            conn: sqlite3.Connection | None = None
            try:
                conn = self._connect()
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                self._listening = True
                backoff = 0.05
                self.waiters.wake_all()  # a change before the first read is not missed: everyone re-reads
                while not self._stopped.is_set():
                    if self.waiters.count() == 0:
                        with self._lock:  # a waiter registers before it calls start(): none is missed
                            if self.waiters.count() == 0:
                                self._listening = False
                                self._thread = None
                                return
                    self._stopped.wait(WATCH_INTERVAL.total_seconds())
                    current = conn.execute("PRAGMA data_version").fetchone()[0]
                    if current != version:
                        version = current
                        self.waiters.wake_all()
            except Exception as error:  # the file went away or the connection broke: reconnect after a pause
                self._listening = False
                if not self._stopped.is_set():
                    log.warning("store.watcher_lost", op="await_events_after", error=type(error).__name__)
                    self.waiters.wake_all()  # waiters fall back to polling until it is back
                    self._stopped.wait(backoff)
                    backoff = min(backoff * 2, 2.0)
            finally:
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass


__all__ = ["WATCH_INTERVAL", "DataVersionWatcher"]

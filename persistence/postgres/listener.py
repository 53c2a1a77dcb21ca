"""``LISTEN``/``NOTIFY`` wake-ups for ``await_events_after``: one listening connection per store.

A commit whose events fit a notification sends them on the schema's events channel at COMMIT (a JSON array of
their stored texts, in ``seq`` order); a bigger commit, and a delete, ``pg_notify`` the schema's channel with the
thread id - but only while a listener is registered on the schema (``tl_listen``, sent with the ``LISTEN`` and
committed with it: a commit nobody listens for sends nothing, so commits need not wait for each other's
notification). The store's :class:`Listener` owns one dedicated connection (never a pooled one) on a thread of its
own, listens on both, registers, and wakes the :class:`Waiters` of the named thread, handing them the events a
notification carried. A notification is only a hint: a waiter whose position the carried events do not continue
re-reads, and so does any waiter told only the thread id; a lost one costs at most the wait's timeout; whenever the
listener (re-)establishes its connection it wakes every waiter, since notifications sent while it was down are lost.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from threadloom.persistence.logs import get_logger
from threadloom.persistence.postgres.watchdog import abort_connection
from threadloom.persistence.wakeups import Waiters

log = get_logger("threadloom.persistence.postgres.listener")

LISTENER_POLL = timedelta(milliseconds=250)
"""How long the listener thread blocks for notifications before it checks whether the store closed."""

LISTENER_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
"""TCP keepalives of the listening connection (libpq parameters; the caller's own settings win): a connection
whose peer vanished without a reset fails within about 25 s and is re-established."""

LISTENER_BACKOFF_MAX = timedelta(seconds=2)
"""Longest pause between attempts to re-establish a lost listening connection."""


def listen_connection(pool: Any, connect_timeout: timedelta) -> Any:
    """A new autocommit connection to ``pool``'s server, with the pool's settings and TCP keepalives."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    kwargs = dict(pool.kwargs or {})
    kwargs.update(autocommit=True, connect_timeout=max(2, math.ceil(connect_timeout.total_seconds())))
    try:
        given = conninfo_to_dict(pool.conninfo)
    except Exception:
        given = {}
    for name, value in LISTENER_KEEPALIVES.items():  # a silently dead peer is noticed, then replaced
        if name not in given:
            kwargs.setdefault(name, value)
    kwargs.pop("row_factory", None)
    kwargs.pop("cursor_factory", None)
    return psycopg.Connection.connect(pool.conninfo, **kwargs)


class Listener:
    """Owns the store's dedicated ``LISTEN`` connection on a daemon thread of its own, started on first use.

    ``on_notify(thread_id)`` and ``on_ready()`` run on the listener's thread: the first for each notification
    on ``channel``, the second whenever the connection is (re-)established or lost (waiters then re-read or fall
    back to polling). With ``events_channel``, ``on_events(payload)`` runs for each notification on that channel.
    ``register`` is a statement sent in the same message as the ``LISTEN`` (one transaction): the schema's
    ``tl_listen()``. ``ready`` is set while the connection listens; ``backend_pid`` names its server process (the
    latest one, also once the connection is gone: what the registration names).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        channel: str,
        on_notify: Callable[[str], None],
        on_ready: Callable[[], None],
        name: str,
        *,
        events_channel: str | None = None,
        on_events: Callable[[str], None] | None = None,
        register: str | None = None,
    ) -> None:
        self._connect = connect
        self._register = register
        self._channel = channel
        self._events_channel = events_channel
        self._on_events = on_events
        self._on_notify = on_notify
        self._on_ready = on_ready
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._conn: Any = None
        self.ready = threading.Event()
        self.backend_pid: int | None = None

    def start(self) -> None:
        """Starts the listener thread unless it runs or was stopped (called by every waiter; cheap)."""
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=f"threadloom-pg-listener[{self._name}]", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Stops the thread and closes its connection (waits at most 2 s for the thread)."""
        self._stopped.set()
        with self._lock:  # the listener closes its connection under this lock: the descriptor is still ours
            thread = self._thread
            if self._conn is not None:
                abort_connection(self._conn)
        if thread is not None:
            thread.join(timeout=2)

    def _run(self) -> None:
        from psycopg import sql

        backoff = 0.05
        while not self._stopped.is_set():
            conn = None
            try:
                conn = self._connect()
                with self._lock:
                    if self._stopped.is_set():
                        break
                    self._conn = conn
                events_channel, on_events = self._events_channel, self._on_events
                channels = [self._channel] if events_channel is None else [self._channel, events_channel]
                # One request for every channel and the registration: one transaction, so the connection listens on
                # all of them, registered, once it is answered.
                statements = [sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in channels]
                if self._register is not None:
                    statements.append(sql.SQL(self._register))  # type: ignore[arg-type]  # rendered by the store
                conn.execute(sql.SQL("; ").join(statements))
                self.backend_pid = conn.info.backend_pid
                self.ready.set()
                backoff = 0.05
                self._on_ready()
                while not self._stopped.is_set():
                    for notify in conn.notifies(timeout=LISTENER_POLL.total_seconds()):
                        if on_events is not None and notify.channel == events_channel:
                            on_events(notify.payload)
                        else:
                            self._on_notify(notify.payload)
            except Exception as error:  # the connection died or could not be made: re-establish it
                self.ready.clear()
                if not self._stopped.is_set():
                    log.warning("store.listener_lost", op="await_events_after", error=type(error).__name__)
                    self._on_ready()  # waiters fall back to polling until it is back
                    self._stopped.wait(backoff)
                    backoff = min(backoff * 2, LISTENER_BACKOFF_MAX.total_seconds())
            finally:
                self.ready.clear()
                with self._lock:
                    self._conn = None
                    if conn is not None:
                        try:
                            conn.close()
                        except Exception:
                            pass


__all__ = ["LISTENER_BACKOFF_MAX", "LISTENER_KEEPALIVES", "LISTENER_POLL", "Listener", "Waiters", "listen_connection"]

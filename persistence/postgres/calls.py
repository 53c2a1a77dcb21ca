"""``Database``: the package's one way to run a statement - a bounded call on a pooled connection.

The store (:mod:`~threadloom.persistence.postgres.store`), its run queue (:mod:`~threadloom.persistence.postgres.queue`)
and the migrations (:mod:`~threadloom.persistence.postgres.schema`) all call through one ``Database``; none
reaches into another's internals. Its interface, internal to the package:

* :meth:`Database.render` - a SQL template with ``{s}`` (the schema), ``{channel}`` (the notification channel),
  ``{queue_lock}`` and ``{listen_lock}`` filled in, quoted by ``psycopg.sql``;
* :meth:`Database.call` - one statement as one transaction in one round trip, under the call bound, its errors
  mapped by :func:`~threadloom.persistence.postgres.errors.map_error`;
* :meth:`Database.checkout`, :meth:`Database.give_back`, :meth:`Database.error` and ``watchdog`` - for a caller
  that runs several statements on one connection (the migrations);
* :meth:`Database.close` - stops the watchdog and closes a pool the store owns;
* :func:`as_utc` - a time the driver returned, as aware UTC.

How a call runs:

* It takes a pooled connection (psycopg 3 + psycopg_pool; each call its own) in autocommit mode, and first
  makes sure, without a round trip, that the connection has not been ended while it sat idle
  (:func:`ended_while_idle`): the server ends a session by sending its last words and closing the socket (a
  restart, a failover, ``pg_terminate_backend``, ``idle_session_timeout``), and a reset network path closes it,
  so the socket of such a connection is readable although no call is running on it. Every such connection
  met is discarded (the pool opens a replacement) and the next one is taken, within ``connect_timeout``: a
  fault between calls costs no call, and a write is never sent on a connection known dead.
* With a pool of the store's own, the server-side limits (``statement_timeout``, ``lock_timeout``,
  ``idle_in_transaction_session_timeout``, all ``call_timeout``) are session settings its ``configure`` callback
  set once per connection, so a write is a single prepared statement with binary parameters. Over a caller's pool
  the store never changes the connections' sessions: each message then carries ``SET TRANSACTION ISOLATION
  LEVEL READ COMMITTED`` and ``SET LOCAL`` of the limits before the statement (client-side binding, no
  server-side prepared statements: fit for transaction-mode poolers).
* A read is one statement in a ``REPEATABLE READ READ ONLY`` transaction: ``SET TRANSACTION`` and the
  ``SELECT`` in one message; a ``prepared`` read (one ``SELECT`` that reads one snapshot by itself:
  ``latest``, ``checkpoint``, ``history``, a walk's stamp source) runs on the store's own pool as a write does.
* The watchdog enforces the client-side deadline (``call_timeout`` plus a margin) and a call's ``cancel``: it
  aborts the call's connection, which is then discarded, never returned to the pool.
"""

from __future__ import annotations

import functools
import select
import struct
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from threadloom.domain.errors import StoreClosed, ThreadloomError
from threadloom.persistence.postgres import conninfo
from threadloom.persistence.postgres.config import PostgresCheckpointerConfig
from threadloom.persistence.postgres.errors import map_error
from threadloom.persistence.postgres.sql import LISTEN_LOCK_CLASS, QUEUE_LOCK_CLASS
from threadloom.persistence.postgres.watchdog import Watchdog

if TYPE_CHECKING:  # pragma: no cover
    from psycopg_pool import ConnectionPool


class ConnectFailures:
    """Why the latest attempt to open a connection failed (None once one succeeds), for the store's own pool.

    :meth:`connection_class` is the ``connection_class`` given to the pool: psycopg's ``Connection`` that also
    records the first line of each failure, so a call that finds no connection can say why.
    """

    def __init__(self) -> None:
        self.last: str | None = None

    def connection_class(self) -> type[Any]:
        """A ``psycopg.Connection`` subclass whose ``connect`` records its outcome here."""
        import psycopg

        failures = self

        class RecordingConnection(psycopg.Connection):
            @classmethod
            def connect(cls, *args: Any, **kwargs: Any) -> Any:
                try:
                    conn = super().connect(*args, **kwargs)
                except Exception as error:
                    failures.last = conninfo.first_line(error) or type(error).__name__
                    raise
                failures.last = None
                return conn

        RecordingConnection.__qualname__ = "RecordingConnection"  # as the pool's log lines name it
        return RecordingConnection


def ended_while_idle(conn: Any) -> bool:
    """Whether an idle connection is known to be dead, without a round trip to the server.

    True when psycopg knows it closed or broken, or when its socket is readable: nothing is running on an idle
    connection, so the server has nothing to say on it unless it ended the session (its last message and the
    close, or a reset of the path). False says only that no end was seen: a path that died silently shows up
    as the call's own failure.
    """
    if conn.closed or conn.broken:
        return True
    try:
        fd = conn.pgconn.socket
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        readable, _, _ = select.select([fd], [], [], 0)
        return bool(readable)
    except Exception:  # no socket: it is not usable either
        return True


class TextArray(list[str]):
    """A list of str sent as a ``text[]`` parameter; on the store's own pool in PostgreSQL's binary array format,
    built at once (:func:`text_array_dumper`), without psycopg's per-call look at the elements of a plain list.

    Anywhere else (a caller's pool, text parameters) it is dumped as the list it is.
    """

    __slots__ = ()


_TEXT_OID = 25
_TEXT_ARRAY_OID = 1009
_ARRAY_HEAD = struct.Struct("!iiIii")  # dimensions (1), has-nulls (0), element type, length, lower bound (1)
_EMPTY_ARRAY = struct.pack("!iiI", 0, 0, _TEXT_OID)  # no dimension: an empty text[]
_LENGTH = struct.Struct("!i")


@functools.cache
def text_array_dumper() -> type[Any]:
    """The psycopg binary dumper of :class:`TextArray` (its elements str, none None), registered on each connection
    of the store's own pool: ``conn.adapters.register_dumper(TextArray, text_array_dumper())``."""
    from psycopg import adapt, pq

    class TextArrayDumper(adapt.Dumper):
        format = pq.Format.BINARY
        oid = _TEXT_ARRAY_OID

        def __init__(self, cls: type, context: Any = None) -> None:
            super().__init__(cls, context)
            conn = self.connection
            self._encoding = conn.info.encoding if conn is not None else "utf-8"

        def dump(self, obj: Any) -> bytes:
            if not obj:
                return _EMPTY_ARRAY
            encoding, length = self._encoding, _LENGTH.pack
            parts = [_ARRAY_HEAD.pack(1, 0, _TEXT_OID, len(obj), 1)]
            for text in obj:
                data = text.encode(encoding)
                parts.append(length(len(data)))
                parts.append(data)
            return b"".join(parts)

    return TextArrayDumper


def as_utc(when: datetime) -> datetime:
    """A ``timestamptz`` the driver returned (aware, in the session's time zone) as aware UTC."""
    return when.astimezone(UTC)


class Database:
    """Bounded calls on the connections of one pool, for one schema (see the module docstring).

    Safe to call from any number of threads. Build it with psycopg importable.

    Args:
        pool: the pool to take connections from.
        config: schema, call bound and connect timeout.
        owns_pool: whether the pool is the store's own (its connections carry the limits as session settings,
            and :meth:`close` closes it).
        secrets: every form of the connection string's password, scrubbed from error text.
        failures: where the store's own pool records why its attempts to connect failed (None for a caller's
            pool).
    """

    def __init__(
        self,
        pool: ConnectionPool,
        config: PostgresCheckpointerConfig,
        *,
        owns_pool: bool,
        secrets: tuple[str, ...],
        failures: ConnectFailures | None = None,
    ) -> None:
        from psycopg import ClientCursor, sql
        from psycopg.rows import tuple_row

        self.pool = pool
        self.config = config
        self.owns_pool = owns_pool
        self.closed = False
        """Set by :meth:`close`: a call that then finds no connection is :class:`StoreClosed`."""
        self.watchdog = Watchdog(config.schema)
        self._secrets = secrets
        self._failures = failures
        self._cursor = ClientCursor
        self._tuple_row = tuple_row
        self._connect_s = config.connect_timeout.total_seconds()
        limits = "" if owns_pool else config.limits("SET LOCAL")
        self._write_prefix = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; " + limits
        self._read_prefix = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; " + limits
        self._values = {
            "s": sql.Identifier(config.schema),
            "channel": sql.Literal(config.channel),
            "events_channel": sql.Literal(config.events_channel),
            "queue_lock": sql.Literal(QUEUE_LOCK_CLASS),
            "listen_lock": sql.Literal(LISTEN_LOCK_CLASS),
        }
        self._sql = sql
        self._binary: dict[str, str] = {}

    def render(self, template: str) -> str:
        """``template`` with ``{s}``, ``{channel}``, ``{events_channel}``, ``{queue_lock}`` and ``{listen_lock}``
        filled in (literal braces doubled)."""
        return self._sql.SQL(template).format(**self._values).as_string(None)

    def cursor(self, conn: Any) -> Any:
        """A client-side-binding cursor on ``conn`` returning tuples."""
        return self._cursor(conn, row_factory=self._tuple_row)

    def error(
        self,
        error: BaseException,
        operation: str,
        thread_id: str | None,
        *,
        write: bool,
        aborted: str | None,
        broken: bool | None = None,
        answered: bool = False,
    ) -> ThreadloomError:
        """:func:`~threadloom.persistence.postgres.errors.map_error` with this store's bound and secrets, and why
        the last attempt to connect failed."""
        return map_error(
            error,
            operation=operation,
            thread_id=thread_id,
            write=write,
            aborted=aborted,
            call_timeout=self.config.call_timeout,
            scrub=lambda text: conninfo.scrub(self._secrets, text),
            broken=broken,
            answered=answered,
            connect_failure=self._failures.last if self._failures is not None else None,
        )

    def checkout(self, operation: str, thread_id: str | None) -> tuple[Any, bool]:
        """A live connection from the pool in autocommit mode, and whether to restore manual commit on return.

        Every connection :func:`ended_while_idle` that the pool hands out is discarded and the next one taken,
        all within ``connect_timeout``.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: no live connection within ``connect_timeout`` (naming why the last attempt to
                connect failed, when the store's own pool made one).
        """
        deadline = time.monotonic() + self._connect_s
        while True:
            try:
                conn = self.pool.getconn(timeout=max(0.001, deadline - time.monotonic()))
            except Exception as error:
                if self.closed:
                    raise StoreClosed(operation, "the store is closed; open a new one") from None
                raise self.error(error, operation, thread_id, write=False, aborted=None) from None
            if not ended_while_idle(conn):
                break
            self.give_back(conn, discard=True)
        restore = False
        try:
            if not conn.autocommit:
                conn.autocommit = True
                restore = True
        except Exception as error:
            self.give_back(conn, discard=True)
            raise self.error(error, operation, thread_id, write=False, aborted=None) from None
        return conn, restore

    def give_back(self, conn: Any, *, discard: bool, restore: bool = False) -> None:
        """Returns ``conn`` to the pool: closed first when ``discard``, in manual-commit mode when ``restore``."""
        try:
            if discard:
                conn.close()
            elif restore:
                conn.autocommit = False
        except Exception:
            conn.close()
        try:
            self.pool.putconn(conn)
        except Exception:  # a closed pool: the connection is closed with it
            try:
                conn.close()
            except Exception:
                pass

    def call(
        self,
        operation: str,
        thread_id: str | None,
        statement: str,
        params: Sequence[Any],
        *,
        write: bool,
        cancel: threading.Event | None = None,
        rollback: bool = False,
        prepared: bool = False,
        single: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Runs one rendered statement as one transaction in one round trip and returns its rows.

        Args:
            operation: the store method, named in errors.
            thread_id: the thread the call is about (named in errors), or None.
            statement: SQL with ``%s`` placeholders, from :meth:`render`.
            params: one value per placeholder.
            write: a write runs READ COMMITTED (on the store's own pool: one prepared statement with binary
                parameters); a read runs REPEATABLE READ READ ONLY.
            cancel: aborts the call when set (its connection is discarded).
            rollback: run the statement in a transaction that is rolled back: its rows, nothing changed (a dry
                run of a write).
            prepared: a read that is one ``SELECT`` (one snapshot however it runs) and is called often, such as
                a walk's: on the store's own pool it runs as a write does (one prepared statement with binary
                parameters, READ COMMITTED), which costs the server and the client about a third of the
                ``SET TRANSACTION`` message; its errors are a read's.
            single: (a read) the statement is one ``SELECT`` that reads one snapshot by itself: on the store's own
                pool it runs as a prepared statement on its own, with text parameters and results (no ``SET
                TRANSACTION`` before it, no parse or plan per call).

        Raises:
            ThreadloomError: the mapped failure (see :mod:`~threadloom.persistence.postgres.errors`).
        """
        from psycopg import pq

        conn, restore = self.checkout(operation, thread_id)
        watch = self.watchdog.enter(conn, time.monotonic() + self.config.deadline_s, cancel)
        answered = False  # the server answered the statement: an error from here on came reading its rows
        try:
            if rollback:  # a dry run: the statement's rows, then ROLLBACK
                cur = self.cursor(conn)
                with conn.transaction(force_rollback=True):
                    cur.execute((self._write_prefix if write else self._read_prefix) + statement, params)
                    answered = True
                    while cur.nextset():
                        pass
                    rows = cur.fetchall()
            elif (write or prepared) and self.owns_pool:  # one prepared statement: its own implicit transaction
                binary = self._binary.get(statement)
                if binary is None:  # binary parameters: bodies are sent as they are, never escaped
                    binary = self._binary[statement] = statement.replace("%s", "%b")
                cur = conn.execute(binary, params, prepare=True, binary=True)
                answered = True
                rows = cur.fetchall()
            elif single and self.owns_pool:  # one prepared SELECT: one snapshot whatever the isolation level
                cur = conn.execute(statement, params, prepare=True)
                answered = True
                rows = cur.fetchall()
            else:
                cur = self.cursor(conn)
                cur.execute((self._write_prefix if write else self._read_prefix) + statement, params)
                answered = True
                while cur.nextset():
                    pass
                rows = cur.fetchall()
        except BaseException as error:
            aborted = self.watchdog.leave(watch)
            lost = bool(conn.closed or conn.broken)
            broken = aborted is not None or lost or conn.info.transaction_status != pq.TransactionStatus.IDLE
            self.give_back(conn, discard=broken, restore=restore)
            if isinstance(error, Exception):
                raise self.error(
                    error, operation, thread_id, write=write, aborted=aborted, broken=lost, answered=answered
                ) from None
            raise
        aborted = self.watchdog.leave(watch)
        self.give_back(conn, discard=aborted is not None, restore=restore)  # it answered; its socket may be shut
        return rows

    def close(self) -> None:
        """Stops the watchdog and closes the pool when it is the store's own (waits up to ``connect_timeout``)."""
        self.closed = True
        self.watchdog.stop()
        if self.owns_pool:
            try:
                self.pool.close(timeout=self._connect_s)
            except Exception:
                pass


__all__ = ["ConnectFailures", "Database", "as_utc", "ended_while_idle"]

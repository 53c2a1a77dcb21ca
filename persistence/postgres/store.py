"""``PostgresCheckpointer``: the store shared by every runtime on every machine (seeds 003; DESIGN §3 "Stores").

Threads, checkpoint histories, pending writes, event logs, effect records and claims live in one PostgreSQL
schema (``PostgresCheckpointerConfig.schema``, or ``?schema=name`` in the URL given to
:meth:`PostgresCheckpointer.open`) that the store creates and migrates itself. It behaves exactly
like :class:`~threadloom.persistence.memory.InMemoryCheckpointer` except that **the database decides time**:
claim expiry, ``updated_at``, tombstone age and retention age are judged by the server's ``clock_timestamp()``,
read once a call holds its row locks.

How a call runs (one round trip, one transaction):

* Every call takes a pooled connection (psycopg 3 + psycopg_pool; each call its own) in autocommit mode.
* A write is one PL/pgSQL function (``tl_commit``, ``tl_claim``, ``tl_delete``…, see
  :mod:`~threadloom.persistence.postgres.sql`) called in one statement: it locks the thread's row, checks
  token, fence and parent, numbers events from the row and writes the JSON texts it was given.
* The server-side limits (``statement_timeout``, ``lock_timeout``, ``idle_in_transaction_session_timeout``, all
  ``call_timeout``) are set, with a pool of the store's own, once per connection by the pool's ``configure``
  callback, so a write is a single prepared statement with binary parameters. Over a caller's pool
  (:meth:`PostgresCheckpointer.create`) the store never changes the connections' sessions: each message then
  carries ``SET TRANSACTION ISOLATION LEVEL READ COMMITTED`` and ``SET LOCAL`` of the limits before the
  statement (client-side binding, no server-side prepared statements: fit for transaction-mode poolers).
* A read is one statement in a ``REPEATABLE READ READ ONLY`` transaction: ``SET TRANSACTION`` and the
  ``SELECT`` in one message.
* A watchdog thread enforces the client-side deadline (``call_timeout`` plus a margin, so the server's own
  timeouts normally answer first) and ``await_events_after``'s ``cancel``: it aborts the call's connection (its
  socket shut down), and the connection is discarded, never returned to the pool.
* ``await_events_after`` waits on ``LISTEN``: one dedicated connection per store, owned by a listener thread
  that re-establishes it if it dies; commits and deletes ``pg_notify`` the schema's channel with the thread id
  at COMMIT. The notification is only a hint: the waiter re-reads.

The durable run queue (DESIGN §4) lives in the same schema: ``store.queue`` is a
:class:`~threadloom.persistence.postgres.queue.PostgresRunQueue` whose calls run through this store's bounded
calls and error mapping (leases with ``FOR UPDATE SKIP LOCKED``, one function call each); ``prune`` and ``sweep``
keep the newest checkpoint of every run an open entry recorded, read in their own transaction.

psycopg is imported lazily, so ``from threadloom import PostgresCheckpointer`` works without the ``postgres``
extra; :meth:`PostgresCheckpointer.open` then raises ``ProcessingError`` naming the extra.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import attrs
from threadloom.persistence.logs import get_logger as _safe_logger

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.clock import duration_micros
from threadloom.domain.errors import (
    CancelledError,
    CheckpointConflict,
    CheckpointNotFound,
    InvalidCommit,
    OutcomeUnknown,
    ProcessingError,
    StaleClaim,
    ThreadBusy,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.values import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventRecord,
    RetentionPolicy,
    RunClaim,
    StoredCheckpoint,
    SweepGuard,
    SweepPage,
    SweepPolicy,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
    ThreadStatus,
    ThreadSummary,
)
from threadloom.persistence import codec
from threadloom.persistence.postgres import sql as q
from threadloom.persistence.base import StoreBase, ask_guard
from threadloom.persistence.encoded import EncodedCommit
from threadloom.persistence.postgres.queue import PostgresRunQueue

if TYPE_CHECKING:  # pragma: no cover
    from psycopg_pool import ConnectionPool

log = _safe_logger("threadloom.persistence.postgres.store")

_SCHEMA_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEADLINE_MARGIN = timedelta(milliseconds=250)
"""How long after ``call_timeout`` the client aborts a call the server has not answered (the server's own
``statement_timeout``/``lock_timeout`` answer first when it is reachable). Capped at a quarter of
``call_timeout``."""

CANCEL_POLL = timedelta(milliseconds=5)
"""How often the watchdog looks at the ``cancel`` events of waiting calls while any are registered."""

LISTENER_POLL = timedelta(milliseconds=250)
"""How long the listener thread blocks for notifications before it checks whether the store closed."""

LISTENER_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
"""TCP keepalives of the listening connection (libpq parameters; the caller's own settings win): a connection
whose peer vanished without a reset fails within about 25 s and is re-established."""

LISTENER_BACKOFF_MAX = timedelta(seconds=2)
"""Longest pause between attempts to re-establish a lost listening connection."""


def _check_schema(_inst: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, str):
        raise ValidationError("config.schema", (f"must be a str, got {type(value).__name__}",))
    problems = []
    if not _SCHEMA_RE.fullmatch(value):
        problems.append("must be an identifier: a letter or underscore, then letters, digits or underscores")
    if len(value.encode()) > 63:
        problems.append("must be at most 63 bytes (PostgreSQL's identifier limit)")
    if value.lower().startswith("pg_"):
        problems.append("must not start with pg_ (reserved for system schemas)")
    if problems:
        raise ValidationError("config.schema", tuple(problems))


def _check_size(field: str, low: int):
    return lambda _inst, _attr, value: v.check_int(field, value, low=low, high=10_000)


MIN_CALL_TIMEOUT = timedelta(milliseconds=10)
"""Shortest ``call_timeout``: below it a call cannot even reach a nearby server (and the migration at
:meth:`PostgresCheckpointer.open` would always time out)."""

MAX_CALL_TIMEOUT = timedelta(days=1)
"""Longest ``call_timeout``: it is set on the server in milliseconds (``statement_timeout`` and the other two
limits are ``int4``, at most about 24.8 days), and a call that may run a day is no longer bounded in any
useful sense."""

MIN_CONNECT_TIMEOUT = timedelta(milliseconds=10)
"""Shortest ``connect_timeout``: the wait for a pooled connection."""

MAX_CONNECT_TIMEOUT = timedelta(minutes=10)
"""Longest ``connect_timeout``: :meth:`PostgresCheckpointer.open` may wait this long for a server, and every
call this long for a free connection."""


def _check_bounded(field: str, low: timedelta, high: timedelta):
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if isinstance(value, timedelta) and value > high:
            raise ValidationError(field, (f"must be at most {high.total_seconds():g} s ({high}), got {value}",))
        v.check_positive_duration(field, value)
        if value < low:
            raise ValidationError(field, (f"must be at least {low.total_seconds():g} s, got {value}",))

    return check


def _check_flag(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValidationError(field, (f"must be True or False, got {type(value).__name__}",))


@attrs.frozen(kw_only=True)
class PostgresCheckpointerConfig:
    """How a :class:`PostgresCheckpointer` reaches and bounds its database (DESIGN §2 "Constructors").

    Attributes:
        schema: the schema holding the store's tables: an identifier (letters, digits, underscores; not
            ``pg_…``; at most 63 bytes), always quoted in SQL. Stores on one schema share one storage.
        min_size: connections :meth:`PostgresCheckpointer.open`'s own pool keeps open (>= 0).
        max_size: most connections that pool opens (>= 1, >= ``min_size``). The listener of
            ``await_events_after`` uses one more, outside the pool.
        connect_timeout: longest wait for a connection (opening one, or taking one from the pool): 10 ms to
            10 minutes (:data:`MIN_CONNECT_TIMEOUT`, :data:`MAX_CONNECT_TIMEOUT`).
        call_timeout: longest a call may run on its connection: set on the server for each transaction
            (``statement_timeout``, ``lock_timeout``, ``idle_in_transaction_session_timeout``) and enforced on
            the client (seeds 003: "Every call returns within a bound"): 10 ms to 1 day
            (:data:`MIN_CALL_TIMEOUT`, :data:`MAX_CALL_TIMEOUT`; the server takes these limits in ``int4``
            milliseconds).
        create: create the schema and its tables when it holds no store yet (default). False: such a schema is
            refused with a ProcessingError and nothing is created, as a read-only tool wants (a store already
            there is still migrated to this version).

    Raises:
        ValidationError: a field out of range, naming it (``config.schema``, ``config.max_size``…).
    """

    schema: str = attrs.field(default="threadloom", validator=_check_schema)
    min_size: int = attrs.field(default=1, validator=_check_size("config.min_size", 0))
    max_size: int = attrs.field(default=10, validator=_check_size("config.max_size", 1))
    connect_timeout: timedelta = attrs.field(
        default=timedelta(seconds=5),
        validator=_check_bounded("config.connect_timeout", MIN_CONNECT_TIMEOUT, MAX_CONNECT_TIMEOUT),
    )
    call_timeout: timedelta = attrs.field(
        default=timedelta(seconds=10),
        validator=_check_bounded("config.call_timeout", MIN_CALL_TIMEOUT, MAX_CALL_TIMEOUT),
    )
    create: bool = attrs.field(default=True, validator=lambda _i, _a, value: _check_flag("config.create", value))

    def __attrs_post_init__(self) -> None:
        if self.max_size < self.min_size:
            raise ValidationError(
                "config.max_size", (f"must be at least min_size ({self.min_size}), got {self.max_size}",)
            )

    @property
    def channel(self) -> str:
        """The ``LISTEN``/``NOTIFY`` channel of the schema: ``threadloom.<schema>`` (hashed when too long)."""
        name = f"threadloom.{self.schema}"
        if len(name.encode()) <= 63:
            return name
        return "threadloom." + hashlib.sha256(self.schema.encode()).hexdigest()[:40]


# -- error mapping: the one place driver errors become ours ------------------------------------------------------

_CONNECTION_LOST = frozenset({"57P01", "57P02", "57P03", "25P03"})
_SCHEMA_MISSING = frozenset({"3F000", "42P01"})
_SCHEMA_MISMATCH = frozenset({"42883", "42703", "42804"})


def _is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` is psycopg's own report of a connection that failed (``OperationalError``)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - then it cannot be one of psycopg's errors
        return False
    return isinstance(error, psycopg.OperationalError)


def map_error(
    error: BaseException,
    *,
    operation: str,
    thread_id: str | None,
    write: bool,
    aborted: str | None = None,
    call_timeout: timedelta | None = None,
    scrub: Callable[[str], str] = lambda text: text,
    broken: bool | None = None,
    answered: bool = False,
) -> ThreadloomError:
    """The threadloom error for a failure of a database call: the only place psycopg errors are classified.

    Classified by SQLSTATE (never by message text), by why the watchdog aborted the call, if it did, and, for an
    error without a SQLSTATE (raised by the client, not the server), by the state of the call's connection:

    * ``aborted == "cancel"``: :class:`CancelledError` (the caller's ``cancel`` was set).
    * ``aborted == "timeout"``, or a lost connection (class ``08``, ``57P01``-``57P03``, ``25P03``; or no
      SQLSTATE and the connection is broken, or, when ``broken`` is not known, psycopg's ``OperationalError``):
      for a write, :class:`OutcomeUnknown` (its COMMIT may have landed), else :class:`ProcessingError`.
    * a client-side error on a connection that is still sound (no SQLSTATE: psycopg's ``DataError`` or
      ``ProgrammingError`` while converting a value, ``InterfaceError``, any other exception): nothing was sent,
      so :class:`ProcessingError` - except when the statement had already been ``answered`` (the error came
      while reading its rows) and it was a write, which then applied: :class:`OutcomeUnknown`.
    * a server error (any other SQLSTATE): the transaction rolled back, so :class:`ProcessingError`, worded
      for timeouts (``57014``, ``55P03``), conflicts (class ``40``), a missing schema or table (``3F000``,
      ``42P01``), a schema whose functions or columns do not match this version (``42883``, ``42703``,
      ``42804``) and the rest.
    * the pool (``PoolTimeout``, ``PoolClosed``): :class:`ProcessingError`.
    * a :class:`ThreadloomError` is returned unchanged.

    Args:
        operation: the store method, named in the error.
        thread_id: the thread the call was about, named in the message when given.
        write: whether the call writes (only a write can be :class:`OutcomeUnknown`).
        aborted: ``"timeout"`` or ``"cancel"`` when the watchdog aborted the call's connection.
        call_timeout: the bound, named in timeout messages.
        scrub: removes secrets (the DSN's password) from driver text.
        broken: whether the call's connection is closed or broken after the error (None: not known).
        answered: whether the server had answered the statement (the error came while reading its rows).

    Returns:
        The error to raise (the caller raises it ``from`` the driver's error).
    """
    if isinstance(error, ThreadloomError):
        return error
    where = f" on thread {thread_id!r}" if thread_id is not None else ""
    bound = f"{call_timeout.total_seconds():g} s" if call_timeout is not None else "the call timeout"
    if aborted == "cancel":
        return CancelledError(operation)
    sqlstate = getattr(error, "sqlstate", None)
    detail = scrub(_first_line(error))
    kind = type(error).__name__
    if kind in ("PoolTimeout", "TooManyRequests"):
        return ProcessingError(
            operation, f"no database connection became free within the connect timeout{where} ({detail})"
        )
    if kind == "PoolClosed":
        return ProcessingError(operation, f"the connection pool is closed{where}; open a new store")
    if aborted == "timeout":
        message = f"no answer from the database within {bound}{where}; the connection was aborted and discarded"
        return OutcomeUnknown(operation, message) if write else ProcessingError(operation, message)
    if sqlstate is None:
        lost = broken if broken is not None else _is_connection_error(error)
    else:
        lost = sqlstate.startswith("08") or sqlstate in _CONNECTION_LOST
    if lost:
        message = f"the database connection was lost{where} ({detail or kind})"
        return OutcomeUnknown(operation, message) if write else ProcessingError(operation, message)
    if sqlstate is None:  # raised by the client on a sound connection: a value it could not convert, a misuse
        text = f"{kind}: {detail}" if detail else kind
        if answered and write:
            return OutcomeUnknown(
                operation, f"the database applied the call{where}, but its answer could not be read ({text})"
            )
        if answered:
            return ProcessingError(operation, f"the database's answer{where} could not be read ({text})")
        return ProcessingError(
            operation, f"the database driver refused the call's values{where}; nothing was sent ({text})"
        )
    if sqlstate == "57014":
        return ProcessingError(operation, f"the database cancelled the call{where} after {bound} ({detail})")
    if sqlstate == "55P03":
        return ProcessingError(
            operation, f"a lock{where} stayed held by another transaction for {bound}; nothing was written"
        )
    if sqlstate.startswith("40"):
        return ProcessingError(operation, f"a conflicting transaction{where} made the database roll back ({detail})")
    if sqlstate in _SCHEMA_MISSING:
        return ProcessingError(
            operation, f"the store's schema or one of its tables is missing{where}: was it dropped? ({detail})"
        )
    if sqlstate in _SCHEMA_MISMATCH:
        return ProcessingError(
            operation,
            f"the store's schema or functions do not match this version{where} ([{sqlstate}] {detail})"
            + ("; nothing was written" if write else ""),
        )
    return ProcessingError(operation, f"the database failed{where}: [{sqlstate}] {detail}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _utc(when: datetime) -> datetime:
    return when.astimezone(UTC)



# -- the watchdog: client-side deadlines and cancellation --------------------------------------------------------


class _Call:
    __slots__ = ("cancel", "conn", "deadline", "reason", "wake")

    def __init__(self, conn: Any, deadline: float, cancel: threading.Event | None, wake: threading.Event | None):
        self.conn = conn
        self.deadline = deadline
        self.cancel = cancel
        self.wake = wake
        self.reason: str | None = None


def _abort_connection(conn: Any) -> None:
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


class _Watchdog:
    """One thread per store that aborts calls past their deadline or whose ``cancel`` was set.

    Runs on its own daemon thread; :meth:`enter` and :meth:`leave` are called by the calling threads. A call's
    end and its abort are decided under one lock, so exactly one of them wins.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._calls: set[_Call] = set()
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
    ) -> _Call:
        call = _Call(conn, deadline, cancel, wake)
        with self._cond:
            self._calls.add(call)
            first_look = time.monotonic() + CANCEL_POLL.total_seconds() if cancel is not None else deadline
            if first_look < self._wake_at:
                self._cond.notify()
        return call

    def leave(self, call: _Call) -> str | None:
        """Ends the call's watch; returns why it was aborted (``"timeout"``, ``"cancel"``) or None."""
        with self._cond:
            self._calls.discard(call)
            return call.reason

    def stop(self) -> None:
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

    def _fire(self, call: _Call, reason: str) -> None:  # lock held: the caller cannot close the connection now
        call.reason = reason
        self._calls.discard(call)
        if call.conn is not None:
            _abort_connection(call.conn)
        if call.wake is not None:
            call.wake.set()


# -- the listener: one LISTEN connection per store ---------------------------------------------------------------


class _Listener:
    """Owns the store's dedicated ``LISTEN`` connection on a thread of its own (never a pooled connection).

    It wakes the waiters of a thread id when a notification names it, and every waiter whenever it
    (re-)establishes the connection, since notifications sent while it was down are lost (the waiters re-read).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        channel: str,
        on_notify: Callable[[str], None],
        on_ready: Callable[[], None],
        name: str,
    ) -> None:
        self._connect = connect
        self._channel = channel
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
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=f"threadloom-pg-listener[{self._name}]", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:  # the listener closes its connection under this lock: the descriptor is still ours
            thread = self._thread
            if self._conn is not None:
                _abort_connection(self._conn)
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
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                self.backend_pid = conn.info.backend_pid
                self.ready.set()
                backoff = 0.05
                self._on_ready()
                while not self._stopped.is_set():
                    for notify in conn.notifies(timeout=LISTENER_POLL.total_seconds()):
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


# -- the store ---------------------------------------------------------------------------------------------------


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as error:
        raise ProcessingError(
            "open", f"PostgreSQL needs the postgres extra (pip install 'threadloom[postgres]'): {error}"
        ) from error


_URI_PREFIXES = ("postgresql://", "postgres://")  # as libpq spells them (case-sensitive)
_PARSE_REFUSAL = re.compile(r'invalid (?:connection option|URI query parameter):? "([A-Za-z_][A-Za-z0-9_]*)"')


def _conninfo_problem(why: str) -> ValidationError:
    return ValidationError("conninfo", (f"{why} (the string is not shown: it may hold a password)",))


def _take_schema(conninfo: str) -> tuple[str, str | None]:
    """``conninfo`` without its ``schema`` query parameter, and that parameter (None when absent).

    Only a ``postgresql://`` (or ``postgres://``) URL has a query; its parts are found as libpq finds them: the
    user info ends at the first ``@`` before any ``/`` (a password may hold ``?`` and ``#``), and the query
    starts at the first ``?`` after it. The value is percent-decoded, as libpq decodes the other parameters.

    Raises:
        ValidationError: (field ``conninfo``) the user info holds a raw ``/`` or ``@``, which libpq would read
            as part of the host or database (so a password would be shown as one), or ``schema`` is given twice.
    """
    prefix = next((p for p in _URI_PREFIXES if conninfo.startswith(p)), None)
    if prefix is None:
        return conninfo, None
    rest = conninfo[len(prefix) :]
    stop = next((i for i, ch in enumerate(rest) if ch in "@/"), len(rest))
    host_start = stop + 1 if stop < len(rest) and rest[stop] == "@" else 0
    mark = rest.find("?", host_start)
    last_at = rest.rfind("@", 0, mark if mark >= 0 else len(rest))
    if last_at >= host_start and ":" in rest[:last_at]:
        raise _conninfo_problem(
            "the user name or password holds a raw '/' or '@', which PostgreSQL would read as part of the host "
            "or database; percent-encode them ('/' as %2F, '@' as %40)"
        )
    if mark < 0:
        return conninfo, None
    kept: list[str] = []
    found: list[str] = []
    for item in rest[mark + 1 :].split("&"):
        key, _sep, value = item.partition("=")
        if unquote(key) == "schema":
            found.append(unquote(value))
        else:
            kept.append(item)
    if not found:
        return conninfo, None
    if len(found) > 1:
        raise ValidationError("conninfo", ("the schema query parameter is given more than once",))
    query = "&".join(item for item in kept if item)
    return prefix + rest[:mark] + ("?" + query if query else ""), found[0]


def _parse_conninfo(conninfo: str) -> dict[str, Any]:
    """libpq's reading of ``conninfo`` (psycopg's ``conninfo_to_dict``), refused up front when it has none.

    Raises:
        ValidationError: (field ``conninfo``) libpq cannot parse it. The message never shows any part of the
            string (libpq's own message repeats it, password included); it names an unknown option.
    """
    from psycopg.conninfo import conninfo_to_dict

    try:
        return conninfo_to_dict(conninfo)
    except Exception as error:
        unknown = _PARSE_REFUSAL.search(str(error))
        if unknown is not None:
            name = unknown.group(1)
            hint = ""
            if name == "schema":
                hint = "; name the schema in a postgresql:// URL (?schema=name) or in config.schema"
            raise _conninfo_problem(f"{name!r} is not a connection option libpq knows{hint}") from None
        raise _conninfo_problem("is not a valid libpq connection string or postgresql:// URL") from None


def _secrets_of(conninfo: str, parts: dict[str, Any] | None, kwargs: dict[str, Any] | None = None) -> tuple[str, ...]:
    """Every form of every password ``conninfo`` (read as ``parts``) and ``kwargs`` hold, longest first."""
    from threadloom.persistence import url_secrets

    found = set(url_secrets(conninfo))
    for source in (parts or {}, kwargs or {}):
        for key in ("password", "sslpassword"):
            if source.get(key):
                found.add(str(source[key]))
    return tuple(sorted(found, key=lambda text: (-len(text), text)))


def _target_of(parts: dict[str, Any] | None, secrets: tuple[str, ...] = ()) -> str:
    """Where a connection string points, from libpq's reading of it: ``user@host:port/dbname``.

    Only those four values are shown - never a password, an option or the string itself; ``<unparsed
    conninfo>`` when there is no reading. Any password form found in them anyway is replaced by ``***``.
    """
    if parts is None:
        return "<unparsed conninfo>"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port") or "5432"
    user = parts.get("user")
    target = f"{user + '@' if user else ''}{host}:{port}/{parts.get('dbname') or ''}"
    return _scrub_all(secrets, target)


def _scrub_all(secrets: tuple[str, ...], text: str) -> str:
    for secret in secrets:  # longest first: a shorter form inside a longer one goes with it
        text = text.replace(secret, "***")
    return text


class PostgresCheckpointer(StoreBase):
    """The store contract in a PostgreSQL schema, shared by every store over it (seeds 003; DESIGN §3).

    Build it with :meth:`open` (a pool of its own) or :meth:`create` (the caller's pool); safe to call from any
    number of threads, each call on a connection of its own. Stores on one database and schema behave as one
    store: tokens come from one sequence, each write locks the thread's row, and ``await_events_after`` wakes
    on commits and deletes made through any of them (``LISTEN``/``NOTIFY``; a lost notification costs at most
    one ``timeout``).

    Every method behaves as :class:`~threadloom.persistence.base.Checkpointer` documents, with the database's
    clock as the store's clock, and in addition (seeds 003):

    * returns within ``connect_timeout`` (waiting for a connection) plus ``call_timeout`` (plus a margin of at
      most 250 ms); past that it raises ``ProcessingError``, its connection aborted and discarded;
    * a failure of the database is a ``ProcessingError`` naming the operation and thread; a write whose
      connection was lost or timed out after it was sent is ``OutcomeUnknown`` (it may have applied: read the
      thread before retrying; fencing keeps a retry safe); a read is safe to retry;
    * ``await_events_after(..., cancel=event)`` raises ``CancelledError`` within milliseconds of ``event`` being
      set, also in the middle of a read, whose connection is then discarded.
    """

    def __init__(
        self,
        pool: ConnectionPool,
        config: PostgresCheckpointerConfig,
        *,
        owns_pool: bool,
        secrets: tuple[str, ...],
        target: str,
    ) -> None:
        """Internal: use :meth:`open` or :meth:`create`."""
        super().__init__()
        from psycopg import ClientCursor, sql
        from psycopg.rows import tuple_row
        from psycopg.types.json import Jsonb

        self._pool = pool
        self._config = config
        self._owns_pool = owns_pool
        self._secrets = secrets
        self._target = target
        self._ClientCursor = ClientCursor
        self._Jsonb = lambda value: Jsonb(value, dumps=codec.dumps)
        self._tuple_row = tuple_row
        self._connect_s = config.connect_timeout.total_seconds()
        self._call_s = config.call_timeout.total_seconds()
        margin = min(DEADLINE_MARGIN.total_seconds(), self._call_s / 4)
        self._deadline_s = self._call_s + margin
        # With a pool of its own the store sets the limits once per connection (session_settings, run by the
        # pool's configure callback), so a write is one prepared statement; on the caller's connections it
        # leaves the session alone and sets them for each transaction, in the same message as the statement.
        self._session_limits = owns_pool
        limits = "" if owns_pool else self._limits("SET LOCAL")
        self._write_prefix = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; " + limits
        self._read_prefix = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; " + limits
        schema = sql.Identifier(config.schema)
        channel = sql.Literal(config.channel)

        def render(template: str) -> str:
            return sql.SQL(template).format(s=schema, channel=channel).as_string(None)

        self._render = render
        self._sql = {
            name: render(getattr(q, name))
            for name in ["CLAIM", "RENEW", "RELEASE", "COMMIT", "DELETE", "COMPACT", "PRUNE", "SWEEP", "LATEST", "CHECKPOINT", "HISTORY", "HISTORY_BEFORE", "CHILDREN", "CHILDREN_AFTER", "EVENTS", "EFFECT", "LOOKUP_RUN", "SWEEP_PAGE"]
        }
        self._binary_sql: dict[str, str] = {}
        self._registry_sql: dict[tuple[tuple[str, ...], tuple[str, ...], str], str] = {}
        self._waiters: dict[str, set[threading.Event]] = {}
        self._waiters_lock = threading.Lock()
        self._watchdog = _Watchdog(config.schema)
        self._listener = _Listener(
            self._listen_connection, config.channel, self._notified, self._wake_all, config.schema
        )
        self.queue = PostgresRunQueue(self)
        """The store's run queue (DESIGN §4), in the same schema: its open entries' runs survive retention."""

    # -- construction ------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, conninfo: str, config: PostgresCheckpointerConfig | None = None) -> PostgresCheckpointer:
        """Opens a store over a connection pool of its own, creating or migrating the schema (seeds 003).

        Args:
            conninfo: a libpq connection string (``host=… dbname=…``) or ``postgresql://`` URL (percent-encode
                ``/`` and ``@`` in its user name or password). A URL may name the schema in its query,
                ``postgresql://…/db?schema=name``: it overrides ``config.schema``, is checked like it, and is
                taken out before libpq sees the URL. The password never appears in an error, a log line or the
                store's ``repr`` (which show only ``user@host:port/dbname``), and a string libpq cannot parse is
                refused before any connection is tried, without showing any of it.
            config: schema, pool sizes and timeouts; ``PostgresCheckpointerConfig()`` by default.

        Returns:
            The open store; :meth:`close` closes its pool too.

        Raises:
            ValidationError: ``conninfo`` is not a str or not a connection string libpq can parse, its ``schema``
                parameter is not a valid schema name (field ``conninfo``), or ``config`` is not a
                ``PostgresCheckpointerConfig``. Nothing was connected to.
            ProcessingError: the database cannot be reached within ``connect_timeout``, the schema cannot be
                migrated, or the ``postgres`` extra is missing. Retrying is safe (opening writes nothing a
                retry could repeat).
        """
        if not isinstance(conninfo, str):
            raise ValidationError("conninfo", (f"must be a str, got {type(conninfo).__name__}",))
        config = cls._check_config(config)
        _require_psycopg()
        from psycopg_pool import ConnectionPool

        conninfo, schema = _take_schema(conninfo)
        if schema is not None:
            try:
                config = attrs.evolve(config, schema=schema)
            except ValidationError as error:
                raise ValidationError(
                    "conninfo", tuple(f"its schema parameter {problem}" for problem in error.problems)
                ) from None
        parts = _parse_conninfo(conninfo)
        secrets = _secrets_of(conninfo, parts)
        target = _target_of(parts, secrets)
        connect_s = max(2, math.ceil(config.connect_timeout.total_seconds()))
        settings = cls.session_settings(config)

        def configure(conn: Any) -> None:  # runs on the pool's worker thread, once per new connection
            from psycopg import ClientCursor

            ClientCursor(conn).execute(settings)

        try:
            pool = ConnectionPool(
                conninfo,
                min_size=config.min_size,
                max_size=config.max_size,
                kwargs={"autocommit": True, "connect_timeout": connect_s},
                configure=configure,
                timeout=config.connect_timeout.total_seconds(),
                open=False,
                name=f"threadloom[{config.schema}]",
            )
        except Exception as error:
            raise ProcessingError(
                "open", f"invalid connection string for {target}: {_scrub_all(secrets, _first_line(error))}"
            ) from None
        try:
            pool.open(wait=config.min_size > 0, timeout=config.connect_timeout.total_seconds())
        except Exception as error:
            pool.close(timeout=0)
            raise ProcessingError(
                "open",
                f"cannot connect to PostgreSQL at {target} within {config.connect_timeout.total_seconds():g} s "
                f"({_scrub_all(secrets, _first_line(error))})",
            ) from None
        store = cls(pool, config, owns_pool=True, secrets=secrets, target=target)
        try:
            store._migrate()
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def create(cls, pool: ConnectionPool, config: PostgresCheckpointerConfig | None = None) -> PostgresCheckpointer:
        """A store over the caller's open ``psycopg_pool.ConnectionPool``, creating or migrating the schema.

        The store uses each connection in autocommit mode for the length of a call and restores the mode when
        it gives the connection back. :meth:`close` leaves the pool open. ``config.min_size`` and
        ``config.max_size`` are the pool's business and are ignored.

        Raises:
            ValidationError: ``pool`` is not a ``ConnectionPool`` or ``config`` not a config.
            ProcessingError: as for :meth:`open`.
        """
        config = cls._check_config(config)
        _require_psycopg()
        from psycopg_pool import ConnectionPool

        if not isinstance(pool, ConnectionPool):
            raise ValidationError("pool", (f"must be a psycopg_pool.ConnectionPool, got {type(pool).__name__}",))
        conninfo = pool.conninfo if isinstance(pool.conninfo, str) else ""
        try:
            parts: dict[str, Any] | None = _parse_conninfo(conninfo)
        except ValidationError:  # the pool's business: it fails to connect and says so
            parts = None
        secrets = _secrets_of(conninfo, parts, dict(pool.kwargs or {}))
        store = cls(pool, config, owns_pool=False, secrets=secrets, target=_target_of(parts, secrets))
        try:
            store._migrate()
        except BaseException:
            store.close()
            raise
        return store

    @staticmethod
    def _check_config(config: Any) -> PostgresCheckpointerConfig:
        if config is None:
            return PostgresCheckpointerConfig()
        if not isinstance(config, PostgresCheckpointerConfig):
            raise ValidationError("config", (f"must be a PostgresCheckpointerConfig, got {type(config).__name__}",))
        return config

    def _limits(self, verb: str) -> str:
        """The three server-side limits of a call, from ``call_timeout`` (``SET`` or ``SET LOCAL``)."""
        ms = max(1, math.ceil(self._config.call_timeout.total_seconds() * 1000))
        return "".join(
            f"{verb} {name} = {ms}; "
            for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
        )

    @staticmethod
    def session_settings(config: PostgresCheckpointerConfig) -> str:
        """What the store's own pool runs on each new connection: the call limits and READ COMMITTED writes.

        Returns:
            ``SET`` statements: ``statement_timeout``, ``lock_timeout`` and ``idle_in_transaction_session_timeout``
            at ``config.call_timeout`` (milliseconds), and ``default_transaction_isolation`` READ COMMITTED.
        """
        ms = max(1, math.ceil(config.call_timeout.total_seconds() * 1000))
        return (
            f"SET statement_timeout = {ms}; SET lock_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}; "
            "SET default_transaction_isolation = 'read committed'"
        )

    @property
    def config(self) -> PostgresCheckpointerConfig:
        """The configuration the store was opened with."""
        return self._config

    @property
    def pool(self) -> ConnectionPool:
        """The connection pool the store takes its connections from (its own, or the caller's)."""
        return self._pool

    def __repr__(self) -> str:
        return f"PostgresCheckpointer(target={self._target!r}, schema={self._config.schema!r})"

    def _migrate(self) -> None:
        """Creates the schema or applies the migrations it lacks, under a transaction-level advisory lock."""
        from psycopg import errors

        latest = q.MIGRATIONS[-1][0]
        conn, restore = self._checkout("open", None)
        # Migrating may first wait (lock_timeout) for another process's migration: two call bounds.
        call = self._watchdog.enter(conn, time.monotonic() + 2 * self._deadline_s)
        discard = True
        try:
            for attempt in range(3):
                try:
                    cur = self._ClientCursor(conn, row_factory=self._tuple_row)
                    try:
                        cur.execute(self._render(q.VERSION))
                        row = cur.fetchone()
                        if row is not None and row[0] >= latest:
                            self._check_version(row[0], latest)
                            discard = False
                            return
                    except (errors.UndefinedTable, errors.InvalidSchemaName):
                        if not self._config.create:
                            raise ProcessingError(
                                "open",
                                f"no threadloom store in schema {self._config.schema!r} at {self._target} "
                                "(nothing was created); run a command that writes, or check the schema",
                            ) from None
                    ms = max(1, math.ceil(self._call_s * 1000))
                    with conn.transaction():
                        cur.execute(f"SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {ms}")
                        cur.execute(
                            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                            (q.SCHEMA_LOCK_CLASS, self._config.schema),
                        )
                        cur.execute(self._render(q.BOOTSTRAP))
                        cur.execute(self._render(q.VERSION))
                        current = cur.fetchone()[0]
                        self._check_version(current, latest)
                        for version, text in q.MIGRATIONS:
                            if version > current:
                                cur.execute(self._render(text))
                                cur.execute(self._render(q.RECORD_VERSION), (version,))
                    if current < latest:
                        log.info("store.migrated", op="open", schema=self._config.schema, version=latest)
                    discard = False
                    return
                except (errors.UniqueViolation, errors.DuplicateSchema, errors.DuplicateTable):
                    # CREATE SCHEMA/TABLE IF NOT EXISTS raced a creator that does not take our lock: try again.
                    if attempt == 2:
                        raise
        except ThreadloomError:
            raise
        except Exception as error:
            aborted = self._watchdog.leave(call)  # DDL under an advisory lock, idempotent: never OutcomeUnknown
            broken = bool(conn.closed or conn.broken)
            raise self._error(error, "open", None, write=False, aborted=aborted, broken=broken) from None
        finally:
            discard = self._watchdog.leave(call) is not None or discard
            self._give_back(conn, discard=discard, restore=restore)

    def _check_version(self, current: int, latest: int) -> None:
        if current > latest:
            raise ProcessingError(
                "open",
                f"schema {self._config.schema!r} is at version {current}, newer than this threadloom knows "
                f"({latest}); upgrade threadloom",
            )

    # -- connections and calls ------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return _scrub_all(self._secrets, text)

    def _error(
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
        return map_error(
            error,
            operation=operation,
            thread_id=thread_id,
            write=write,
            aborted=aborted,
            call_timeout=self._config.call_timeout,
            scrub=self._scrub,
            broken=broken,
            answered=answered,
        )

    def _checkout(self, operation: str, thread_id: str | None) -> tuple[Any, bool]:
        """A connection from the pool in autocommit mode, and whether to restore manual commit on return."""
        try:
            conn = self._pool.getconn(timeout=self._connect_s)
        except Exception as error:
            if self._closed:
                raise ProcessingError(operation, "the store is closed; open a new one") from None
            raise self._error(error, operation, thread_id, write=False, aborted=None) from None
        restore = False
        try:
            if not conn.autocommit:
                conn.autocommit = True
                restore = True
        except Exception as error:
            self._give_back(conn, discard=True)
            raise self._error(error, operation, thread_id, write=False, aborted=None) from None
        return conn, restore

    def _give_back(self, conn: Any, *, discard: bool, restore: bool = False) -> None:
        try:
            if discard:
                conn.close()
            elif restore:
                conn.autocommit = False
        except Exception:
            conn.close()
        try:
            self._pool.putconn(conn)
        except Exception:  # a closed pool: the connection is closed with it
            try:
                conn.close()
            except Exception:
                pass

    def _call(
        self,
        operation: str,
        thread_id: str | None,
        statement: str,
        params: Sequence[Any],
        *,
        write: bool,
        cancel: threading.Event | None = None,
    ) -> list[tuple[Any, ...]]:
        """Runs one statement as one transaction in one round trip; returns its rows (see the module doc).

        A write on the store's own pool is one prepared statement (the limits are session settings of the
        pool's connections); otherwise the message carries the transaction's settings and then the statement.
        """
        from psycopg import pq

        conn, restore = self._checkout(operation, thread_id)
        call = self._watchdog.enter(conn, time.monotonic() + self._deadline_s, cancel)
        answered = False  # the server answered the statement: an error from here on came reading its rows
        try:
            if write and self._session_limits:  # one prepared statement: its own implicit transaction
                binary = self._binary_sql.get(statement)
                if binary is None:  # binary parameters: bodies are sent as they are, never escaped
                    binary = self._binary_sql[statement] = statement.replace("%s", "%b")
                cur = conn.execute(binary, params, prepare=True, binary=True)
                answered = True
                rows = cur.fetchall()
            else:
                cur = self._ClientCursor(conn, row_factory=self._tuple_row)
                cur.execute((self._write_prefix if write else self._read_prefix) + statement, params)
                answered = True
                while cur.nextset():
                    pass
                rows = cur.fetchall()
        except BaseException as error:
            aborted = self._watchdog.leave(call)
            lost = bool(conn.closed or conn.broken)
            broken = aborted is not None or lost or conn.info.transaction_status != pq.TransactionStatus.IDLE
            self._give_back(conn, discard=broken, restore=restore)
            if isinstance(error, Exception):
                raise self._error(
                    error, operation, thread_id, write=write, aborted=aborted, broken=lost, answered=answered
                ) from None
            raise
        aborted = self._watchdog.leave(call)
        self._give_back(conn, discard=aborted is not None, restore=restore)  # it answered; its socket may be shut
        return rows

    # -- claims ----------------------------------------------------------------------------------------------------

    def _claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        rows = self._call(
            "claim",
            thread_id,
            self._sql["CLAIM"],
            (thread_id, request.holder, duration_micros(request.ttl), request.tenant_id),
            write=True,
        )
        code, token, expires_at, old_holder, old_tenant, latest = rows[0]
        if code == 1:
            raise ThreadBusy(thread_id, latest, rules.busy_holder(old_holder, old_tenant, request.tenant_id))
        return RunClaim(
            thread_id=thread_id,
            holder=request.holder,
            token=token,
            expires_at=_utc(expires_at),
            tenant_id=request.tenant_id,
            taken_over_from=rules.taken_over_from(old_holder, old_tenant, request.tenant_id),
        )

    def _renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        rows = self._call("renew", thread_id, self._sql["RENEW"], (thread_id, token, duration_micros(ttl)), write=True)
        code, current, holder, expires_at, tenant = rows[0]
        if code == 1:
            raise StaleClaim(thread_id, token, current)
        return RunClaim(thread_id=thread_id, holder=holder, token=token, expires_at=_utc(expires_at), tenant_id=tenant)

    def _release(self, thread_id: str, token: int) -> None:
        self._call("release", thread_id, self._sql["RELEASE"], (thread_id, token), write=True)

    # -- commits -----------------------------------------------------------------------------------------------------

    def _commit(self, thread_id: str, encoded: EncodedCommit) -> list[EventRecord]:
        commit = encoded.source  # transitional: this store still encodes the Commit itself
        cp = commit.checkpoint
        body = origin = None
        if cp is not None:
            body = codec.encode_checkpoint(codec.stamp_token(cp, commit.token))
            origin = cp.origin.parent_thread if cp.origin is not None else None
        thread_json = codec.dumps(thread_id)
        zero = '{"thread_id":' + thread_json + ',"seq":0,"token":0,'
        tails = []
        for draft in commit.events:
            text = codec.encode_event(EventRecord.of(draft, thread_id=thread_id, seq=0, token=0))
            if not text.startswith(zero):  # the codec's field order is what the server splices into
                raise ProcessingError("commit", "the event codec's layout changed; the store cannot number events")
            tails.append(text[len(zero) :])
        prefix = '{"thread_id":' + thread_json + ',"seq":'
        fence_thread, fence_token = commit.fence if commit.fence is not None else (None, None)
        rows = self._call(
            "commit",
            thread_id,
            self._sql["COMMIT"],
            (
                thread_id,
                commit.token,
                fence_thread,
                fence_token,
                cp.id if cp else None,
                cp.parent if cp else None,
                cp.run_id if cp else None,
                cp.status.value if cp else None,
                cp.tenant_id if cp else None,
                cp.graph_id if cp else None,
                origin,
                body,
                commit.retract_turn,
                [pw.checkpoint_id for pw in commit.pending_writes],
                [codec.encode_pending_write(pw) for pw in commit.pending_writes],
                prefix,
                tails,
                [effect.key for effect in commit.effects],
                [codec.encode_effect(effect) for effect in commit.effects],
                self._Jsonb(commit.metadata) if commit.metadata else None,
            ),
            write=True,
        )
        code, n, t = rows[0]
        if code == 0:
            return [
                codec.decode_event(f'{prefix}{n + index},"token":{commit.token},{tail}', thread_id)
                for index, tail in enumerate(tails)
            ]
        if code == 1:
            raise StaleClaim(thread_id, commit.token, n)
        if code == 2:
            assert commit.fence is not None
            raise StaleClaim(commit.fence[0], commit.fence[1], n)
        assert cp is not None or code in (5, 6)
        if code == 3:
            raise CheckpointConflict(thread_id, cp.parent, t)
        if code == 4:
            raise InvalidCommit(thread_id, f"checkpoint {cp.id!r} is already in the history")
        if code == 5:
            pw = commit.pending_writes[n]
            raise InvalidCommit(
                thread_id,
                f"pending write of task {pw.task_id!r} names checkpoint {pw.checkpoint_id!r}, not the latest {t!r}",
            )
        raise InvalidCommit(thread_id, "retract_turn needs a checkpoint to follow the settled one")

    # -- reads -------------------------------------------------------------------------------------------------------

    def _latest(self, thread_id: str) -> StoredCheckpoint | None:
        rows = self._call("latest", thread_id, self._sql["LATEST"], (thread_id,), write=False)
        if not rows:
            return None
        body, pending = rows[0]
        return StoredCheckpoint(
            checkpoint=codec.decode_checkpoint(body, thread_id),
            pending_writes=tuple(codec.decode_pending_write(text, thread_id) for text in pending),
        )

    def _checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        rows = self._call("checkpoint", thread_id, self._sql["CHECKPOINT"], (thread_id, checkpoint_id), write=False)
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    def _history(self, thread_id: str, limit: int, before: str | None) -> list[Checkpoint]:
        if before is None:
            rows = self._call("history", thread_id, self._sql["HISTORY"], (thread_id, limit), write=False)
            bodies = [row[0] for row in rows]
        else:
            rows = self._call(
                "history", thread_id, self._sql["HISTORY_BEFORE"], (limit, thread_id, before), write=False
            )
            if not rows:
                raise CheckpointNotFound(thread_id, before)
            bodies = rows[0][0]
        return [codec.decode_checkpoint(text, thread_id) for text in bodies]

    def _children(self, parent: str, limit: int, after: str | None) -> list[str]:
        if after is None:
            rows = self._call("children", parent, self._sql["CHILDREN"], (parent, limit), write=False)
            return [row[0] for row in rows]
        rows = self._call("children", parent, self._sql["CHILDREN_AFTER"], (limit, parent, after), write=False)
        if not rows:
            raise ValidationError("after", (f"{after!r} is not known as a child of {parent!r}",))
        return list(rows[0][0])

    def _read_events(
        self, operation: str, thread_id: str, after_seq: int, limit: int, cancel: threading.Event | None = None
    ) -> list[EventRecord]:
        rows = self._call(
            operation,
            thread_id,
            self._sql["EVENTS"],
            (thread_id, after_seq, limit, thread_id),
            write=False,
            cancel=cancel,
        )
        first_seq, floor, mark, bodies = rows[0]
        if first_seq is None:
            first_seq = floor = max(1, mark)
        rules.read_start(thread_id, after_seq, first_seq=first_seq, floor=floor)
        return [codec.decode_event(text, thread_id) for text in bodies]

    def _events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        return self._read_events("events_after", thread_id, after_seq, limit)

    def _notified(self, thread_id: str) -> None:
        with self._waiters_lock:
            waiters = list(self._waiters.get(thread_id, ()))
        for wake in waiters:
            wake.set()

    def _wake_all(self) -> None:
        with self._waiters_lock:
            waiters = [wake for group in self._waiters.values() for wake in group]
        for wake in waiters:
            wake.set()

    def _listen_connection(self) -> Any:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        kwargs = dict(self._pool.kwargs or {})
        kwargs.update(autocommit=True, connect_timeout=max(2, math.ceil(self._connect_s)))
        try:
            given = conninfo_to_dict(self._pool.conninfo)
        except Exception:
            given = {}
        for name, value in LISTENER_KEEPALIVES.items():  # a silently dead peer is noticed, then replaced
            if name not in given:
                kwargs.setdefault(name, value)
        kwargs.pop("row_factory", None)
        kwargs.pop("cursor_factory", None)
        return psycopg.Connection.connect(self._pool.conninfo, **kwargs)

    def _await_events_after(
        self, thread_id: str, after_seq: int, limit: int, timeout: timedelta, cancel: threading.Event | None
    ) -> list[EventRecord]:
        """Reads, and while it finds nothing waits for a notification naming the thread (seeds 003, 000).

        Holds no connection while it waits. ``cancel`` ends it promptly with ``CancelledError``, also in the
        middle of a read (whose connection is then discarded).
        """
        operation = "await_events_after"
        deadline = time.monotonic() + timeout.total_seconds()
        if timeout <= timedelta(0):
            return self._read_events(operation, thread_id, after_seq, limit, cancel)
        wake = threading.Event()
        with self._waiters_lock:
            self._waiters.setdefault(thread_id, set()).add(wake)
        watch = self._watchdog.enter(None, math.inf, cancel, wake) if cancel is not None else None
        try:
            self._listener.start()
            poll = self.poll_interval.total_seconds()
            while True:
                wake.clear()
                self._ensure_open(operation)
                if cancel is not None and cancel.is_set():
                    raise CancelledError(operation)
                found = self._read_events(operation, thread_id, after_seq, limit, cancel)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0:
                    return found
                listening = self._listener.ready.is_set()
                woke = wake.wait(min(remaining, threading.TIMEOUT_MAX) if listening else min(remaining, poll))
                if cancel is not None and cancel.is_set():
                    raise CancelledError(operation)
                if not woke and listening and time.monotonic() >= deadline:
                    return []  # no notification named the thread: nothing landed (a lost one costs this timeout)
        finally:
            if watch is not None:
                self._watchdog.leave(watch)
            with self._waiters_lock:
                group = self._waiters.get(thread_id)
                if group is not None:
                    group.discard(wake)
                    if not group:
                        del self._waiters[thread_id]

    def _effect(self, thread_id: str, key: str) -> EffectRecord | None:
        rows = self._call("effect", thread_id, self._sql["EFFECT"], (thread_id, key), write=False)
        return codec.decode_effect(rows[0][0], thread_id) if rows else None

    def _lookup_run(self, thread_id: str, run_ids: frozenset[str]) -> Checkpoint | None:
        rows = self._call(
            "lookup_run", thread_id, self._sql["LOOKUP_RUN"], (sorted(run_ids), thread_id), write=False
        )
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    # -- writes without a claim ----------------------------------------------------------------------------------

    def _compact_events(self, thread_id: str, before_seq: int) -> None:
        self._call("compact_events", thread_id, self._sql["COMPACT"], (thread_id, before_seq), write=True)

    def _delete_thread(self, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        fence_thread, fence_token = fence if fence is not None else (None, None)
        rows = self._call(
            "delete_thread", thread_id, self._sql["DELETE"], (thread_id, token, fence_thread, fence_token), write=True
        )
        code, n = rows[0]
        if code == 1:
            raise StaleClaim(thread_id, token, n)
        if code == 2:
            assert fence is not None
            raise StaleClaim(fence[0], fence[1], n)

    @staticmethod
    def _policy_params(policy: RetentionPolicy) -> tuple[int | None, int | None, int | None]:
        return (
            duration_micros(policy.max_age) if policy.max_age is not None else None,
            policy.max_checkpoints,
            policy.max_events,
        )

    def _prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        if policy.keeps_everything:
            return
        self._call("prune", thread_id, self._sql["PRUNE"], (thread_id, *self._policy_params(policy)), write=True)

    def _sweep(self, policy: SweepPolicy, guard: SweepGuard | None, after: str | None) -> SweepPage:
        rows = self._call(
            "sweep", None, self._sql["SWEEP_PAGE"], (after or "", policy.batch_size + 1), write=False
        )
        ids = [row[0] for row in rows]
        page = tuple(ids[: policy.batch_size])
        more = len(ids) > policy.batch_size
        protected = ask_guard(guard, page)
        pruned: tuple[str, ...] = ()
        reclaimed: tuple[str, ...] = ()
        if page and (not policy.retention.keeps_everything or policy.tombstone_age is not None):
            rows = self._call(
                "sweep",
                None,
                self._sql["SWEEP"],
                (
                    list(page),
                    self._Jsonb({key: sorted(runs) for key, runs in protected.items()}),
                    *self._policy_params(policy.retention),
                    duration_micros(policy.tombstone_age) if policy.tombstone_age is not None else None,
                ),
                write=True,
            )
            pruned, reclaimed = tuple(rows[0][0]), tuple(rows[0][1])
        return SweepPage(visited=page, pruned=pruned, reclaimed=reclaimed, next=page[-1] if more and page else None)

    # -- registry ----------------------------------------------------------------------------------------------

    def _summaries(self, rows: list[tuple[Any, ...]]) -> list[ThreadSummary]:
        out = []
        for thread_id, tenant_id, status, live, metadata, updated_at, latest_id, latest_run, graph_id in rows:
            meta = codec.decode_metadata(metadata, thread_id)
            out.append(
                ThreadSummary(
                    thread_id=thread_id,
                    tenant_id=tenant_id,
                    status=rules.thread_status(CheckpointStatus(status), live_claim=live, metadata=meta),
                    updated_at=_utc(updated_at),
                    latest_checkpoint_id=latest_id,
                    latest_run_id=latest_run,
                    graph_id=graph_id,
                    metadata=meta,
                )
            )
        return out

    def _registry(
        self,
        operation: str,
        tenant_id: str | None,
        statuses: list[str],
        conditions: tuple[str, ...],
        params: list[Any],
        *,
        newest_first: bool,
        limit: int,
    ) -> list[ThreadSummary]:
        """Up to ``limit + 1`` registry rows of ``statuses``, merged from one index-ordered branch per status."""
        order = "DESC" if newest_first else "ASC"
        key = (tuple(statuses), conditions, order)
        statement = self._registry_sql.get(key)
        if statement is None:
            where = " AND ".join((q.REGISTRY_ROOTS, *conditions))
            branches = [
                f"(SELECT {q.REGISTRY_COLUMNS} FROM {{s}}.threads t WHERE {where} AND {q.REGISTRY_BRANCHES[status]} "
                f"ORDER BY t.updated_at {order}, t.thread_id {order} LIMIT %s)"
                for status in statuses
            ]
            statement = self._registry_sql[key] = self._render(
                f"SELECT * FROM ({' UNION ALL '.join(branches)}) AS page "
                f"ORDER BY 6 {order}, 1 {order} LIMIT %s"
            )
        values: list[Any] = []
        for _status in statuses:
            values += [tenant_id or "", *params, limit + 1]
        values.append(limit + 1)
        return self._summaries(self._call(operation, None, statement, values, write=False))

    def _threads(self, query: ThreadQuery) -> ThreadPage:
        conditions: list[str] = []
        params: list[Any] = []
        if query.after is not None:
            conditions.append("(t.updated_at, t.thread_id) < (%s, %s)")
            params += [query.after.updated_at, query.after.thread_id]
        if query.updated_since is not None:
            conditions.append("t.updated_at >= %s")
            params.append(query.updated_since)
        if query.graph_id is not None:
            conditions.append("t.graph_id = %s")
            params.append(query.graph_id)
        wanted = query.statuses if query.statuses is not None else frozenset(ThreadStatus)
        statuses = sorted(status.value for status in wanted)
        if not statuses:
            return ThreadPage()
        rows = self._registry(
            "threads", query.tenant_id, statuses, tuple(conditions), params, newest_first=True, limit=query.limit
        )
        return ThreadPage.of([row for row in rows if query.matches(row)], query.limit)

    def _incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage:
        conditions: tuple[str, ...] = ()
        params: list[Any] = []
        if after is not None:
            conditions = ("(t.updated_at, t.thread_id) > (%s, %s)",)
            params = [after.updated_at, after.thread_id]
        rows = self._registry("incomplete", tenant_id, ["idle"], conditions, params, newest_first=False, limit=limit)
        return ThreadPage.of([row for row in rows if row.status is ThreadStatus.IDLE], limit)

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def _close(self) -> None:
        self._listener.stop()
        self._wake_all()
        self._watchdog.stop()
        if self._owns_pool:
            try:
                self._pool.close(timeout=self._connect_s)
            except Exception:
                pass


__all__ = ["PostgresCheckpointer", "PostgresCheckpointerConfig", "map_error"]

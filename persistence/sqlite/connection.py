"""One SQLite file as the store and its run queue share it: connections, transactions, group commit, errors.

:class:`Database` is the package's internal interface: :class:`~threadloom.persistence.sqlite.store.SqliteCheckpointer`
and :class:`~threadloom.persistence.sqlite.queue.SqliteRunQueue` both run their work through one instance, and
neither reaches into the other. It offers:

* :meth:`Database.write` - ``work(conn, *args)`` inside a ``BEGIN IMMEDIATE`` transaction (the write lock is taken
  before anything is read, so a read never upgrades to a write), returning once the transaction committed;
* :meth:`Database.read` - ``work(conn, *args)`` in one deferred read transaction, or as a single statement: one
  consistent snapshot per call that never waits for a writer (WAL);
* :meth:`Database.now` - the store's clock; :attr:`Database.closed`;
* every driver error mapped by :func:`threadloom.persistence.sqlite.errors.map_error`.

**Group commit.** Within one process the writes of a database share transactions: a call that finds no other
write under way leads; calls that arrive meanwhile queue up, and the next leader runs up to
:data:`MAX_WRITE_BATCH` of them in one transaction, each in a savepoint of its own (a refused call rolls back
alone), with one ``COMMIT`` for all. Every call returns after the ``COMMIT`` of its batch: a batch changes when
writes land, never what they do. The databases of one process over one file take turns on one in-process lock
(:func:`file_lock`), so they hand the file over at once instead of sleeping in SQLite's busy handler; other
processes meet the busy timeout.

Connection settings: ``synchronous`` (``NORMAL`` by default: in WAL mode a commit survives a crash of the process
and never corrupts the file; a power loss may lose the last commits; ``FULL`` syncs every commit) and
``wal_autocheckpoint`` = :data:`WAL_AUTOCHECKPOINT` pages. Every :data:`CHECKPOINT_EVERY` write transactions a
thread of the database copies the log back into the file (a passive checkpoint on its own connection), so commits
do not pay for the copy and its syncs; a commit's durability is that of its own ``COMMIT``, checkpoint or not.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from threadloom.domain.clock import Clock
from threadloom.domain.errors import ProcessingError, StoreUnavailable
from threadloom.persistence.clock import read_clock
from threadloom.persistence.sqlite.errors import lock_timeout, map_error, not_applied
from threadloom.persistence.sqlite.readonly import Access
from threadloom.persistence.sqlite.readonly import connect as connect_read_only

T = TypeVar("T")

SYNCHRONOUS = "NORMAL"
"""The default ``PRAGMA synchronous`` of every connection (WAL journal). Benchmarks compare against raw sqlite3
with this same setting."""

SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
"""The values ``synchronous`` may take."""

WAL_AUTOCHECKPOINT = 10_000
"""``PRAGMA wal_autocheckpoint`` of every connection, in pages (SQLite's default is 1,000). A commit writes
about ten pages (a checkpoint row, its id index, the thread row and its registry index entry, events, pending
writes), so the default would copy the log back into the file, and sync it, every ~100 commits; 10,000 pages
(about 40 MB of log at 4 KiB pages) makes that ten times rarer and lets a page written by many commits be copied
back once."""

CHECKPOINT_EVERY = 100
"""Write transactions of a database between two of its background WAL checkpoints. The database's checkpointer
thread copies the log back into the file (``PRAGMA wal_checkpoint(PASSIVE)``: it never waits for a writer or a
reader, and a writer never waits for it), so a commit seldom pays for the copy and its syncs itself; the
connections' ``wal_autocheckpoint`` (:data:`WAL_AUTOCHECKPOINT`) stays as the bound of the log when the
checkpointer falls behind (a reader holding an old snapshot, another process checkpointing)."""

MAX_WRITE_BATCH = 32
"""Most writes of one database that share one transaction and one ``COMMIT`` (group commit)."""

IMMUTABLE_READ_ATTEMPTS = 5
"""How many times a read-only store's snapshot read is tried while writers keep changing the file under it."""

MAX_IDLE_CONNECTIONS = 16
"""How many idle connections a database keeps for reuse; more are opened on demand and closed after use."""

_FILE_LOCKS: dict[str, threading.Lock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


def file_lock(path: str) -> threading.Lock:
    """The in-process writer lock of one file, shared by every database of this process over it."""
    key = os.path.normcase(os.path.realpath(path))
    with _FILE_LOCKS_GUARD:
        lock = _FILE_LOCKS.get(key)
        if lock is None:
            lock = _FILE_LOCKS[key] = threading.Lock()
        return lock


class _Write:
    """One queued write call: its work, then its outcome (set by the batch that ran it)."""

    __slots__ = ("operation", "thread_id", "work", "args", "wake", "finished", "value", "error")

    def __init__(
        self,
        operation: str,
        thread_id: str | None,
        work: Callable[..., Any],
        args: tuple[Any, ...],
        wake: threading.Event | None,
    ) -> None:
        self.operation = operation
        self.thread_id = thread_id
        self.work = work
        self.args = args
        self.wake = wake  # None for a call that leads at once: nobody has to wake it
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None

    def outcome(self) -> Any:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return self.value


class _Checkpointer:
    """The thread that checkpoints a database's WAL when poked (:data:`CHECKPOINT_EVERY`), on a connection of its
    own; started at the first poke, stopped by :meth:`stop`. A checkpoint that fails is skipped: the next poke tries
    again, and a commit's auto-checkpoint bounds the log meanwhile."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str) -> None:
        self._connect = connect
        self._name = name
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.passes = 0
        """Checkpoints completed (for tests and diagnostics)."""

    def poke(self) -> None:
        with self._lock:
            if self._stopping:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    if conn is None:
                        conn = self._connect()
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.passes += 1
                except sqlite3.Error:  # busy, closed, I/O: the log stays as it is until the next poke
                    if conn is not None:
                        conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()


class Database:
    """One SQLite file, its connection pool and its group-commit writer (see the module).

    Safe to use from any number of threads. Built by the store's ``open``; the store and its run queue share it.

    Args:
        path: the absolute path of the file.
        clock: the store's clock.
        busy_s: how long, in seconds, a write waits for other writers of the file (> 0).
        synchronous: ``PRAGMA synchronous`` of the connections, one of :data:`SYNCHRONOUS_MODES`.
        read_only: how a read-only store reads the file (:mod:`threadloom.persistence.sqlite.readonly`); None for a
            store that writes. A read-only database refuses every write before touching the file.
    """

    def __init__(
        self, path: str, clock: Clock, busy_s: float, synchronous: str, read_only: Access | None = None
    ) -> None:
        self.path = path
        self.read_only = read_only
        self.clock = clock
        self.busy_s = busy_s
        self.synchronous = synchronous
        self.write_lock = file_lock(path)
        self.idle: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._closed = False
        self.waiting: list[_Write] = []  # writes waiting for the next batch (group commit)
        self._queue_lock = threading.Lock()
        self.leading = False
        self._last_batch = 0
        self._since_checkpoint = 0  # write transactions committed since the checkpointer was last poked
        self.checkpointer = _Checkpointer(self._connect, f"threadloom-sqlite-checkpoint-{os.path.basename(path)}")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def now(self) -> datetime:
        """The store clock's reading, aware UTC (a clock that returns a naive time is a ``ProcessingError``)."""
        return read_clock(self.clock)

    def close(self) -> None:
        """Closes the idle connections; a connection in use is closed when its call gives it back."""
        with self._pool_lock:
            self._closed = True
            idle, self.idle = self.idle, []
        self.checkpointer.stop(self.busy_s)
        for conn in idle:
            conn.close()

    def failure(
        self, error: BaseException, operation: str, thread_id: str | None, *, committing: bool = False
    ) -> ProcessingError:
        """The threadloom error of the driver error ``error``, mapped by
        :func:`~threadloom.persistence.sqlite.errors.map_error`."""
        return map_error(
            error,
            operation=operation,
            thread_id=thread_id,
            path=self.path,
            busy_s=self.busy_s,
            closed=self._closed,
            committing=committing,
        )

    # -- connections ---------------------------------------------------------------------------------------------

    def _connect(self, *, immutable: bool = False) -> sqlite3.Connection:
        if self.read_only is not None:
            return connect_read_only(self.path, self.busy_s, immutable=immutable)
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_s,
            isolation_level=None,  # no implicit transactions: every transaction below is explicit
            check_same_thread=False,  # a connection is used by one thread at a time, through the pool
            cached_statements=256,
        )
        try:
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")  # one of SYNCHRONOUS_MODES
            conn.execute(f"PRAGMA wal_autocheckpoint = {int(WAL_AUTOCHECKPOINT)}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _take(self) -> sqlite3.Connection:
        with self._pool_lock:
            if self.idle:
                return self.idle.pop()
        return self._connect()

    def _give(self, conn: sqlite3.Connection, healthy: bool) -> None:
        # An immutable connection is never reused: the next call looks again for a writer's -wal.
        if healthy and (self.read_only is None or not self.read_only.immutable):
            with self._pool_lock:
                if not self._closed and len(self.idle) < MAX_IDLE_CONNECTIONS:
                    self.idle.append(conn)
                    return
        conn.close()

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> bool:
        """Ends any open transaction; False when the connection is no longer fit to reuse."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return True
        except sqlite3.Error:
            return False

    def setup(self, work: Callable[[sqlite3.Connection], None]) -> None:
        """Runs ``work(conn)`` on a new connection when the store opens (migrations), then pools the connection.

        Raises:
            ProcessingError: (operation ``"open"``) a driver error, mapped, without sqlite3's traceback chained:
                the caller gave a bad file, and our error alone says so. Errors ``work`` raises itself pass.
        """
        try:
            conn = self._connect()
        except sqlite3.Error as error:
            raise self.failure(error, "open", None) from None
        try:
            try:
                work(conn)
            except BaseException as error:
                self._rollback(conn)
                if isinstance(error, sqlite3.Error):
                    raise self.failure(error, "open", None) from None
                raise
            self._give(conn, True)
        except BaseException:
            conn.close()
            raise

    # -- reads ---------------------------------------------------------------------------------------------------

    def read(
        self, operation: str, thread_id: str | None, work: Callable[..., T], *args: Any, snapshot: bool = True
    ) -> T:
        """Runs ``work(conn, *args)`` in one deferred read transaction (``snapshot=False``: as one statement).

        A read-only store that reads an ``immutable=1`` snapshot (no writer attached: see
        :mod:`~threadloom.persistence.sqlite.readonly`) keeps a read only if the file did not change under it;
        else it reads again, through ``mode=ro`` once a writer's ``-wal`` exists.

        Raises:
            ProcessingError: a driver error, mapped (``StoreUnavailable``, ``StoreCorrupt``...). What ``work``
                raises itself passes unchanged.
        """
        access = self.read_only
        if access is None or not access.immutable:
            return self._read_on(self._take, operation, thread_id, work, args, snapshot)
        for _attempt in range(IMMUTABLE_READ_ATTEMPTS):
            before = access.stamp(self.path)
            if before.wal:  # a writer is attached: share its -shm index, as every reader does
                return self._read_on(self._connect, operation, thread_id, work, args, snapshot)
            try:
                result = self._read_on(self._connect_immutable, operation, thread_id, work, args, snapshot)
            except BaseException:
                if access.stamp(self.path) == before:
                    raise
                continue  # a writer changed the file under the read: what it saw may be torn
            if access.stamp(self.path) == before:
                return result
        raise StoreUnavailable(
            operation,
            f"the SQLite file {self.path!r} changed under every read-only read of {IMMUTABLE_READ_ATTEMPTS} (writers "
            "attach and detach); nothing was written; retry",
        )

    def _connect_immutable(self) -> sqlite3.Connection:
        return self._connect(immutable=True)

    def _read_on(
        self,
        connect: Callable[[], sqlite3.Connection],
        operation: str,
        thread_id: str | None,
        work: Callable[..., T],
        args: tuple[Any, ...],
        snapshot: bool,
    ) -> T:
        try:
            conn = connect()
        except sqlite3.Error as error:
            raise self.failure(error, operation, thread_id) from error
        try:
            if snapshot:
                conn.execute("BEGIN")
            result = work(conn, *args)
            if snapshot:
                conn.execute("COMMIT")
        except BaseException as error:
            self._give(conn, self._rollback(conn) and not isinstance(error, sqlite3.Error))
            if isinstance(error, sqlite3.Error):
                raise self.failure(error, operation, thread_id) from error
            raise
        self._give(conn, True)
        return result

    def fetch_all(self, operation: str, thread_id: str | None, sql: str, params: Any) -> list[tuple[Any, ...]]:
        """The rows of one statement (one snapshot), as :meth:`read` runs it."""
        return self.read(operation, thread_id, _fetch_all, sql, params, snapshot=False)

    # -- writes --------------------------------------------------------------------------------------------------

    def write(self, operation: str, thread_id: str | None, work: Callable[..., T], *args: Any) -> T:
        """Runs ``work(conn, *args)`` inside a ``BEGIN IMMEDIATE`` transaction and returns once it committed.

        ``work`` may raise to refuse the call (``StaleClaim``...): its changes roll back alone, nothing of it is
        written, and the error is raised here.

        Raises:
            StoreUnavailable: the file stayed busy past the busy timeout, is read-only, the disk is full...;
                nothing was written: retrying is safe.
            OutcomeUnknown: the ``COMMIT`` failed: the write may or may not have applied.
            ProcessingError: another driver error (mapped), or the store was opened read-only (raised before the
                file is touched); nothing was written.
        """
        if self.read_only is not None:
            raise ProcessingError(
                operation,
                f"the store over {self.path!r} was opened read-only; nothing was written; open it without "
                "read_only to write",
            )
        with self._queue_lock:
            lead = not self.leading
            request = _Write(operation, thread_id, work, args, None if lead else threading.Event())
            self.waiting.append(request)
            self.leading = True
        if not lead:
            assert request.wake is not None
            request.wake.wait()  # the leader always finishes its batch (each is bounded) and hands over
            if request.finished:
                return request.outcome()
        self._lead()
        return request.outcome()

    def _lead(self) -> None:
        """Runs the next batch of queued writes (starting with the caller's), then hands leadership on."""
        if self._last_batch > 1:
            time.sleep(0)  # writers are concurrent: let the ones just woken queue up to join this batch
        with self._queue_lock:
            batch = self.waiting[:MAX_WRITE_BATCH]
            del self.waiting[:MAX_WRITE_BATCH]
        self._last_batch = len(batch)
        try:
            self._run_batch(batch)
        except BaseException as error:  # not a driver error (those are outcomes): let no waiter hang on it
            for request in batch:
                if request.error is None:
                    request.error = error
            raise
        finally:
            for request in batch:
                request.finished = True
            with self._queue_lock:
                successor = self.waiting[0] if self.waiting else None
                if successor is None:
                    self.leading = False
            for request in batch:
                if request.wake is not None:
                    request.wake.set()
            if successor is not None and successor.wake is not None:
                successor.wake.set()  # not finished: it leads the next batch

    def _run_batch(self, batch: list[_Write]) -> None:
        """One transaction for ``batch``; each request ends with its value or its error set."""
        if not self.write_lock.acquire(timeout=self.busy_s):
            for request in batch:
                request.error = lock_timeout(request.operation, request.thread_id, self.path, self.busy_s)
            return
        try:
            try:
                conn = self._take()
            except sqlite3.Error as error:
                self._fail_all(batch, error, committing=False)
                return
            savepoints = len(batch) > 1
            applied: list[_Write] = []
            committing = False
            try:
                conn.execute("BEGIN IMMEDIATE")
                for request in batch:
                    if savepoints:
                        conn.execute("SAVEPOINT write")
                    try:
                        request.value = request.work(conn, *request.args)
                    except (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError) as error:
                        # A fault of this request's own values: it alone fails, the batch goes on.
                        if not savepoints:
                            raise
                        request.error = self.failure(error, request.operation, request.thread_id)
                        request.error.__cause__ = error
                        conn.execute("ROLLBACK TO write")
                    except sqlite3.Error:
                        raise
                    except BaseException as error:  # the call's own outcome (StaleClaim, ...): it alone rolls back
                        request.error = error
                        if savepoints:
                            conn.execute("ROLLBACK TO write")
                    else:
                        applied.append(request)
                    if savepoints:
                        conn.execute("RELEASE write")
                if applied:
                    committing = True
                    conn.execute("COMMIT")
                    self._since_checkpoint += 1
                else:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as error:
                if committing and not_applied(conn, error):
                    committing = False  # the COMMIT failed and SQLite says the transaction did not land
                # A connection that raised a driver error is closed, never pooled again.
                self._rollback(conn)
                self._give(conn, False)
                if committing:
                    self._fail_all(applied, error, committing=True)
                else:  # nothing of the batch landed
                    self._fail_all([r for r in batch if r.error is None], error, committing=False)
                return
            self._give(conn, True)
        finally:
            self.write_lock.release()
        if self._since_checkpoint >= CHECKPOINT_EVERY:
            self._since_checkpoint = 0
            self.checkpointer.poke()

    def _fail_all(self, requests: list[_Write], error: sqlite3.Error, *, committing: bool) -> None:
        for request in requests:
            mapped = self.failure(error, request.operation, request.thread_id, committing=committing)
            mapped.__cause__ = error
            request.value, request.error = None, mapped


def _fetch_all(conn: sqlite3.Connection, sql: str, params: Any) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()


__all__ = [
    "CHECKPOINT_EVERY",
    "IMMUTABLE_READ_ATTEMPTS",
    "MAX_IDLE_CONNECTIONS",
    "MAX_WRITE_BATCH",
    "SYNCHRONOUS",
    "SYNCHRONOUS_MODES",
    "WAL_AUTOCHECKPOINT",
    "Database",
    "file_lock",
]

"""``SqliteCheckpointer``: the embedded default store, one SQLite file (DESIGN §3 "Stores").

It behaves exactly like the reference :class:`~threadloom.persistence.memory.InMemoryCheckpointer`, deciding
with the same pure rules (:mod:`threadloom.domain.rules`) and storing the same JSON text
(:mod:`threadloom.persistence.codec`). What SQLite adds:

* **All state lives in the file** - the token counter, the reclamation mark, claims, event numbering, children's
  places - so several stores and several processes over one file behave as one store (DESIGN §3 rule 2).
* **Writes** run in ``BEGIN IMMEDIATE`` transactions (the write lock is taken before anything is read, so a read
  never upgrades to a write). Within one process, the writers of a store share transactions (group commit: each
  call in a savepoint of its own, one ``COMMIT`` for the batch, every call returning after that ``COMMIT``), and
  the stores over one file take turns on an in-process lock, so they hand the file over at once instead of
  sleeping in SQLite's busy handler; other processes meet the busy timeout. **Reads** are one deferred
  transaction (or a single statement): one consistent snapshot per call, never waiting for a writer (WAL).
* **Times** are integer microseconds since the Unix epoch, stamped by the store's clock at commit.
* **Bounded calls** (DESIGN §3 rule 9): every call is answered through an index (see :data:`MIGRATIONS`); a
  writer waits at most ``busy_timeout`` for the file, then fails with ``ProcessingError``.
* **Migrations** are numbered and recorded in ``schema_version``; they run under ``BEGIN IMMEDIATE``, so any
  number of processes may open a new file at once, and a file written at an earlier version is migrated forward
  when it is opened.
* **The run queue** (DESIGN §4) lives in the same file: ``store.queue`` is a
  :class:`~threadloom.persistence.sqlite.queue.SqliteRunQueue` working through this store's transactions, and
  ``prune`` and ``sweep`` read the runs its open entries recorded inside their own write transaction.

Connection settings: ``journal_mode=WAL`` (stored in the file), ``synchronous`` = :data:`SYNCHRONOUS`
(``NORMAL``: in WAL mode a commit survives a crash of the process and never corrupts the file; a power loss may
lose the last commits. Pass ``synchronous="FULL"`` to :meth:`SqliteCheckpointer.open` to sync every commit), and
``wal_autocheckpoint`` = :data:`WAL_AUTOCHECKPOINT` pages.

A driver error never reaches the caller: :meth:`SqliteCheckpointer._failure` maps every one (busy, I/O, full
disk, not a database, damaged file...) to ``ProcessingError`` naming the thread, or to ``OutcomeUnknown`` when
the ``COMMIT`` itself failed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.clock import Clock
from threadloom.domain.clock import duration_micros
from threadloom.domain.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    InvalidCommit,
    OutcomeUnknown,
    ProcessingError,
    StaleClaim,
    StoreCorrupt,
    ThreadBusy,
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
from threadloom.persistence.base import StoreBase, ask_guard
from threadloom.persistence.encoded import EncodedCommit
from threadloom.persistence.clock import SystemClock
from threadloom.persistence.sqlite.queue import QUEUE_MIGRATION, SqliteRunQueue, open_runs_in

T = TypeVar("T")

SYNCHRONOUS = "NORMAL"
"""The default ``PRAGMA synchronous`` of every connection (WAL journal). Benchmarks compare against raw sqlite3
with this same setting."""

JOURNAL_MODE = "WAL"
"""The journal mode the store puts its file in (persistent in the file)."""

WAL_AUTOCHECKPOINT = 10_000
"""``PRAGMA wal_autocheckpoint`` of every connection, in pages (SQLite's default is 1,000). A commit writes a
dozen pages (a checkpoint row, its indexes, the thread row and the registry's indexes, events, pending writes), so
the default would copy the log back into the file, and sync it, every ~80 commits; 10,000 pages (about 40 MB of
log at 4 KiB pages) makes that ten times rarer and lets a page written by many commits be copied back once."""

SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
"""The values :meth:`SqliteCheckpointer.open` accepts for ``synchronous``."""

JOURNAL_RETRY_FIRST_PAUSE_S = 0.002
"""First pause, in seconds, before retrying ``PRAGMA journal_mode`` that met another opener (doubles each time)."""

JOURNAL_RETRY_MAX_PAUSE_S = 0.05
"""Longest pause, in seconds, between retries of ``PRAGMA journal_mode`` (retries end at the busy timeout)."""

MAX_WRITE_BATCH = 32
"""Most writes of one store that share one transaction and one ``COMMIT`` (group commit, see ``_write``)."""

MAX_IDLE_CONNECTIONS = 16
"""How many idle connections a store keeps for reuse; more are opened on demand and closed after use."""

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)

# SQLite primary result codes (https://sqlite.org/rescode.html), read from ``sqlite3.Error.sqlite_errorcode``.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_INTERRUPT = 9
_SQLITE_IOERR = 10
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the whole schema. Every call's query is answered through one of these indexes (DESIGN §3 rule 9).
    (
        # The store-wide row: the token counter and the reclamation mark (DESIGN §3 rules 2 and 6).
        "CREATE TABLE store ("
        " id INTEGER PRIMARY KEY CHECK (id = 1),"
        " last_token INTEGER NOT NULL,"
        " mark INTEGER NOT NULL)",
        "INSERT INTO store (id, last_token, mark) VALUES (1, 0, 0)",
        # One row per thread the store holds (tombstones included): its claim, numbering, metadata, and its
        # latest checkpoint's registry fields, denormalized so the registry never reads a checkpoint body.
        "CREATE TABLE threads ("
        " thread_id TEXT PRIMARY KEY NOT NULL,"
        " claim_holder TEXT, claim_token INTEGER, claim_expires INTEGER, claim_tenant TEXT,"
        " first_seq INTEGER NOT NULL, next_seq INTEGER NOT NULL, floor INTEGER NOT NULL,"
        " n_checkpoints INTEGER NOT NULL DEFAULT 0,"
        " n_pending INTEGER NOT NULL DEFAULT 0,"
        " metadata TEXT,"
        " deleting INTEGER NOT NULL DEFAULT 0,"
        " updated_at INTEGER, deleted_at INTEGER,"
        " latest_id TEXT, latest_position INTEGER, latest_status TEXT, latest_run_id TEXT,"
        " latest_tenant TEXT, latest_graph_id TEXT, origin_parent TEXT"
        ") WITHOUT ROWID",
        # threads(): a tenant's root threads by (updated_at, thread_id).
        "CREATE INDEX threads_registry ON threads (latest_tenant, updated_at, thread_id)"
        " WHERE origin_parent IS NULL AND latest_id IS NOT NULL",
        # incomplete(): a tenant's root threads whose latest checkpoint is RUNNING and no cascade delete began.
        "CREATE INDEX threads_incomplete ON threads (latest_tenant, updated_at, thread_id)"
        " WHERE origin_parent IS NULL AND latest_status = 'running' AND deleting = 0",
        # Tables keyed by (thread, ...) are WITHOUT ROWID: the key's b-tree holds the row, so a write touches
        # one b-tree fewer (fewer WAL frames per commit); secondary indexes carry the key's columns.
        # The history: position increases with each commit of a checkpoint to the thread.
        "CREATE TABLE checkpoints ("
        " thread_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL, run_id TEXT NOT NULL,"
        " settled INTEGER NOT NULL, committed_at INTEGER NOT NULL, seq_mark INTEGER NOT NULL,"
        " body TEXT NOT NULL, PRIMARY KEY (thread_id, position)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX checkpoints_id ON checkpoints (thread_id, id)",
        "CREATE INDEX checkpoints_run ON checkpoints (thread_id, run_id, position)",
        "CREATE INDEX checkpoints_age ON checkpoints (thread_id, committed_at, position)",
        "CREATE INDEX checkpoints_settled ON checkpoints (thread_id, position) WHERE settled = 1",
        # The latest checkpoint's pending writes, in commit order.
        "CREATE TABLE pending ("
        " thread_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL,"
        " PRIMARY KEY (thread_id, idx)) WITHOUT ROWID",
        "CREATE TABLE events ("
        " thread_id TEXT NOT NULL, seq INTEGER NOT NULL, committed_at INTEGER NOT NULL, body TEXT NOT NULL,"
        " PRIMARY KEY (thread_id, seq)) WITHOUT ROWID",
        "CREATE INDEX events_age ON events (thread_id, committed_at, seq)",
        "CREATE TABLE effects ("
        " thread_id TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,"
        " PRIMARY KEY (thread_id, key)) WITHOUT ROWID",
        # Each child's place among a parent's children (the order of its first commit with that origin);
        # ``listed`` is 1 while the child's latest checkpoint names the parent.
        "CREATE TABLE children ("
        " place INTEGER PRIMARY KEY, parent TEXT NOT NULL, child TEXT NOT NULL, listed INTEGER NOT NULL)",
        "CREATE UNIQUE INDEX children_pair ON children (parent, child)",
        "CREATE INDEX children_child ON children (child)",
        "CREATE INDEX children_listed ON children (parent, place) WHERE listed = 1",
    ),
    # 2: the durable run queue (DESIGN §4): tables run_queue and run_queue_runs, see
    # :mod:`threadloom.persistence.sqlite.queue` for the columns and the call each index answers.
    QUEUE_MIGRATION,
)
"""Numbered migrations: ``MIGRATIONS[n - 1]`` takes the schema from version ``n - 1`` to ``n``."""

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes; a file of a newer version is refused."""

# -- statements (fixed text: sqlite3 reuses each prepared statement from its cache) -----------------------------

_SQL_TOKEN = "UPDATE store SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token, mark"
_SQL_MARK = "SELECT mark FROM store WHERE id = 1"
_SQL_CLAIM_READ = "SELECT claim_holder, claim_token, claim_expires, claim_tenant, latest_id FROM threads WHERE thread_id = ?"
_SQL_CLAIM_WRITE = (
    "INSERT INTO threads (thread_id, claim_holder, claim_token, claim_expires, claim_tenant,"
    " first_seq, next_seq, floor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id) DO UPDATE SET claim_holder = excluded.claim_holder,"
    " claim_token = excluded.claim_token, claim_expires = excluded.claim_expires,"
    " claim_tenant = excluded.claim_tenant"
)
_SQL_TOKEN_OF = "SELECT claim_token FROM threads WHERE thread_id = ?"
_SQL_RENEW_READ = "SELECT claim_holder, claim_token, claim_tenant FROM threads WHERE thread_id = ?"
_SQL_RENEW = "UPDATE threads SET claim_expires = ? WHERE thread_id = ?"
_SQL_RELEASE_READ = (
    "SELECT claim_token, latest_id, n_pending, metadata, deleted_at, first_seq, next_seq FROM threads"
    " WHERE thread_id = ?"
)
_SQL_RELEASE = (
    "UPDATE threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL, claim_tenant = NULL"
    " WHERE thread_id = ?"
)
_SQL_FORGETTABLE = (
    "SELECT (SELECT mark FROM store WHERE id = 1),"
    " EXISTS (SELECT 1 FROM effects WHERE thread_id = ?1),"
    " EXISTS (SELECT 1 FROM children WHERE child = ?1)"
)
_SQL_FORGET = "DELETE FROM threads WHERE thread_id = ?"
_SQL_COMMIT_READ = (
    "SELECT claim_token, next_seq, n_checkpoints, n_pending, metadata, deleting, updated_at,"
    " latest_id, latest_position, latest_status, latest_run_id, latest_tenant, latest_graph_id, origin_parent"
    " FROM threads WHERE thread_id = ?"
)
# INDEXED BY: else the planner may walk the history backwards from the latest until a settled checkpoint.
_SQL_NEWEST_SETTLED = (
    "SELECT position, id FROM checkpoints INDEXED BY checkpoints_settled WHERE thread_id = ? AND settled = 1"
    " ORDER BY position DESC LIMIT 1"
)
_SQL_HAS_CHECKPOINT = "SELECT 1 FROM checkpoints WHERE thread_id = ? AND id = ?"
_SQL_CUT_HISTORY = "DELETE FROM checkpoints WHERE thread_id = ? AND position > ?"
_SQL_INSERT_CHECKPOINT = (
    "INSERT INTO checkpoints (thread_id, position, id, run_id, settled, committed_at, seq_mark, body)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQL_DROP_PENDING = "DELETE FROM pending WHERE thread_id = ?"
_SQL_INSERT_PENDING = "INSERT INTO pending (thread_id, idx, body) VALUES (?, ?, ?)"
_SQL_INSERT_EVENT = "INSERT INTO events (thread_id, seq, committed_at, body) VALUES (?, ?, ?, ?)"
_SQL_INSERT_EFFECT = "INSERT INTO effects (thread_id, key, body) VALUES (?, ?, ?) ON CONFLICT (thread_id, key) DO NOTHING"
_SQL_UNLIST_CHILD = "UPDATE children SET listed = 0 WHERE parent = ? AND child = ?"
_SQL_LIST_CHILD = (
    "INSERT INTO children (parent, child, listed) VALUES (?, ?, 1)"
    " ON CONFLICT (parent, child) DO UPDATE SET listed = 1"
)
# A commit with neither checkpoint nor metadata leaves the registry's indexed columns alone: this narrower
# statement does not rewrite their index entries.
_SQL_COMMIT_WRITE_LOG = "UPDATE threads SET next_seq = ?, n_pending = ? WHERE thread_id = ?"
_SQL_COMMIT_WRITE = (
    "UPDATE threads SET next_seq = ?, n_checkpoints = ?, n_pending = ?, metadata = ?, deleting = ?,"
    " updated_at = ?, latest_id = ?, latest_position = ?, latest_status = ?, latest_run_id = ?,"
    " latest_tenant = ?, latest_graph_id = ?, origin_parent = ? WHERE thread_id = ?"
)
# The latest checkpoint (kind 0) and its pending writes (kind 1) in one statement: one snapshot, no transaction.
_SQL_LATEST = (
    "SELECT 0, 0, body FROM (SELECT body FROM checkpoints WHERE thread_id = ?1 ORDER BY position DESC LIMIT 1)"
    " UNION ALL SELECT 1, idx, body FROM pending WHERE thread_id = ?1"
)
_SQL_CHECKPOINT = "SELECT body FROM checkpoints WHERE thread_id = ? AND id = ?"
_SQL_POSITION_OF = "SELECT position FROM checkpoints WHERE thread_id = ? AND id = ?"
_SQL_HISTORY = "SELECT body FROM checkpoints WHERE thread_id = ? ORDER BY position DESC LIMIT ?"
_SQL_HISTORY_BEFORE = (
    "SELECT body FROM checkpoints WHERE thread_id = ? AND position < ? ORDER BY position DESC LIMIT ?"
)
_SQL_PLACE_OF = "SELECT place FROM children WHERE parent = ? AND child = ?"
_SQL_CHILDREN = "SELECT child FROM children WHERE parent = ? AND listed = 1 AND place > ? ORDER BY place LIMIT ?"
# The thread's numbering (seq NULL) and its events after ``after_seq`` in one statement. Every stored event has
# seq >= floor >= first_seq, so ``seq > after_seq`` selects what ``seq > read_start(...)`` would.
_SQL_EVENTS = (
    "SELECT NULL, t.first_seq, t.floor, s.mark FROM store AS s LEFT JOIN threads AS t ON t.thread_id = ?1"
    " WHERE s.id = 1"
    " UNION ALL SELECT * FROM (SELECT seq, NULL, NULL, body FROM events WHERE thread_id = ?1 AND seq > ?2"
    " ORDER BY seq LIMIT ?3)"
)
_SQL_COMPACT_READ = "SELECT floor, next_seq FROM threads WHERE thread_id = ?"
_SQL_SET_FLOOR = "UPDATE threads SET floor = ? WHERE thread_id = ?"
_SQL_DROP_EVENTS_BEFORE = "DELETE FROM events WHERE thread_id = ? AND seq < ?"
_SQL_DELETE_READ = "SELECT claim_token, first_seq, next_seq, origin_parent FROM threads WHERE thread_id = ?"
_SQL_DELETE_CHECKPOINTS = "DELETE FROM checkpoints WHERE thread_id = ?"
_SQL_DELETE_EVENTS = "DELETE FROM events WHERE thread_id = ?"
_SQL_DELETE_EFFECTS = "DELETE FROM effects WHERE thread_id = ?"
_SQL_TOMBSTONE = (
    "UPDATE threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL, claim_tenant = NULL,"
    " first_seq = coalesce(?1, first_seq), next_seq = coalesce(?1, next_seq), floor = coalesce(?1, floor),"
    " n_checkpoints = 0, n_pending = 0, metadata = NULL, deleting = 0, updated_at = NULL, deleted_at = ?2,"
    " latest_id = NULL, latest_position = NULL, latest_status = NULL, latest_run_id = NULL,"
    " latest_tenant = NULL, latest_graph_id = NULL, origin_parent = NULL WHERE thread_id = ?3"
)
_SQL_EFFECT = "SELECT body FROM effects WHERE thread_id = ? AND key = ?"
# The newest checkpoint (by position) of any of the runs in a JSON array: one index probe per run.
_SQL_LOOKUP_RUN = (
    "SELECT body FROM checkpoints WHERE thread_id = ?1 AND position = (SELECT max(p) FROM"
    " (SELECT (SELECT max(position) FROM checkpoints WHERE thread_id = ?1 AND run_id = j.value) AS p"
    " FROM json_each(?2) AS j))"
)
_SQL_PROTECTED_POSITIONS = (
    "SELECT (SELECT max(position) FROM checkpoints WHERE thread_id = ?1 AND run_id = j.value)"
    " FROM json_each(?2) AS j"
)
_SQL_PRUNE_READ = (
    "SELECT claim_token, first_seq, next_seq, floor, n_checkpoints, latest_position, n_pending, metadata,"
    " deleted_at FROM threads WHERE thread_id = ?"
)
_SQL_COUNT_CUTOFF = "SELECT position FROM checkpoints WHERE thread_id = ? ORDER BY position LIMIT 1 OFFSET ?"
_SQL_ANY_EXPIRED = (
    "SELECT 1 FROM checkpoints INDEXED BY checkpoints_age WHERE thread_id = ? AND committed_at <= ? AND position < ?"
    " LIMIT 1"
)
_SQL_OLDEST_KEPT = "SELECT seq_mark FROM checkpoints WHERE thread_id = ? AND position >= ? ORDER BY position LIMIT 1"
_SQL_OLDEST_KEPT_AGED = (
    "SELECT seq_mark FROM checkpoints WHERE thread_id = ? AND position >= ? AND (committed_at > ? OR position = ?)"
    " ORDER BY position LIMIT 1"
)
_SQL_PRUNE_BY_COUNT = "DELETE FROM checkpoints WHERE thread_id = ? AND position < ?"
_SQL_PRUNE_BY_COUNT_KEEP = (
    "DELETE FROM checkpoints WHERE thread_id = ? AND position < ? AND position NOT IN (SELECT value FROM json_each(?))"
)
_SQL_PRUNE_BY_AGE = (
    "DELETE FROM checkpoints INDEXED BY checkpoints_age WHERE thread_id = ? AND committed_at <= ? AND position < ?"
)
_SQL_PRUNE_BY_AGE_KEEP = (
    "DELETE FROM checkpoints INDEXED BY checkpoints_age WHERE thread_id = ? AND committed_at <= ? AND position < ?"
    " AND position NOT IN (SELECT value FROM json_each(?))"
)
# INDEXED BY: without it the planner may answer max(seq) by walking the log backwards from its newest event.
_SQL_NEWEST_EXPIRED_EVENT = "SELECT max(seq) FROM events INDEXED BY events_age WHERE thread_id = ? AND committed_at <= ?"
_SQL_PRUNED = "UPDATE threads SET floor = ?, n_checkpoints = ? WHERE thread_id = ?"
# Thread ids are never empty, so ``after = ''`` starts at the first thread.
_SQL_SWEEP_PAGE = "SELECT thread_id FROM threads WHERE thread_id > ? ORDER BY thread_id LIMIT ?"
_SQL_HAS_EFFECTS = "SELECT 1 FROM effects WHERE thread_id = ? LIMIT 1"
_SQL_RAISE_MARK = "UPDATE store SET mark = max(mark, ?) WHERE id = 1"
_SQL_RECLAIM_CHILD = "DELETE FROM children WHERE child = ?"
_REGISTRY_COLUMNS = (
    "SELECT thread_id, latest_tenant, latest_status, claim_token, claim_expires, metadata, updated_at, latest_id,"
    " latest_run_id, latest_graph_id FROM threads"
)
# ThreadStatus as rules.thread_status decides it, for filtering in SQL (``:now`` is the store clock's reading).
_SQL_STATUS = (
    "(CASE WHEN deleting = 1 THEN 'deleted'"
    " WHEN claim_token IS NOT NULL AND claim_expires > :now THEN 'running'"
    " WHEN latest_status = 'running' THEN 'idle' ELSE latest_status END)"
)
_SQL_INCOMPLETE = (
    _REGISTRY_COLUMNS + " WHERE latest_tenant IS :tenant AND origin_parent IS NULL AND latest_status = 'running'"
    " AND deleting = 0 AND (claim_token IS NULL OR claim_expires <= :now)"
)

_Row = tuple[Any, ...]



def _clamp(value: int) -> int:
    return max(_INT64_MIN, min(_INT64_MAX, value))


def _check_path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise ValidationError("path", (f"must be a str or os.PathLike, got {type(path).__name__}",))
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ValidationError("path", ("must be a text path, not bytes",))
    if not text or text == ":memory:" or text.startswith("file:"):
        raise ValidationError(
            "path", (f"{text!r} names no file; give a file path (use memory:// for a store in memory)",)
        )
    if "\x00" in text:
        raise ValidationError("path", ("must not contain NUL",))
    absolute = os.path.abspath(text)
    if os.path.isdir(absolute):
        raise ValidationError("path", (f"{text!r} is a directory; give the path of a database file in it",))
    return absolute


_FILE_LOCKS: dict[str, threading.Lock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


def _file_lock(path: str) -> threading.Lock:
    """The in-process writer lock of one file, shared by every store of this process over it."""
    key = os.path.normcase(os.path.realpath(path))
    with _FILE_LOCKS_GUARD:
        lock = _FILE_LOCKS.get(key)
        if lock is None:
            lock = _FILE_LOCKS[key] = threading.Lock()
        return lock


_OPENING = object()


class SqliteCheckpointer(StoreBase):
    """The store contract in one SQLite file (DESIGN §3 "Stores"); build it with :meth:`open`.

    Safe to call from any number of threads (each read takes a pooled connection of its own; writes share
    transactions, see the module) and from any number of processes over the same file; every store over the file
    behaves as one. ``await_events_after`` polls every :attr:`poll_interval` (the base class's default), so it
    sees commits made through any store or process.
    """

    def __init__(self, path: str, clock: Clock, busy_timeout: timedelta, synchronous: str, opening: object) -> None:
        if opening is not _OPENING:
            raise TypeError("build a SqliteCheckpointer with SqliteCheckpointer.open(path, ...)")
        super().__init__()
        self._path = path
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._busy_s = busy_timeout.total_seconds()
        self._synchronous = synchronous
        self._write_lock = _file_lock(path)
        self._idle: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._pool_closed = False
        self._queue: list[_Write] = []  # writes waiting for the next batch (group commit, see _write)
        self._queue_lock = threading.Lock()
        self._leading = False
        self._last_batch = 0
        self.queue = SqliteRunQueue(self)
        """The store's run queue (DESIGN §4), in the same file: its open entries' runs survive retention."""

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        clock: Clock | None = None,
        busy_timeout: timedelta = timedelta(seconds=5),
        *,
        synchronous: str = SYNCHRONOUS,
    ) -> SqliteCheckpointer:
        """Opens (creating and migrating as needed) the store in the SQLite file at ``path``.

        Source: DESIGN §2 "Constructors", §3 "Stores". Any number of stores and processes may open one file,
        a new one included, at the same time.

        Args:
            path: the database file (str or path-like); its directory must exist. Relative paths are resolved
                against the working directory now.
            clock: the store's clock (default :class:`SystemClock`); it decides claim expiry, ``updated_at``,
                tombstone and retention age. Every store over one file should read the same time.
            busy_timeout: how long a call waits for another writer (thread or process) to release the file
                before it fails with ``ProcessingError`` (> 0).
            synchronous: ``PRAGMA synchronous`` of the connections, one of :data:`SYNCHRONOUS_MODES`;
                default :data:`SYNCHRONOUS` (``NORMAL``).

        Returns:
            The open store; close it with :meth:`close` (or use it as a context manager).

        Raises:
            ValidationError: ``path`` is not a file path (a directory, empty, ``:memory:``) or another argument
                is bad.
            ProcessingError: the file cannot be opened or created (missing directory, not writable), is not a
                SQLite database, is damaged, or was written by a newer version of threadloom.
        """
        absolute = _check_path(path)
        if clock is None:
            clock = SystemClock()
        elif not callable(getattr(clock, "now", None)):
            raise ValidationError("clock", (f"must have a now() method, got {type(clock).__name__}",))
        v.check_positive_duration("busy_timeout", busy_timeout)
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValidationError("synchronous", (f"must be one of {sorted(SYNCHRONOUS_MODES)}, got {synchronous!r}",))
        store = cls(absolute, clock, busy_timeout, synchronous.upper(), _OPENING)
        try:
            store._migrate()
        except BaseException:
            store.close()
            raise
        return store

    @property
    def path(self) -> str:
        """The absolute path of the database file."""
        return self._path

    def __repr__(self) -> str:
        return f"SqliteCheckpointer(path={self._path!r}, clock={self._clock!r})"

    # -- connections, transactions and the one error mapping ------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_s,
            isolation_level=None,  # no implicit transactions: every transaction below is explicit
            check_same_thread=False,  # a connection is used by one thread at a time, through the pool
            cached_statements=256,
        )
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")  # one of SYNCHRONOUS_MODES
            conn.execute(f"PRAGMA wal_autocheckpoint = {int(WAL_AUTOCHECKPOINT)}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _take(self) -> sqlite3.Connection:
        with self._pool_lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give(self, conn: sqlite3.Connection, healthy: bool) -> None:
        if healthy:
            with self._pool_lock:
                if not self._pool_closed and len(self._idle) < MAX_IDLE_CONNECTIONS:
                    self._idle.append(conn)
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

    def _failure(
        self, error: BaseException, operation: str, thread_id: str | None, *, committing: bool = False
    ) -> ProcessingError:
        """The one place a sqlite3 error becomes a threadloom error (STYLE: one mapping function per store).

        Classified by SQLite's result code, never by message text. A failure of the ``COMMIT`` statement
        itself is :class:`OutcomeUnknown`: the write may or may not have landed.
        """
        where = f"thread {thread_id!r}" if thread_id is not None else "the store"
        file = repr(self._path)
        code = getattr(error, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if self._closed and (isinstance(error, sqlite3.ProgrammingError) or primary is None):
            problem, advice = f"the store was closed while working on {where}", "open a new one"
        elif primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            problem = (
                f"another writer held the SQLite file {file} for longer than the busy timeout ({self._busy_s:g} s) "
                f"while working on {where}"
            )
            advice = "retry later, or open the store with a longer busy_timeout"
        elif primary == _SQLITE_NOTADB:
            problem, advice = f"{file} is not a SQLite database (while working on {where})", "give a store file"
        elif primary == _SQLITE_CORRUPT:
            problem, advice = f"the SQLite file {file} is damaged (while working on {where})", "restore it from a backup"
        elif primary == _SQLITE_CANTOPEN:
            problem = f"cannot open or create the SQLite file {file} (while working on {where})"
            advice = "check that its directory exists and is writable"
        elif primary == _SQLITE_READONLY:
            problem, advice = f"the SQLite file {file} is read-only (while working on {where})", "make it writable"
        elif primary == _SQLITE_FULL:
            problem, advice = f"the disk holding {file} is full (while working on {where})", "free space and retry"
        elif primary == _SQLITE_IOERR:
            problem, advice = f"disk I/O error on {file} while working on {where} ({error})", "check the disk and retry"
        elif primary == _SQLITE_INTERRUPT:
            problem, advice = f"the SQLite call was interrupted while working on {where}", "retry"
        else:
            problem = f"SQLite failed while working on {where} ({type(error).__name__}: {error})"
            advice = "retry; if it persists, check the file"
        if committing:
            return OutcomeUnknown(operation, f"{problem}, while its COMMIT was in flight")
        return ProcessingError(operation, f"{problem}; {advice}")

    def _write(self, operation: str, thread_id: str | None, work: Callable[..., T], *args: Any) -> T:
        """Runs ``work(conn, *args)`` inside a ``BEGIN IMMEDIATE`` transaction and returns once it committed.

        Group commit: a call that finds no other write of this store under way leads; calls that arrive while it
        works queue up, and the next leader runs up to :data:`MAX_WRITE_BATCH` of them in one transaction, each
        in a savepoint of its own (a refused call rolls back alone), with one ``COMMIT`` for all. Every call
        returns only after the ``COMMIT`` of its batch: a batch changes when writes land, never what they do.
        """
        request = _Write(operation, thread_id, work, args)
        with self._queue_lock:
            self._queue.append(request)
            lead = not self._leading
            self._leading = True
        if not lead:
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
            batch = self._queue[:MAX_WRITE_BATCH]
            del self._queue[:MAX_WRITE_BATCH]
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
                successor = self._queue[0] if self._queue else None
                if successor is None:
                    self._leading = False
            for request in batch:
                request.wake.set()
            if successor is not None:
                successor.wake.set()  # not finished: it leads the next batch

    def _run_batch(self, batch: list[_Write]) -> None:
        """One transaction for ``batch``; each request ends with its value or its error set."""
        if not self._write_lock.acquire(timeout=self._busy_s):
            for request in batch:
                where = f"thread {request.thread_id!r}" if request.thread_id is not None else "the store"
                request.error = ProcessingError(
                    request.operation,
                    f"other writers in this process held the SQLite file {self._path!r} for longer than the busy "
                    f"timeout ({self._busy_s:g} s) while working on {where}; retry later, or open the store with "
                    "a longer busy_timeout",
                )
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
                        request.error = self._failure(error, request.operation, request.thread_id, committing=False)
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
                else:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as error:
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
            self._write_lock.release()

    def _fail_all(self, requests: list[_Write], error: sqlite3.Error, *, committing: bool) -> None:
        for request in requests:
            mapped = self._failure(error, request.operation, request.thread_id, committing=committing)
            mapped.__cause__ = error
            request.value, request.error = None, mapped

    def _read(
        self, operation: str, thread_id: str | None, work: Callable[..., T], *args: Any, snapshot: bool = True
    ) -> T:
        """Runs ``work(conn, *args)`` in one deferred read transaction (``snapshot=False``: one statement)."""
        try:
            conn = self._take()
        except sqlite3.Error as error:
            raise self._failure(error, operation, thread_id) from error
        try:
            if snapshot:
                conn.execute("BEGIN")
            result = work(conn, *args)
            if snapshot:
                conn.execute("COMMIT")
        except BaseException as error:
            self._give(conn, self._rollback(conn) and not isinstance(error, sqlite3.Error))
            if isinstance(error, sqlite3.Error):
                raise self._failure(error, operation, thread_id) from error
            raise
        self._give(conn, True)
        return result

    def _migrate(self) -> None:
        """Puts the file in WAL mode and applies the numbered migrations it lacks (DESIGN §3 "Stores")."""
        # The caller gave a bad file: say so in our error alone, without chaining sqlite3's traceback.
        try:
            conn = self._connect()
        except sqlite3.Error as error:
            raise self._failure(error, "open", None) from None
        try:
            try:
                self._apply_migrations(conn)
            except BaseException as error:
                self._rollback(conn)
                if isinstance(error, sqlite3.Error):
                    raise self._failure(error, "open", None) from None
                raise
            self._give(conn, True)
        except BaseException:
            conn.close()
            raise

    def _apply_migrations(self, conn: sqlite3.Connection) -> None:
        mode = self._set_journal_mode(conn)
        if str(mode).upper() != JOURNAL_MODE:
            raise ProcessingError(
                "open", f"the SQLite file {self._path!r} cannot use {JOURNAL_MODE} journaling (it stays {mode!r}); "
                "put it on a local filesystem"
            )
        if self._schema_version(conn) == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
        )
        current = self._schema_version(conn)
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, codec.to_micros(self._clock.now())),
            )
        conn.execute("COMMIT")

    def _set_journal_mode(self, conn: sqlite3.Connection) -> Any:
        """``PRAGMA journal_mode = WAL``, retried while another opener holds the file, for up to the busy timeout.

        Switching a new file into WAL needs an exclusive lock; SQLite answers ``SQLITE_BUSY`` at once, without its
        busy handler, when another connection holds a lock meanwhile (several processes opening a new file at
        once). The statement is idempotent, so it is retried with a short backoff; any other error is raised.
        """
        deadline = time.monotonic() + self._busy_s
        pause = JOURNAL_RETRY_FIRST_PAUSE_S
        while True:
            try:
                return conn.execute(f"PRAGMA journal_mode = {JOURNAL_MODE}").fetchone()[0]
            except sqlite3.OperationalError as error:
                code = getattr(error, "sqlite_errorcode", None)
                busy = isinstance(code, int) and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
                if not busy or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, JOURNAL_RETRY_MAX_PAUSE_S)

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if exists is None:
            return 0
        version = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreCorrupt(
                "open",
                f"the SQLite file {self._path!r} has schema version {version}, newer than this threadloom's "
                f"{SCHEMA_VERSION}; upgrade threadloom to open it",
            )
        return version

    def _close(self) -> None:
        with self._pool_lock:
            self._pool_closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- helpers (inside a transaction) ----------------------------------------------------------------------------

    def _now(self) -> datetime:
        return self._clock.now()

    @staticmethod
    def _check_fence(conn: sqlite3.Connection, fence: tuple[str, int] | None) -> None:
        if fence is not None:
            other, token = fence
            row = conn.execute(_SQL_TOKEN_OF, (other,)).fetchone()
            current = row[0] if row is not None else None
            if current != token:
                raise StaleClaim(other, token, current)

    # -- claims ----------------------------------------------------------------------------------------------------

    def _claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        return self._write("claim", thread_id, self._claim_work, thread_id, request)

    def _claim_work(self, conn: sqlite3.Connection, thread_id: str, request: ClaimRequest) -> RunClaim:
        now = self._now()
        row = conn.execute(_SQL_CLAIM_READ, (thread_id,)).fetchone()
        old_holder = old_tenant = None
        if row is not None and row[1] is not None:
            old_holder, _token, expires, old_tenant, latest_id = row
            if rules.claim_is_live(codec.from_micros(expires), now):
                raise ThreadBusy(thread_id, latest_id, rules.busy_holder(old_holder, old_tenant, request.tenant_id))
        expires_at = _expiry("request.ttl", now, request.ttl)
        token, mark = conn.execute(_SQL_TOKEN).fetchall()[0]
        start = max(1, mark)
        conn.execute(
            _SQL_CLAIM_WRITE,
            (thread_id, request.holder, token, codec.to_micros(expires_at), request.tenant_id, start, start, start),
        )
        return RunClaim(
            thread_id=thread_id,
            holder=request.holder,
            token=token,
            expires_at=expires_at,
            tenant_id=request.tenant_id,
            taken_over_from=rules.taken_over_from(old_holder, old_tenant, request.tenant_id),
        )

    def _renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        return self._write("renew", thread_id, self._renew_work, thread_id, token, ttl)

    def _renew_work(self, conn: sqlite3.Connection, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        row = conn.execute(_SQL_RENEW_READ, (thread_id,)).fetchone()
        current = row[1] if row is not None else None
        if current != token:
            raise StaleClaim(thread_id, token, current)
        expires_at = _expiry("ttl", self._now(), ttl)
        conn.execute(_SQL_RENEW, (codec.to_micros(expires_at), thread_id))
        return RunClaim(thread_id=thread_id, holder=row[0], token=token, expires_at=expires_at, tenant_id=row[2])

    def _release(self, thread_id: str, token: int) -> None:
        self._write("release", thread_id, self._release_work, thread_id, token)

    def _release_work(self, conn: sqlite3.Connection, thread_id: str, token: int) -> None:
        row = conn.execute(_SQL_RELEASE_READ, (thread_id,)).fetchone()
        if row is None or row[0] != token:
            return
        _token, latest_id, n_pending, metadata, deleted_at, first_seq, next_seq = row
        if latest_id is None and n_pending == 0 and metadata is None and deleted_at is None and next_seq == first_seq:
            # A thread that holds nothing but the claim is forgotten, as the reference store forgets it.
            mark, has_effects, has_place = conn.execute(_SQL_FORGETTABLE, (thread_id,)).fetchone()
            if first_seq <= max(1, mark) and not has_effects and not has_place:
                conn.execute(_SQL_FORGET, (thread_id,))
                return
        conn.execute(_SQL_RELEASE, (thread_id,))

    # -- commits -----------------------------------------------------------------------------------------------------

    def _commit(self, thread_id: str, encoded: EncodedCommit) -> list[EventRecord]:
        commit = encoded.source  # transitional: this store still encodes the Commit itself
        return self._write("commit", thread_id, self._commit_work, thread_id, commit)

    def _commit_work(self, conn: sqlite3.Connection, thread_id: str, commit: Commit) -> list[EventRecord]:
        row = conn.execute(_SQL_COMMIT_READ, (thread_id,)).fetchone()
        if row is None or row[0] != commit.token:
            raise StaleClaim(thread_id, commit.token, row[0] if row is not None else None)
        (
            _token,
            next_seq,
            n_checkpoints,
            n_pending,
            metadata_text,
            deleting,
            updated_at,
            latest_id,
            latest_position,
            latest_status,
            latest_run_id,
            latest_tenant,
            latest_graph_id,
            origin_parent,
        ) = row
        self._check_fence(conn, commit.fence)
        cp = commit.checkpoint
        keep_position, base = latest_position or 0, latest_id
        if commit.retract_turn and cp is not None:
            settled = conn.execute(_SQL_NEWEST_SETTLED, (thread_id,)).fetchone()
            keep_position, base = settled if settled is not None else (0, None)
        if cp is not None:
            if cp.parent != base:
                raise CheckpointConflict(thread_id, cp.parent, base)
            if conn.execute(_SQL_HAS_CHECKPOINT, (thread_id, cp.id)).fetchone() is not None:
                raise InvalidCommit(thread_id, f"checkpoint {cp.id!r} is already in the history")
        resulting = cp.id if cp is not None else latest_id
        for pw in commit.pending_writes:
            if pw.checkpoint_id != resulting:
                raise InvalidCommit(
                    thread_id,
                    f"pending write of task {pw.task_id!r} names checkpoint {pw.checkpoint_id!r}, "
                    f"not the latest {resulting!r}",
                )
        if commit.retract_turn and cp is None:
            raise InvalidCommit(thread_id, "retract_turn needs a checkpoint to follow the settled one")
        # Every check passed: apply.
        now_us = codec.to_micros(self._now())
        first_pending = n_pending
        if cp is not None:
            if keep_position < (latest_position or 0):
                n_checkpoints -= conn.execute(_SQL_CUT_HISTORY, (thread_id, keep_position)).rowcount
            stamped = codec.stamp_token(cp, commit.token)
            latest_position = keep_position + 1
            conn.execute(
                _SQL_INSERT_CHECKPOINT,
                (
                    thread_id,
                    latest_position,
                    cp.id,
                    cp.run_id,
                    1 if cp.status.settled else 0,
                    now_us,
                    next_seq,
                    codec.encode_checkpoint(stamped),
                ),
            )
            n_checkpoints += 1
            if n_pending:
                conn.execute(_SQL_DROP_PENDING, (thread_id,))
            first_pending = 0
            n_pending = len(commit.pending_writes)
            updated_at = now_us
            latest_id, latest_status, latest_run_id = cp.id, cp.status.value, cp.run_id
            latest_tenant, latest_graph_id = cp.tenant_id, cp.graph_id
            new_parent = cp.origin.parent_thread if cp.origin is not None else None
            if new_parent != origin_parent:
                if origin_parent is not None:
                    conn.execute(_SQL_UNLIST_CHILD, (origin_parent, thread_id))
                if new_parent is not None:
                    conn.execute(_SQL_LIST_CHILD, (new_parent, thread_id))
                origin_parent = new_parent
        else:
            n_pending += len(commit.pending_writes)
        if commit.pending_writes:
            conn.executemany(
                _SQL_INSERT_PENDING,
                [
                    (thread_id, first_pending + index, codec.encode_pending_write(pw))
                    for index, pw in enumerate(commit.pending_writes)
                ],
            )
        records = []
        if commit.events:
            rows = []
            for draft in commit.events:
                text = codec.encode_event(_Numbered(draft, thread_id, next_seq, commit.token))
                rows.append((thread_id, next_seq, now_us, text))
                records.append(codec.decode_event(text, thread_id))
                next_seq += 1
            conn.executemany(_SQL_INSERT_EVENT, rows)
        if commit.effects:
            conn.executemany(
                _SQL_INSERT_EFFECT, [(thread_id, effect.key, codec.encode_effect(effect)) for effect in commit.effects]
            )
        if commit.metadata:
            merged = {**codec.decode_metadata(metadata_text, thread_id), **commit.metadata}
            metadata_text = codec.encode_metadata(merged)
            deleting = 1 if merged.get(rules.DELETING_KEY) == "true" else 0
            updated_at = now_us
        if cp is None and not commit.metadata:
            conn.execute(_SQL_COMMIT_WRITE_LOG, (next_seq, n_pending, thread_id))
            return records
        conn.execute(
            _SQL_COMMIT_WRITE,
            (
                next_seq,
                n_checkpoints,
                n_pending,
                metadata_text,
                deleting,
                updated_at,
                latest_id,
                latest_position,
                latest_status,
                latest_run_id,
                latest_tenant,
                latest_graph_id,
                origin_parent,
                thread_id,
            ),
        )
        return records

    # -- reads -------------------------------------------------------------------------------------------------------

    def _latest(self, thread_id: str) -> StoredCheckpoint | None:
        rows = self._read("latest", thread_id, _fetch_all, _SQL_LATEST, (thread_id,), snapshot=False)
        rows.sort(key=lambda row: (row[0], row[1]))
        if not rows or rows[0][0] != 0:
            return None
        return StoredCheckpoint(
            checkpoint=codec.decode_checkpoint(rows[0][2], thread_id),
            pending_writes=tuple(codec.decode_pending_write(row[2], thread_id) for row in rows[1:]),
        )

    def _checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        rows = self._read("checkpoint", thread_id, _fetch_all, _SQL_CHECKPOINT, (thread_id, checkpoint_id), snapshot=False)
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    def _history(self, thread_id: str, limit: int, before: str | None) -> list[Checkpoint]:
        if before is None:
            rows = self._read("history", thread_id, _fetch_all, _SQL_HISTORY, (thread_id, limit), snapshot=False)
        else:
            rows = self._read("history", thread_id, self._history_work, thread_id, limit, before)
        return [codec.decode_checkpoint(row[0], thread_id) for row in rows]

    @staticmethod
    def _history_work(conn: sqlite3.Connection, thread_id: str, limit: int, before: str) -> list[_Row]:
        found = conn.execute(_SQL_POSITION_OF, (thread_id, before)).fetchone()
        if found is None:
            raise CheckpointNotFound(thread_id, before)
        return conn.execute(_SQL_HISTORY_BEFORE, (thread_id, found[0], limit)).fetchall()

    def _children(self, parent: str, limit: int, after: str | None) -> list[str]:
        return self._read("children", parent, self._children_work, parent, limit, after, snapshot=after is not None)

    @staticmethod
    def _children_work(conn: sqlite3.Connection, parent: str, limit: int, after: str | None) -> list[str]:
        start = 0
        if after is not None:
            found = conn.execute(_SQL_PLACE_OF, (parent, after)).fetchone()
            if found is None:
                raise ValidationError("after", (f"{after!r} is not known as a child of {parent!r}",))
            start = found[0]
        return [row[0] for row in conn.execute(_SQL_CHILDREN, (parent, start, limit))]

    def _events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        rows = self._read(
            "events_after", thread_id, _fetch_all, _SQL_EVENTS, (thread_id, _clamp(after_seq), limit), snapshot=False
        )
        events = []
        for seq, first_seq, floor, text in rows:
            if seq is None:
                start = max(1, text)  # the header row: the store's mark in the last column
                rules.read_start(
                    thread_id,
                    after_seq,
                    first_seq=first_seq if first_seq is not None else start,
                    floor=floor if floor is not None else start,
                )
            else:
                events.append((seq, text))
        events.sort()
        return [codec.decode_event(text, thread_id) for _seq, text in events]

    def _effect(self, thread_id: str, key: str) -> EffectRecord | None:
        rows = self._read("effect", thread_id, _fetch_all, _SQL_EFFECT, (thread_id, key), snapshot=False)
        return codec.decode_effect(rows[0][0], thread_id) if rows else None

    def _lookup_run(self, thread_id: str, run_ids: frozenset[str]) -> Checkpoint | None:
        rows = self._read(
            "lookup_run",
            thread_id,
            _fetch_all,
            _SQL_LOOKUP_RUN,
            (thread_id, codec.dumps(sorted(run_ids))),
            snapshot=False,
        )
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    # -- writes without a checkpoint ---------------------------------------------------------------------------------

    def _compact_events(self, thread_id: str, before_seq: int) -> None:
        self._write("compact_events", thread_id, self._compact_work, thread_id, before_seq)

    @staticmethod
    def _compact_work(conn: sqlite3.Connection, thread_id: str, before_seq: int) -> None:
        row = conn.execute(_SQL_COMPACT_READ, (thread_id,)).fetchone()
        if row is None:
            return
        floor, next_seq = row
        new_floor = rules.compacted_floor(floor=floor, next_seq=next_seq, before_seq=before_seq)
        if new_floor != floor:
            conn.execute(_SQL_SET_FLOOR, (new_floor, thread_id))
            conn.execute(_SQL_DROP_EVENTS_BEFORE, (thread_id, new_floor))

    def _delete_thread(self, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        self._write("delete_thread", thread_id, self._delete_work, thread_id, token, fence)

    def _delete_work(self, conn: sqlite3.Connection, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        row = conn.execute(_SQL_DELETE_READ, (thread_id,)).fetchone()
        if row is None or row[0] != token:
            raise StaleClaim(thread_id, token, row[0] if row is not None else None)
        self._check_fence(conn, fence)
        _token, first_seq, next_seq, origin_parent = row
        start = rules.tombstone_next_seq(first_seq=first_seq, next_seq=next_seq)
        for statement in (_SQL_DELETE_CHECKPOINTS, _SQL_DROP_PENDING, _SQL_DELETE_EVENTS, _SQL_DELETE_EFFECTS):
            conn.execute(statement, (thread_id,))
        if origin_parent is not None:
            conn.execute(_SQL_UNLIST_CHILD, (origin_parent, thread_id))
        conn.execute(_SQL_TOMBSTONE, (start, codec.to_micros(self._now()), thread_id))

    # -- retention -------------------------------------------------------------------------------------------------

    def _prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        self._write("prune", thread_id, self._prune_work, thread_id, policy)

    def _prune_work(self, conn: sqlite3.Connection, thread_id: str, policy: RetentionPolicy) -> None:
        row = conn.execute(_SQL_PRUNE_READ, (thread_id,)).fetchone()
        if row is not None:
            # The runs open queue entries recorded, read in this transaction (seeds 000: lookupRun; DESIGN §4).
            protected = open_runs_in(conn, (thread_id,)).get(thread_id, frozenset())
            self._prune_row(conn, thread_id, row, policy, codec.to_micros(self._now()), protected)

    @staticmethod
    def _prune_row(
        conn: sqlite3.Connection,
        thread_id: str,
        row: _Row,
        policy: RetentionPolicy,
        now_us: int,
        protected: frozenset[str],
    ) -> bool:
        """Prunes one thread as the reference store's ``_prune_row`` does, in SQL; True when anything went.

        Reads only what it removes plus a bounded number of rows: the count cut-off is found from the oldest
        end (the rows before it are the ones removed), age through the ``(thread_id, committed_at)`` indexes.
        """
        _token, _first, next_seq, floor, n_checkpoints, latest_position, *_rest = row
        threshold = None if policy.max_age is None else _clamp(now_us - duration_micros(policy.max_age))
        removed = 0
        oldest_kept_mark = None
        if latest_position is not None and (policy.max_age is not None or policy.max_checkpoints is not None):
            cutoff = None  # the oldest checkpoint max_checkpoints keeps; those before it go
            if policy.max_checkpoints is not None and n_checkpoints > policy.max_checkpoints:
                cutoff = conn.execute(
                    _SQL_COUNT_CUTOFF, (thread_id, n_checkpoints - policy.max_checkpoints)
                ).fetchone()[0]
            aged = threshold is not None and (
                conn.execute(_SQL_ANY_EXPIRED, (thread_id, threshold, latest_position)).fetchone() is not None
            )
            if cutoff is not None or aged:
                # Events before the oldest checkpoint the policy alone keeps go (protected runs keep theirs).
                start = cutoff if cutoff is not None else 0
                if threshold is None:
                    found = conn.execute(_SQL_OLDEST_KEPT, (thread_id, start)).fetchone()
                else:
                    found = conn.execute(
                        _SQL_OLDEST_KEPT_AGED, (thread_id, start, threshold, latest_position)
                    ).fetchone()
                oldest_kept_mark = found[0]
                keep = None
                if protected:
                    positions = conn.execute(
                        _SQL_PROTECTED_POSITIONS, (thread_id, codec.dumps(sorted(protected)))
                    ).fetchall()
                    keep = codec.dumps(sorted({p for (p,) in positions if p is not None}))
                if cutoff is not None:
                    if keep is None:
                        removed += conn.execute(_SQL_PRUNE_BY_COUNT, (thread_id, cutoff)).rowcount
                    else:
                        removed += conn.execute(_SQL_PRUNE_BY_COUNT_KEEP, (thread_id, cutoff, keep)).rowcount
                if aged:
                    if keep is None:
                        removed += conn.execute(_SQL_PRUNE_BY_AGE, (thread_id, threshold, latest_position)).rowcount
                    else:
                        removed += conn.execute(
                            _SQL_PRUNE_BY_AGE_KEEP, (thread_id, threshold, latest_position, keep)
                        ).rowcount
        newest_expired = None
        if threshold is not None:
            newest_expired = conn.execute(_SQL_NEWEST_EXPIRED_EVENT, (thread_id, threshold)).fetchone()[0]
        new_floor = rules.pruned_floor(
            floor=floor,
            next_seq=next_seq,
            policy=policy,
            oldest_kept_mark=oldest_kept_mark,
            newest_expired_seq=newest_expired,
        )
        events_removed = 0
        if new_floor != floor:
            events_removed = conn.execute(_SQL_DROP_EVENTS_BEFORE, (thread_id, new_floor)).rowcount
        if removed or new_floor != floor:
            conn.execute(_SQL_PRUNED, (new_floor, n_checkpoints - removed, thread_id))
        return removed > 0 or events_removed > 0

    def _sweep(self, policy: SweepPolicy, guard: SweepGuard | None, after: str | None) -> SweepPage:
        rows = self._read(
            "sweep", None, _fetch_all, _SQL_SWEEP_PAGE, (after or "", policy.batch_size + 1), snapshot=False
        )
        ids = [row[0] for row in rows]
        page = tuple(ids[: policy.batch_size])
        protected = ask_guard(guard, page)  # before any change, outside any transaction: the guard is user code
        pruned: list[str] = []
        reclaimed: list[str] = []
        if page and (not policy.retention.keeps_everything or policy.tombstone_age is not None):
            self._write("sweep", None, self._sweep_work, page, policy, protected, pruned, reclaimed)
        more = len(ids) > policy.batch_size
        return SweepPage(
            visited=page, pruned=tuple(pruned), reclaimed=tuple(reclaimed), next=page[-1] if more and page else None
        )

    def _sweep_work(
        self,
        conn: sqlite3.Connection,
        page: tuple[str, ...],
        policy: SweepPolicy,
        protected: dict[str, frozenset[str]],
        pruned: list[str],
        reclaimed: list[str],
    ) -> None:
        pruned.clear()
        reclaimed.clear()
        now_us = codec.to_micros(self._now())
        age_us = None if policy.tombstone_age is None else duration_micros(policy.tombstone_age)
        # Whatever the guard answered, the runs open queue entries recorded are kept too (seeds 000 "sweep"),
        # read in this transaction, so an entry finished or a run recorded meanwhile is seen as of now.
        queued = open_runs_in(conn, page) if not policy.retention.keeps_everything else {}
        for thread_id in page:
            row = conn.execute(_SQL_PRUNE_READ, (thread_id,)).fetchone()
            if row is None:
                continue
            runs = protected.get(thread_id, frozenset()) | queued.get(thread_id, frozenset())
            if self._prune_row(conn, thread_id, row, policy.retention, now_us, runs):
                pruned.append(thread_id)
            claim_token, first_seq, next_seq, _floor, _n, latest_position, n_pending, metadata, deleted_at = row
            if (
                age_us is not None
                and deleted_at is not None
                and now_us - deleted_at > age_us
                and claim_token is None
                and latest_position is None
                and n_pending == 0
                and metadata is None
                and next_seq == first_seq
                and thread_id not in protected
                and conn.execute(_SQL_HAS_EFFECTS, (thread_id,)).fetchone() is None
            ):
                conn.execute(_SQL_RAISE_MARK, (first_seq,))
                conn.execute(_SQL_FORGET, (thread_id,))
                conn.execute(_SQL_RECLAIM_CHILD, (thread_id,))
                reclaimed.append(thread_id)

    # -- registry --------------------------------------------------------------------------------------------------

    @staticmethod
    def _summary(row: _Row, now: datetime) -> ThreadSummary:
        thread_id, tenant_id, status, claim_token, claim_expires, metadata_text, updated_at, latest_id, run_id, graph = row
        metadata = codec.decode_metadata(metadata_text, thread_id)
        live = claim_token is not None and rules.claim_is_live(codec.from_micros(claim_expires), now)
        try:
            latest_status = CheckpointStatus(status)
        except ValueError as error:
            raise StoreCorrupt(
                "decode", f"the stored status {status!r} of thread {thread_id!r} does not decode; the row is damaged"
            ) from error
        return ThreadSummary(
            thread_id=thread_id,
            tenant_id=tenant_id,
            status=rules.thread_status(latest_status, live_claim=live, metadata=metadata),
            updated_at=codec.from_micros(updated_at),
            latest_checkpoint_id=latest_id,
            latest_run_id=run_id,
            graph_id=graph,
            metadata=metadata,
        )

    def _threads(self, query: ThreadQuery) -> ThreadPage:
        now = self._now()
        sql = [_REGISTRY_COLUMNS, " WHERE latest_tenant IS :tenant AND origin_parent IS NULL AND latest_id IS NOT NULL"]
        params: dict[str, Any] = {"tenant": query.tenant_id, "now": codec.to_micros(now), "limit": query.limit + 1}
        if query.after is not None:
            sql.append(" AND (updated_at, thread_id) < (:after_at, :after_id)")
            params["after_at"] = codec.to_micros(query.after.updated_at)
            params["after_id"] = query.after.thread_id
        if query.updated_since is not None:
            sql.append(" AND updated_at >= :since")
            params["since"] = codec.to_micros(query.updated_since)
        if query.graph_id is not None:
            sql.append(" AND latest_graph_id = :graph")
            params["graph"] = query.graph_id
        if query.statuses is not None:
            names = sorted(status.value for status in query.statuses)
            if not names:
                return ThreadPage()
            sql.append(f" AND {_SQL_STATUS} IN ({', '.join(f':s{i}' for i in range(len(names)))})")
            params.update({f"s{i}": name for i, name in enumerate(names)})
        sql.append(" ORDER BY updated_at DESC, thread_id DESC LIMIT :limit")
        rows = self._read("threads", None, _fetch_all, "".join(sql), params, snapshot=False)
        summaries = [self._summary(row, now) for row in rows]
        return ThreadPage.of([s for s in summaries if query.matches(s)], query.limit)

    def _incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage:
        now = self._now()
        params: dict[str, Any] = {"tenant": tenant_id, "now": codec.to_micros(now), "limit": limit + 1}
        sql = _SQL_INCOMPLETE
        if after is not None:
            sql += " AND (updated_at, thread_id) > (:after_at, :after_id)"
            params["after_at"] = codec.to_micros(after.updated_at)
            params["after_id"] = after.thread_id
        sql += " ORDER BY updated_at, thread_id LIMIT :limit"
        rows = self._read("incomplete", None, _fetch_all, sql, params, snapshot=False)
        summaries = [self._summary(row, now) for row in rows]
        return ThreadPage.of([s for s in summaries if s.status is ThreadStatus.IDLE], limit)


class _Write:
    """One queued write call: its work, then its outcome (set by the batch that ran it)."""

    __slots__ = ("operation", "thread_id", "work", "args", "wake", "finished", "value", "error")

    def __init__(self, operation: str, thread_id: str | None, work: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.operation = operation
        self.thread_id = thread_id
        self.work = work
        self.args = args
        self.wake = threading.Event()
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None

    def outcome(self) -> Any:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return self.value


class _Numbered:
    """An event draft as numbered by a commit: the fields ``codec.encode_event`` reads of an ``EventRecord``.

    Encoding this view instead of building an ``EventRecord`` spares re-validating the draft (it was validated
    when it was built); the record returned to the caller is decoded from the stored text, as every read is.
    """

    __slots__ = ("_draft", "thread_id", "seq", "token")

    def __init__(self, draft: Any, thread_id: str, seq: int, token: int) -> None:
        self._draft = draft
        self.thread_id = thread_id
        self.seq = seq
        self.token = token

    def __getattr__(self, name: str) -> Any:
        return getattr(self._draft, name)


def _fetch_all(conn: sqlite3.Connection, sql: str, params: Any) -> list[_Row]:
    return conn.execute(sql, params).fetchall()


def _expiry(field: str, now: datetime, ttl: timedelta) -> datetime:
    try:
        return now + ttl
    except OverflowError:
        raise ValidationError(field, (f"{ttl} from now is past the largest time a store can record",)) from None


__all__ = [
    "JOURNAL_MODE",
    "MAX_WRITE_BATCH",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SYNCHRONOUS",
    "SYNCHRONOUS_MODES",
    "SqliteCheckpointer",
    "WAL_AUTOCHECKPOINT",
]

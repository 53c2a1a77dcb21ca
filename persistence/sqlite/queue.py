"""``SqliteRunQueue``: the durable run queue inside a ``SqliteCheckpointer``'s file (``store.queue``).

It is the store's ``queue`` attribute and works through the store's
:class:`~threadloom.persistence.sqlite.connection.Database`, the package's internal interface to the file: every
write is one of its ``BEGIN IMMEDIATE`` transactions (:meth:`Database.write`), every read one deferred snapshot or
one statement (:meth:`Database.read`), and every driver error goes through the package's one mapping function
(:mod:`threadloom.persistence.sqlite.errors`). Because the write lock of the file is taken before anything is
read, two leases - from two threads, two stores or two processes over one file - never grant the same entry: the
second reads the first's lease.

Tables (migration 2 of :data:`threadloom.persistence.sqlite.schema.MIGRATIONS`; migration 4 adds ``refunded``, the
leases handed back with a refund, and migration 10 ``retried_as``, the entry a retry enqueued), times as integer
microseconds since the epoch by the store's clock:

* ``run_queue`` - one row per entry. ``entry_id`` is ``INTEGER PRIMARY KEY AUTOINCREMENT``, so an id is never
  reused. ``thread_head`` is 1 while the entry is open and no older entry of its thread is open: it is set by
  the enqueue (no open entry of the thread yet) and by the finish of the thread's previous head, and cleared by
  the entry's own finish. Only a head is leasable (rule 2: one thread's inputs run in enqueue order).
* ``run_queue_runs`` - the RunIds each entry recorded, by ``position`` (0, 1, ...), at most
  :data:`~threadloom.persistence.queue.MAX_RUNS_PER_ENTRY` per entry.

Indexes and the calls they answer (every call reads a bounded number of rows):

* ``run_queue_leasable (entry_id, available_at, lease_expires_at, graph_id, status, thread_head) WHERE
  status = 'open' AND thread_head = 1`` - the lease: the oldest leasable head is the first row of this partial
  index, in ``entry_id`` order, whose columns pass the filter; the index covers every column the filter reads,
  and it holds only the open head of each thread, so the walk skips only entries that are leased, delayed or of
  another graph kind - never finished entries, nor entries queued behind their thread's head.
* ``run_queue_thread (thread_id, entry_id) WHERE status = 'open'`` - a thread's open entries: the enqueue's
  head test, the finish's next head, and the runs ``prune`` and ``sweep`` protect.
* ``run_queue_status (status, entry_id)`` - :meth:`RunQueue.entries` filtered by status.
* ``run_queue_runs`` primary key ``(entry_id, position)`` and unique ``(entry_id, run_id)``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from threadloom.domain.clock import from_micros, to_micros
from threadloom.domain.errors import StaleLease, ValidationError
from threadloom.domain.queue import EntryStatus, Lease, PurgePage, QueueDepth, QueueEntry
from threadloom.persistence import codec
from threadloom.persistence.queue import MAX_RUNS_PER_ENTRY, QueueBase

if TYPE_CHECKING:
    from threadloom.persistence.sqlite.connection import Database

QUEUE_MIGRATION: tuple[str, ...] = (
    (
        "CREATE TABLE run_queue ("
        " entry_id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " thread_id TEXT NOT NULL, graph_id TEXT NOT NULL, input TEXT NOT NULL, tenant_id TEXT,"
        " status TEXT NOT NULL CHECK (status IN ('open', 'completed', 'failed')),"
        " thread_head INTEGER NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0, leased_by TEXT, lease_expires_at INTEGER,"
        " available_at INTEGER NOT NULL, enqueued_at INTEGER NOT NULL, finished_at INTEGER, error TEXT)"
    ),
    # status and thread_head are columns too, so that the lease reads the index alone (a covering index).
    (
        "CREATE INDEX run_queue_leasable"
        " ON run_queue (entry_id, available_at, lease_expires_at, graph_id, status, thread_head)"
        " WHERE status = 'open' AND thread_head = 1"
    ),
    "CREATE INDEX run_queue_thread ON run_queue (thread_id, entry_id) WHERE status = 'open'",
    "CREATE INDEX run_queue_status ON run_queue (status, entry_id)",
    (
        "CREATE TABLE run_queue_runs ("
        " entry_id INTEGER NOT NULL, position INTEGER NOT NULL, run_id TEXT NOT NULL,"
        " PRIMARY KEY (entry_id, position)) WITHOUT ROWID"
    ),
    "CREATE UNIQUE INDEX run_queue_runs_run ON run_queue_runs (entry_id, run_id)",
)
"""The statements of the queue's migration (number 2 of the store's ``MIGRATIONS``)."""

# -- statements (fixed text, reused from sqlite3's statement cache) ------------------------------------------------

_COLUMNS = (
    "entry_id, thread_id, graph_id, input, tenant_id, status, attempts, leased_by, lease_expires_at, available_at,"
    " enqueued_at, finished_at, error, refunded, retried_as"
)
_SQL_Q_ENQUEUE = (
    "INSERT INTO run_queue (thread_id, graph_id, input, tenant_id, status, thread_head, available_at, enqueued_at)"
    " VALUES (?1, ?2, ?3, ?4, 'open',"
    " NOT EXISTS (SELECT 1 FROM run_queue INDEXED BY run_queue_thread WHERE thread_id = ?1 AND status = 'open'),"
    " ?5, ?6) RETURNING entry_id"
)
# The oldest leasable entry (rule 2): an open head, available, without a live lease. INDEXED BY keeps the plan
# on the partial index whatever the statistics say (the table's own b-tree is in entry_id order too, but holds
# every finished entry).
_SQL_Q_NEXT = (
    "SELECT entry_id FROM run_queue INDEXED BY run_queue_leasable"
    " WHERE status = 'open' AND thread_head = 1 AND available_at <= ?1"
    " AND (lease_expires_at IS NULL OR lease_expires_at <= ?1) ORDER BY entry_id LIMIT 1"
)
_SQL_Q_NEXT_OF = (
    "SELECT entry_id FROM run_queue INDEXED BY run_queue_leasable"
    " WHERE status = 'open' AND thread_head = 1 AND available_at <= ?1"
    " AND (lease_expires_at IS NULL OR lease_expires_at <= ?1)"
    " AND graph_id IN (SELECT value FROM json_each(?2)) ORDER BY entry_id LIMIT 1"
)
_SQL_Q_LEASE = (
    "UPDATE run_queue SET attempts = attempts + 1, leased_by = ?1, lease_expires_at = ?2 WHERE entry_id = ?3"
)
_SQL_Q_STATE = "SELECT status, attempts, leased_by, thread_id FROM run_queue WHERE entry_id = ?"
_SQL_Q_RENEW = "UPDATE run_queue SET lease_expires_at = ? WHERE entry_id = ?"
_SQL_Q_HAS_RUN = "SELECT 1 FROM run_queue_runs WHERE entry_id = ? AND run_id = ?"
_SQL_Q_LAST_POSITION = "SELECT max(position) FROM run_queue_runs WHERE entry_id = ?"
_SQL_Q_ADD_RUN = "INSERT INTO run_queue_runs (entry_id, position, run_id) VALUES (?, ?, ?)"
_SQL_Q_FINISH = (
    "UPDATE run_queue SET status = ?1, thread_head = 0, error = ?2, finished_at = ?3, leased_by = NULL,"
    " lease_expires_at = NULL WHERE entry_id = ?4"
)
# The thread's next open entry becomes its head (the one just finished was the head: only heads are leased).
_SQL_Q_NEXT_HEAD = (
    "UPDATE run_queue SET thread_head = 1 WHERE entry_id = (SELECT entry_id FROM run_queue INDEXED BY"
    " run_queue_thread WHERE thread_id = ? AND status = 'open' ORDER BY entry_id LIMIT 1)"
)
_SQL_Q_RELEASE = (
    "UPDATE run_queue SET leased_by = NULL, lease_expires_at = NULL, available_at = ?, refunded = refunded + ?"
    " WHERE entry_id = ?"
)
_SQL_Q_ENTRY = f"SELECT {_COLUMNS} FROM run_queue WHERE entry_id = ?"
_SQL_Q_ENTRY_RUNS = "SELECT run_id FROM run_queue_runs WHERE entry_id = ? ORDER BY position"
_SQL_Q_ENTRIES = f"SELECT {_COLUMNS} FROM run_queue WHERE entry_id > ? ORDER BY entry_id LIMIT ?"
_SQL_Q_ENTRIES_OF = (
    f"SELECT {_COLUMNS} FROM run_queue INDEXED BY run_queue_status WHERE status = ? AND entry_id > ?"
    " ORDER BY entry_id LIMIT ?"
)
# The runs of a page of entries (a JSON array of entry ids): one primary-key range per entry; sorted by the caller.
_SQL_Q_PAGE_RUNS = (
    "SELECT r.entry_id, r.position, r.run_id FROM json_each(?) AS j JOIN run_queue_runs AS r ON r.entry_id = j.value"
)
# The runs the open entries of some threads (a JSON array of thread ids) recorded: what prune and sweep keep.
_SQL_Q_OPEN_RUNS = (
    "SELECT q.thread_id, r.run_id FROM json_each(?) AS j"
    " JOIN run_queue AS q INDEXED BY run_queue_thread ON q.thread_id = j.value AND q.status = 'open'"
    " JOIN run_queue_runs AS r ON r.entry_id = q.entry_id"
)

# retry: the failed entry's run, then _SQL_Q_ENQUEUE of it and the mark that it was retried.
_SQL_Q_RETRY_READ = (
    "SELECT thread_id, graph_id, input, tenant_id FROM run_queue"
    " WHERE entry_id = ? AND status = 'failed' AND retried_as IS NULL"
)
_SQL_Q_RETRIED = "UPDATE run_queue SET retried_as = ? WHERE entry_id = ?"
# take_lease: the entry's state, then _SQL_Q_LEASE on it.
_SQL_Q_TAKE_STATE = "SELECT status, leased_by, lease_expires_at FROM run_queue WHERE entry_id = ?"
# purge: one page of entries by primary key, then each finished, old enough entry and its runs deleted.
# depth: the open entries counted on the run_queue_status index, and the oldest one's enqueue time.
_SQL_Q_DEPTH = (
    "SELECT count(*), (SELECT enqueued_at FROM run_queue INDEXED BY run_queue_status WHERE status = 'open'"
    " ORDER BY entry_id LIMIT 1) FROM run_queue INDEXED BY run_queue_status WHERE status = 'open'"
)
_SQL_Q_PURGE_PAGE = "SELECT entry_id, status, finished_at FROM run_queue WHERE entry_id > ? ORDER BY entry_id LIMIT ?"
_SQL_Q_PURGE_ENTRY = "DELETE FROM run_queue WHERE entry_id = ? AND status <> 'open'"
_SQL_Q_PURGE_RUNS = "DELETE FROM run_queue_runs WHERE entry_id = ?"

STATEMENTS: Mapping[str, str] = {name: sql for name, sql in dict(globals()).items() if name.startswith("_SQL_Q_")}
"""Every statement of the queue by name (the tests read their query plans)."""


def open_runs_in(conn: sqlite3.Connection, thread_ids: Iterable[str]) -> dict[str, frozenset[str]]:
    """The RunIds the open entries of each of ``thread_ids`` recorded, read on ``conn`` (inside its transaction).

    The store's ``prune`` and ``sweep`` call it inside their write transaction, so an entry finished or a run
    recorded by another store or process is seen as of the moment the pruning starts. A thread none of whose
    open entries recorded a run is absent.
    """
    ids = sorted(set(thread_ids))
    if not ids:
        return {}
    found: dict[str, set[str]] = {}
    for thread_id, run_id in conn.execute(_SQL_Q_OPEN_RUNS, (codec.dumps(ids),)):
        found.setdefault(thread_id, set()).add(run_id)
    return {thread_id: frozenset(runs) for thread_id, runs in found.items()}


def _entry_value(row: tuple[Any, ...], run_ids: Iterable[str]) -> QueueEntry:
    return codec.decode_queue_entry(row, run_ids, from_micros)


def _read_entry(conn: sqlite3.Connection, entry_id: int) -> QueueEntry | None:
    row = conn.execute(_SQL_Q_ENTRY, (entry_id,)).fetchone()
    if row is None:
        return None
    return _entry_value(row, (run_id for (run_id,) in conn.execute(_SQL_Q_ENTRY_RUNS, (entry_id,))))


def _read_page(conn: sqlite3.Connection, limit: int, after: int, status: EntryStatus | None) -> list[QueueEntry]:
    if status is None:
        rows = conn.execute(_SQL_Q_ENTRIES, (after, limit)).fetchall()
    else:
        rows = conn.execute(_SQL_Q_ENTRIES_OF, (status.value, after, limit)).fetchall()
    if not rows:
        return []
    runs: dict[int, list[tuple[int, str]]] = {}
    for entry_id, position, run_id in conn.execute(_SQL_Q_PAGE_RUNS, (codec.dumps([row[0] for row in rows]),)):
        runs.setdefault(entry_id, []).append((position, run_id))
    return [_entry_value(row, (run_id for _p, run_id in sorted(runs.get(row[0], ())))) for row in rows]


def _peek(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> bool:
    return conn.execute(sql, params).fetchone() is not None


def _later(field: str, now: datetime, span: timedelta) -> datetime:
    try:
        return now + span
    except OverflowError:
        raise ValidationError(field, (f"{span} from now is past the largest time a store can record",)) from None


class SqliteRunQueue(QueueBase):
    """The run queue of one ``SqliteCheckpointer`` (``store.queue``); built by the store itself.

    Safe to call from any number of threads, and from any number of stores and processes over the same file:
    they all see one queue. It shares the store's database: connections, transactions, clock, closed state and
    error mapping.

    Args:
        database: the store's database (its file, clock and transactions).
    """

    def __init__(self, database: Database) -> None:
        self._db = database

    def __repr__(self) -> str:
        return f"SqliteRunQueue(path={self._db.path!r})"

    @property
    def closed(self) -> bool:
        """True once the store is closed."""
        return self._db.closed

    # -- helpers (inside a transaction) -----------------------------------------------------------------------

    @staticmethod
    def _current(conn: sqlite3.Connection, entry_id: int, attempt: int) -> tuple[Any, ...]:
        """The entry's state if ``attempt`` is its current lease, else ``StaleLease`` (as the reference decides)."""
        row = conn.execute(_SQL_Q_STATE, (entry_id,)).fetchone()
        if row is None or row[0] != EntryStatus.OPEN.value or row[2] is None or row[1] != attempt:
            current = row[1] if row is not None and row[0] == EntryStatus.OPEN.value and row[2] is not None else None
            raise StaleLease(entry_id, attempt, current)
        return row

    # -- writes -----------------------------------------------------------------------------------------------

    def _enqueue(
        self,
        thread_id: str,
        graph_id: str,
        input: Any,
        tenant_id: str | None,
        delay: timedelta,
    ) -> QueueEntry:
        text = codec.dumps(input)
        return self._db.write("enqueue", thread_id, self._enqueue_work, thread_id, graph_id, text, tenant_id, delay)

    def _enqueue_work(
        self,
        conn: sqlite3.Connection,
        thread_id: str,
        graph_id: str,
        text: str,
        tenant_id: str | None,
        delay: timedelta,
    ) -> QueueEntry:
        now = self._db.now()
        available = _later("delay", now, delay)
        (entry_id,) = conn.execute(
            _SQL_Q_ENQUEUE,
            (thread_id, graph_id, text, tenant_id, to_micros(available), to_micros(now)),
        ).fetchone()
        entry = _read_entry(conn, entry_id)
        assert entry is not None
        return entry

    def _lease(self, holder: str, ttl: timedelta, graph_ids: frozenset[str] | None) -> Lease | None:
        kinds: tuple[str, ...] = ()
        if graph_ids is None:
            sql = _SQL_Q_NEXT
        else:
            sql, kinds = _SQL_Q_NEXT_OF, (codec.dumps(sorted(graph_ids)),)
        # A read first: an idle worker polling an empty queue never takes the file's write lock. The write
        # below decides again under that lock, so the read only saves work, never grants anything.
        now_us = to_micros(self._db.now())
        if not self._db.read("lease", None, _peek, sql, (now_us, *kinds), snapshot=False):
            return None
        return self._db.write("lease", None, self._lease_work, holder, ttl, sql, kinds)

    def _lease_work(
        self, conn: sqlite3.Connection, holder: str, ttl: timedelta, sql: str, kinds: tuple[str, ...]
    ) -> Lease | None:
        now = self._db.now()
        expires_at = _later("ttl", now, ttl)
        row = conn.execute(sql, (to_micros(now), *kinds)).fetchone()
        if row is None:
            return None
        entry_id = row[0]
        previous = conn.execute(_SQL_Q_STATE, (entry_id,)).fetchone()[2]  # an expired lease nobody released
        conn.execute(_SQL_Q_LEASE, (holder, to_micros(expires_at), entry_id))
        entry = _read_entry(conn, entry_id)
        assert entry is not None
        return self._lease_value(entry, previous)

    def _renew_lease(self, entry_id: int, attempt: int, ttl: timedelta) -> Lease:
        return self._db.write("renew_lease", None, self._renew_work, entry_id, attempt, ttl)

    def _renew_work(self, conn: sqlite3.Connection, entry_id: int, attempt: int, ttl: timedelta) -> Lease:
        self._current(conn, entry_id, attempt)
        expires_at = _later("ttl", self._db.now(), ttl)
        conn.execute(_SQL_Q_RENEW, (to_micros(expires_at), entry_id))
        entry = _read_entry(conn, entry_id)
        assert entry is not None
        return self._lease_value(entry)

    def _record_run(self, entry_id: int, attempt: int, run_id: str) -> QueueEntry:
        return self._db.write("record_run", None, self._record_work, entry_id, attempt, run_id)

    def _record_work(self, conn: sqlite3.Connection, entry_id: int, attempt: int, run_id: str) -> QueueEntry:
        self._current(conn, entry_id, attempt)
        if conn.execute(_SQL_Q_HAS_RUN, (entry_id, run_id)).fetchone() is None:
            last = conn.execute(_SQL_Q_LAST_POSITION, (entry_id,)).fetchone()[0]
            position = 0 if last is None else last + 1
            if position >= MAX_RUNS_PER_ENTRY:
                raise ValidationError(
                    "run_id", (f"entry {entry_id} already recorded {MAX_RUNS_PER_ENTRY} runs; finish it",)
                )
            conn.execute(_SQL_Q_ADD_RUN, (entry_id, position, run_id))
        entry = _read_entry(conn, entry_id)
        assert entry is not None
        return entry

    def _finish(self, entry_id: int, attempt: int, status: EntryStatus, error: str | None) -> QueueEntry:
        return self._db.write("finish", None, self._finish_work, entry_id, attempt, status, error)

    def _finish_work(
        self, conn: sqlite3.Connection, entry_id: int, attempt: int, status: EntryStatus, error: str | None
    ) -> QueueEntry:
        row = conn.execute(_SQL_Q_STATE, (entry_id,)).fetchone()
        if row is None or row[0] != status.value or row[1] != attempt:
            _status, _attempts, _holder, thread_id = self._current(conn, entry_id, attempt)
            conn.execute(
                _SQL_Q_FINISH,
                (
                    status.value,
                    error if status is EntryStatus.FAILED else None,
                    to_micros(self._db.now()),
                    entry_id,
                ),
            )
            conn.execute(_SQL_Q_NEXT_HEAD, (thread_id,))
        # else: the same attempt finished it already with this status - a retry returns it unchanged
        entry = _read_entry(conn, entry_id)
        assert entry is not None
        return entry

    def _release_lease(self, entry_id: int, attempt: int, delay: timedelta, refund: bool) -> None:
        self._db.write("release_lease", None, self._release_work, entry_id, attempt, delay, refund)

    def _release_work(
        self, conn: sqlite3.Connection, entry_id: int, attempt: int, delay: timedelta, refund: bool
    ) -> None:
        try:
            self._current(conn, entry_id, attempt)
        except StaleLease:
            return  # not the current lease: changes nothing, like a claim's release
        available = _later("delay", self._db.now(), delay)
        conn.execute(_SQL_Q_RELEASE, (to_micros(available), int(refund), entry_id))

    def _take_lease(self, entry_id: int, holder: str, ttl: timedelta, force: bool) -> Lease | None:
        return self._db.write("take_lease", None, self._take_work, entry_id, holder, ttl, force)

    def _take_work(
        self, conn: sqlite3.Connection, entry_id: int, holder: str, ttl: timedelta, force: bool
    ) -> Lease | None:
        row = conn.execute(_SQL_Q_TAKE_STATE, (entry_id,)).fetchone()
        if row is None or row[0] != EntryStatus.OPEN.value:
            return None
        now = self._db.now()
        if row[2] is not None and to_micros(now) < row[2] and not force:
            return None  # a live lease holds it
        expires_at = _later("ttl", now, ttl)
        conn.execute(_SQL_Q_LEASE, (holder, to_micros(expires_at), entry_id))
        entry = _read_entry(conn, entry_id)
        assert entry is not None
        return self._lease_value(entry, row[1])

    def _retry(self, entry_id: int) -> QueueEntry | None:
        return self._db.write("retry", None, self._retry_work, entry_id)

    def _retry_work(self, conn: sqlite3.Connection, entry_id: int) -> QueueEntry | None:
        row = conn.execute(_SQL_Q_RETRY_READ, (entry_id,)).fetchone()
        if row is None:
            return None  # unknown, not failed, or retried already (the write lock is held: no other retry runs)
        thread_id, graph_id, text, tenant_id = row
        entry = self._enqueue_work(conn, thread_id, graph_id, text, tenant_id, timedelta(0))
        conn.execute(_SQL_Q_RETRIED, (entry.entry_id, entry_id))
        return entry

    def _purge(self, older_than: timedelta, limit: int, after: int) -> PurgePage:
        return self._db.write("purge", None, self._purge_work, older_than, limit, after)

    def _purge_work(self, conn: sqlite3.Connection, older_than: timedelta, limit: int, after: int) -> PurgePage:
        now = self._db.now()
        cutoff = to_micros(now) - (older_than // timedelta(microseconds=1))
        rows = conn.execute(_SQL_Q_PURGE_PAGE, (after, limit)).fetchall()
        purged = []
        for entry_id, status, finished_at in rows:
            if status != EntryStatus.OPEN.value and finished_at is not None and finished_at <= cutoff:
                conn.execute(_SQL_Q_PURGE_ENTRY, (entry_id,))
                conn.execute(_SQL_Q_PURGE_RUNS, (entry_id,))
                purged.append(entry_id)
        return PurgePage(
            visited=len(rows), purged=tuple(purged), next=rows[-1][0] if len(rows) == limit else None
        )

    # -- reads ------------------------------------------------------------------------------------------------

    def _entry(self, entry_id: int) -> QueueEntry | None:
        return self._db.read("entry", None, _read_entry, entry_id)

    def _entries(self, limit: int, after: int, status: EntryStatus | None) -> list[QueueEntry]:
        return self._db.read("entries", None, _read_page, limit, after, status)

    def _depth(self) -> QueueDepth:
        now = self._db.now()
        count, oldest = self._db.fetch_all("depth", None, _SQL_Q_DEPTH, ())[0]
        return QueueDepth(
            open=count, oldest_enqueued_at=from_micros(oldest) if oldest is not None else None, read_at=now
        )

    def _open_runs(self, thread_ids: tuple[str, ...]) -> Mapping[str, frozenset[str]]:
        return self._db.read("open_runs", None, open_runs_in, thread_ids, snapshot=False)


__all__ = ["QUEUE_MIGRATION", "STATEMENTS", "SqliteRunQueue", "open_runs_in"]

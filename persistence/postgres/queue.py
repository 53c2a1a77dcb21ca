"""``PostgresRunQueue``: the durable run queue in a :class:`PostgresCheckpointer`'s schema.

It is the store's ``queue`` attribute and calls through the store's
:class:`~threadloom.persistence.postgres.calls.Database` - the package's one way to run a statement: one pooled
connection, one transaction, one round trip, the call timeout set on the server and enforced on the client, and
every driver error through :func:`~threadloom.persistence.postgres.errors.map_error`. Of the store itself it
uses only the public ``closed``. The database decides time: enqueue, lease, expiry, renewal, release and finish
times are the server's ``clock_timestamp()``.

Each write is one PL/pgSQL function (``migrations/functions/run_queue.sql``) called in one statement:

* ``tl_q_lease`` selects the oldest leasable head ``FOR UPDATE SKIP LOCKED LIMIT 1`` through the partial index
  ``run_queue_leasable`` and numbers the next attempt on it, so concurrent leases - from threads, stores or
  processes - never grant one entry twice and never wait for each other.
* ``tl_q_renew``, ``tl_q_record``, ``tl_q_finish`` and ``tl_q_release`` lock the entry's row and compare the
  attempt (the lease's fencing number) first: a stale one is ``StaleLease`` (a release changes nothing).
* ``tl_q_enqueue`` and ``tl_q_finish`` take a transaction-level advisory lock on the entry's thread, so a thread
  has exactly one head (its oldest open entry) whatever runs at the same time.

``prune`` and ``sweep`` keep the newest checkpoint of every run an open entry recorded, read inside their own
write transaction after they locked the thread's row (``tl_prune_row``, ``migrations/functions/retention.sql``).

Entry ids and attempts are ``bigint`` and durations microseconds: the public methods already bound them
(``validation.MAX_INT``, ``validation.MAX_DURATION``), so every argument fits its column.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from threadloom.domain.clock import duration_micros
from threadloom.domain.errors import ProcessingError, StaleLease, ValidationError
from threadloom.domain.queue import EntryStatus, Lease, PurgePage, QueueDepth, QueueEntry
from threadloom.persistence import codec
from threadloom.persistence.postgres import sql as q
from threadloom.persistence.postgres.calls import as_utc
from threadloom.persistence.queue import MAX_RUNS_PER_ENTRY, QueueBase

if TYPE_CHECKING:  # pragma: no cover
    from threadloom.persistence.postgres.calls import Database
    from threadloom.persistence.postgres.store import PostgresCheckpointer



def entry_value(row: tuple[Any, ...]) -> QueueEntry:
    """The :class:`QueueEntry` of a row of the queue's reads (or the entry part of a ``tl_q_result``)."""
    return codec.decode_queue_entry((*row[:13], *row[14:16]), row[13] or (), as_utc)


class PostgresRunQueue(QueueBase):
    """The run queue of one :class:`PostgresCheckpointer` (``store.queue``); built by the store itself.

    Safe to call from any number of threads, and from any number of stores and processes over the same schema:
    they all see one queue. It shares the store's pool, call bounds, closed state and error mapping.

    Every call raises what :class:`~threadloom.persistence.queue.RunQueue` documents and, like the store's own
    calls, a ``ProcessingError`` of the kind the store documents: ``StoreUnavailable`` when nothing was applied
    (retry it), ``OutcomeUnknown`` when a write's connection was lost after it was sent (a lease may then have
    been granted: it expires unused; ``record_run``, ``renew_lease``, ``finish`` and ``release_lease`` are safe
    to retry), ``StoreCorrupt`` for a schema that does not match this version.

    Args:
        store: the store the queue belongs to (its ``closed`` state).
        db: the store's calls, on the same schema and connections.
    """

    def __init__(self, store: PostgresCheckpointer, db: Database) -> None:
        self._store = store
        self._db = db
        self._sql = {
            name: db.render(getattr(q, name))
            for name in (
                "Q_ENQUEUE",
                "Q_LEASE",
                "Q_RENEW",
                "Q_RECORD",
                "Q_FINISH",
                "Q_RELEASE",
                "Q_RETRY",
                "Q_ENTRY",
                "Q_ENTRIES",
                "Q_DEPTH",
                "Q_ENTRIES_OF",
                "Q_OPEN_RUNS",
                "Q_TAKE_LEASE",
                "Q_PURGE",
            )
        }

    def __repr__(self) -> str:
        return f"PostgresRunQueue({self._store!r})"

    @property
    def closed(self) -> bool:
        """True once the store is closed."""
        return self._store.closed

    # -- helpers ----------------------------------------------------------------------------------------------

    def _write(self, operation: str, thread_id: str | None, name: str, params: tuple[Any, ...]) -> tuple[Any, ...]:
        rows = self._db.call(operation, thread_id, self._sql[name], params, write=True)
        if len(rows) != 1:
            raise ProcessingError(operation, f"the queue function answered {len(rows)} rows, not one")
        return rows[0]

    @staticmethod
    def _entry_of(operation: str, row: tuple[Any, ...]) -> QueueEntry:
        if row[3] is None:
            raise ProcessingError(operation, "the run-queue entry vanished while the call ran; was it deleted?")
        return entry_value(row[3:])

    # -- writes -----------------------------------------------------------------------------------------------

    def _enqueue(
        self,
        thread_id: str,
        graph_id: str,
        input: Any,  # noqa: A002
        tenant_id: str | None,
        delay: timedelta,
    ) -> QueueEntry:
        text = codec.dumps(input)
        delay_us = duration_micros(delay)
        row = self._write("enqueue", thread_id, "Q_ENQUEUE", (thread_id, graph_id, text, tenant_id, delay_us))
        return self._entry_of("enqueue", row)

    def _lease(self, holder: str, ttl: timedelta, graph_ids: frozenset[str] | None) -> Lease | None:
        ttl_us = duration_micros(ttl)
        kinds = None if graph_ids is None else sorted(graph_ids)
        row = self._write("lease", None, "Q_LEASE", (holder, ttl_us, kinds))
        if row[0] == 1:
            return None
        return self._lease_value(self._entry_of("lease", row), row[2])

    def _stale(self, entry_id: int, attempt: int, row: tuple[Any, ...]) -> StaleLease:
        return StaleLease(entry_id, attempt, row[1])

    def _renew_lease(self, entry_id: int, attempt: int, ttl: timedelta) -> Lease:
        ttl_us = duration_micros(ttl)
        row = self._write("renew_lease", None, "Q_RENEW", (entry_id, attempt, ttl_us))
        if row[0] == 1:
            raise self._stale(entry_id, attempt, row)
        return self._lease_value(self._entry_of("renew_lease", row))

    def _record_run(self, entry_id: int, attempt: int, run_id: str) -> QueueEntry:
        row = self._write(
            "record_run", None, "Q_RECORD", (entry_id, attempt, run_id, MAX_RUNS_PER_ENTRY)
        )
        if row[0] == 1:
            raise self._stale(entry_id, attempt, row)
        if row[0] == 2:
            raise ValidationError(
                "run_id", (f"entry {entry_id} already recorded {MAX_RUNS_PER_ENTRY} runs; finish it",)
            )
        return self._entry_of("record_run", row)

    def _finish(self, entry_id: int, attempt: int, status: EntryStatus, error: str | None) -> QueueEntry:
        row = self._write(
            "finish", None, "Q_FINISH", (entry_id, attempt, status.value, error)
        )
        if row[0] == 1:
            raise self._stale(entry_id, attempt, row)
        return self._entry_of("finish", row)

    def _release_lease(self, entry_id: int, attempt: int, delay: timedelta, refund: bool) -> None:
        delay_us = duration_micros(delay)
        self._db.call(
            "release_lease", None, self._sql["Q_RELEASE"], (entry_id, attempt, delay_us, refund), write=True
        )

    def _take_lease(self, entry_id: int, holder: str, ttl: timedelta, force: bool) -> Lease | None:
        ttl_us = duration_micros(ttl)
        rows = self._db.call(
            "take_lease", None, self._sql["Q_TAKE_LEASE"], (holder, ttl_us, entry_id, force), write=True
        )
        if not rows:
            return None  # unknown, finished, or held by a live lease (without force)
        return self._lease_value(entry_value(rows[0][1:]), rows[0][0])

    def _retry(self, entry_id: int) -> QueueEntry | None:
        row = self._write("retry", None, "Q_RETRY", (entry_id,))
        if row[0] == 1:
            return None  # unknown, not failed, or retried already
        return self._entry_of("retry", row)

    def _purge(self, older_than: timedelta, limit: int, after: int) -> PurgePage:
        age_us = duration_micros(older_than)
        rows = self._db.call("purge", None, self._sql["Q_PURGE"], (after, limit, age_us), write=True)
        visited, last, purged = rows[0]
        return PurgePage(
            visited=visited, purged=tuple(purged or ()), next=last if visited == limit else None
        )

    # -- reads ------------------------------------------------------------------------------------------------

    def _entry(self, entry_id: int) -> QueueEntry | None:
        rows = self._db.call("entry", None, self._sql["Q_ENTRY"], (entry_id,), write=False)
        return entry_value(rows[0]) if rows else None

    def _entries(self, limit: int, after: int, status: EntryStatus | None) -> list[QueueEntry]:
        if status is None:
            rows = self._db.call("entries", None, self._sql["Q_ENTRIES"], (after, limit), write=False)
        else:
            rows = self._db.call(
                "entries", None, self._sql["Q_ENTRIES_OF"], (status.value, after, limit), write=False
            )
        return [entry_value(row) for row in rows]

    def _depth(self) -> QueueDepth:
        count, oldest, now = self._db.call("depth", None, self._sql["Q_DEPTH"], (), write=False)[0]
        return QueueDepth(
            open=count, oldest_enqueued_at=as_utc(oldest) if oldest is not None else None, read_at=as_utc(now)
        )

    def _open_runs(self, thread_ids: tuple[str, ...]) -> Mapping[str, frozenset[str]]:
        rows = self._db.call("open_runs", None, self._sql["Q_OPEN_RUNS"], (list(thread_ids),), write=False)
        found: dict[str, set[str]] = {}
        for thread_id, run_id in rows:
            found.setdefault(thread_id, set()).add(run_id)
        return {thread_id: frozenset(runs) for thread_id, runs in found.items()}


__all__ = ["PostgresRunQueue", "entry_value"]

"""``InMemoryRunQueue``: the reference run queue, inside an :class:`InMemoryCheckpointer`.

It shares the store's lock, clock and closed state, so a lease, a commit and a prune see one state, and the
store's ``prune`` and ``sweep`` ask :meth:`InMemoryRunQueue.protected_runs` (lock held) which runs open entries
name. Inputs are kept as JSON text and decoded on read, so nothing returned aliases stored state.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs

from threadloom.domain import rules
from threadloom.domain.errors import StaleLease, ValidationError
from threadloom.domain.queue import EntryStatus, Lease, PurgePage, QueueDepth, QueueEntry
from threadloom.persistence import codec
from threadloom.persistence.clock import read_clock
from threadloom.persistence.queue import MAX_RUNS_PER_ENTRY, QueueBase

if TYPE_CHECKING:
    from threadloom.persistence.memory.store import InMemoryCheckpointer


@attrs.define
class _EntryRow:
    entry_id: int
    thread_id: str
    graph_id: str
    input_text: str
    tenant_id: str | None
    enqueued_at: datetime
    available_at: datetime
    status: EntryStatus = EntryStatus.OPEN
    attempts: int = 0
    refunded: int = 0
    run_ids: list[str] = attrs.Factory(list)
    leased_by: str | None = None
    lease_expires_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    retried_as: int | None = None

    def value(self) -> QueueEntry:
        return QueueEntry(
            entry_id=self.entry_id,
            thread_id=self.thread_id,
            graph_id=self.graph_id,
            input=codec.loads(self.input_text),
            tenant_id=self.tenant_id,
            status=self.status,
            attempts=self.attempts,
            refunded=self.refunded,
            run_ids=tuple(self.run_ids),
            enqueued_at=self.enqueued_at,
            available_at=self.available_at,
            leased_by=self.leased_by,
            lease_expires_at=self.lease_expires_at,
            finished_at=self.finished_at,
            error=self.error,
            retried_as=self.retried_as,
        )


class InMemoryRunQueue(QueueBase):
    """The run queue of one :class:`InMemoryCheckpointer` (``store.queue``); built by the store itself.

    Args:
        store: the store whose lock, clock and closed state the queue shares.
    """

    def __init__(self, store: InMemoryCheckpointer) -> None:
        self._store = store
        self._rows: dict[int, _EntryRow] = {}
        self._last_id = 0

    def __repr__(self) -> str:
        return f"InMemoryRunQueue({self._store!r})"

    @property
    def closed(self) -> bool:
        """True once the store is closed."""
        return self._store.closed

    # -- helpers (lock held) ----------------------------------------------------------------------------------

    def _now(self) -> datetime:
        return read_clock(self._store._clock)

    def _current(self, entry_id: int, attempt: int) -> _EntryRow:
        row = self._rows.get(entry_id)
        if row is None or row.status is not EntryStatus.OPEN or row.leased_by is None or row.attempts != attempt:
            current = row.attempts if row is not None and row.status is EntryStatus.OPEN and row.leased_by else None
            raise StaleLease(entry_id, attempt, current)
        return row

    def protected_runs(self, thread_id: str) -> frozenset[str]:
        """The RunIds the open entries of ``thread_id`` recorded (the store's lock held by the caller)."""
        return frozenset(
            run_id
            for row in self._rows.values()
            if row.thread_id == thread_id and row.status is EntryStatus.OPEN
            for run_id in row.run_ids
        )

    # -- implementation ---------------------------------------------------------------------------------------

    def _enqueue(
        self,
        thread_id: str,
        graph_id: str,
        input: Any,
        tenant_id: str | None,
        delay: timedelta,  # noqa: A002
    ) -> QueueEntry:
        text = codec.dumps(input)
        with self._store._lock:
            now = self._now()
            self._last_id += 1
            row = _EntryRow(self._last_id, thread_id, graph_id, text, tenant_id, now, now + delay)
            self._rows[row.entry_id] = row
            return row.value()

    def _lease(self, holder: str, ttl: timedelta, graph_ids: frozenset[str] | None) -> Lease | None:
        with self._store._lock:
            now = self._now()
            blocked: set[str] = set()  # threads with an older open entry
            for entry_id in sorted(self._rows):
                row = self._rows[entry_id]
                if row.status is not EntryStatus.OPEN:
                    continue
                first_of_thread = row.thread_id not in blocked
                blocked.add(row.thread_id)
                if not first_of_thread or (graph_ids is not None and row.graph_id not in graph_ids):
                    continue
                if row.available_at > now:
                    continue
                if row.lease_expires_at is not None and rules.claim_is_live(row.lease_expires_at, now):
                    continue
                previous = row.leased_by
                row.attempts += 1
                row.leased_by = holder
                row.lease_expires_at = now + ttl
                return self._lease_value(row.value(), previous)
            return None

    def _renew_lease(self, entry_id: int, attempt: int, ttl: timedelta) -> Lease:
        with self._store._lock:
            row = self._current(entry_id, attempt)
            row.lease_expires_at = self._now() + ttl
            return self._lease_value(row.value())

    def _record_run(self, entry_id: int, attempt: int, run_id: str) -> QueueEntry:
        with self._store._lock:
            row = self._current(entry_id, attempt)
            if run_id not in row.run_ids:
                if len(row.run_ids) >= MAX_RUNS_PER_ENTRY:
                    raise ValidationError(
                        "run_id", (f"entry {entry_id} already recorded {MAX_RUNS_PER_ENTRY} runs; finish it",)
                    )
                row.run_ids.append(run_id)
            return row.value()

    def _finish(self, entry_id: int, attempt: int, status: EntryStatus, error: str | None) -> QueueEntry:
        with self._store._lock:
            row = self._rows.get(entry_id)
            if row is not None and row.status is status and row.attempts == attempt:
                return row.value()  # the same attempt finished it already: a retry
            row = self._current(entry_id, attempt)
            row.status = status
            row.error = error if status is EntryStatus.FAILED else None
            row.finished_at = self._now()
            row.leased_by = None
            row.lease_expires_at = None
            return row.value()

    def _release_lease(self, entry_id: int, attempt: int, delay: timedelta, refund: bool) -> None:
        with self._store._lock:
            try:
                row = self._current(entry_id, attempt)
            except StaleLease:
                return
            now = self._now()
            row.leased_by = None
            row.lease_expires_at = None
            row.available_at = now + delay
            row.refunded += int(refund)

    def _take_lease(self, entry_id: int, holder: str, ttl: timedelta, force: bool) -> Lease | None:
        with self._store._lock:
            row = self._rows.get(entry_id)
            if row is None or row.status is not EntryStatus.OPEN:
                return None
            now = self._now()
            live = row.lease_expires_at is not None and rules.claim_is_live(row.lease_expires_at, now)
            if live and not force:
                return None
            previous = row.leased_by
            row.attempts += 1
            row.leased_by = holder
            row.lease_expires_at = now + ttl
            return self._lease_value(row.value(), previous)

    def _retry(self, entry_id: int) -> QueueEntry | None:
        with self._store._lock:
            old = self._rows.get(entry_id)
            if old is None or old.status is not EntryStatus.FAILED or old.retried_as is not None:
                return None
            now = self._now()
            self._last_id += 1
            row = _EntryRow(self._last_id, old.thread_id, old.graph_id, old.input_text, old.tenant_id, now, now)
            self._rows[row.entry_id] = row
            old.retried_as = row.entry_id
            return row.value()

    def _purge(self, older_than: timedelta, limit: int, after: int) -> PurgePage:
        with self._store._lock:
            cutoff = self._now() - older_than
            page = [entry_id for entry_id in sorted(self._rows) if entry_id > after][:limit]
            purged = []
            for entry_id in page:
                row = self._rows[entry_id]
                if row.status is not EntryStatus.OPEN and row.finished_at is not None and row.finished_at <= cutoff:
                    del self._rows[entry_id]
                    purged.append(entry_id)
            return PurgePage(visited=len(page), purged=tuple(purged), next=page[-1] if len(page) == limit else None)

    def _entry(self, entry_id: int) -> QueueEntry | None:
        with self._store._lock:
            row = self._rows.get(entry_id)
            return None if row is None else row.value()

    def _entries(self, limit: int, after: int, status: EntryStatus | None) -> list[QueueEntry]:
        with self._store._lock:
            out = []
            for entry_id in sorted(self._rows):
                row = self._rows[entry_id]
                if entry_id <= after or (status is not None and row.status is not status):
                    continue
                out.append(row.value())
                if len(out) == limit:
                    break
            return out

    def _depth(self) -> QueueDepth:
        with self._store._lock:
            open_ids = [entry_id for entry_id, row in self._rows.items() if row.status is EntryStatus.OPEN]
            oldest = self._rows[min(open_ids)].enqueued_at if open_ids else None
            return QueueDepth(open=len(open_ids), oldest_enqueued_at=oldest, read_at=self._now())

    def _open_runs(self, thread_ids: tuple[str, ...]) -> Mapping[str, frozenset[str]]:
        with self._store._lock:
            out = {}
            for thread_id in thread_ids:
                runs = self.protected_runs(thread_id)
                if runs:
                    out[thread_id] = runs
            return out

"""The values of the durable run queue.

An entry asks for a run of ``graph_id`` on a thread with an input, for a tenant. Workers lease entries for a
time (the store's clock decides expiry), record each attempt's RunId on the entry before the attempt touches
the thread, and finish them. Entry ids and attempt numbers are the store's, never the caller's.
"""

from __future__ import annotations

import enum
from datetime import datetime, timedelta
from typing import Any

import attrs

from threadloom.domain import validation as v


class EntryStatus(enum.Enum):
    """Where a run-queue entry stands: ``OPEN`` until an attempt finishes it ``COMPLETED`` or ``FAILED``."""

    OPEN = "open"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        """True for ``COMPLETED`` and ``FAILED``."""
        return self is not EntryStatus.OPEN


def _run_ids(value: Any) -> tuple[str, ...]:
    items = tuple(value)
    for item in items:
        v.check_id("entry.run_ids item", item)
    return items


@attrs.frozen(kw_only=True)
class QueueEntry:
    """One run-queue entry, as the store holds it when read.

    Attributes:
        entry_id: the store's number for it: increasing in enqueue order, never reused.
        thread_id: the thread the run is for.
        graph_id: the kind of graph to run.
        input: the run's input (JSON), admitted once by the first attempt that commits it.
        tenant_id: the tenant the run is for (None for the tenant-less).
        status: ``OPEN`` until finished.
        attempts: how many leases the store granted on it (the current lease's ``attempt``).
        refunded: how many of those leases were handed back with ``release_lease(..., refund=True)`` (a worker
            that stopped, not a failed try): they do not count against ``ServePolicy.max_attempts``.
        run_ids: every attempt's RunId, in the order recorded (oldest first).
        enqueued_at: when the store enqueued it, by its clock.
        available_at: no lease before this time, by the store's clock (a released lease can push it back).
        leased_by: the holder of the latest lease while the entry is open, else None (the lease may have expired).
        lease_expires_at: when that lease expires, by the store's clock; None when not leased.
        finished_at: when an attempt finished it, by the store's clock; None while open.
        error: what the attempt that finished it ``FAILED`` said; None otherwise.
        retried_as: the entry :meth:`RunQueue.retry` enqueued for this ``FAILED`` one; None while it was not
            retried (an entry is retried at most once).
    """

    entry_id: int
    thread_id: str
    graph_id: str
    input: Any = None
    tenant_id: str | None = None
    status: EntryStatus = EntryStatus.OPEN
    attempts: int = 0
    refunded: int = 0
    run_ids: tuple[str, ...] = attrs.field(default=(), converter=_run_ids)
    enqueued_at: datetime
    available_at: datetime
    leased_by: str | None = None
    lease_expires_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    retried_as: int | None = None

    @property
    def open(self) -> bool:
        """True while no attempt finished the entry."""
        return self.status is EntryStatus.OPEN

    @property
    def counted_attempts(self) -> int:
        """The leases that count as tries: ``attempts`` less those handed back with a refund (``refunded``)."""
        return self.attempts - self.refunded


@attrs.frozen(kw_only=True)
class Lease:
    """A granted lease on an entry: ``attempt`` fences the holder's renewals, run records and finish.

    Attributes:
        entry: the entry as the lease left it (``entry.attempts == attempt``).
        attempt: this lease's number, 1 for the first lease of the entry; a later lease has a higher one.
        holder: who holds it (a worker's node id).
        expires_at: when it expires, by the store's clock. The holder may renew, record and finish after
            expiry for as long as no other lease replaced it.
        taken_over_from: the holder of an expired, unfinished lease this one replaced; None otherwise.
    """

    entry: QueueEntry
    attempt: int
    holder: str
    expires_at: datetime
    taken_over_from: str | None = None

    @property
    def entry_id(self) -> int:
        """The leased entry's id."""
        return self.entry.entry_id


@attrs.frozen(kw_only=True)
class PurgePage:
    """What one :meth:`RunQueue.purge` call did, over one page of entries in ``entry_id`` order.

    Attributes:
        visited: how many entries the page read (open ones included; at most the call's ``limit``).
        purged: the ids of the finished entries it deleted, ascending.
        next: pass it as ``after`` to purge the next page; None once the page read fewer than the call's
            ``limit`` entries (the end of the queue).
    """

    visited: int
    purged: tuple[int, ...] = ()
    next: int | None = None


@attrs.frozen(kw_only=True)
class QueueDepth:
    """How deep the run queue is, read at one moment by :meth:`RunQueue.depth`.

    Attributes:
        open: how many entries are open (waiting, or leased by a worker): not finished yet.
        oldest_enqueued_at: when the oldest open entry (the lowest ``entry_id``) was enqueued, by the store's
            clock; None when no entry is open.
        read_at: the store's clock when it was read.
    """

    open: int
    oldest_enqueued_at: datetime | None
    read_at: datetime

    @property
    def oldest_age(self) -> timedelta | None:
        """How long the oldest open entry has waited, by the store's clock (never negative); None when none is
        open."""
        if self.oldest_enqueued_at is None:
            return None
        return max(self.read_at - self.oldest_enqueued_at, timedelta(0))


"""The ``RunQueue`` contract: the durable run queue every store holds.

A store exposes its queue as ``store.queue``, declared on :class:`~threadloom.persistence.base.Checkpointer`
(None for a store without one; a wrapper shows its inner store's): a :class:`RunQueue` over the same storage,
sharing the store's lock or connections and its closed state. One store object is then both the
``Checkpointer`` and the queue, and the store's ``prune`` and ``sweep`` keep the newest checkpoint of every run
an open entry names.

Like :class:`~threadloom.persistence.base.Checkpointer`, every public method validates its arguments first
(``ValidationError`` naming the field, nothing read or written) and refuses the call once the store is closed
(``StoreClosed``, a ``ProcessingError``). A store's queue subclasses :class:`QueueBase`, which does both and
then calls the ``_``-prefixed implementation the store provides; a wrapper subclasses
:class:`~threadloom.persistence.forwarding.ForwardingRunQueue`, which hands each call to another queue's public
method.

The rules every queue shares:

1. **Entries** are numbered by the store in enqueue order (``entry_id``, never reused) and are ``OPEN`` until an
   attempt finishes them ``COMPLETED`` or ``FAILED``; a finished entry never opens again.
2. **Leases.** :meth:`RunQueue.lease` grants the oldest entry (by ``entry_id``) that is open, available
   (``available_at <= now``) and not held by a live lease (live while ``now < lease_expires_at``), skipping an
   entry while an older entry of the same thread is open, so one thread's inputs run in enqueue order. Each lease
   numbers a new ``attempt`` (1, 2, …), which fences the holder: renew, record and finish need the current
   attempt (``StaleLease`` otherwise). The holder may renew, record and finish after expiry while no other lease
   replaced it. The store's clock decides time.
3. **Runs.** An attempt records its RunId (:meth:`RunQueue.record_run`) *before* it touches the thread and, with
   the RunIds the entry recorded, asks ``Checkpointer.lookup_run`` whether an earlier attempt's input was
   admitted: then it recovers instead of admitting the input twice.
4. **Retention.** While an entry is open, the store's ``prune`` and ``sweep`` keep the newest checkpoint each run
   it recorded committed, whatever the policy or sweep guard says.
5. **Bounds.** Every call touches a bounded number of rows through an index; lists are paged.
6. **Operators.** :meth:`RunQueue.take_lease` leases one named entry (an operator's cancel: take it, then
   finish it ``FAILED``; see :func:`cancel_entry`), and :meth:`RunQueue.purge` deletes finished entries once
   they are old enough (the retention of the queue; open entries are never purged).
7. **Retries.** :meth:`RunQueue.retry` enqueues a ``FAILED`` entry's run again as a new entry, at most once per
   entry: the failed entry records the new entry's id (``retried_as``) in the same transaction, so two retries
   of one entry, however concurrent, enqueue exactly one new entry.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from datetime import timedelta
from time import perf_counter
from typing import Any, NoReturn

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.access import WALK_GRAPH_ID
from threadloom.domain.errors import StoreClosed, ValidationError
from threadloom.domain.queue import EntryStatus, Lease, PurgePage, QueueDepth, QueueEntry
from threadloom.persistence.logs import SlowCalls

MAX_ERROR_LENGTH = 4000
"""Longest ``error`` text :meth:`RunQueue.finish` keeps, in characters; longer text is cut to this length."""


def _entry_id(field: str, value: Any) -> int:
    return v.check_int(field, value, low=1)


def _thread_ids(field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValidationError(field, ("must be a collection of thread ids",))
    items = tuple(dict.fromkeys(v.check_id(f"{field} item", item) for item in value))
    if len(items) > rules.MAX_PAGE:
        raise ValidationError(field, (f"must name at most {rules.MAX_PAGE} threads, got {len(items)}",))
    return items


class RunQueue(abc.ABC):
    """The durable run queue of one storage. Safe to call from any number of threads.

    A store builds it over its own storage and exposes it as ``store.queue``; it is closed with its store.
    Concrete queues subclass :class:`QueueBase`, wrappers
    :class:`~threadloom.persistence.forwarding.ForwardingRunQueue`; ``isinstance(x, RunQueue)`` holds for both.
    """

    # -- lifecycle --------------------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once the store the queue belongs to is closed."""

    # -- writes -----------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def enqueue(
        self,
        thread_id: str,
        *,
        graph_id: str,
        input: Any = None,  # noqa: A002 - the run's input, the public name
        tenant_id: str | None = None,
        delay: timedelta = timedelta(0),
    ) -> QueueEntry:
        """Adds an open entry asking for a run of ``graph_id`` on ``thread_id`` with ``input``.

        Args:
            thread_id: the thread to run on (it need not exist yet).
            graph_id: the kind of graph a worker runs for it (``GraphRuntime.serve`` looks it up by this id).
            input: the run's input, a JSON value.
            tenant_id: the tenant the run is for; the worker's run claims and checks the thread for it.
            delay: the entry is not leased before ``delay`` from now, by the store's clock (>= 0).

        Returns:
            The new entry: ``OPEN``, no attempt, a new ``entry_id`` greater than every earlier one.

        Raises:
            ValidationError: a bad id, ``graph_id`` the reserved walk graph id
                (:data:`~threadloom.domain.access.WALK_GRAPH_ID`), ``input`` that is not JSON, a negative
                ``delay``; nothing written.
            ProcessingError: the storage failed or the store is closed. Enqueueing again after a failure may
                add a second entry (entries have no idempotency key).
        """

    @abc.abstractmethod
    def lease(self, holder: str, ttl: timedelta, *, graph_ids: Iterable[str] | None = None) -> Lease | None:
        """Leases the oldest leasable entry for ``holder`` until ``ttl`` from now, by the store's clock.

        Leasable: open, ``available_at`` reached, no live lease, and no older open entry of the same thread
        (rule 2). A lease replacing an expired, unfinished one names that holder in ``taken_over_from``.

        Args:
            holder: who leases (a worker's node id), recorded as ``leased_by``.
            ttl: how long the lease lives (> 0).
            graph_ids: only entries of these graph kinds (a non-empty collection), or None for every kind.

        Returns:
            The lease, its ``attempt`` one more than the entry's previous; None when nothing is leasable.

        Raises:
            ValidationError: bad ``holder``, ``ttl`` or ``graph_ids``; nothing changed.
            ProcessingError: the storage failed or the store is closed.
        """

    @abc.abstractmethod
    def renew_lease(self, entry_id: int, attempt: int, ttl: timedelta) -> Lease:
        """Extends lease ``attempt`` of the entry to ``ttl`` from now, by the store's clock.

        An expired lease nobody replaced is renewed (rule 2).

        Raises:
            StaleLease: ``attempt`` is not the entry's current lease (re-leased, released, finished, unknown).
            ValidationError, ProcessingError: as :meth:`lease`.
        """

    @abc.abstractmethod
    def record_run(self, entry_id: int, attempt: int, run_id: str) -> QueueEntry:
        """Records ``run_id`` as attempt ``attempt``'s run on the entry, before the attempt touches the thread.

        Recording the same RunId twice keeps
        one. The entry's ``run_ids`` then protect that run's newest checkpoint from retention while it is open.

        Returns:
            The entry with ``run_id`` among its ``run_ids`` (appended, oldest first).

        Raises:
            StaleLease: ``attempt`` is not the entry's current lease; nothing recorded.
            ValidationError: a bad ``run_id`` or more than 1000 runs on one entry; nothing recorded.
            ProcessingError: the storage failed or the store is closed. Retrying is safe.
        """

    @abc.abstractmethod
    def finish(
        self, entry_id: int, attempt: int, *, status: EntryStatus = EntryStatus.COMPLETED, error: str | None = None
    ) -> QueueEntry:
        """Finishes the entry ``COMPLETED`` or ``FAILED`` (with ``error``), fenced by ``attempt``.

        Finishing again by the attempt that finished it, with the same status, returns the entry unchanged
        (a retry after an unknown outcome is safe). The finished entry no longer protects its runs.

        Raises:
            StaleLease: ``attempt`` is not the entry's current lease, or another attempt finished it.
            ValidationError: ``status`` is ``OPEN`` or not an ``EntryStatus``; ``error`` is not text.
            ProcessingError: the storage failed or the store is closed.
        """

    @abc.abstractmethod
    def release_lease(
        self, entry_id: int, attempt: int, *, delay: timedelta = timedelta(0), refund: bool = False
    ) -> None:
        """Gives lease ``attempt`` back unfinished: the entry is leasable again ``delay`` from now.

        A worker that stops, or that finds the thread busy, hands the entry on this way instead of letting
        the lease expire. An attempt that is not the current lease changes nothing (like a claim's release).

        With ``refund``, the lease does not count as a try: the entry's ``refunded`` goes up by one, so its
        ``counted_attempts`` is as before the lease (a worker that stopped gracefully hands back this way). The
        attempt numbers themselves never go back: the next lease's ``attempt`` is still one more, and the
        refunded attempt stays fenced out.

        Raises:
            ValidationError, ProcessingError: as :meth:`lease`.
        """

    @abc.abstractmethod
    def take_lease(self, entry_id: int, holder: str, ttl: timedelta, *, force: bool = False) -> Lease | None:
        """Leases the entry ``entry_id`` itself for ``holder`` until ``ttl`` from now, by the store's clock.

        For an operator who acts on one entry (cancelling it: :func:`cancel_entry`), not for a worker: it
        ignores ``available_at``, the graph kind and the thread's order of entries. Like :meth:`lease` it
        numbers a new ``attempt``, which fences the previous holder (its renewals, run records and finish
        raise ``StaleLease`` from now on); the holder it replaced is named in ``taken_over_from``.

        Args:
            entry_id: the entry to lease.
            holder: who leases (recorded as ``leased_by``).
            ttl: how long the lease lives (> 0).
            force: also replace a live lease (``now < lease_expires_at``); without it a live lease is left alone.

        Returns:
            The lease; None (nothing changed) when the entry is unknown, finished, or held by a live lease
            and ``force`` is False. Read :meth:`entry` to tell which.

        Raises:
            ValidationError: a bad ``entry_id``, ``holder`` or ``ttl``; nothing changed.
            ProcessingError: the storage failed or the store is closed. A retry after an unknown outcome may
                take a second lease (its own first one is then the fenced one).
        """

    @abc.abstractmethod
    def retry(self, entry_id: int) -> QueueEntry | None:
        """Enqueues the ``FAILED`` entry ``entry_id`` again: a new open entry with its thread, graph, input, tenant.

        At most once per entry (rule 7): in one transaction it checks that the entry is ``FAILED`` and not yet
        retried, enqueues the new entry (as :meth:`enqueue`, no delay) and records its id as the failed entry's
        ``retried_as``. Two retries of one entry, from any threads, stores or processes, enqueue one entry.
        It does not read the thread: whether the failed entry's run was admitted and is still incomplete (then
        recover the thread rather than admit the input twice) is the caller's to check first.

        Args:
            entry_id: the failed entry.

        Returns:
            The new entry; None (nothing written) when the entry is unknown, not ``FAILED`` (open or
            completed), or already retried - read :meth:`entry` to tell which: a retried entry's
            ``retried_as`` names the entry its retry enqueued.

        Raises:
            ValidationError: a bad ``entry_id``, or an entry of the walks' reserved graph id (enqueued before
                :meth:`enqueue` refused it); nothing written.
            ProcessingError: the storage failed or the store is closed. Retrying after an unknown outcome is
                safe: if the first call applied, the second answers None and :meth:`entry` names its entry.
        """

    @abc.abstractmethod
    def purge(self, older_than: timedelta, *, limit: int = 100, after: int | None = None) -> PurgePage:
        """Deletes finished entries (``COMPLETED`` or ``FAILED``) that finished at least ``older_than`` ago.

        One page: it reads the ``limit`` entries with ``entry_id > after`` in ``entry_id`` order and deletes
        those of them that are finished and old enough, by the store's clock (``finished_at <= now -
        older_than``), with their recorded RunIds. Open entries are never deleted, and an entry id is never
        reused. Purge the whole queue by passing each page's ``next`` as ``after`` until it is None.

        Args:
            older_than: how long a finished entry is kept after it finished (> 0).
            limit: entries read by this call (1..1000).
            after: start after this entry id (None: from the first).

        Returns:
            The page: entries visited, ids deleted (ascending), and the cursor of the next page (None once a
            page read fewer than ``limit`` entries: the end).

        Raises:
            ValidationError: a bad ``older_than``, ``limit`` or ``after``; nothing deleted.
            ProcessingError: the storage failed or the store is closed. Retrying is safe.
        """

    # -- reads ------------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def entry(self, entry_id: int) -> QueueEntry | None:
        """The entry ``entry_id`` as the store holds it now; None if there is none."""

    @abc.abstractmethod
    def entries(
        self, *, limit: int = 50, after: int | None = None, status: EntryStatus | None = None
    ) -> list[QueueEntry]:
        """Up to ``limit`` (1..1000) entries with ``entry_id > after``, ascending, of ``status`` when given.

        Page by passing the last ``entry_id`` of each page as ``after``.
        """

    @abc.abstractmethod
    def depth(self) -> QueueDepth:
        """How many entries are open and when the oldest of them was enqueued, read in one statement.

        Counts through the queue's index of entries by status (every open entry is counted: the cost grows
        with the number of open entries, not with the finished ones). Reads only: retrying is safe.

        Returns:
            ``QueueDepth``: ``open``, ``oldest_enqueued_at`` (None when none is open) and ``read_at``, both by
            the store's clock; ``oldest_age`` is their difference.
        """

    @abc.abstractmethod
    def open_runs(self, thread_ids: Iterable[str]) -> Mapping[str, frozenset[str]]:
        """The RunIds the open entries of each of ``thread_ids`` (at most 1000) recorded.

        These are the runs an open entry protects from retention. A thread without an open entry that
        recorded a run is absent from the mapping.
        """


class QueueBase(SlowCalls, RunQueue):
    """The base of every store's run queue: it validates each call once, then runs the store's implementation.

    Each public method of :class:`RunQueue` checks its arguments (``ValidationError`` naming the field, nothing
    read or written), refuses the call once the store is closed (``StoreClosed``), and calls the queue's
    ``_``-prefixed method of the same name. A queue implements those abstract ``_`` methods and never
    re-validates. The public methods' documentation is :class:`RunQueue`'s.
    """

    def _ensure_open(self, operation: str) -> None:
        if self.closed:
            raise StoreClosed(operation, "the store is closed; open a new one")

    @property
    def _closed(self) -> bool:  # type: ignore[override]
        return self.closed

    @staticmethod
    def _lease_value(entry: QueueEntry, taken_over_from: str | None = None) -> Lease:
        """The lease a queue hands out for ``entry``, just leased (or renewed) by ``entry.leased_by``."""
        assert entry.leased_by is not None and entry.lease_expires_at is not None
        return Lease(
            entry=entry,
            attempt=entry.attempts,
            holder=entry.leased_by,
            expires_at=entry.lease_expires_at,
            taken_over_from=taken_over_from,
        )

    # -- writes -----------------------------------------------------------------------------------------------

    def enqueue(
        self,
        thread_id: str,
        *,
        graph_id: str,
        input: Any = None,  # noqa: A002 - the run's input, the public name
        tenant_id: str | None = None,
        delay: timedelta = timedelta(0),
    ) -> QueueEntry:
        check_enqueue(thread_id, graph_id, input, tenant_id, delay)
        started = self._begin("enqueue")
        try:
            return self._enqueue(thread_id, graph_id, input, tenant_id, delay)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("enqueue", thread_id, started)

    def lease(self, holder: str, ttl: timedelta, *, graph_ids: Iterable[str] | None = None) -> Lease | None:
        v.check_id("holder", holder)
        v.check_positive_duration("ttl", ttl)
        kinds: frozenset[str] | None = None
        if graph_ids is not None:
            kinds = v.check_run_ids("graph_ids", graph_ids)
            if not kinds:
                raise ValidationError("graph_ids", ("must name at least one graph kind, or be None for every kind",))
        started = self._begin("lease")
        try:
            return self._lease(holder, ttl, kinds)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("lease", None, started)

    def renew_lease(self, entry_id: int, attempt: int, ttl: timedelta) -> Lease:
        _entry_id("entry_id", entry_id)
        v.check_int("attempt", attempt, low=1)
        v.check_positive_duration("ttl", ttl)
        started = self._begin("renew_lease")
        try:
            return self._renew_lease(entry_id, attempt, ttl)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("renew_lease", None, started)

    def record_run(self, entry_id: int, attempt: int, run_id: str) -> QueueEntry:
        _entry_id("entry_id", entry_id)
        v.check_int("attempt", attempt, low=1)
        v.check_id("run_id", run_id)
        started = self._begin("record_run")
        try:
            return self._record_run(entry_id, attempt, run_id)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("record_run", None, started)

    def finish(
        self, entry_id: int, attempt: int, *, status: EntryStatus = EntryStatus.COMPLETED, error: str | None = None
    ) -> QueueEntry:
        _entry_id("entry_id", entry_id)
        v.check_int("attempt", attempt, low=1)
        if not isinstance(status, EntryStatus) or status is EntryStatus.OPEN:
            raise ValidationError("status", ("must be EntryStatus.COMPLETED or EntryStatus.FAILED",))
        if error is not None:
            error = v.check_text("error", error)[:MAX_ERROR_LENGTH]
        started = self._begin("finish")
        try:
            return self._finish(entry_id, attempt, status, error)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("finish", None, started)

    def release_lease(
        self, entry_id: int, attempt: int, *, delay: timedelta = timedelta(0), refund: bool = False
    ) -> None:
        _entry_id("entry_id", entry_id)
        v.check_int("attempt", attempt, low=1)
        v.check_non_negative_duration("delay", delay)
        if not isinstance(refund, bool):
            raise ValidationError("refund", (f"must be True or False, got {type(refund).__name__}",))
        started = self._begin("release_lease")
        try:
            self._release_lease(entry_id, attempt, delay, refund)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("release_lease", None, started)

    def take_lease(self, entry_id: int, holder: str, ttl: timedelta, *, force: bool = False) -> Lease | None:
        _entry_id("entry_id", entry_id)
        v.check_id("holder", holder)
        v.check_positive_duration("ttl", ttl)
        if not isinstance(force, bool):
            raise ValidationError("force", ("must be True or False",))
        started = self._begin("take_lease")
        try:
            return self._take_lease(entry_id, holder, ttl, force)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("take_lease", None, started)

    def retry(self, entry_id: int) -> QueueEntry | None:
        _entry_id("entry_id", entry_id)
        failed = self.entry(entry_id)  # an entry's graph never changes: read before the retry's transaction
        if failed is not None and failed.graph_id == WALK_GRAPH_ID:
            _reserved_graph()
        started = self._begin("retry")
        try:
            return self._retry(entry_id)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("retry", None, started)

    def purge(self, older_than: timedelta, *, limit: int = 100, after: int | None = None) -> PurgePage:
        v.check_positive_duration("older_than", older_than)
        v.check_int("limit", limit, low=1, high=rules.MAX_PAGE)
        if after is not None:
            v.check_int("after", after, low=0)
        started = self._begin("purge")
        try:
            return self._purge(older_than, limit, after or 0)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("purge", None, started)

    # -- reads ------------------------------------------------------------------------------------------------

    def entry(self, entry_id: int) -> QueueEntry | None:
        _entry_id("entry_id", entry_id)
        started = self._begin("entry")
        try:
            return self._entry(entry_id)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("entry", None, started)

    def entries(
        self, *, limit: int = 50, after: int | None = None, status: EntryStatus | None = None
    ) -> list[QueueEntry]:
        v.check_int("limit", limit, low=1, high=rules.MAX_PAGE)
        if after is not None:
            v.check_int("after", after, low=0)
        if status is not None and not isinstance(status, EntryStatus):
            raise ValidationError("status", ("must be an EntryStatus or None",))
        started = self._begin("entries")
        try:
            return self._entries(limit, after or 0, status)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("entries", None, started)

    def depth(self) -> QueueDepth:
        started = self._begin("depth")
        try:
            return self._depth()
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("depth", None, started)

    def open_runs(self, thread_ids: Iterable[str]) -> Mapping[str, frozenset[str]]:
        ids = _thread_ids("thread_ids", thread_ids)
        started = self._begin("open_runs")
        if not ids:
            return {}
        try:
            return self._open_runs(ids)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("open_runs", None, started)

    # -- what a store implements ------------------------------------------------------------------------------

    @abc.abstractmethod
    def _enqueue(
        self,
        thread_id: str,
        graph_id: str,
        input: Any,
        tenant_id: str | None,
        delay: timedelta,  # noqa: A002
    ) -> QueueEntry: ...

    @abc.abstractmethod
    def _lease(self, holder: str, ttl: timedelta, graph_ids: frozenset[str] | None) -> Lease | None: ...

    @abc.abstractmethod
    def _renew_lease(self, entry_id: int, attempt: int, ttl: timedelta) -> Lease: ...

    @abc.abstractmethod
    def _record_run(self, entry_id: int, attempt: int, run_id: str) -> QueueEntry: ...

    @abc.abstractmethod
    def _finish(self, entry_id: int, attempt: int, status: EntryStatus, error: str | None) -> QueueEntry: ...

    @abc.abstractmethod
    def _release_lease(self, entry_id: int, attempt: int, delay: timedelta, refund: bool) -> None: ...

    @abc.abstractmethod
    def _take_lease(self, entry_id: int, holder: str, ttl: timedelta, force: bool) -> Lease | None: ...

    @abc.abstractmethod
    def _retry(self, entry_id: int) -> QueueEntry | None: ...

    @abc.abstractmethod
    def _purge(self, older_than: timedelta, limit: int, after: int) -> PurgePage: ...

    @abc.abstractmethod
    def _entry(self, entry_id: int) -> QueueEntry | None: ...

    @abc.abstractmethod
    def _entries(self, limit: int, after: int, status: EntryStatus | None) -> list[QueueEntry]: ...

    @abc.abstractmethod
    def _open_runs(self, thread_ids: tuple[str, ...]) -> Mapping[str, frozenset[str]]: ...

    @abc.abstractmethod
    def _depth(self) -> QueueDepth: ...


MAX_RUNS_PER_ENTRY = 1000
"""Most RunIds one entry records; an entry that reached it is a ``ValidationError`` on ``record_run``."""


QUEUE_OPERATIONS: tuple[str, ...] = (
    "enqueue", "lease", "renew_lease", "record_run", "finish", "release_lease", "take_lease", "retry", "entry",
    "entries", "open_runs", "purge", "depth",
)
"""The public methods of :class:`RunQueue` (the forwarding base and the metered queue iterate over this list)."""

CANCEL_LEASE_TTL = timedelta(seconds=30)
"""How long :func:`cancel_entry`'s own lease lives: if the cancel fails half-way, a worker may lease the entry
again this long after."""


def cancel_entry(
    queue: RunQueue, entry_id: int, *, holder: str, reason: str = "cancelled", force: bool = False
) -> QueueEntry | None:
    """Finishes the open entry ``entry_id`` ``FAILED`` with ``reason``, fenced like any attempt.

    It takes a lease on the entry (:meth:`RunQueue.take_lease`, as ``holder``), then finishes it with that
    lease's attempt, so a worker holding an older lease can no longer renew, record or finish it
    (``StaleLease``: ``GraphRuntime.serve`` then cancels its run at the next step). A run already admitted on the
    thread is not undone: the thread keeps what it committed.

    Args:
        queue: the run queue.
        entry_id: the entry to cancel.
        holder: who cancels (recorded as the lease's holder).
        reason: the entry's ``error`` text once cancelled.
        force: also cancel an entry a live lease holds (a worker is running it); without it such an entry is
            left alone.

    Returns:
        The cancelled entry; None when nothing changed: the entry is unknown, finished, or (without
        ``force``) held by a live lease - read :meth:`RunQueue.entry` to tell which.

    Raises:
        ValidationError: bad arguments; nothing changed.
        ProcessingError: the storage failed. If the lease was taken but the finish failed, the entry stays
            open and a worker may lease it again once :data:`CANCEL_LEASE_TTL` has passed; cancelling again is
            safe.
    """
    lease = queue.take_lease(entry_id, holder, CANCEL_LEASE_TTL, force=force)
    if lease is None:
        return None
    return queue.finish(entry_id, lease.attempt, status=EntryStatus.FAILED, error=reason)


def queue_of(store: Any) -> RunQueue:
    """The run queue of ``store`` (its ``queue`` attribute).

    Raises:
        ValidationError: the store has no run queue (``store.queue`` is None or missing).
    """
    queue = getattr(store, "queue", None)
    if not isinstance(queue, RunQueue):
        raise ValidationError("store", (f"{type(store).__name__} has no run queue (store.queue)",))
    return queue


def _reserved_graph() -> NoReturn:
    raise ValidationError("graph_id", (f"{WALK_GRAPH_ID!r} is reserved for the walks; no run of it can be enqueued",))


def check_enqueue(thread_id: Any, graph_id: Any, input: Any, tenant_id: Any, delay: Any) -> None:  # noqa: A002
    """The checks of :meth:`RunQueue.enqueue`'s arguments, without a store: a caller that would create a store to
    enqueue (``threadloom queue enqueue``) runs them first, so bad input creates nothing either.

    Raises:
        ValidationError: as :meth:`RunQueue.enqueue`, naming the argument.
    """
    v.check_id("thread_id", thread_id)
    v.check_id("graph_id", graph_id)
    if graph_id == WALK_GRAPH_ID:
        _reserved_graph()
    v.check_json("input", input)
    v.check_optional_id("tenant_id", tenant_id)
    v.check_non_negative_duration("delay", delay)


__all__ = [
    "CANCEL_LEASE_TTL",
    "MAX_ERROR_LENGTH",
    "MAX_RUNS_PER_ENTRY",
    "QUEUE_OPERATIONS",
    "QueueBase",
    "RunQueue",
    "cancel_entry",
    "check_enqueue",
    "queue_of",
]

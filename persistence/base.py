"""The ``Checkpointer`` contract, and ``StoreBase``, the base of every concrete store.

:class:`Checkpointer` is the abstract public contract: every store and every wrapper is one. Concrete stores
subclass :class:`StoreBase`, whose public methods validate their arguments first (``ValidationError`` naming
the field, nothing read or written), refuse the call once the store is closed (``StoreClosed``), and then call
the store's ``_``-prefixed implementation; stores implement those and never re-validate. Wrappers subclass
:class:`~threadloom.persistence.forwarding.ForwardingCheckpointer` instead, which hands every call to another
store's public method, so a call is validated once, by the store at the end of the chain.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from time import perf_counter
from typing import Any

import attrs

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.access import AccessSchemas
from threadloom.domain.errors import CancelledError, ProcessingError, StoreClosed, ValidationError
from threadloom.domain.values import (
    Checkpoint,
    CheckpointPage,
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
    TenantPage,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
)
from threadloom.persistence.access import ACCESS_OPERATIONS, AccessContract, AccessStore, check_access
from threadloom.persistence.encoded import EncodedCommit, encode_commit
from threadloom.persistence.logs import SlowCalls, slow_call_seconds
from threadloom.persistence.pressure import PRESS_WINDOW, Bulkhead, WritePressure, pool_probe, timed_write
from threadloom.persistence.queue import QueueBase, RunQueue


def _instance(field: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise ValidationError(field, (f"must be a {kind.__name__}, got {type(value).__name__}",))
    return value


def _check_cancel(cancel: Any) -> threading.Event | None:
    if cancel is not None and not (
        callable(getattr(cancel, "is_set", None)) and callable(getattr(cancel, "wait", None))
    ):
        raise ValidationError("cancel", ("must be a threading.Event or None",))
    return cancel


DEFAULT_MAX_JSON_SIZE = 16 * 1024 * 1024
"""The default ``max_json_size`` of every store: 16 MiB characters of JSON per stored record."""

MAX_MAX_JSON_SIZE = 128 * 1024 * 1024
"""The largest ``max_json_size`` a store takes: SQLite refuses a value of 1e9 bytes or more (and a character
may take 4 bytes in UTF-8), PostgreSQL one of 1 GiB."""


def check_max_json_size(value: Any) -> int:
    """Validates a store's ``max_json_size`` (an int, 1 .. :data:`MAX_MAX_JSON_SIZE`)."""
    return v.check_int("max_json_size", value, low=1, high=MAX_MAX_JSON_SIZE)


def check_metadata_filter(value: Any) -> dict[str, str]:
    """Validates ``search_history``'s ``metadata``: a mapping of str to str (no NUL, no surrogates), at most
    :data:`~threadloom.domain.rules.MAX_FILTER_KEYS` keys; returns a fresh copy.

    Raises:
        ValidationError: naming ``metadata``.
    """
    wanted = v.check_str_map("metadata", value)
    if len(wanted) > rules.MAX_FILTER_KEYS:
        raise ValidationError("metadata", (f"must hold at most {rules.MAX_FILTER_KEYS} keys, got {len(wanted)}",))
    return wanted


def check_commit(
    thread_id: str, commit: Any, max_json_size: int | None = None, access: AccessSchemas | None = None
) -> EncodedCommit:
    """Validates ``commit`` for ``thread_id`` and encodes it, once (deriving its access stamp by ``access``).

    The encoding is :func:`~threadloom.persistence.encoded.encode_commit`'s.

    Raises:
        ValidationError: not a ``Commit``; its checkpoint names another thread or carries another token; its
            fence names the thread itself; two effects share a key; a part changed behind its constructor; a
            stored record would be longer than ``max_json_size`` characters.
    """
    return encode_commit(thread_id, commit, max_json_size, access)


OPERATIONS: tuple[str, ...] = (
    "claim", "renew", "release", "current_claim", "commit", "latest", "checkpoint", "history", "search_history",
    "children",
    "events_after", "await_events_after", "compact_events", "delete_thread", "effect", "lookup_run", "prune", "sweep",
    "threads", "incomplete", "tenants", *ACCESS_OPERATIONS,
)
"""The public methods of the contract, in the order :class:`Checkpointer` declares them (the forwarding base,
the metered store and the contract suite all iterate over this one list)."""


class Checkpointer(AccessContract):
    """A store of agent threads: claims, fenced commits, history, events, tombstones, retention.

    The contract every store and every wrapper keeps (README "The library in ten lines"). Concrete stores
    subclass :class:`StoreBase`, which validates each call once and hands it to the store's implementation;
    wrappers (a metered store, a simulated one) subclass
    :class:`~threadloom.persistence.forwarding.ForwardingCheckpointer`, which hands each call on to another
    store's public method, so the store at the end validates it once. ``isinstance(x, Checkpointer)`` holds for
    both.

    Every method raises ``ValidationError`` (naming the field) for bad input before anything is read or
    written, and ``ProcessingError`` when the storage failed or the store is closed (``StoreClosed``,
    ``StoreUnavailable`` - retryable - or ``StoreCorrupt``); the errors listed per method come on top. Safe to
    call from any number of threads; several stores over one storage behave as one. Use as a context manager
    to close it.
    """

    queue: RunQueue | None = None
    """The store's durable run queue over the same storage (README "Agent runs that survive crashes"), or None
    for a store without one. It shares the store's closed state; a wrapper shows its inner store's queue."""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once :meth:`close` was called (a wrapper: or the store it wraps was closed)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Closes the store: later calls raise ``StoreClosed`` (a ``ProcessingError``); closing twice does nothing.

        A claim this store granted stays in the storage until released through another store or expired.
        """

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    def pressed(self, window: timedelta = PRESS_WINDOW) -> bool:
        """Whether this store's writes were pressed within the last ``window`` (docs/operations.md "Access
        walks"; :mod:`threadloom.persistence.pressure` defines the signal per store). A store that measures
        nothing is never pressed. Reads no storage; never raises."""
        return False

    # -- claims --------------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        """Claims ``thread_id`` for ``request.holder`` until ``request.ttl`` from now, by the store's clock.

        A thread need not have a checkpoint to be claimed.

        Returns:
            The claim with a new fencing token, greater than every token the storage issued before; its
            ``taken_over_from`` names the holder of an expired, unreleased claim it replaced (same tenant only).

        Raises:
            ThreadBusy: a live claim holds the thread (the holder's own included); nothing changed. The holder
                is named only to a request of the same tenant. Retrying after the claim ends is safe.
            ValidationError: bad ``thread_id`` or ``request``.
            ProcessingError: the storage failed or the store is closed.
        """

    @abc.abstractmethod
    def renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        """Extends the claim ``token`` to ``ttl`` from now by the store's clock.

        An expired claim nobody replaced is renewed. Renewing again is safe.

        Raises:
            StaleClaim: ``token`` is not the thread's current claim (taken over, released, or deleted).
            ValidationError, ProcessingError: as for :meth:`claim`.
        """

    @abc.abstractmethod
    def release(self, thread_id: str, token: int) -> None:
        """Ends the claim ``token`` so the thread can be claimed again at once.

        A token that is not the thread's current claim changes nothing: a run that lost its claim never
        releases its successor's. Releasing again is safe.
        """

    @abc.abstractmethod
    def current_claim(self, thread_id: str) -> RunClaim | None:
        """The claim the store holds on ``thread_id`` now, live or expired; None when it holds none.

        None for a thread never claimed, whose claim was released, or that was deleted (a delete ends the
        claim). A claim past ``expires_at`` that nobody released or replaced is returned as it is: whether it
        is live is judged by the store's clock, against ``expires_at`` (``ThreadSummary.status`` is ``RUNNING``
        while it is). For operators: it names the holder and its tenant whoever asks (reads check no tenant),
        and ``taken_over_from`` is None (the store keeps no record of the claim a takeover replaced).
        """

    # -- commits -------------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def commit(self, thread_id: str, commit: Commit) -> list[EventRecord]:
        """Applies ``commit`` atomically, fenced by its token.

        Checks, in order, the first failure winning with nothing written: own token (``StaleClaim``), the
        fence's token (``StaleClaim`` naming the other thread), the checkpoint's parent against the latest
        (``CheckpointConflict``; with ``retract_turn`` too, against the latest before the cut), a checkpoint id
        already in the history (before any cut), a pending write not naming the resulting latest,
        ``retract_turn`` without a checkpoint (each ``InvalidCommit``). Only once every check passed does
        ``retract_turn`` cut the history back to its newest settled checkpoint (all of it when none is settled),
        the new checkpoint then following that one; the new checkpoint keeps the ``parent`` it named. The holder
        may commit after expiry until another claim replaces it. The commit's JSON parts are written as their
        constructors validated and encoded them (changing a dict you passed to a constructor afterwards changes
        nothing that is stored). Every row the commit writes carries the access stamp its resulting latest
        checkpoint derives by this store's schema (README "Access schemas"), written in the same transaction.

        Size: each stored record's JSON text - the checkpoint with its state, each pending write with its
        payload, each event with its payload, each effect record with its result - may hold at most the store's
        ``max_json_size`` characters (default 16 MiB; README "Limits"). A longer one is a ``ValidationError``
        naming the part (``commit.checkpoint.state``, ``commit.events[2].payload``, ...) and its size, raised
        before the storage is touched.

        Returns:
            The commit's events, numbered contiguously in commit order, each with the commit's token: what a
            later read returns.

        Raises:
            StaleClaim, CheckpointConflict, InvalidCommit: as above; a retry with the same commit is refused
                the same way.
            OutcomeUnknown: the storage failed while the commit was in flight (read the thread to learn).
            ValidationError: as for :meth:`claim`, and a record over ``max_json_size`` (nothing written; the
                same commit is refused again).
            ProcessingError: as for :meth:`claim`.
        """

    # -- reads -----------------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def latest(self, thread_id: str) -> StoredCheckpoint | None:
        """The thread's latest checkpoint and its pending writes in commit order; None for a new thread."""

    @abc.abstractmethod
    def checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        """Checkpoint ``checkpoint_id`` of the thread's history, latest included; None if it is not there."""

    @abc.abstractmethod
    def history(self, thread_id: str, *, limit: int, before: str | None = None) -> list[Checkpoint]:
        """Up to ``limit`` (1..1000) of the thread's checkpoints, newest first, after ``before`` when given.

        Page by passing the last id of each page as ``before``.

        Raises:
            CheckpointNotFound: ``before`` is not in the history.
        """

    @abc.abstractmethod
    def search_history(
        self, thread_id: str, *, metadata: Mapping[str, str], limit: int, before: str | None = None,
        scan: int = rules.MAX_SCAN,
    ) -> CheckpointPage:
        """The thread's checkpoints whose metadata holds every key of ``metadata`` with exactly its value.

        Examines at most ``scan`` (1..1000) checkpoints, newest first, after ``before`` when given, and returns
        up to ``limit`` (1..1000) of those that match, newest first, with the ``before`` of the next page
        (``CheckpointPage.next``; None once nothing older is left). A key matches only a checkpoint whose
        ``Checkpoint.metadata`` holds it (values compare as exact strings); an empty ``metadata`` matches every
        checkpoint. One call reads one snapshot, through the history's index: its cost grows with ``scan``,
        never with the history's length (README "LangGraph" pages through it).

        Raises:
            ValidationError: ``metadata`` is not a mapping of str to str (no NUL, no surrogates) of at most 64
                keys; ``limit`` or ``scan`` out of range.
            CheckpointNotFound: ``before`` is not in the history.
        """

    @abc.abstractmethod
    def children(self, parent: str, *, limit: int, after: str | None = None) -> list[str]:
        """Up to ``limit`` (at most 1000) of ``parent``'s direct children, oldest first.

        A child is a thread whose latest checkpoint's origin names ``parent``, ordered by when it first
        committed a checkpoint with that origin; deleted threads are not listed but keep their place while
        their tombstone does. A ``limit`` below 1 reads none.

        Raises:
            ValidationError: ``after`` is not known as a child of ``parent``; ``limit`` is not an int or above
                1000.
        """

    @abc.abstractmethod
    def events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        """Up to ``limit`` (1..10000) events with ``seq > after_seq``, ascending.

        ``after_seq`` 0 and the number just before the incarnation's first both read from its first event.

        Raises:
            ReplayUnavailable: the start lies behind the replay floor.
            ThreadDeleted: ``after_seq`` lies inside a deleted incarnation's log.
        """

    @abc.abstractmethod
    def await_events_after(
        self,
        thread_id: str,
        after_seq: int,
        limit: int,
        timeout: timedelta,
        *,
        cancel: threading.Event | None = None,
    ) -> list[EventRecord]:
        """:meth:`events_after`, waiting up to ``timeout`` for a commit when there is nothing yet.

        Returns at once when the log holds events after ``after_seq``; otherwise the events of a commit that
        lands within ``timeout`` through any store over the storage, or ``[]``. A store that cannot wake on
        commits polls every :attr:`StoreBase.poll_interval`.

        Raises:
            CancelledError: ``cancel`` was set (checked before the call and while waiting).
            ReplayUnavailable, ThreadDeleted: as :meth:`events_after`.
        """

    @abc.abstractmethod
    def compact_events(self, thread_id: str, before_seq: int) -> None:
        """Drops events with ``seq < before_seq``; replay then starts no earlier.

        Needs no claim. The floor never moves back and never passes the thread's next number; compacting again
        is safe.
        """

    @abc.abstractmethod
    def delete_thread(self, thread_id: str, token: int, *, fence: tuple[str, int] | None = None) -> None:
        """Removes everything stored for the thread, fenced like a commit.

        History, pending writes, events, effects and the claim go; a tombstone keeps where the event numbering
        ended (the next incarnation starts one number past it) and when the store deleted it. Wakes waiters.

        Raises:
            StaleClaim: ``token`` is not the thread's current claim (a thread with no claim is refused: claim
                it first), or the fence's token is not the fence thread's; nothing deleted. A retry after a
                delete that applied is refused this way too (the claim went with the thread).
        """

    @abc.abstractmethod
    def effect(self, thread_id: str, key: str) -> EffectRecord | None:
        """The thread's effect record under ``key``; None if it has none or the thread is unknown."""

    @abc.abstractmethod
    def lookup_run(self, thread_id: str, run_ids: Iterable[str]) -> Checkpoint | None:
        """The newest checkpoint (by place in the history) whose ``run_id`` is one of ``run_ids``, or None.

        An empty ``run_ids`` is None.
        """

    @abc.abstractmethod
    def prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        """Removes the checkpoints and events ``policy`` does not keep, by the store's clock.

        Age is judged against the store's commit times, never the producer's. The latest checkpoint and its
        pending writes are always kept, and so is the newest checkpoint of every run an open run-queue entry
        names; pruning checkpoints also removes the events before the oldest kept; removing events raises the
        replay floor. Needs no claim; an unknown thread is a no-op; pruning again is safe.
        """

    @abc.abstractmethod
    def sweep(self, policy: SweepPolicy, guard: SweepGuard | None, *, after: str | None = None) -> SweepPage:
        """One bounded page of the store-wide retention sweep.

        Visits at most ``policy.batch_size`` threads (tombstones included) after ``after`` in thread-id order,
        asks ``guard`` which are protected, prunes each by ``policy.retention`` (keeping the newest checkpoint of
        every protected run), and reclaims tombstones older than ``policy.tombstone_age`` that nothing was
        stored under since, raising the store's reclamation mark.

        Returns:
            What the page visited, pruned and reclaimed, and ``next`` (the cursor to pass as ``after``) while
            more threads follow, else None.

        Raises:
            Whatever ``guard`` raises, with nothing changed (a non-threadloom error becomes ``ProcessingError``).
        """

    @abc.abstractmethod
    def threads(self, query: ThreadQuery) -> ThreadPage:
        """A page of ``query.tenant_id``'s root threads, newest first by ``updated_at`` (ties: id descending).

        Listed are threads with a checkpoint whose latest checkpoint has the query's tenant and no origin,
        filtered by ``query.matches``.
        """

    @abc.abstractmethod
    def incomplete(self, tenant_id: str | None, *, limit: int, after: ThreadCursor | None = None) -> ThreadPage:
        """The tenant's ``IDLE`` root threads, oldest first by ``updated_at`` (ties: id ascending).

        At most ``limit`` (1..1000); a thread whose cascade delete began is not listed.
        """

    @abc.abstractmethod
    def tenants(self, *, limit: int = 100, after: str | None = None) -> TenantPage:
        """The registry's tenants with how many root threads each holds (README "The `threadloom` command").

        A root thread is one ``threads`` lists: a thread with a checkpoint whose latest checkpoint has no origin,
        of any status (a thread whose cascade delete began included); a thread is counted under the tenant of its
        latest checkpoint. Rows come in ascending order of tenant id (code point order), and the threads that
        have no tenant last, as one row whose ``tenant_id`` is None. A tenant with no root thread is not listed.
        Each page is read through an index; counting reads every root thread of the page's tenants.

        Args:
            limit: at most this many rows (1..1000).
            after: the ``next`` of the previous page: only tenants after this id (and then the tenant-less)
                are listed; None starts from the first.

        Returns:
            ``TenantPage``: the rows, and ``next`` (the ``after`` of the next page) or None when no more follow.
            Reads only: retrying is safe.
        """


class StoreBase(SlowCalls, AccessStore, Checkpointer):
    """The base of every concrete store: it validates each call once, then runs the store's implementation.

    Each public method of :class:`Checkpointer` checks its arguments (``ValidationError`` naming the field,
    nothing read or written), refuses the call once the store is closed (``StoreClosed``), and calls the
    store's ``_``-prefixed method of the same name. A store implements those abstract ``_`` methods and never
    re-validates: the arguments it gets are checked. The public methods' documentation is
    :class:`Checkpointer`'s. A store that cannot wake on commits keeps the polling :meth:`await_events_after`
    of this class.
    """

    poll_interval: timedelta = timedelta(milliseconds=50)
    """How often the polling default of :meth:`await_events_after` re-reads (a store that wakes overrides it)."""

    def __init__(self, *, max_json_size: int = DEFAULT_MAX_JSON_SIZE, access: AccessSchemas | None = None) -> None:
        self._access = check_access(access)
        self.max_json_size = check_max_json_size(max_json_size)
        """The longest JSON text, in characters, of one stored record (a checkpoint with its state, a pending
        write, an event, an effect record) that :meth:`commit` accepts; a longer one is a ``ValidationError``."""
        self._closed = False
        self._close_lock = threading.Lock()
        self.write_pressure = WritePressure()
        """The store's pressed signal (:mod:`threadloom.persistence.pressure`); set ``write_pressure.threshold``
        to change what a slow write call is."""
        self.history_bulkhead = Bulkhead("history reads", pressure=self.write_pressure)
        """The bounded bulkhead an access walk's history reads (stamping) run under; a refusal presses the store."""
        self._probed = False

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def _ensure_open(self, operation: str) -> None:
        if self._closed:
            raise StoreClosed(operation, "the store is closed; open a new one")

    @property
    def slow_call(self) -> timedelta | None:
        """A call that takes longer than this (default 1 s) is logged as ``store.call_slow`` with ``op``,
        ``thread_id`` and ``duration_ms``, whatever its outcome; None: never. Set it (or ``open_store``'s
        ``slow_call`` option) to a ``timedelta``; ``timedelta(0)`` or None turns it off (no clock is read then).
        It covers every public call of the store and of its ``queue`` but ``await_events_after`` (a wait by
        design). Changing it while calls run is safe: a call in flight is judged by the threshold as it ends,
        and one that began while it was off is never reported.

        Raises:
            ValidationError: (on set) not a timedelta or None, or negative.
        """
        return None if self._slow_s == float("inf") else timedelta(seconds=self._slow_s)

    @slow_call.setter
    def slow_call(self, value: timedelta | None) -> None:
        self._slow_s = slow_call_seconds(value)
        if isinstance(self.queue, QueueBase):
            self.queue._slow_s = self._slow_s

    def pressed(self, window: timedelta = PRESS_WINDOW) -> bool:
        if not self._probed:  # a pooled store (PostgreSQL) adds its pool's wait statistics
            self._probed = True
            self.write_pressure.probe = pool_probe(getattr(self, "pool", None))
        return self.write_pressure.pressed(window)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._close()

    # -- claims --------------------------------------------------------------------------------------------------

    @timed_write("claim")
    def claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        v.check_id("thread_id", thread_id)
        _instance("request", request, ClaimRequest)
        attrs.validate(request)
        started = self._begin("claim")
        try:
            return self._claim(thread_id, request)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("claim", thread_id, started)

    @timed_write("renew")
    def renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        v.check_id("thread_id", thread_id)
        v.check_int("token", token, low=1)
        v.check_positive_duration("ttl", ttl)
        started = self._begin("renew")
        try:
            return self._renew(thread_id, token, ttl)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("renew", thread_id, started)

    @timed_write("release")
    def release(self, thread_id: str, token: int) -> None:
        v.check_id("thread_id", thread_id)
        v.check_int("token", token, low=1)
        started = self._begin("release")
        try:
            self._release(thread_id, token)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("release", thread_id, started)

    def current_claim(self, thread_id: str) -> RunClaim | None:
        v.check_id("thread_id", thread_id)
        started = self._begin("current_claim")
        try:
            return self._current_claim(thread_id)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("current_claim", thread_id, started)

    # -- commits -------------------------------------------------------------------------------------------------

    @timed_write("commit")
    def commit(self, thread_id: str, commit: Commit) -> list[EventRecord]:
        """:meth:`Checkpointer.commit`: validates and encodes ``commit`` once
        (:func:`~threadloom.persistence.encoded.encode_commit`), then the store writes the encoded texts."""
        v.check_id("thread_id", thread_id)
        encoded = check_commit(thread_id, commit, self.max_json_size, self._access)
        started = self._begin("commit")
        try:
            return self._commit(thread_id, encoded)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("commit", thread_id, started)

    # -- reads -----------------------------------------------------------------------------------------------------

    def latest(self, thread_id: str) -> StoredCheckpoint | None:
        v.check_id("thread_id", thread_id)
        started = self._begin("latest")
        try:
            return self._latest(thread_id)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("latest", thread_id, started)

    def checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        v.check_id("thread_id", thread_id)
        v.check_id("checkpoint_id", checkpoint_id)
        started = self._begin("checkpoint")
        try:
            return self._checkpoint(thread_id, checkpoint_id)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("checkpoint", thread_id, started)

    def history(self, thread_id: str, *, limit: int, before: str | None = None) -> list[Checkpoint]:
        v.check_id("thread_id", thread_id)
        v.check_int("limit", limit, low=1, high=rules.MAX_PAGE)
        v.check_optional_id("before", before)
        started = self._begin("history")
        try:
            return self._history(thread_id, limit, before)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("history", thread_id, started)

    def search_history(
        self, thread_id: str, *, metadata: Mapping[str, str], limit: int, before: str | None = None,
        scan: int = rules.MAX_SCAN,
    ) -> CheckpointPage:
        v.check_id("thread_id", thread_id)
        wanted = check_metadata_filter(metadata)
        v.check_int("limit", limit, low=1, high=rules.MAX_PAGE)
        v.check_optional_id("before", before)
        v.check_int("scan", scan, low=1, high=rules.MAX_SCAN)
        started = self._begin("search_history")
        try:
            return self._search_history(thread_id, wanted, limit, before, scan)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("search_history", thread_id, started)

    def children(self, parent: str, *, limit: int, after: str | None = None) -> list[str]:
        v.check_id("parent", parent)
        v.check_int("limit", limit, high=rules.MAX_PAGE)
        v.check_optional_id("after", after)
        started = self._begin("children")
        if limit < 1:
            return []
        try:
            return self._children(parent, limit, after)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("children", parent, started)

    def events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        v.check_id("thread_id", thread_id)
        v.check_int("after_seq", after_seq, low=0)
        v.check_int("limit", limit, low=1, high=rules.MAX_EVENTS_PAGE)
        started = self._begin("events_after")
        try:
            return self._events_after(thread_id, after_seq, limit)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("events_after", thread_id, started)

    def await_events_after(
        self,
        thread_id: str,
        after_seq: int,
        limit: int,
        timeout: timedelta,
        *,
        cancel: threading.Event | None = None,
    ) -> list[EventRecord]:
        v.check_id("thread_id", thread_id)
        v.check_int("after_seq", after_seq, low=0)
        v.check_int("limit", limit, low=1, high=rules.MAX_EVENTS_PAGE)
        v.check_non_negative_duration("timeout", timeout)
        _check_cancel(cancel)
        self._ensure_open("await_events_after")
        if cancel is not None and cancel.is_set():
            raise CancelledError("await_events_after")
        return self._await_events_after(thread_id, after_seq, limit, timeout, cancel)

    def _await_events_after(
        self, thread_id: str, after_seq: int, limit: int, timeout: timedelta, cancel: threading.Event | None
    ) -> list[EventRecord]:
        deadline = time.monotonic() + timeout.total_seconds()
        interval = self.poll_interval.total_seconds()
        while True:
            self._ensure_open("await_events_after")
            found = self._events_after(thread_id, after_seq, limit)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            pause = min(interval, remaining)
            if cancel is not None:
                if cancel.wait(pause):
                    raise CancelledError("await_events_after")
            else:
                time.sleep(pause)

    def compact_events(self, thread_id: str, before_seq: int) -> None:
        v.check_id("thread_id", thread_id)
        v.check_int("before_seq", before_seq, low=0)
        started = self._begin("compact_events")
        try:
            self._compact_events(thread_id, before_seq)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("compact_events", thread_id, started)

    @timed_write("delete_thread")
    def delete_thread(self, thread_id: str, token: int, *, fence: tuple[str, int] | None = None) -> None:
        v.check_id("thread_id", thread_id)
        v.check_int("token", token, low=1)
        if fence is not None:
            if not isinstance(fence, tuple) or len(fence) != 2:
                raise ValidationError("fence", ("must be a (thread_id, token) pair or None",))
            v.check_id("fence thread_id", fence[0])
            v.check_int("fence token", fence[1], low=1)
            if fence[0] == thread_id:
                raise ValidationError("fence", ("must name another thread than the one deleted",))
        started = self._begin("delete_thread")
        try:
            self._delete_thread(thread_id, token, fence)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("delete_thread", thread_id, started)

    def effect(self, thread_id: str, key: str) -> EffectRecord | None:
        v.check_id("thread_id", thread_id)
        v.check_id("key", key)
        started = self._begin("effect")
        try:
            return self._effect(thread_id, key)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("effect", thread_id, started)

    def lookup_run(self, thread_id: str, run_ids: Iterable[str]) -> Checkpoint | None:
        v.check_id("thread_id", thread_id)
        ids = v.check_run_ids("run_ids", run_ids)
        started = self._begin("lookup_run")
        if not ids:
            return None
        try:
            return self._lookup_run(thread_id, ids)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("lookup_run", thread_id, started)

    def prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        v.check_id("thread_id", thread_id)
        _instance("policy", policy, RetentionPolicy)
        started = self._begin("prune")
        try:
            self._prune(thread_id, policy)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("prune", thread_id, started)

    def sweep(self, policy: SweepPolicy, guard: SweepGuard | None, *, after: str | None = None) -> SweepPage:
        _instance("policy", policy, SweepPolicy)
        if guard is not None and not callable(getattr(guard, "protected", None)):
            raise ValidationError("guard", ("must have a protected(thread_ids) method, or be None",))
        v.check_optional_id("after", after)
        started = self._begin("sweep")
        try:
            return self._sweep(policy, guard, after)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("sweep", None, started)

    def preview_sweep(self, policy: SweepPolicy, *, after: str | None = None) -> SweepPage:
        """What ``sweep(policy, None, after=after)`` would do now, with nothing changed: a dry run of one page.

        The page is swept by the store's own code inside a transaction that is then rolled back, so the answer
        is exact for the moment of the call (open queue entries protect their runs as in a real sweep; there
        is no guard). It takes the write lock as a sweep does (SQLite: the file's write lock; PostgreSQL: the
        page's thread rows) for the length of the call, so it needs a store opened for writing. Not part of the
        ``Checkpointer`` contract: the in-memory store cannot preview.

        Returns:
            The page a sweep would return: visited, would be pruned, would be reclaimed, and ``next``.

        Raises:
            ValidationError: a bad ``policy`` or ``after``.
            ProcessingError: the store cannot preview, is closed or read-only, or the storage failed; nothing
                changed either way, so retrying is safe.
        """
        _instance("policy", policy, SweepPolicy)
        v.check_optional_id("after", after)
        self._ensure_open("preview_sweep")
        return self._preview_sweep(policy, after)

    def _preview_sweep(self, policy: SweepPolicy, after: str | None) -> SweepPage:
        raise ProcessingError("preview_sweep", f"{type(self).__name__} cannot preview a sweep; nothing changed")

    def threads(self, query: ThreadQuery) -> ThreadPage:
        _instance("query", query, ThreadQuery)
        started = self._begin("threads")
        try:
            return self._threads(query)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("threads", None, started)

    def incomplete(self, tenant_id: str | None, *, limit: int, after: ThreadCursor | None = None) -> ThreadPage:
        v.check_optional_id("tenant_id", tenant_id)
        v.check_int("limit", limit, low=1, high=ThreadQuery.MAX_LIMIT)
        if after is not None:
            _instance("after", after, ThreadCursor)
        started = self._begin("incomplete")
        try:
            return self._incomplete(tenant_id, limit, after)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("incomplete", None, started)

    def tenants(self, *, limit: int = 100, after: str | None = None) -> TenantPage:
        v.check_int("limit", limit, low=1, high=TenantPage.MAX_LIMIT)
        v.check_optional_id("after", after)
        started = self._begin("tenants")
        try:
            return self._tenants(limit, after)
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow("tenants", None, started)

    # -- what a store implements -----------------------------------------------------------------------------------

    @abc.abstractmethod
    def _claim(self, thread_id: str, request: ClaimRequest) -> RunClaim: ...

    @abc.abstractmethod
    def _renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim: ...

    @abc.abstractmethod
    def _release(self, thread_id: str, token: int) -> None: ...

    @abc.abstractmethod
    def _current_claim(self, thread_id: str) -> RunClaim | None: ...

    @abc.abstractmethod
    def _commit(self, thread_id: str, commit: EncodedCommit) -> list[EventRecord]:
        """Applies an encoded commit (checks by :func:`threadloom.domain.rules.check_commit`); writes its texts as
        they are."""

    @abc.abstractmethod
    def _latest(self, thread_id: str) -> StoredCheckpoint | None: ...

    @abc.abstractmethod
    def _checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None: ...

    @abc.abstractmethod
    def _history(self, thread_id: str, limit: int, before: str | None) -> list[Checkpoint]: ...

    @abc.abstractmethod
    def _search_history(
        self, thread_id: str, metadata: dict[str, str], limit: int, before: str | None, scan: int
    ) -> CheckpointPage: ...

    @abc.abstractmethod
    def _children(self, parent: str, limit: int, after: str | None) -> list[str]: ...

    @abc.abstractmethod
    def _events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]: ...

    @abc.abstractmethod
    def _compact_events(self, thread_id: str, before_seq: int) -> None: ...

    @abc.abstractmethod
    def _delete_thread(self, thread_id: str, token: int, fence: tuple[str, int] | None) -> None: ...

    @abc.abstractmethod
    def _effect(self, thread_id: str, key: str) -> EffectRecord | None: ...

    @abc.abstractmethod
    def _lookup_run(self, thread_id: str, run_ids: frozenset[str]) -> Checkpoint | None: ...

    @abc.abstractmethod
    def _prune(self, thread_id: str, policy: RetentionPolicy) -> None: ...

    @abc.abstractmethod
    def _sweep(self, policy: SweepPolicy, guard: SweepGuard | None, after: str | None) -> SweepPage: ...

    @abc.abstractmethod
    def _threads(self, query: ThreadQuery) -> ThreadPage: ...

    @abc.abstractmethod
    def _incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage: ...

    @abc.abstractmethod
    def _tenants(self, limit: int, after: str | None) -> TenantPage: ...

    @abc.abstractmethod
    def _close(self) -> None: ...


def ask_guard(guard: SweepGuard | None, thread_ids: tuple[str, ...]) -> Mapping[str, frozenset[str]]:
    """Asks a sweep guard which of ``thread_ids`` are protected, before anything changes.

    Returns:
        Protected thread id → the run ids whose newest checkpoints must be kept.

    Raises:
        The guard's own ``ThreadloomError``; any other exception as ``ProcessingError("sweep", …)``.
    """
    if guard is None or not thread_ids:
        return {}
    from threadloom.domain.errors import ThreadloomError

    try:
        answer = guard.protected(thread_ids)
        protected = {}
        for key, runs in dict(answer).items():
            if not isinstance(key, str) or isinstance(runs, (str, bytes)) or not hasattr(runs, "__iter__"):
                raise ValidationError(
                    "guard", (f"protected() must map thread ids to collections of run ids, got {key!r}: {runs!r}",)
                )
            protected[key] = frozenset(v.check_id("guard run id", run) for run in runs)
        return protected
    except ThreadloomError:
        raise
    except Exception as error:  # the guard is user code: anything it raises ends the sweep, nothing changed
        raise ProcessingError(
            "sweep", f"the sweep guard failed ({type(error).__name__}: {error}); nothing changed"
        ) from error

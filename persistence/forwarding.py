"""``ForwardingCheckpointer`` and ``ForwardingRunQueue``: the bases of every wrapper around a store or its run queue
(metered, simulated, test arrangements).

A wrapper is a :class:`~threadloom.persistence.base.Checkpointer` that hands every call on to another store's
*public* method: that store validates the arguments and checks that it is open, so a call through any number of
wrappers is validated once, by the store at the end, and its own :meth:`await_events_after` (the one that wakes
on commits) runs unchanged. A wrapper never implements a store's ``_``-prefixed methods; it customises one
seam, :meth:`ForwardingCheckpointer._forward`, or overrides a public method of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from threadloom.domain import rules
from threadloom.domain.access import NO_ACCESS, AccessSchemas, Member, TenantExportPage
from threadloom.domain.errors import StoreClosed, ValidationError
from threadloom.domain.queue import EntryStatus, Lease, PurgePage, QueueDepth, QueueEntry
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
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.queue import RunQueue


class ForwardingCheckpointer(Checkpointer):
    """A store that forwards every call to another store: subclass it to act around each call.

    Every method of the contract (:data:`~threadloom.persistence.base.OPERATIONS`) calls
    :meth:`_forward` with the operation's name and the caller's arguments unchanged; the default calls the
    method of that name on :attr:`inner` and returns its result or raises its error unchanged. Nothing is
    validated here: the inner store does it, once. Thread safety is the inner store's.

    Closing the wrapper closes the inner store (the wrapper owns it); :attr:`closed` is True once either was
    closed, and the closed inner store then refuses every call with ``StoreClosed``. :attr:`queue` is the
    inner store's run queue.

    Args:
        inner: the store every call goes to, or None for a wrapper whose :meth:`_forward` picks a store per
            call (such a wrapper refuses calls itself once closed, with :meth:`_ensure_open`).

    Raises:
        ValidationError: ``inner`` is neither a ``Checkpointer`` nor None.
    """

    def __init__(self, inner: Checkpointer | None) -> None:
        if inner is not None and not isinstance(inner, Checkpointer):
            raise ValidationError("inner", (f"must be a Checkpointer, got {type(inner).__name__}",))
        self._inner = inner
        self._closed = False
        self._close_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"

    @property
    def inner(self) -> Checkpointer | None:
        """The store calls are forwarded to (None when the wrapper picks one per call)."""
        return self._inner

    # -- the seam ------------------------------------------------------------------------------------------------

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """Runs one call of the contract: ``operation`` (a name in ``OPERATIONS``) with the caller's arguments.

        The one place a wrapper customises: override it to act around every call (call
        ``super()._forward(operation, *args, **kwargs)`` in the middle) or to send the call to another store.
        ``args`` and ``kwargs`` are exactly what the public method received (keyword-only parameters as
        keywords). Runs on the caller's thread.

        Returns:
            The inner store's result, unchanged.

        Raises:
            Whatever the inner store raises, unchanged.
        """
        return getattr(self._inner, operation)(*args, **kwargs)

    def _ensure_open(self, operation: str) -> None:
        """Raises ``StoreClosed`` for ``operation`` once this wrapper was closed."""
        if self._closed:
            raise StoreClosed(operation, "the store is closed; open a new one")

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once this wrapper or its inner store was closed."""
        return self._closed or (self._inner is not None and self._inner.closed)

    def close(self) -> None:
        """Closes the wrapper and its inner store; closing twice does nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._inner is not None:
            self._inner.close()

    @property
    def max_json_size(self) -> int | None:
        """The inner store's ``max_json_size`` (characters of JSON per record); None when it has none."""
        return getattr(self._inner, "max_json_size", None)

    @property
    def queue(self) -> RunQueue | None:  # type: ignore[override]
        """The inner store's run queue (its calls are not forwarded through this wrapper); None without one."""
        return self._inner.queue if self._inner is not None else None

    def pressed(self, window: timedelta = timedelta(seconds=1)) -> bool:
        """The inner store's pressed signal (not a forwarded call: never metered); False without one."""
        return self._inner.pressed(window) if self._inner is not None else False

    # -- the contract ----------------------------------------------------------------------------------------------

    def claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        return self._forward("claim", thread_id, request)

    def renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        return self._forward("renew", thread_id, token, ttl)

    def release(self, thread_id: str, token: int) -> None:
        return self._forward("release", thread_id, token)

    def current_claim(self, thread_id: str) -> RunClaim | None:
        return self._forward("current_claim", thread_id)

    def commit(self, thread_id: str, commit: Commit) -> list[EventRecord]:
        return self._forward("commit", thread_id, commit)

    def latest(self, thread_id: str) -> StoredCheckpoint | None:
        return self._forward("latest", thread_id)

    def checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        return self._forward("checkpoint", thread_id, checkpoint_id)

    def history(self, thread_id: str, *, limit: int, before: str | None = None) -> list[Checkpoint]:
        return self._forward("history", thread_id, limit=limit, before=before)

    def search_history(
        self, thread_id: str, *, metadata: Mapping[str, str], limit: int, before: str | None = None,
        scan: int = rules.MAX_SCAN,
    ) -> CheckpointPage:
        return self._forward(
            "search_history", thread_id, metadata=metadata, limit=limit, before=before, scan=scan
        )

    def children(self, parent: str, *, limit: int, after: str | None = None) -> list[str]:
        return self._forward("children", parent, limit=limit, after=after)

    def events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        return self._forward("events_after", thread_id, after_seq, limit)

    def await_events_after(
        self,
        thread_id: str,
        after_seq: int,
        limit: int,
        timeout: timedelta,
        *,
        cancel: threading.Event | None = None,
    ) -> list[EventRecord]:
        return self._forward("await_events_after", thread_id, after_seq, limit, timeout, cancel=cancel)

    def compact_events(self, thread_id: str, before_seq: int) -> None:
        return self._forward("compact_events", thread_id, before_seq)

    def delete_thread(self, thread_id: str, token: int, *, fence: tuple[str, int] | None = None) -> None:
        return self._forward("delete_thread", thread_id, token, fence=fence)

    def effect(self, thread_id: str, key: str) -> EffectRecord | None:
        return self._forward("effect", thread_id, key)

    def lookup_run(self, thread_id: str, run_ids: Iterable[str]) -> Checkpoint | None:
        return self._forward("lookup_run", thread_id, run_ids)

    def prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        return self._forward("prune", thread_id, policy)

    def sweep(self, policy: SweepPolicy, guard: SweepGuard | None, *, after: str | None = None) -> SweepPage:
        return self._forward("sweep", policy, guard, after=after)

    def threads(self, query: ThreadQuery) -> ThreadPage:
        return self._forward("threads", query)

    def incomplete(self, tenant_id: str | None, *, limit: int, after: ThreadCursor | None = None) -> ThreadPage:
        return self._forward("incomplete", tenant_id, limit=limit, after=after)

    def tenants(self, *, limit: int = 100, after: str | None = None) -> TenantPage:
        return self._forward("tenants", limit=limit, after=after)
    # -- access (README "Access schemas") ----------------------------------------------------------------------------

    @property
    def access(self) -> AccessSchemas:
        """The inner store's access schemas (none declared when the wrapper picks a store per call)."""
        return self._inner.access if self._inner is not None else NO_ACCESS

    def stamp_thread(self, thread_id: str, *, fence: tuple[str, int] | None = None) -> int:
        return self._forward("stamp_thread", thread_id, fence=fence)

    def graph_threads(self, graph_id: str, *, after: str | None = None, limit: int) -> list[str]:
        return self._forward("graph_threads", graph_id, after=after, limit=limit)

    def token_high_water(self) -> int:
        return self._forward("token_high_water")

    def heartbeat(self, group: str, member: str, serves: Sequence[str], ttl: timedelta) -> None:
        return self._forward("heartbeat", group, member, serves, ttl)

    def members(self, group: str) -> list[Member]:
        return self._forward("members", group)

    def tenant_history(
        self, thread_id: str, tenant_id: str | None, *, limit: int, before: str | None = None
    ) -> list[Checkpoint]:
        return self._forward("tenant_history", thread_id, tenant_id, limit=limit, before=before)

    def tenant_events_after(
        self, thread_id: str, tenant_id: str | None, after_seq: int, limit: int
    ) -> list[EventRecord]:
        return self._forward("tenant_events_after", thread_id, tenant_id, after_seq, limit)

    def export_tenant(self, tenant_id: str | None, *, after: str | None = None, limit: int = 10) -> TenantExportPage:
        return self._forward("export_tenant", tenant_id, after=after, limit=limit)


class ForwardingRunQueue(RunQueue):
    """A run queue that forwards every call to another queue's public method: subclass it to act around each call.

    The queue counterpart of :class:`ForwardingCheckpointer`: every method of
    :class:`~threadloom.persistence.queue.RunQueue` calls :meth:`_forward` with the operation's name and the
    caller's arguments unchanged; the default calls the method of that name on :attr:`inner` and returns its
    result or raises its error unchanged. The inner queue validates each call once and refuses it once its
    store is closed; :attr:`closed` is the inner queue's. Thread safety is the inner queue's.

    Args:
        inner: the queue every call goes to.

    Raises:
        ValidationError: ``inner`` is not a ``RunQueue``.
    """

    def __init__(self, inner: RunQueue) -> None:
        if not isinstance(inner, RunQueue):
            raise ValidationError("inner", (f"must be a RunQueue, got {type(inner).__name__}",))
        self._inner = inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"

    @property
    def inner(self) -> RunQueue:
        """The queue calls are forwarded to."""
        return self._inner

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """Runs one call of the queue: ``operation`` (a public method's name) with the caller's arguments.

        The one place a wrapper customises, as :meth:`ForwardingCheckpointer._forward`. Runs on the caller's
        thread.

        Returns:
            The inner queue's result, unchanged.

        Raises:
            Whatever the inner queue raises, unchanged.
        """
        return getattr(self._inner, operation)(*args, **kwargs)

    @property
    def closed(self) -> bool:
        """True once the inner queue's store was closed."""
        return self._inner.closed

    def enqueue(
        self,
        thread_id: str,
        *,
        graph_id: str,
        input: Any = None,  # noqa: A002 - the run's input, as RunQueue.enqueue names it
        tenant_id: str | None = None,
        delay: timedelta = timedelta(0),
    ) -> QueueEntry:
        return self._forward("enqueue", thread_id, graph_id=graph_id, input=input, tenant_id=tenant_id, delay=delay)

    def lease(self, holder: str, ttl: timedelta, *, graph_ids: Iterable[str] | None = None) -> Lease | None:
        return self._forward("lease", holder, ttl, graph_ids=graph_ids)

    def renew_lease(self, entry_id: int, attempt: int, ttl: timedelta) -> Lease:
        return self._forward("renew_lease", entry_id, attempt, ttl)

    def record_run(self, entry_id: int, attempt: int, run_id: str) -> QueueEntry:
        return self._forward("record_run", entry_id, attempt, run_id)

    def finish(
        self, entry_id: int, attempt: int, *, status: EntryStatus = EntryStatus.COMPLETED, error: str | None = None
    ) -> QueueEntry:
        return self._forward("finish", entry_id, attempt, status=status, error=error)

    def release_lease(
        self, entry_id: int, attempt: int, *, delay: timedelta = timedelta(0), refund: bool = False
    ) -> None:
        return self._forward("release_lease", entry_id, attempt, delay=delay, refund=refund)

    def take_lease(self, entry_id: int, holder: str, ttl: timedelta, *, force: bool = False) -> Lease | None:
        return self._forward("take_lease", entry_id, holder, ttl, force=force)

    def retry(self, entry_id: int) -> QueueEntry | None:
        return self._forward("retry", entry_id)

    def purge(self, older_than: timedelta, *, limit: int = 100, after: int | None = None) -> PurgePage:
        return self._forward("purge", older_than, limit=limit, after=after)

    def entry(self, entry_id: int) -> QueueEntry | None:
        return self._forward("entry", entry_id)

    def entries(
        self, *, limit: int = 50, after: int | None = None, status: EntryStatus | None = None
    ) -> list[QueueEntry]:
        return self._forward("entries", limit=limit, after=after, status=status)

    def open_runs(self, thread_ids: Iterable[str]) -> Mapping[str, frozenset[str]]:
        return self._forward("open_runs", thread_ids)

    def depth(self) -> QueueDepth:
        return self._forward("depth")


__all__ = ["ForwardingCheckpointer", "ForwardingRunQueue"]

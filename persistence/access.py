"""The access part of the store contract (README "Access schemas"): stamps, walks' reads and membership.

:class:`AccessContract` declares the public methods every store and wrapper has (``Checkpointer`` inherits it);
:class:`AccessStore` implements them once for every concrete store (``StoreBase`` inherits it): it validates the
arguments, then calls the store's ``_``-prefixed hooks. The tenant-scoped reads are defined here, over the hooks,
so every store fails closed the same way: a row whose stamp is not of the store's current schema makes the read
stamp its thread first (the follower, :meth:`AccessContract.stamp_thread` without a fence) and read again; a row
still not stamped by the current schema, or stamped for another tenant, is never returned.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from datetime import timedelta
from time import perf_counter
from typing import Any, TypeVar

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.access import (
    NO_ACCESS,
    WALK_GRAPH_ID,
    AccessSchemas,
    Member,
    StampColumns,
    TenantExportPage,
    TenantThread,
)
from threadloom.domain.errors import ValidationError
from threadloom.domain.values import Checkpoint, EffectRecord, EventRecord, PendingWrite

ACCESS_OPERATIONS: tuple[str, ...] = (
    "stamp_thread", "graph_threads", "token_high_water", "heartbeat", "members", "tenant_history",
    "tenant_events_after", "export_tenant",
)
"""The public methods of the access contract, in the order :class:`AccessContract` declares them."""

MAX_EXPORT_THREADS = 100
"""Most threads in one page of :meth:`AccessContract.export_tenant`."""

MAX_SERVES = 100
"""Most entries a member may heartbeat that it serves."""

_T = TypeVar("_T")
Stamped = list[tuple[_T, StampColumns | None]]


def _own(value: Any, tenant_id: str | None) -> bool:
    """False for a checkpoint (or an export's ``(kind, checkpoint)``) committed for another tenant than
    ``tenant_id``: a thread's stamp is derived from its latest checkpoint, so a restamp after a change of tenant
    names the newer tenant on the older tenant's checkpoints; those stay hidden (fail closed)."""
    if isinstance(value, tuple) and len(value) == 2:
        value = value[1]
    return not isinstance(value, Checkpoint) or value.tenant_id == tenant_id


def check_access(value: Any) -> AccessSchemas:
    """Validates a store's ``access`` option: an ``AccessSchemas`` or None (none declared)."""
    if value is None:
        return NO_ACCESS
    if not isinstance(value, AccessSchemas):
        raise ValidationError("access", (f"must be an AccessSchemas or None, got {type(value).__name__}",))
    return value


def check_fence(fence: Any) -> tuple[str, int] | None:
    """Validates a ``(thread_id, token)`` fence or None."""
    if fence is None:
        return None
    if not isinstance(fence, tuple) or len(fence) != 2:
        raise ValidationError("fence", ("must be a (thread_id, token) pair or None",))
    v.check_id("fence thread_id", fence[0])
    v.check_int("fence token", fence[1], low=1)
    return fence


class AccessContract(abc.ABC):
    """The access methods of every store (README "Access schemas"). Bad input is a ``ValidationError`` naming the
    field, before anything is read or written; a failed storage a ``ProcessingError``."""

    @property
    @abc.abstractmethod
    def access(self) -> AccessSchemas:
        """The access schemas this store stamps with (its node's declarations; none: every graph kind has its
        implicit tenant-only schema)."""

    @abc.abstractmethod
    def stamp_thread(self, thread_id: str, *, fence: tuple[str, int] | None = None) -> int:
        """Stamps every row of the thread (checkpoints, pending writes, events, effect records) with the stamp its
        latest checkpoint derives by this store's schema, where the stamp differs.

        One write transaction under the thread's write lock derives the stamp and writes it, so a concurrent
        commit's newer stamp is never overwritten. A thread without a checkpoint, unknown, or a walk thread: 0.
        Retrying is safe (a second call changes nothing).

        Args:
            thread_id: the thread.
            fence: ``(walk_thread_id, lease_token)``: checked in the same transaction.

        Returns:
            How many rows changed.

        Raises:
            StaleClaim: the fence's token is not its thread's current claim; nothing written.
        """

    @abc.abstractmethod
    def graph_threads(self, graph_id: str, *, after: str | None = None, limit: int) -> list[str]:
        """Up to ``limit`` (1..1000) ids of the threads whose latest checkpoint is of graph kind ``graph_id``
        (children too; never walk threads), ascending by id, after ``after``. Index-backed; a thread committed
        meanwhile keeps its place (ids never move)."""

    @abc.abstractmethod
    def token_high_water(self) -> int:
        """The storage-wide fencing-token high-water mark: the largest token issued so far (0 on an empty store)."""

    @abc.abstractmethod
    def heartbeat(self, group: str, member: str, serves: Sequence[str], ttl: timedelta) -> None:
        """Records that ``member`` of ``group`` is alive and serves ``serves`` (at most 100 entries) until ``ttl``
        from now by the store's clock, replacing its previous heartbeat. Retrying is safe."""

    @abc.abstractmethod
    def members(self, group: str) -> list[Member]:
        """The members of ``group`` whose last heartbeat has not expired by the store's clock, by name."""

    @abc.abstractmethod
    def tenant_history(
        self, thread_id: str, tenant_id: str | None, *, limit: int, before: str | None = None
    ) -> list[Checkpoint]:
        """:meth:`~threadloom.persistence.base.Checkpointer.history`, checked against the stamps, failing closed.

        A checkpoint is returned only when its stamp is of this store's current schema for the thread's graph
        kind and names ``tenant_id``. When the page holds a row without such a stamp, the thread is stamped
        first (the follower) and the page read again; what is still not stamped by the current schema (an older
        node committed meanwhile) is left out, never shown unchecked. A walk thread reads as empty.

        Raises:
            CheckpointNotFound: ``before`` is not in the history.
        """

    @abc.abstractmethod
    def tenant_events_after(
        self, thread_id: str, tenant_id: str | None, after_seq: int, limit: int
    ) -> list[EventRecord]:
        """:meth:`~threadloom.persistence.base.Checkpointer.events_after`, checked as :meth:`tenant_history`.

        Raises:
            ReplayUnavailable, ThreadDeleted: as ``events_after``.
        """

    @abc.abstractmethod
    def export_tenant(self, tenant_id: str | None, *, after: str | None = None, limit: int = 10) -> TenantExportPage:
        """A page of the tenant's threads (those whose latest checkpoint names the tenant), ascending by id after
        ``after``, at most ``limit`` (1..100, default 10) of them, each with its checkpoints, pending writes, events
        and effect records, each row checked as :meth:`tenant_history` checks it. A thread's rows are read whole:
        the page's size is bounded by ``limit`` threads, not by rows (README "Limits")."""


class AccessStore(AccessContract):
    """The access methods of a concrete store: validation, then the store's hooks (see the module docstring).

    The class mixing it in provides ``_begin``/``_slow``/``_slow_s`` (``SlowCalls``) and ``_ensure_open``, and
    sets ``_access``.
    """

    _access: AccessSchemas = NO_ACCESS
    _slow_s: float

    @property
    def access(self) -> AccessSchemas:
        return self._access

    def _begin(self, operation: str) -> float:  # pragma: no cover - SlowCalls provides it
        raise NotImplementedError

    def _slow(self, operation: str, thread_id: str | None, started: float) -> None:  # pragma: no cover
        raise NotImplementedError

    def _timed(self, operation: str, thread_id: str | None, call: Callable[[], _T]) -> _T:
        started = self._begin(operation)
        try:
            return call()
        finally:
            if started and perf_counter() - started > self._slow_s:
                self._slow(operation, thread_id, started)

    def stamp_thread(self, thread_id: str, *, fence: tuple[str, int] | None = None) -> int:
        v.check_id("thread_id", thread_id)
        check_fence(fence)
        if fence is not None and fence[0] == thread_id:
            raise ValidationError("fence", ("must name another thread than the one stamped",))
        return self._timed("stamp_thread", thread_id, lambda: self._stamp_thread(thread_id, fence))

    def graph_threads(self, graph_id: str, *, after: str | None = None, limit: int) -> list[str]:
        v.check_id("graph_id", graph_id)
        v.check_optional_id("after", after)
        v.check_int("limit", limit, low=1, high=rules.MAX_PAGE)
        if graph_id == WALK_GRAPH_ID:
            raise ValidationError("graph_id", (f"{WALK_GRAPH_ID!r} is reserved for the walks",))
        return self._timed("graph_threads", None, lambda: self._graph_threads(graph_id, after, limit))

    def token_high_water(self) -> int:
        return self._timed("token_high_water", None, self._token_high_water)

    def heartbeat(self, group: str, member: str, serves: Sequence[str], ttl: timedelta) -> None:
        v.check_id("group", group)
        v.check_id("member", member)
        if isinstance(serves, (str, bytes)) or not isinstance(serves, Sequence):
            raise ValidationError("serves", ("must be a sequence of str",))
        if len(serves) > MAX_SERVES:
            raise ValidationError("serves", (f"holds {len(serves)} entries, more than {MAX_SERVES}",))
        items = tuple(sorted({v.check_id("serves", item) for item in serves}))
        v.check_positive_duration("ttl", ttl)
        self._timed("heartbeat", None, lambda: self._heartbeat(group, member, items, ttl))

    def members(self, group: str) -> list[Member]:
        v.check_id("group", group)
        return self._timed("members", None, lambda: self._members(group))

    def tenant_history(
        self, thread_id: str, tenant_id: str | None, *, limit: int, before: str | None = None
    ) -> list[Checkpoint]:
        v.check_id("thread_id", thread_id)
        v.check_optional_id("tenant_id", tenant_id)
        v.check_int("limit", limit, low=1, high=rules.MAX_PAGE)
        v.check_optional_id("before", before)
        return self._timed(
            "tenant_history",
            thread_id,
            lambda: self._checked(thread_id, tenant_id, lambda: self._stamped_history(thread_id, limit, before)),
        )

    def tenant_events_after(
        self, thread_id: str, tenant_id: str | None, after_seq: int, limit: int
    ) -> list[EventRecord]:
        v.check_id("thread_id", thread_id)
        v.check_optional_id("tenant_id", tenant_id)
        v.check_int("after_seq", after_seq, low=0)
        v.check_int("limit", limit, low=1, high=rules.MAX_EVENTS_PAGE)
        return self._timed(
            "tenant_events_after",
            thread_id,
            lambda: self._checked(thread_id, tenant_id, lambda: self._stamped_events(thread_id, after_seq, limit)),
        )

    def export_tenant(self, tenant_id: str | None, *, after: str | None = None, limit: int = 10) -> TenantExportPage:
        v.check_optional_id("tenant_id", tenant_id)
        v.check_optional_id("after", after)
        v.check_int("limit", limit, low=1, high=MAX_EXPORT_THREADS)
        return self._timed("export_tenant", None, lambda: self._export(tenant_id, after, limit))

    # -- the fail-closed check ------------------------------------------------------------------------------------

    def _current_schema(self, graph_id: str | None) -> str | None:
        """The hash of the schema a thread of ``graph_id`` must be stamped with; None: nothing may be shown."""
        if graph_id is None or graph_id == WALK_GRAPH_ID:
            return None
        return self._access.for_graph(graph_id).hash

    def _checked(
        self,
        thread_id: str,
        tenant_id: str | None,
        read: Callable[[], tuple[str | None, Stamped[_T]]],
    ) -> list[_T]:
        graph_id, rows = read()
        expected = self._current_schema(graph_id)
        if expected is None:
            return []
        if any(stamp is None or stamp[0] != expected for _, stamp in rows):
            self._stamp_thread(thread_id, None)  # the follower: stamp the thread, then read it again
            graph_id, rows = read()
            expected = self._current_schema(graph_id)
            if expected is None:
                return []
        return [
            value
            for value, stamp in rows
            if stamp is not None and stamp[0] == expected and stamp[1] == tenant_id and _own(value, tenant_id)
        ]

    def _export(self, tenant_id: str | None, after: str | None, limit: int) -> TenantExportPage:
        ids = self._tenant_threads(tenant_id, after, limit + 1)
        page = ids[:limit]
        threads = []
        for thread_id in page:
            parts = self._checked(thread_id, tenant_id, self._reader(thread_id))
            threads.append(
                TenantThread(
                    thread_id=thread_id,
                    checkpoints=tuple(part for kind, part in parts if kind == 0),
                    pending_writes=tuple(part for kind, part in parts if kind == 1),
                    events=tuple(part for kind, part in parts if kind == 2),
                    effects=tuple(part for kind, part in parts if kind == 3),
                )
            )
        return TenantExportPage(threads=tuple(threads), next=page[-1] if len(ids) > limit and page else None)

    def _reader(self, thread_id: str) -> Callable[[], tuple[str | None, Stamped[tuple[int, Any]]]]:
        return lambda: self._whole_thread(thread_id)

    def _whole_thread(self, thread_id: str) -> tuple[str | None, Stamped[tuple[int, Any]]]:
        graph_id, checkpoints, pending, events, effects = self._stamped_thread(thread_id)
        rows: Stamped[tuple[int, Any]] = []
        parts: tuple[Any, ...] = (checkpoints, pending, events, effects)
        for kind, part in enumerate(parts):
            rows.extend(((kind, value), stamp) for value, stamp in part)
        return graph_id, rows

    # -- what a store implements -------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _stamp_thread(self, thread_id: str, fence: tuple[str, int] | None) -> int: ...

    @abc.abstractmethod
    def _graph_threads(self, graph_id: str, after: str | None, limit: int) -> list[str]: ...

    @abc.abstractmethod
    def _token_high_water(self) -> int: ...

    @abc.abstractmethod
    def _heartbeat(self, group: str, member: str, serves: tuple[str, ...], ttl: timedelta) -> None: ...

    @abc.abstractmethod
    def _members(self, group: str) -> list[Member]: ...

    @abc.abstractmethod
    def _stamped_history(
        self, thread_id: str, limit: int, before: str | None
    ) -> tuple[str | None, Stamped[Checkpoint]]:
        """The ``history`` page with each checkpoint's stamp, and the graph kind of the thread's latest checkpoint
        (None when it has none), read in one snapshot."""

    @abc.abstractmethod
    def _stamped_events(
        self, thread_id: str, after_seq: int, limit: int
    ) -> tuple[str | None, Stamped[EventRecord]]:
        """The ``events_after`` page with each event's stamp, and the thread's graph kind, in one snapshot."""

    @abc.abstractmethod
    def _tenant_threads(self, tenant_id: str | None, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` ids of the threads whose latest checkpoint names ``tenant_id`` (no walk threads),
        ascending, after ``after``."""

    @abc.abstractmethod
    def _stamped_thread(
        self, thread_id: str
    ) -> tuple[
        str | None, Stamped[Checkpoint], Stamped[PendingWrite], Stamped[EventRecord], Stamped[EffectRecord]
    ]:
        """The thread's graph kind and every row with its stamp (history oldest first, pending writes in commit
        order, events ascending, effects by key), in one snapshot."""


__all__ = ["ACCESS_OPERATIONS", "MAX_EXPORT_THREADS", "AccessContract", "AccessStore", "check_access", "check_fence"]

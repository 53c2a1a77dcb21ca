"""The store contract as coroutines: :class:`AsyncStore` around any store, :func:`open_async_store` from a URL.

Every ``Checkpointer`` method has an awaitable twin of the same name, arguments, result and errors (README
"asyncio"). A call that does I/O runs on a bounded thread pool the async store owns, so the event loop never
blocks on the disk or the network; :meth:`AsyncStore.await_events_after` holds no thread while it waits: it
registers a wake with the store's watcher (memory: the commit itself; SQLite: one ``PRAGMA data_version``
watcher per store; PostgreSQL: one ``LISTEN`` connection per store) and only its re-reads use the pool. On
PostgreSQL a commit's notification carries its events when they fit: a wait they continue returns them without a
read.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.access import Member, TenantExportPage
from threadloom.domain.errors import CancelledError, StoreClosed, ValidationError
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
from threadloom.persistence.opening import open_store
from threadloom.persistence.queue import RunQueue
from threadloom.persistence.wakeups import LoopWake, Wakeups

T = TypeVar("T")

DEFAULT_WORKERS = 8
"""Threads of an async store's pool unless told. Each store serializes what would contend anyway (SQLite: one
writer per file, with group commit; PostgreSQL: its connection pool, 10 connections by default), so more threads
would mostly queue on the store's own locks; 8 keeps a PostgreSQL pool busy and SQLite's readers concurrent
(``benchmarks/bench_async.py`` measures 1,000 concurrent calls at several sizes)."""

MAX_WORKERS = 256

CANCEL_CHECK = timedelta(milliseconds=20)
"""How often a wait given a ``threading.Event`` as ``cancel`` looks at it (task cancellation needs no check)."""


def _is_event(value: Any) -> bool:
    return callable(getattr(value, "is_set", None)) and callable(getattr(value, "wait", None))


def _find_wakeups(store: Checkpointer) -> Wakeups | None:
    """The wakeups of ``store`` or of the store a chain of wrappers ends at (None: the store cannot wake)."""
    seen = 0
    current: Any = store
    while current is not None and seen < 16:
        wakeups = getattr(current, "wakeups", None)
        if callable(wakeups):
            found = wakeups()
            return found if isinstance(found, Wakeups) else None
        current = getattr(current, "inner", None)
        seen += 1
    return None


class AsyncStore:
    """A store whose contract methods are coroutines; wraps any :class:`Checkpointer` (memory, SQLite,
    PostgreSQL, a metered or other wrapper).

    Every method takes the same arguments and raises the same errors as the store's method of that name
    (README "The library in ten lines"); validation and the work happen in the store, on the async store's
    pool. Safe to use from any number of tasks and event loops, and at the same time as the store itself.

    Cancelling the task of a call (``asyncio.CancelledError``) returns at once. A wait in
    :meth:`await_events_after` gives back its wake and, mid-read, sets the read's cancel (PostgreSQL then
    discards that read's connection); any other call already handed to the pool still runs to its end in the
    background, so its outcome is unknown to the caller - read the thread, or retry: fencing refuses a write
    twice. The store stays usable either way.

    Args:
        store: the store every call goes to.
        max_workers: threads of the pool (1..256; default :data:`DEFAULT_WORKERS`). At most that many calls do
            I/O at once; more wait their turn (waits in ``await_events_after`` do not count while they wait).
        own_store: close ``store`` with :meth:`close` (default True).

    Raises:
        ValidationError: ``store`` is not a ``Checkpointer`` or ``max_workers`` is out of range.
    """

    def __init__(self, store: Checkpointer, *, max_workers: int | None = None, own_store: bool = True) -> None:
        if not isinstance(store, Checkpointer):
            raise ValidationError("store", (f"must be a Checkpointer, got {type(store).__name__}",))
        workers = DEFAULT_WORKERS if max_workers is None else max_workers
        v.check_int("max_workers", workers, low=1, high=MAX_WORKERS)
        self._store = store
        self._own = own_store
        self._workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="threadloom-aio")
        self._closed = False
        self._wakeups = _find_wakeups(store)
        # Reads in flight, shared by waiters of one thread from one place on one loop (see _shared_read).
        self._reads: dict[tuple[int, str, int, int], _SharedRead] = {}
        self._numbers = itertools.count(1)  # strictly increasing from any thread: reads and wake stamps

    def __repr__(self) -> str:
        return f"AsyncStore({self._store!r}, max_workers={self._workers})"

    @property
    def store(self) -> Checkpointer:
        """The store the calls go to (use it for its synchronous API, e.g. from a thread)."""
        return self._store

    @property
    def max_workers(self) -> int:
        """Threads of the pool."""
        return self._workers

    @property
    def queue(self) -> RunQueue | None:
        """The store's run queue (its calls are synchronous)."""
        return self._store.queue

    @property
    def closed(self) -> bool:
        """True once this async store or its store was closed."""
        return self._closed or self._store.closed

    async def _run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise StoreClosed(getattr(function, "__name__", "call"), "the store is closed; open a new one")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(function, *args, **kwargs))

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs blocking ``fn(*args, **kwargs)`` on this store's pool and awaits it (e.g. a run queue call)."""
        return await self._run(fn, *args, **kwargs)

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Closes the store (unless ``own_store=False``) and the pool; closing twice does nothing.

        Calls still on the pool finish first (a ``StoreClosed`` for those that start after the store closed)."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._own:
            await loop.run_in_executor(None, self._store.close)
        await loop.run_in_executor(None, functools.partial(self._pool.shutdown, wait=True))

    def shutdown(self) -> None:
        """Stops the pool without waiting and without closing the store (for an owner that is not on a loop);
        later calls raise ``StoreClosed``."""
        self._closed = True
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *_exc: Any) -> None:
        await self.close()

    # -- the contract ----------------------------------------------------------------------------------------------

    async def claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        return await self._run(self._store.claim, thread_id, request)

    async def renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        return await self._run(self._store.renew, thread_id, token, ttl)

    async def release(self, thread_id: str, token: int) -> None:
        await self._run(self._store.release, thread_id, token)

    async def current_claim(self, thread_id: str) -> RunClaim | None:
        return await self._run(self._store.current_claim, thread_id)

    async def commit(self, thread_id: str, commit: Commit) -> list[EventRecord]:
        return await self._run(self._store.commit, thread_id, commit)

    async def latest(self, thread_id: str) -> StoredCheckpoint | None:
        return await self._run(self._store.latest, thread_id)

    async def checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        return await self._run(self._store.checkpoint, thread_id, checkpoint_id)

    async def history(self, thread_id: str, *, limit: int, before: str | None = None) -> list[Checkpoint]:
        return await self._run(self._store.history, thread_id, limit=limit, before=before)

    async def search_history(
        self, thread_id: str, *, metadata: Mapping[str, str], limit: int, before: str | None = None,
        scan: int = rules.MAX_SCAN,
    ) -> CheckpointPage:
        return await self._run(
            self._store.search_history, thread_id, metadata=metadata, limit=limit, before=before, scan=scan
        )

    async def children(self, parent: str, *, limit: int, after: str | None = None) -> list[str]:
        return await self._run(self._store.children, parent, limit=limit, after=after)

    async def events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        return await self._run(self._store.events_after, thread_id, after_seq, limit)

    async def compact_events(self, thread_id: str, before_seq: int) -> None:
        await self._run(self._store.compact_events, thread_id, before_seq)

    async def delete_thread(self, thread_id: str, token: int, *, fence: tuple[str, int] | None = None) -> None:
        await self._run(self._store.delete_thread, thread_id, token, fence=fence)

    async def effect(self, thread_id: str, key: str) -> EffectRecord | None:
        return await self._run(self._store.effect, thread_id, key)

    async def lookup_run(self, thread_id: str, run_ids: Iterable[str]) -> Checkpoint | None:
        return await self._run(self._store.lookup_run, thread_id, run_ids)

    async def prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        await self._run(self._store.prune, thread_id, policy)

    async def sweep(self, policy: SweepPolicy, guard: SweepGuard | None, *, after: str | None = None) -> SweepPage:
        return await self._run(self._store.sweep, policy, guard, after=after)

    async def threads(self, query: ThreadQuery) -> ThreadPage:
        return await self._run(self._store.threads, query)

    async def incomplete(self, tenant_id: str | None, *, limit: int, after: ThreadCursor | None = None) -> ThreadPage:
        return await self._run(self._store.incomplete, tenant_id, limit=limit, after=after)

    async def tenants(self, *, limit: int = 100, after: str | None = None) -> TenantPage:
        return await self._run(self._store.tenants, limit=limit, after=after)

    # -- access (README "Access schemas") ----------------------------------------------------------------------------

    async def stamp_thread(self, thread_id: str, *, fence: tuple[str, int] | None = None) -> int:
        return await self._run(self._store.stamp_thread, thread_id, fence=fence)

    async def graph_threads(self, graph_id: str, *, after: str | None = None, limit: int) -> list[str]:
        return await self._run(self._store.graph_threads, graph_id, after=after, limit=limit)

    async def token_high_water(self) -> int:
        return await self._run(self._store.token_high_water)

    async def heartbeat(self, group: str, member: str, serves: Sequence[str], ttl: timedelta) -> None:
        return await self._run(self._store.heartbeat, group, member, serves, ttl)

    async def members(self, group: str) -> list[Member]:
        return await self._run(self._store.members, group)

    async def tenant_history(
        self, thread_id: str, tenant_id: str | None, *, limit: int, before: str | None = None
    ) -> list[Checkpoint]:
        return await self._run(self._store.tenant_history, thread_id, tenant_id, limit=limit, before=before)

    async def tenant_events_after(
        self, thread_id: str, tenant_id: str | None, after_seq: int, limit: int
    ) -> list[EventRecord]:
        return await self._run(self._store.tenant_events_after, thread_id, tenant_id, after_seq, limit)

    async def export_tenant(
        self, tenant_id: str | None, *, after: str | None = None, limit: int = 10
    ) -> TenantExportPage:
        return await self._run(self._store.export_tenant, tenant_id, after=after, limit=limit)

    async def await_events_after(
        self,
        thread_id: str,
        after_seq: int,
        limit: int,
        timeout: timedelta,
        *,
        cancel: threading.Event | None = None,
    ) -> list[EventRecord]:
        """:meth:`events_after`, waiting up to ``timeout`` for a commit when there is nothing yet, holding no
        thread while it waits.

        Returns at once when the log holds events after ``after_seq``; otherwise the events of a commit that
        lands within ``timeout`` through any store over the storage (woken by the store's watcher: memory,
        SQLite, PostgreSQL; a store without one is re-read every ``poll_interval``), or ``[]``.

        Raises:
            asyncio.CancelledError: the task was cancelled; the wait's wake is given back at once.
            CancelledError: ``cancel`` (a ``threading.Event``, for callers outside the loop) was set.
            ValidationError, ReplayUnavailable, ThreadDeleted, ProcessingError: as :meth:`events_after`.
        """
        operation = "await_events_after"
        v.check_id("thread_id", thread_id)
        v.check_int("after_seq", after_seq, low=0)
        v.check_int("limit", limit, low=1, high=rules.MAX_EVENTS_PAGE)
        v.check_non_negative_duration("timeout", timeout)
        if cancel is not None and not _is_event(cancel):
            raise ValidationError("cancel", ("must be a threading.Event or None",))
        if self.closed:
            raise StoreClosed(operation, "the store is closed; open a new one")
        if cancel is not None and cancel.is_set():
            raise CancelledError(operation)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout.total_seconds()
        wakeups = self._wakeups
        wake = LoopWake(stamp=self._tick) if wakeups is not None and timeout > timedelta(0) else None
        if wake is not None and wakeups is not None:
            wakeups.waiters.add(thread_id, wake)
        poll = getattr(self._store, "poll_interval", timedelta(milliseconds=50)).total_seconds()
        try:
            if wakeups is not None:
                wakeups.start()
            mark = self._tick()  # only a read issued after this may answer the first read
            while True:
                if wake is not None:
                    wake.event.clear()
                    mark = max(mark, wake.mark)  # a fire this clear swallows: only a read issued after it
                found = await self._shared_read(loop, thread_id, after_seq, limit, mark)
                remaining = deadline - loop.time()
                if found or remaining <= 0:
                    return found
                listening = wakeups is not None and wakeups.listening()
                step = remaining if listening else min(remaining, poll)
                if cancel is not None:
                    step = min(step, CANCEL_CHECK.total_seconds())
                mark = self._tick()
                if wake is not None:
                    try:
                        async with asyncio.timeout(step):
                            await wake.event.wait()
                        mark = wake.mark  # a read issued once the wake fired saw the commit that fired it
                    except TimeoutError:
                        mark = self._tick()
                else:
                    await asyncio.sleep(step)
                    mark = self._tick()
                if cancel is not None and cancel.is_set():
                    raise CancelledError(operation)
                if self.closed:
                    raise StoreClosed(operation, "the store is closed; open a new one")
                if wake is not None and wake.offered is not None:
                    offered, wake.offered = wake.offered, None
                    if offered and offered[0].seq == after_seq + 1 and offered[0].thread_id == thread_id:
                        return list(offered[:limit])  # the events its notification carried: no read
        finally:
            if wake is not None and wakeups is not None:
                wakeups.waiters.remove(thread_id, wake)

    def _tick(self) -> int:
        """The next number: reads are numbered as issued, wakes stamped as they fire, from one sequence."""
        return next(self._numbers)

    async def _shared_read(
        self, loop: asyncio.AbstractEventLoop, thread_id: str, after_seq: int, limit: int, mark: int
    ) -> list[EventRecord]:
        """One read for every waiter of ``thread_id`` from ``after_seq`` on this loop: a commit that wakes a
        thousand subscribers costs one read, not a thousand.

        A caller joins the read in flight when that read cannot miss what the caller must see: it has not started
        on the pool yet (so it starts after the caller asked), or it was issued after ``mark`` (after the wake
        that woke the caller fired). Otherwise the caller issues a new read. Each caller gets a list of its own
        (the records are immutable values). The last caller to be cancelled cancels the read (PostgreSQL then
        aborts it and discards its connection)."""
        key = (id(loop), thread_id, after_seq, limit)
        shared = self._reads.get(key)
        if shared is None or (shared.started.is_set() and shared.number <= mark):
            shared = _SharedRead(self._tick())
            shared.future = loop.create_task(self._read(thread_id, after_seq, limit, shared.started))
            self._reads[key] = shared

            def forget(_done: object, key: tuple[int, str, int, int] = key, shared: _SharedRead = shared) -> None:
                if self._reads.get(key) is shared:
                    del self._reads[key]

            shared.future.add_done_callback(forget)
        shared.waiters += 1
        try:
            return list(await asyncio.shield(shared.future))
        except asyncio.CancelledError:
            if shared.waiters == 1 and not shared.future.done():
                shared.future.cancel()
            raise
        finally:
            shared.waiters -= 1

    async def _read(
        self, thread_id: str, after_seq: int, limit: int, started: threading.Event
    ) -> list[EventRecord]:
        """One read of the events, cancellable: a cancelled task sets the read's cancel (a PostgreSQL read in
        flight is aborted and its connection discarded). ``started`` is set on the pool thread before the read."""
        stop = threading.Event()

        def read() -> list[EventRecord]:
            started.set()
            return self._store.await_events_after(thread_id, after_seq, limit, timedelta(0), cancel=stop)

        try:
            return await self._run(read)
        except asyncio.CancelledError:
            stop.set()
            raise


class _SharedRead:
    """A read in flight that waiters of one thread from one place may share (see ``AsyncStore._shared_read``)."""

    __slots__ = ("future", "number", "started", "waiters")

    def __init__(self, number: int) -> None:
        self.number = number
        self.started = threading.Event()
        self.waiters = 0
        self.future: asyncio.Future[list[EventRecord]]


async def open_async_store(url: str, *, max_workers: int | None = None, **options: Any) -> AsyncStore:
    """Opens a store from a URL (:func:`~threadloom.persistence.opening.open_store`, on a worker thread: opening
    may create and migrate a file or a schema) and returns it as an :class:`AsyncStore`.

    Args:
        url: as ``open_store``: ``memory://``, ``sqlite:///path.db``, ``postgresql://…``.
        max_workers: threads of the async store's pool (default :data:`DEFAULT_WORKERS`).
        **options: as ``open_store`` (``clock``, ``busy_timeout``, ``config``, ``slow_call``, ``max_json_size``…).

    Raises:
        ValidationError, ProcessingError: as ``open_store``; nothing is left open.
        asyncio.CancelledError: the task was cancelled; a store the open made meanwhile is closed (nothing is
            left open).
    """
    if max_workers is not None:
        v.check_int("max_workers", max_workers, low=1, high=MAX_WORKERS)
    loop = asyncio.get_running_loop()
    opening = loop.run_in_executor(None, functools.partial(open_store, url, **options))
    try:
        store = await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)  # the worker thread opens it anyway: close what it opened
        raise
    return AsyncStore(store, max_workers=max_workers)


def _close_opened(done: asyncio.Future[Checkpointer]) -> None:
    """Closes the store an open whose caller was cancelled made (off the loop: closing may wait on I/O)."""
    if done.cancelled() or done.exception() is not None:
        return
    store = done.result()
    threading.Thread(target=store.close, name="threadloom-aio-close", daemon=True).start()


__all__ = ["DEFAULT_WORKERS", "MAX_WORKERS", "AsyncStore", "open_async_store"]

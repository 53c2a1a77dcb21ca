"""``Subscription``: a thread's events, once each, in order, without gap.

A subscription replays the log with ``events_after`` pages from ``after_seq``, then watches it with
``await_events_after`` on a task of its own (a thread by default), each call from the last event it queued, so it
sees commits made through any runtime or process sharing the storage. The store numbers each thread's events
contiguously and refuses a read it cannot serve whole (``ReplayUnavailable`` behind the replay floor,
``ThreadDeleted`` inside a deleted log), so what a subscription delivers has no gap and no duplicate; to go on
after a restart, subscribe again with the ``seq`` of the last event handled (:attr:`Subscription.last_seq`).

A read that fails for a reason that may pass (the store unavailable, or failing in a way it does not name) is
made again from the same place after a pause, so an outage delays events but loses none; a damaged or closed
store (``StoreCorrupt``, ``StoreClosed``) ends the subscription with that error instead of reading forever.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from threadloom.actors._failures import closed_under, error_kind, is_fatal, is_transient, retry_pause
from threadloom.actors.aio import running_loop
from threadloom.actors.graph import END_EVENTS
from threadloom.actors.logs import log as _log
from threadloom.actors.policies import WatchPolicy
from threadloom.actors.scheduler import Scheduler, Task
from threadloom.domain import validation as v
from threadloom.domain.errors import CancelledError, ProcessingError, TenantMismatch, ThreadloomError
from threadloom.domain.values import EventRecord
from threadloom.persistence.base import Checkpointer

if TYPE_CHECKING:
    from threadloom.persistence.aio import AsyncStore

PAGE = 500
"""Events read per store call."""

ASYNC_WAIT = timedelta(seconds=30)
"""How long one wait of an async subscription's watch lasts before it reads again: the store's watcher wakes it
on a commit (README "asyncio"), so it needs no short poll; a store without a watcher is re-read every
``poll_interval`` inside the wait."""


_Future = asyncio.Future  # a parked consumer's future, made directly (``loop.create_future`` adds a Python call)
_running_loop = asyncio.get_running_loop

FAN_SLICE = 256
"""How many subscriptions a tail hands a batch to before it yields to the event loop (see ``Tail._fan_out``)."""


class Subscription:
    """A live view of one thread's event log. Made by ``GraphRuntime.subscribe``.

    Iterate it (blocking) or call :meth:`get`; :meth:`cancel` ends it at once. Events are delivered in ``seq``
    order, each once; nothing is delivered after :meth:`cancel`. A subscription whose watch is disabled ends once
    its replay is delivered. A read the store refuses (the thread was deleted, or the events were compacted
    away) or that cannot succeed (``StoreCorrupt``; ``StoreClosed`` once the store was closed under it) ends the
    subscription with that error, raised by :meth:`get` and by iteration after the events before it. A read that
    fails for a reason that may pass (``StoreUnavailable``, a ``ProcessingError`` of unknown kind) is made again
    from the same place after a pause (50 ms doubling to 2 s; a ``subscription.retrying`` warning each time),
    for as long as it fails.

    Attributes:
        thread_id: the thread watched.
        after_seq: where it started (events with a greater ``seq`` are delivered).
    """

    def __init__(
        self,
        store: Checkpointer,
        scheduler: Scheduler,
        thread_id: str,
        after_seq: int,
        *,
        policy: WatchPolicy,
        tenant_check: Callable[[], bool],
        on_end: Callable[[Subscription], None] = lambda _sub: None,
        on_lag: Callable[[], None] | None = None,
        until_run_end: str | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.after_seq = after_seq
        self._store = store
        self._policy = policy
        self._tenant_check = tenant_check
        self._on_end = on_end
        self._on_lag = on_lag  # told (outside the lock) each time the events held undelivered changed
        self._cond = scheduler.condition()
        self._queue: collections.deque[EventRecord] = collections.deque()
        self._queued_seq = after_seq
        self._last_seq = after_seq
        self._cancel = threading.Event()
        self._cancelled = False
        self._ended = False
        self._error: ThreadloomError | None = None
        self._scheduler = scheduler
        self._task: Task | None = None
        self._until_run_end = until_run_end
        self._blocked = 0  # get() calls waiting on the condition: only then does a delivery notify it
        self._parked: list[asyncio.Future[EventRecord | None]] = []  # what parked __anext__ calls await
        self._atask: asyncio.Task[None] | None = None  # the async watch, on the loop that subscribed
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._adone = threading.Event()
        self._tail: Tail | None = None  # the shared watch this async subscription joined
        self._checked = False  # the tenant check passed (async subscriptions)
        self._held: list[EventRecord] = []  # events read before the tenant check could pass (see _screen)

    def start(self) -> Subscription:
        """Starts the watch's task (once); returns the subscription."""
        if self._task is None:
            self._task = self._scheduler.spawn(f"watch-{self.thread_id}", self._watch)
        return self

    def start_async(self, store: AsyncStore, tails: dict[tuple[int, str], Tail] | None = None) -> Subscription:
        """Starts the watch as a task on the running event loop (once), reading through ``store``; it holds no
        thread while it waits. Once its replay caught up, the subscription joins the loop's :class:`Tail` of the
        thread in ``tails`` (made if none): one watch per thread and loop, however many subscribe. Returns the
        subscription."""
        if self._task is None and self._atask is None:
            self._aloop = asyncio.get_running_loop()
            self._atask = self._aloop.create_task(self._awatch(store, {} if tails is None else tails))
        return self

    def __repr__(self) -> str:
        return f"Subscription(thread_id={self.thread_id!r}, last_seq={self.last_seq})"

    def _notify(self, here: asyncio.AbstractEventLoop | None = None) -> None:
        """Wakes every consumer (called under the condition): the blocked ``get`` calls, and each parked
        ``__anext__`` by resolving its future - directly when called on that future's loop (``here``, the
        running loop if not given; a tail delivering to a thousand consumers costs one ``set_result`` each), else
        through ``call_soon_threadsafe``.

        Each parked consumer of ``here``, in the order they parked, is handed the next queued event as its
        future's result while any remain (it returns it without taking the lock again); the others, and
        consumers on other loops, look at the queue when they wake."""
        if self._blocked:
            self._cond.notify_all()
        parked = self._parked
        if parked:
            _wake_parked(parked, self._queue, running_loop() if here is None else here)

    # -- the watch (its own task) -------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Runs on the subscription's task: replays, then watches, queueing events until cancelled or ended."""
        store, policy = self._store, self._policy
        after = self.after_seq
        checked = False
        replaying = True  # the replay reads whole pages at once; then the watch waits for commits
        failures = 0
        try:
            while not self._cancel.is_set():
                if not replaying and not policy.enabled:
                    break
                try:
                    if replaying:
                        batch = store.events_after(self.thread_id, after, PAGE)
                    else:
                        batch = store.await_events_after(
                            self.thread_id, after, PAGE, policy.poll_interval, cancel=self._cancel
                        )
                    if batch and not checked:
                        checked = self._tenant_check()
                except CancelledError:
                    raise
                except ThreadloomError as error:
                    if not is_transient(error, store):
                        raise
                    failures += 1
                    pause = retry_pause(failures)
                    _log.warning(
                        "subscription.retrying",
                        thread_id=self.thread_id,
                        after_seq=after,
                        attempt=failures + 1,
                        pause_ms=pause.total_seconds() * 1000,
                        error=f"{type(error).__name__}: {error}",
                        error_kind=error_kind(error),
                    )
                    self._scheduler.wait(self._cancel, self._scheduler.clock.now() + pause)
                    continue
                failures = 0
                if not self._deliver(self._screen(batch, checked)):
                    return
                if batch:
                    after = batch[-1].seq
                if replaying and len(batch) < PAGE:
                    replaying = False
        except CancelledError:
            pass
        except ThreadloomError as error:
            self._fail(error, store, after)
        except Exception as error:  # the store raised something it should not: end with it, never hang
            with self._cond:
                self._error = ThreadloomError(f"{type(error).__name__}: {error}")
        finally:
            self._end()

    def _fail(self, error: ThreadloomError, store: Checkpointer, after: int) -> None:
        error = closed_under(
            error, store, f"the subscription to thread {self.thread_id!r}", f"subscribe again after seq {after}"
        )
        with self._cond:
            self._error = error
        if is_fatal(error, store):
            _log.error(
                "subscription.ended",
                thread_id=self.thread_id,
                error=f"{type(error).__name__}: {error}",
                error_kind=error_kind(error),
            )
        else:
            _log.info("subscription.ended", thread_id=self.thread_id, error=f"{type(error).__name__}: {error}")

    def _end(self) -> None:
        with self._cond:
            if self._ended:
                return
            self._ended = True
            self._notify()
        self._adone.set()
        self._on_end(self)

    async def _awatch(self, astore: AsyncStore, tails: dict[tuple[int, str], Tail]) -> None:
        """The async watch's first part (a task on the subscriber's loop): replays with ``events_after`` pages,
        then joins the thread's :class:`Tail` on this loop, which delivers every later batch."""
        store, policy = astore.store, self._policy
        after = self.after_seq
        failures = 0
        joined = False
        try:
            while not self._cancel.is_set():
                try:
                    caught_up = False
                    batch = await astore.events_after(self.thread_id, after, PAGE)
                    if batch and not self._checked:
                        self._checked = await astore.call(self._tenant_check)
                    caught_up = len(batch) < PAGE
                except ThreadloomError as error:
                    if not is_transient(error, store):
                        raise
                    failures += 1
                    await asyncio.sleep(self._retry_note(failures, after, error))
                    continue
                failures = 0
                if not self._deliver(self._screen(batch, self._checked)):
                    return
                if batch:
                    after = batch[-1].seq
                if not caught_up:
                    continue
                if not policy.enabled:
                    return
                key = (id(self._aloop), self.thread_id)
                tail = tails.get(key)
                if tail is None or tail.ended:
                    tail = tails[key] = Tail(astore, self.thread_id, after, tails, key)
                if tail.position > after:
                    continue  # the tail is ahead: read the gap first (no await between this check and joining)
                tail.join(self)
                self._tail = tail
                joined = True
                return
        except (CancelledError, asyncio.CancelledError):
            pass
        except ThreadloomError as error:
            self._fail(error, store, after)
        except Exception as error:  # the store raised something it should not: end with it, never hang
            with self._cond:
                self._error = ThreadloomError(f"{type(error).__name__}: {error}")
        finally:
            if not joined:
                self._end()

    def _retry_note(self, failures: int, after: int, error: ThreadloomError) -> float:
        """Logs ``subscription.retrying`` and returns the pause before the next read, in seconds."""
        pause = retry_pause(failures)
        _log.warning(
            "subscription.retrying",
            thread_id=self.thread_id,
            after_seq=after,
            attempt=failures + 1,
            pause_ms=pause.total_seconds() * 1000,
            error=f"{type(error).__name__}: {error}",
            error_kind=error_kind(error),
        )
        return pause.total_seconds()

    async def _take(self, batch: list[EventRecord], astore: AsyncStore) -> bool:
        """A batch from the tail: checks the tenant once, queues it; False when the subscription ended."""
        try:
            if not self._checked:
                self._checked = await astore.call(self._tenant_check)
        except ThreadloomError as error:
            self._fail(error, astore.store, self._queued_seq)
            self._end()
            return False
        if self._deliver(self._screen(batch, self._checked)):
            return True
        self._end()
        return False

    def _screen(self, batch: list[EventRecord], checked: bool) -> list[EventRecord]:
        """Fails closed: while the tenant check has not passed (the thread has events but no checkpoint yet, so
        no tenant), its events wait here, undelivered; once it passes they are delivered first, in order (found by
        hostile testing: they were delivered to any tenant's subscription)."""
        if not checked:
            self._held.extend(batch)
            return []
        if self._held:
            batch, self._held = [*self._held, *batch], []
        return batch

    def _deliver(
        self, batch: list[EventRecord], *, report_lag: bool = True, loop: asyncio.AbstractEventLoop | None = None
    ) -> bool:
        """Queues ``batch``; False when the watch must stop (cancelled, or ``until_run_end``'s end delivered).

        ``loop``: the running loop, when the caller knows it (else :meth:`_notify` asks). A tail delivers with
        :meth:`_hand` instead."""
        reached = False
        cond = self._cond
        cond.acquire()
        try:
            if self._cancelled:
                return False
            for event in batch:
                if event.seq > self._queued_seq:  # never twice, whatever a store returns
                    self._queue.append(event)
                    self._queued_seq = event.seq
                    if event.type in END_EVENTS and event.run_id == self._until_run_end:
                        reached = True
                        break
            if batch:
                self._notify(loop)
        finally:
            cond.release()
        if batch and report_lag and self._on_lag is not None:
            self._on_lag()
        return not reached

    def _hand(self, batch: list[EventRecord], loop: asyncio.AbstractEventLoop) -> bool:
        """:meth:`_deliver` for a tail, from its ``loop``: queues what ``batch`` holds past the last queued event
        and wakes the consumers (no lag report: the tail tells the gauge once for all). A thousand subscriptions
        pass here for every batch, so it is :meth:`_deliver` and :meth:`_notify` in one call, and a batch with
        nothing new wakes nobody. False when the watch must stop (cancelled, or ``until_run_end``'s end queued)."""
        reached = False
        cond = self._cond
        cond.acquire()
        try:
            if self._cancelled:
                return False
            queue = self._queue
            queued = self._queued_seq
            until = self._until_run_end
            for event in batch:
                if event.seq > queued:  # never twice, whatever a store returns
                    queue.append(event)
                    queued = event.seq
                    if event.run_id == until and event.type in END_EVENTS:
                        reached = True
                        break
            if queued == self._queued_seq:
                return True
            self._queued_seq = queued
            if self._blocked:
                cond.notify_all()
            parked = self._parked
            if parked:  # usually one future, parked on ``loop``
                _wake_parked(parked, queue, loop)
        finally:
            cond.release()
        return not reached

    # -- the consumer -------------------------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the last event delivered (``after_seq`` before the first): subscribe again after it."""
        with self._cond:
            return self._last_seq

    @property
    def lag(self) -> int:
        """How many events the subscription has read from the store and not delivered yet (0 once cancelled).

        Events a replay has not read yet are not counted: the store is asked page by page.
        """
        with self._cond:
            return 0 if self._cancelled else self._queued_seq - self._last_seq

    @property
    def active(self) -> bool:
        """True until cancelled, or until the watch ended and every queued event was delivered."""
        with self._cond:
            # An event handed to a parked consumer that has not resumed yet is out of the queue, not delivered.
            delivered = not self._queue and self._queued_seq <= self._last_seq
            return not self._cancelled and not (self._ended and delivered)

    @property
    def error(self) -> ThreadloomError | None:
        """The error the watch ended with, if any."""
        with self._cond:
            return self._error

    def get(self, timeout: timedelta | None = None) -> EventRecord | None:
        """The next event, waiting up to ``timeout`` (None: until one comes or the subscription ends).

        Args:
            timeout: how long to wait, a ``timedelta`` of zero or more (``timedelta(0)``: only what is queued);
                None: no bound.

        Returns:
            The next event in ``seq`` order; None on timeout, after :meth:`cancel`, or once the subscription
            ended and every event was delivered.

        Raises:
            ValidationError: ``timeout`` is not a ``timedelta`` (a number of seconds included) nor None, or is
                negative; nothing was taken from the subscription.
            ThreadDeleted, ReplayUnavailable, TenantMismatch, StoreCorrupt, StoreClosed: the watch ended with it
                (raised once every event before it was delivered). ``StoreClosed`` names the subscription and the
                ``seq`` to subscribe again after.
        """
        seconds = v.wait_seconds("timeout", timeout)
        with self._cond:
            self._blocked += 1
            try:
                ready = self._cond.wait_for(lambda: self._cancelled or self._queue or self._ended, seconds)
            finally:
                self._blocked -= 1
            if not ready or self._cancelled:
                return None
            if self._queue:
                event = self._queue.popleft()
                self._last_seq = event.seq
            elif self._error is not None:
                raise self._error
            else:
                return None
        if self._on_lag is not None:
            self._on_lag()
        return event

    def __aiter__(self) -> Subscription:
        """``async for event in subscription``: :meth:`__iter__` without blocking the event loop."""
        return self

    async def __anext__(self) -> EventRecord:
        """The next event, awaiting it; ends (``StopAsyncIteration``) as :meth:`get` returns None, and raises
        the error the watch ended with once every event before it was delivered."""
        cond = self._cond
        while True:
            cond.acquire()  # not ``with``: a thousand consumers woken by one commit each pass here
            try:
                if self._cancelled:
                    raise StopAsyncIteration
                if self._queue:
                    event = self._queue.popleft()
                    self._last_seq = event.seq
                    return event
                if self._ended:
                    if self._error is not None:
                        raise self._error
                    raise StopAsyncIteration
                parked: asyncio.Future[EventRecord | None] = _Future(loop=_running_loop())
                self._parked.append(parked)
            finally:
                cond.release()
            try:
                handed = await parked
            except asyncio.CancelledError:  # the consumer's task was cancelled: forget its future
                self._unpark(parked)
                raise
            if handed is not None:  # the delivery handed this consumer the next event (see _notify)
                if self._cancelled:  # cancelled since: nothing is delivered after cancel
                    raise StopAsyncIteration
                if handed.seq > self._last_seq:
                    self._last_seq = handed.seq
                return handed

    def _unpark(self, parked: asyncio.Future[EventRecord | None]) -> None:
        """Forgets a cancelled consumer's future; an event already handed to it goes back to the queue's front
        (the task was cancelled after the delivery, before it resumed), so the next consumer gets it."""
        with self._cond:
            self._parked = [future for future in self._parked if future is not parked]
            if parked.done() and not parked.cancelled():
                handed = parked.result()
                if handed is not None and not self._cancelled:
                    self._queue.appendleft(handed)

    def __iter__(self) -> Iterator[EventRecord]:
        """Yields events until the subscription is cancelled or ends (then raises its error, if any)."""
        while True:
            event = self.get()
            if event is None:
                return
            yield event

    def cancel(self, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Ends the subscription at once: nothing is delivered after it returns, the watch stops promptly.

        Waits up to ``timeout`` for the watch's task to end (not when called from the watch itself).

        Raises:
            ValidationError: ``timeout`` is not a ``timedelta`` (a number of seconds included), or is negative;
                the subscription was not cancelled.
        """
        seconds = v.wait_seconds("timeout", timeout)
        with self._cond:
            self._cancelled = True
            self._queue.clear()
            self._notify()
        self._cancel.set()
        if self._task is not None:
            self._task.join(seconds)
        atask, aloop = self._atask, self._aloop
        if atask is not None and aloop is not None:
            if _on_loop(aloop):
                self._stop_async()  # the replay task ends at its next await; the caller's loop runs it
            else:
                try:
                    aloop.call_soon_threadsafe(self._stop_async)
                except RuntimeError:  # that loop closed: the tasks are gone with it
                    return
                self._adone.wait(seconds)

    def _stop_async(self) -> None:
        """On the subscriber's loop: stops the replay task, or leaves the tail and ends."""
        if self._atask is not None and not self._atask.done():
            self._atask.cancel()
        if self._tail is not None:
            self._tail.leave(self)
            self._end()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cancel()


class Tail:
    """One watch of a thread's log on one event loop, shared by every async subscription caught up with it.

    It waits with ``await_events_after`` from :attr:`position` and hands each batch to its subscriptions (each
    drops what it already has), so a commit watched by a thousand subscriptions costs one wake and one read.
    A read that may pass (``StoreUnavailable``…) is made again after a pause; any other error ends every
    subscription of the tail with it. The tail ends when its last subscription leaves.
    """

    def __init__(
        self,
        astore: AsyncStore,
        thread_id: str,
        position: int,
        tails: dict[tuple[int, str], Tail],
        key: tuple[int, str],
    ) -> None:
        self.astore = astore
        self.thread_id = thread_id
        self.position = position
        self.ended = False
        self._subscriptions: list[Subscription] = []
        self._tails = tails
        self._key = key
        self._task = asyncio.get_running_loop().create_task(self._run())

    def join(self, subscription: Subscription) -> None:
        self._subscriptions.append(subscription)

    def leave(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
        if not self._subscriptions:
            self._stop()

    def _stop(self) -> None:
        self.ended = True
        if self._tails.get(self._key) is self:
            del self._tails[self._key]
        if self._task is not asyncio.current_task():
            self._task.cancel()

    async def _run(self) -> None:
        astore, store = self.astore, self.astore.store
        failures = 0
        await asyncio.sleep(0)  # the first subscription joins before the first read
        try:
            while self._subscriptions:
                try:
                    batch = await astore.await_events_after(self.thread_id, self.position, PAGE, ASYNC_WAIT)
                except ThreadloomError as error:
                    if not is_transient(error, store):
                        raise
                    failures += 1
                    await asyncio.sleep(self._subscriptions[0]._retry_note(failures, self.position, error))
                    continue
                failures = 0
                if not batch:
                    continue
                self.position = batch[-1].seq
                await self._fan_out(batch)
        except asyncio.CancelledError:
            # With subscriptions left, the loop is shutting down (``leave`` cancels only an empty tail): end them
            # with an error, or a consumer on another loop would wait forever (found by hostile testing).
            stopped = ProcessingError(
                "subscribe",
                f"the event loop that delivered thread {self.thread_id!r}'s events stopped; subscribe again after "
                "the last event you got",
            )
            for subscription in list(self._subscriptions):
                subscription._fail(stopped, store, self.position)
                subscription._end()
        except Exception as caught:
            failure = (
                caught if isinstance(caught, ThreadloomError) else ThreadloomError(f"{type(caught).__name__}: {caught}")
            )
            for subscription in list(self._subscriptions):
                subscription._fail(failure, store, self.position)
                subscription._end()
        finally:
            self._subscriptions.clear()
            self.ended = True
            if self._tails.get(self._key) is self:
                del self._tails[self._key]

    async def _fan_out(self, batch: list[EventRecord]) -> None:
        """Hands ``batch`` to every subscription of the tail, from this one task.

        Each subscription queues it and resolves the future its parked consumer awaits: one ``set_result`` per
        consumer, no task or coroutine of its own. After every :data:`FAN_SLICE` subscriptions it yields to the
        loop, so the consumers woken so far run (and drop what their last wait held) before it wakes more: a
        commit to a thousand subscriptions neither delays the first consumers behind the last nor piles up a
        thousand pending wake-ups for the garbage collector to walk. It yields after the last slice too, so the
        tail's next read (a pool thread, contending for the GIL) and the lag gauge (told once, at the end, when
        the consumers took their events) come after every consumer woken ran."""
        lag_reports: set[Callable[[], None]] = set()
        loop = asyncio.get_running_loop()
        subscriptions = list(self._subscriptions)
        for start in range(0, len(subscriptions), FAN_SLICE):
            if start:
                await asyncio.sleep(0)
            for subscription in subscriptions[start : start + FAN_SLICE]:
                if subscription._checked:  # the usual case: no coroutine per subscription
                    on_lag = subscription._on_lag
                    if on_lag is not None:
                        lag_reports.add(on_lag)
                    if subscription._hand(batch, loop):
                        continue
                    subscription._end()
                elif await subscription._take(batch, self.astore):
                    continue
                self.leave(subscription)
        await asyncio.sleep(0)
        for report in lag_reports:
            report()


def _wake_parked(
    parked: list[asyncio.Future[EventRecord | None]],
    queue: collections.deque[EventRecord],
    here: asyncio.AbstractEventLoop | None,
) -> None:
    """Wakes and forgets every parked consumer (under the subscription's condition): one of ``here``, in the order
    they parked, gets the next queued event as its future's result while any remain; one of another loop is
    resolved there through ``call_soon_threadsafe`` and looks at the queue when it wakes."""
    for future in parked:
        if future.get_loop() is here:
            if not future.done():
                future.set_result(queue.popleft() if queue else None)
        else:
            try:
                future.get_loop().call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop closed: nobody waits on it any more
                pass
    parked.clear()


def _resolve(future: asyncio.Future[EventRecord | None]) -> None:
    """Resolves a parked consumer's future on its own loop (unless it was cancelled meanwhile)."""
    if not future.done():
        future.set_result(None)


def _on_loop(loop: Any) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def check_tenant(store: Checkpointer, thread_id: str, tenant_id: str | None) -> Callable[[], bool]:
    """A check that the thread's latest checkpoint is ``tenant_id``'s (True once it has one; raises
    ``TenantMismatch`` when it is another tenant's; False while the thread has no checkpoint)."""

    def check() -> bool:
        latest = store.latest(thread_id)
        if latest is None:
            return False
        if latest.checkpoint.tenant_id != tenant_id:
            raise TenantMismatch(thread_id, tenant_id)
        return True

    return check

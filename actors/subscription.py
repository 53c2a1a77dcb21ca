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

import collections
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

from threadloom.actors._failures import closed_under, error_kind, is_fatal, is_transient, retry_pause
from threadloom.actors.logs import log as _log
from threadloom.actors.policies import WatchPolicy
from threadloom.actors.scheduler import Scheduler, Task
from threadloom.domain.errors import CancelledError, TenantMismatch, ThreadloomError
from threadloom.domain.values import EventRecord
from threadloom.persistence.base import Checkpointer

PAGE = 500
"""Events read per store call."""


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

    def start(self) -> Subscription:
        """Starts the watch's task (once); returns the subscription."""
        if self._task is None:
            self._task = self._scheduler.spawn(f"watch-{self.thread_id}", self._watch)
        return self

    def __repr__(self) -> str:
        return f"Subscription(thread_id={self.thread_id!r}, last_seq={self.last_seq})"

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
                if not self._deliver(batch):
                    return
                if batch:
                    after = batch[-1].seq
                if replaying and len(batch) < PAGE:
                    replaying = False
        except CancelledError:
            pass
        except ThreadloomError as error:
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
        except Exception as error:  # the store raised something it should not: end with it, never hang
            with self._cond:
                self._error = ThreadloomError(f"{type(error).__name__}: {error}")
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()
            self._on_end(self)

    def _deliver(self, batch: list[EventRecord]) -> bool:
        with self._cond:
            if self._cancelled:
                return False
            for event in batch:
                if event.seq > self._queued_seq:  # never twice, whatever a store returns
                    self._queue.append(event)
                    self._queued_seq = event.seq
            if batch:
                self._cond.notify_all()
        if batch and self._on_lag is not None:
            self._on_lag()
        return True

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
            return not self._cancelled and not (self._ended and not self._queue)

    @property
    def error(self) -> ThreadloomError | None:
        """The error the watch ended with, if any."""
        with self._cond:
            return self._error

    def get(self, timeout: timedelta | None = None) -> EventRecord | None:
        """The next event, waiting up to ``timeout`` (None: until one comes or the subscription ends).

        Returns:
            The next event in ``seq`` order; None on timeout, after :meth:`cancel`, or once the subscription
            ended and every event was delivered.

        Raises:
            ThreadDeleted, ReplayUnavailable, TenantMismatch, StoreCorrupt, StoreClosed: the watch ended with it
                (raised once every event before it was delivered). ``StoreClosed`` names the subscription and the
                ``seq`` to subscribe again after.
        """
        seconds = None if timeout is None else max(0.0, timeout.total_seconds())
        with self._cond:
            ready = self._cond.wait_for(lambda: self._cancelled or self._queue or self._ended, seconds)
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
        """
        with self._cond:
            self._cancelled = True
            self._queue.clear()
            self._cond.notify_all()
        self._cancel.set()
        if self._task is not None:
            self._task.join(timeout.total_seconds())

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cancel()


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

"""Time, ids and the runtime's own threads, behind small interfaces a simulation can replace.

The actors never read the wall clock, sleep, start threads or make random ids themselves: a
:class:`Scheduler` runs their timers, background tasks (node executions, subscription watches, queue workers)
and waits, by the runtime's ``Clock``; an :class:`IdFactory` makes their RunIds and checkpoint ids. The defaults,
:class:`ThreadScheduler` and :class:`RandomIds`, use real threads and random ids; a deterministic simulation gives
a virtual-clock scheduler and :class:`SequentialIds`.
"""

from __future__ import annotations

import abc
import concurrent.futures
import heapq
import itertools
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from threadloom.actors.logs import log as _log
from threadloom.domain.clock import Clock
from threadloom.persistence.clock import SystemClock

_A = TypeVar("_A")

THREAD_PREFIX = "threadloom-"
"""Every thread a :class:`ThreadScheduler` starts is named with this prefix."""


class Cancellable(Protocol):
    """A scheduled timer: ``cancel()`` keeps it from firing (it may already have fired)."""

    def cancel(self) -> None: ...


class Task(Protocol):
    """A background task: ``join(timeout_s)`` waits for it, ``alive`` says whether it still runs."""

    def join(self, timeout: float | None = None) -> None: ...

    @property
    def alive(self) -> bool: ...


class Scheduler(abc.ABC):
    """Runs the runtime's timers and background tasks, and its waits, by one ``Clock``.

    Timers must be quick (they only ``tell`` an actor); tasks may block (a node, a store wait).
    """

    clock: Clock

    @abc.abstractmethod
    def call_at(self, when: datetime, fn: Callable[[], None]) -> Cancellable:
        """Calls ``fn`` once the clock reads ``when`` or later, on the scheduler's timer thread."""

    @abc.abstractmethod
    def spawn(self, name: str, fn: Callable[[], None]) -> Task:
        """Runs ``fn`` in the background (a thread of its own by default); ``name`` says what it is."""

    @abc.abstractmethod
    def wait(self, event: threading.Event, until: datetime) -> bool:
        """Waits until ``event`` is set (True) or the clock reads ``until`` (False, unless set by then)."""

    def wait_future(self, future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
        """Waits until ``future`` is done (True) or ``timeout`` seconds passed by the clock (False; None: no limit).

        The default blocks the calling thread; a simulation's scheduler yields to its other tasks instead.
        """
        done, _pending = concurrent.futures.wait([future], timeout)
        return bool(done)

    def condition(self) -> threading.Condition:
        """A new condition variable for state its tasks share (a subscription's queue); default ``threading``'s."""
        return threading.Condition()

    def lock(self) -> AbstractContextManager[Any]:
        """A new lock (``with lock:``) for state an actor shares with its tasks (a run's, with its node's thread):
        ``threading.Lock`` by default; a simulation's scheduler yields to its other tasks while it waits."""
        return threading.Lock()

    def actor_class(self, cls: type[_A]) -> type[_A]:
        """The class to start for pykka actor class ``cls``: ``cls`` itself (a thread per actor) by default.

        A simulation's scheduler returns a subclass that runs the same actor on its own single-threaded loop.
        """
        return cls

    @abc.abstractmethod
    def close(self, timeout: timedelta) -> list[str]:
        """Cancels every timer, stops the timer thread and joins every task, each within ``timeout``.

        Returns:
            The names of tasks still running after ``timeout`` (empty after a clean shutdown).
        """


class _Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


IDLE_WORKERS = 64
"""Most idle task threads a :class:`ThreadScheduler` keeps for the next tasks (node executions reuse them)."""

IDLE_SECONDS = 30.0
"""How long an idle task thread waits for a task before it ends (real seconds)."""


class _PoolTask:
    """A task run on one of the scheduler's task threads; joined by waiting for its end, not its thread's."""

    __slots__ = ("done", "fn", "name", "thread")

    def __init__(self, name: str, fn: Callable[[], None]) -> None:
        self.name = name
        self.fn = fn
        self.done = threading.Event()
        self.thread: threading.Thread | None = None  # the thread running it, once it started

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not threading.current_thread():
            self.done.wait(timeout)

    @property
    def alive(self) -> bool:
        return not self.done.is_set()


class ThreadScheduler(Scheduler):
    """The default scheduler: one timer thread (started on first use) and a pool of task threads.

    A task runs on an idle task thread when there is one, else on a new one: no task ever waits for another to end
    (a node may block on a child run whose node needs a thread), and a busy runtime starts no thread per node
    execution. At most :data:`IDLE_WORKERS` idle threads are kept, each for at most :data:`IDLE_SECONDS`.

    With a :class:`SystemClock` the timer thread sleeps until the next timer is due; with any other clock (a
    ``ManualClock`` in tests) it re-reads the clock every ``tick``, so moving the clock fires what became due.

    Args:
        clock: the runtime's clock.
        tick: how often a non-system clock is re-read (default 20 ms).
    """

    def __init__(self, clock: Clock | None = None, *, tick: timedelta = timedelta(milliseconds=20)) -> None:
        self.clock = clock if clock is not None else SystemClock()
        self._tick = tick.total_seconds()
        self._exact = isinstance(self.clock, SystemClock)
        self._cond = threading.Condition()
        self._heap: list[tuple[datetime, int, _Timer, Callable[[], None]]] = []
        self._order = itertools.count()
        self._timer_thread: threading.Thread | None = None
        self._pool = threading.Condition()
        self._queued: list[_PoolTask] = []  # handed to idle task threads, not yet taken
        self._idle = 0  # idle task threads not yet handed a task
        self._running: set[_PoolTask] = set()
        self._workers: set[threading.Thread] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"ThreadScheduler(clock={self.clock!r})"

    def _interval(self, remaining: float) -> float:
        return remaining if self._exact else min(remaining, self._tick)

    def call_at(self, when: datetime, fn: Callable[[], None]) -> Cancellable:
        """Schedules ``fn`` on the timer thread once ``clock.now() >= when``. Runs on the caller's thread."""
        timer = _Timer()
        with self._cond:
            if self._closed:
                timer.cancel()
                return timer
            heapq.heappush(self._heap, (when, next(self._order), timer, fn))
            if self._timer_thread is None:
                self._timer_thread = threading.Thread(
                    target=self._run_timers, name=f"{THREAD_PREFIX}timer", daemon=True
                )
                self._timer_thread.start()
            self._cond.notify_all()
        return timer

    def _run_timers(self) -> None:
        """The timer thread's loop: fires due timers in time order until :meth:`close`."""
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if self._heap:
                        remaining = (self._heap[0][0] - self.clock.now()).total_seconds()
                        if remaining <= 0:
                            _when, _n, timer, fn = heapq.heappop(self._heap)
                            break
                        self._cond.wait(self._interval(remaining))
                    else:
                        self._cond.wait()
            if not timer.cancelled:
                try:
                    fn()
                except Exception as error:  # a timer only tells an actor; a failure must not stop the others
                    _log.error("scheduler.timer_failed", error=f"{type(error).__name__}: {error}")

    def spawn(self, name: str, fn: Callable[[], None]) -> Task:
        """Runs ``fn`` on an idle task thread, or on a new daemon thread if none is idle; the thread is named
        ``threadloom-<name>`` while it runs ``fn``. Runs on the caller's thread."""
        task = _PoolTask(f"{THREAD_PREFIX}{name}", fn)
        with self._pool:
            self._running.add(task)
            if self._idle > 0:
                self._idle -= 1
                self._queued.append(task)
                self._pool.notify()
                return task
            thread = threading.Thread(target=self._work, args=(task,), name=task.name, daemon=True)
            self._workers.add(thread)
        thread.start()
        return task

    def _work(self, task: _PoolTask | None) -> None:
        """A task thread's loop: runs its task, then the tasks handed to it while idle, until none comes."""
        me = threading.current_thread()
        try:
            while task is not None:
                task.thread = me
                me.name = task.name
                try:
                    task.fn()
                finally:
                    with self._pool:
                        self._running.discard(task)
                    task.done.set()
                task = self._next_task()
        finally:
            with self._pool:
                self._workers.discard(me)

    def _next_task(self) -> _PoolTask | None:
        """The next task handed to this idle thread, or None once it should end (closed, enough idle threads, or
        none came within :data:`IDLE_SECONDS`)."""
        with self._pool:
            if self._closed or self._idle >= IDLE_WORKERS:
                return None
            self._idle += 1
            threading.current_thread().name = f"{THREAD_PREFIX}idle"
            while not self._queued:
                if self._closed or not self._pool.wait(IDLE_SECONDS):
                    if self._queued:  # handed one as the wait ended
                        break
                    self._idle -= 1
                    return None
            return self._queued.pop(0)

    def wait(self, event: threading.Event, until: datetime) -> bool:
        """Waits on the caller's thread until ``event`` is set or the clock reads ``until``."""
        while True:
            remaining = (until - self.clock.now()).total_seconds()
            if remaining <= 0:
                return event.is_set()
            if event.wait(self._interval(remaining)):
                return True

    def close(self, timeout: timedelta) -> list[str]:
        """Stops the timer thread and joins every task (each within ``timeout``). Runs on the caller's thread."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
            timer_thread = self._timer_thread
        with self._pool:
            self._closed = True
            self._pool.notify_all()  # idle task threads end
            tasks, workers = list(self._running), list(self._workers)
        seconds = timeout.total_seconds()
        if timer_thread is not None and timer_thread is not threading.current_thread():
            timer_thread.join(seconds)
        me = threading.current_thread()
        left = []
        for task in tasks:
            if task.thread is not me:
                task.join(seconds)
                if task.alive:
                    left.append(task.name)
        for thread in workers:  # idle ones end at once; one whose task is still running is reported above
            if thread is not me and thread.name not in left:
                thread.join(seconds)
        return left


class IdFactory(Protocol):
    """Makes the runtime's ids: injectable so a simulation's ids are deterministic."""

    def run_id(self, node_id: str) -> str:
        """A new RunId for a run (or a delete) started by runtime ``node_id``; never repeated."""
        ...

    def checkpoint_id(self, run_id: str, step: int) -> str:
        """The id of the checkpoint run ``run_id`` commits at ``step`` (0 for the admission)."""
        ...


class RandomIds:
    """The default ids: ``<node_id>:run-<16 hex digits>`` and ``<run_id>:<step>``."""

    def run_id(self, node_id: str) -> str:
        """A random RunId naming the runtime that made it."""
        return f"{node_id}:run-{uuid.uuid4().hex[:16]}"

    def checkpoint_id(self, run_id: str, step: int) -> str:
        """``<run_id>:<step>``: unique because every run (every recovery included) has its own RunId."""
        return f"{run_id}:{step}"


class SequentialIds(RandomIds):
    """Deterministic ids ``<node_id>:run-<n>`` from a counter, for simulations and tests.

    RunIds must never repeat over a storage: give each runtime over it its own ``node_id`` (and a restarted
    runtime a fresh one, or a ``start`` past the numbers it used).
    """

    def __init__(self, start: int = 1) -> None:
        self._counter = itertools.count(start)
        self._lock = threading.Lock()

    def run_id(self, node_id: str) -> str:
        """The next RunId of the counter."""
        with self._lock:
            return f"{node_id}:run-{next(self._counter)}"

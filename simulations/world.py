"""The simulated world: one OS thread, a virtual clock and a seeded choice of what runs next.

Every task of every simulated node — actor loops, node executions, subscription watches, queue workers, the
workload's clients — is a greenlet. A task runs until it *blocks* (waits for a message, a future, an event, a
condition or the clock; or makes a store call, which is a yield point like a network round trip) and then hands
control back to the hub, :meth:`World.run`, which picks the next step among the runnable tasks and due timers
with the seed's own ``random.Random``. Nothing else decides an order, so a seed always gives the same run:
no OS threads, no wall clock, no hash-ordered iteration.

A node is one simulated process: its tasks and timers, its clock (the world's time plus the node's offset,
which a clock-jump fault moves), and its life. A crashed node's tasks are never resumed again (they vanish
without releasing anything); a paused node's tasks and timers wait until it resumes.

:class:`SimScheduler` is the :class:`~threadloom.actors.scheduler.Scheduler` a runtime on a node uses;
:class:`SimActor` is the pykka actor implementation whose inbox, futures and loop live in the world.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import queue
import random
import sys
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import greenlet
import pykka
from pykka import messages as pykka_messages

from threadloom.actors.scheduler import Scheduler

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
"""Where every simulation's virtual clock starts."""

_A = TypeVar("_A")


class SimCrash(BaseException):
    """Thrown into a crashed node's tasks when the world is torn down: they unwind without touching anything.

    A ``BaseException`` so that no ``except Exception`` of the code under test swallows it.
    """


class SimStuck(Exception):
    """The world ran more steps than its limit allows (a livelock)."""


class SimTaskError(Exception):
    """A task ended with an exception no code of the runtime handles (``SystemExit``, ``KeyboardInterrupt`` aside
    from Ctrl-C, a custom ``BaseException``, or an error of the workload itself): the seed fails with it."""


class SimForeignThread(RuntimeError):
    """Simulated code ran on an OS thread other than the world's (a node started a thread): the seed fails."""


class SimNode:
    """One simulated process: its name, clock offset, and whether it is alive, paused or crashed."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.offset = timedelta(0)
        self.dead = False
        self.paused_until: datetime | None = None

    def __repr__(self) -> str:
        return f"SimNode({self.name!r})"

    @property
    def runnable(self) -> bool:
        """True when the node's tasks and timers may run now."""
        return not self.dead and (self.paused_until is None or self.paused_until <= self.world.now)

    def now(self) -> datetime:
        """The node's clock: the world's time plus the node's offset."""
        return self.world.now + self.offset


class NodeClock:
    """The :class:`~threadloom.domain.clock.Clock` of a simulated node (offset by clock-jump faults)."""

    def __init__(self, node: SimNode) -> None:
        self._node = node

    def __repr__(self) -> str:
        return f"NodeClock({self._node.name!r})"

    def now(self) -> datetime:
        """The node's current time (aware UTC)."""
        return self._node.now()


class Task:
    """A greenlet of one node, and what it waits for."""

    __slots__ = ("glet", "name", "node", "number", "predicate", "until")

    def __init__(self, number: int, node: SimNode, name: str, glet: greenlet.greenlet) -> None:
        self.number = number
        self.node = node
        self.name = name
        self.glet = glet
        self.predicate: Callable[[], bool] | None = None
        self.until: datetime | None = None

    @property
    def done(self) -> bool:
        """True once the task's function returned or raised."""
        return self.glet.dead

    def ready(self, now: datetime) -> bool:
        """True when the task can run now: what it waits for came, or its deadline passed."""
        if self.until is not None and self.until <= now:
            return True
        return self.predicate is None or self.predicate()

    def join(self, timeout: float | None = None) -> None:
        """Waits (as the calling task) until this task ended, for at most ``timeout`` seconds of virtual time."""
        world = self.node.world
        if world.current is self:
            return
        until = None if timeout is None else world.now + timedelta(seconds=timeout)
        world.block(lambda: self.glet.dead, until)

    @property
    def alive(self) -> bool:
        """True while the task has not ended."""
        return not self.glet.dead


class _Timer:
    __slots__ = ("cancelled", "fn", "node", "number", "when")

    def __init__(self, number: int, when: datetime, node: SimNode | None, fn: Callable[[], None]) -> None:
        self.number = number
        self.when = when
        self.node = node
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _Timer) -> bool:
        return (self.when, self.number) < (other.when, other.number)


_current_world: World | None = None


def current_world() -> World:
    """The world running on this OS thread (pykka's futures and inboxes find it here)."""
    if _current_world is None:
        raise RuntimeError("no simulation is running: simulated actors exist only inside World.run")
    return _current_world


class World:
    """The hub: virtual time, the seeded scheduler of steps, nodes, tasks and timers.

    Args:
        seed: the seed of every choice the world makes.
        max_steps: a run that takes more steps than this raises :class:`SimStuck`.
    """

    def __init__(self, seed: int, *, max_steps: int = 200_000) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = EPOCH
        self.max_steps = max_steps
        self.steps = 0
        self.nodes: dict[str, SimNode] = {}
        self.tasks: list[Task] = []
        self._timers: list[_Timer] = []
        self._numbers = itertools.count(1)
        self.current: Task | None = None
        self._hub: greenlet.greenlet | None = None
        self.after_step: Callable[[], None] = lambda: None
        self.stopped = False
        self._thread = threading.get_ident()
        self.foreign_thread: str | None = None  # set when simulated code ran on another OS thread

    # -- nodes, tasks, timers -------------------------------------------------------------------------------------

    def node(self, name: str) -> SimNode:
        """A new node named ``name``."""
        node = SimNode(self, name)
        self.nodes[name] = node
        return node

    def spawn(self, node: SimNode, name: str, fn: Callable[[], None]) -> Task:
        """A new task of ``node`` running ``fn``; it first runs when the hub picks it."""
        hub = self._hub
        if hub is None:
            raise RuntimeError("spawn a task from inside World.run (or from a task)")
        task = Task(next(self._numbers), node, name, greenlet.greenlet(fn, parent=hub))
        self.tasks.append(task)
        return task

    def call_at(self, when: datetime, fn: Callable[[], None], node: SimNode | None = None) -> _Timer:
        """Runs ``fn`` on the hub once the world's time reaches ``when`` (while ``node`` is runnable)."""
        timer = _Timer(next(self._numbers), when, node, fn)
        heapq.heappush(self._timers, timer)
        return timer

    def stop(self) -> None:
        """Ends :meth:`run` after the current step."""
        self.stopped = True

    # -- blocking (called from a task) ----------------------------------------------------------------------------

    def block(self, predicate: Callable[[], bool] | None, until: datetime | None = None) -> bool:
        """Hands control back to the hub until ``predicate()`` holds or the world's time reaches ``until``.

        Returns:
            ``predicate()`` when resumed (True if there is none).
        """
        task = self.current
        if threading.get_ident() != self._thread:
            self.foreign_thread = self.foreign_thread or (
                f"simulated code ran on another OS thread ({threading.current_thread().name!r}): a node under "
                "simulation must not start threads"
            )
            raise SimForeignThread(self.foreign_thread)
        if task is None or self._hub is None or greenlet.getcurrent() is self._hub:
            raise RuntimeError("only a task can block: the hub and its timers must not wait")
        if task.node.dead:
            raise SimCrash()
        task.predicate, task.until = predicate, until
        self._hub.switch()
        if task.node.dead:
            raise SimCrash()
        task.predicate, task.until = None, None
        return predicate is None or predicate()

    def sleep(self, duration: timedelta) -> None:
        """Blocks the calling task for ``duration`` of virtual time (zero: lets the other tasks run first)."""
        self.block(lambda: False, self.now + duration) if duration > timedelta(0) else self.block(None)

    # -- the hub --------------------------------------------------------------------------------------------------

    def run(self, main: Callable[[], None], *, until: datetime) -> None:
        """Runs ``main`` as the first task of a node named ``world`` and every step after it, until nothing
        can ever run again or the world's time passes ``until``; calls :attr:`after_step` after each step."""
        global _current_world
        if _current_world is not None:
            raise RuntimeError("a simulation is already running on this thread")
        _current_world = self
        self._hub = greenlet.getcurrent()
        self._thread = threading.get_ident()
        try:
            self.spawn(self.nodes.get("world") or self.node("world"), "main", main)
            self._loop(until)
        finally:
            _current_world = None

    def _loop(self, until: datetime) -> None:
        rng = self.rng
        while True:
            self.steps += 1
            if self.steps > self.max_steps:
                raise SimStuck(f"more than {self.max_steps} steps")
            self.tasks = [task for task in self.tasks if not task.glet.dead]
            now = self.now
            ready: list[Task | _Timer] = [task for task in self.tasks if task.node.runnable and task.ready(now)]
            while self._timers and self._timers[0].cancelled:
                heapq.heappop(self._timers)
            due = [
                timer
                for timer in self._timers
                if timer.when <= now and not timer.cancelled and (timer.node is None or timer.node.runnable)
            ]
            if ready or due:
                choice = rng.choice([*ready, *due]) if len(ready) + len(due) > 1 else (ready or due)[0]
                if isinstance(choice, _Timer):
                    choice.cancelled = True
                    self._timers.remove(choice)
                    heapq.heapify(self._timers)
                    choice.fn()
                else:
                    self.current = choice
                    try:
                        choice.glet.switch()
                    except SimCrash:
                        pass
                    except KeyboardInterrupt:
                        raise
                    except BaseException as error:  # noqa: BLE001 - a node's sys.exit() must not end the process
                        raise SimTaskError(
                            f"task {choice.name!r} of node {choice.node.name} raised {type(error).__name__}: {error}"
                        ) from error
                    finally:
                        self.current = None
                if self.foreign_thread is not None:
                    raise SimTaskError(self.foreign_thread)
                self.after_step()
                if self.stopped:
                    return
                continue
            if self.stopped:
                return
            wake = self._next_wake()
            if wake is None or wake > until:
                return
            self.now = wake

    def _next_wake(self) -> datetime | None:
        times = [
            timer.when for timer in self._timers if not timer.cancelled and (timer.node is None or not timer.node.dead)
        ]
        for task in self.tasks:
            if task.node.dead:
                continue
            if task.until is not None:
                times.append(task.until)
            if task.node.paused_until is not None and task.node.paused_until > self.now:
                times.append(task.node.paused_until)
        future = [when for when in times if when > self.now]
        return min(future) if future else None

    def teardown(self) -> None:
        """Unwinds every task still alive by throwing :class:`SimCrash` into it (their nodes are dead by now)."""
        global _current_world
        _current_world = self
        self._hub = greenlet.getcurrent()
        self._thread = threading.get_ident()
        try:
            for node in self.nodes.values():
                node.dead = True
            for task in list(self.tasks):
                if task.glet and not task.glet.dead:
                    self.current = task
                    try:
                        task.glet.throw(SimCrash())
                    except SimCrash:
                        pass
                    except Exception:  # noqa: BLE001 - unwinding code of a dead node may fail any way
                        pass
                    finally:
                        self.current = None
            self.tasks.clear()
            self._timers.clear()
        finally:
            _current_world = None
            self._hub = None


# -- the Scheduler of a node ------------------------------------------------------------------------------------


class _SimCondition:
    """A condition variable whose waits yield to the world (its tasks never run at the same time)."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._notified = 0  # bumped by every notify: a wait returns on the next one (or its timeout)

    def __enter__(self) -> bool:
        return True

    def __exit__(self, *_exc: object) -> None:
        return None

    def acquire(self, *_args: Any) -> bool:
        return True

    def release(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> bool:
        until = None if timeout is None else self._world.now + timedelta(seconds=timeout)
        seen = self._notified
        return self._world.block(lambda: self._notified != seen, until)

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        until = None if timeout is None else self._world.now + timedelta(seconds=timeout)
        if predicate():
            return predicate()
        self._world.block(lambda: bool(predicate()), until)
        return predicate()

    def notify(self, n: int = 1) -> None:
        self._notified += 1

    def notify_all(self) -> None:
        self._notified += 1


class _SimLock:
    """A lock whose wait yields to the world (its tasks never run at the same time; one may hold it across a yield)."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._held = False

    def __enter__(self) -> bool:
        if self._held:
            self._world.block(lambda: not self._held)
        self._held = True
        return True

    def __exit__(self, *_exc: object) -> None:
        self._held = False


class SimScheduler(Scheduler):
    """The :class:`~threadloom.actors.scheduler.Scheduler` of one simulated node.

    Timers run on the world's hub; tasks are greenlets of the node; every wait yields to the world. Times are
    the node's clock, converted to the world's by the node's offset at the time of the call.
    """

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.world = node.world
        self.clock = NodeClock(node)
        self._tasks: list[Task] = []
        self._timers: list[_Timer] = []
        self._closed = False
        self._actor_classes: dict[type, type] = {}

    def __repr__(self) -> str:
        return f"SimScheduler({self.node.name!r})"

    def _world_time(self, when: datetime) -> datetime:
        return when - self.node.offset

    def call_at(self, when: datetime, fn: Callable[[], None]) -> _Timer:
        """Runs ``fn`` on the hub once the node's clock reads ``when`` (while the node is runnable)."""
        timer = self.world.call_at(self._world_time(when), fn, self.node)
        if self._closed:
            timer.cancel()
        self._timers = [known for known in self._timers if not known.cancelled]
        self._timers.append(timer)
        return timer

    def spawn(self, name: str, fn: Callable[[], None]) -> Task:
        """Starts ``fn`` as a task of the node."""
        task = self.world.spawn(self.node, name, fn)
        self._tasks = [known for known in self._tasks if not known.done]
        self._tasks.append(task)
        return task

    def wait(self, event: threading.Event, until: datetime) -> bool:
        """Yields until ``event`` is set or the node's clock reads ``until``."""
        if event.is_set():
            return True
        return self.world.block(event.is_set, self._world_time(until))

    def wait_future(self, future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
        """Yields until ``future`` is done, or ``timeout`` seconds of virtual time passed."""
        if future.done():
            return True
        until = None if timeout is None else self.world.now + timedelta(seconds=timeout)
        return self.world.block(future.done, until)

    def condition(self) -> Any:
        """A condition whose waits yield to the world."""
        return _SimCondition(self.world)

    def lock(self) -> Any:
        """A lock whose wait yields to the world."""
        return _SimLock(self.world)

    def actor_class(self, cls: type[_A]) -> type[_A]:
        """``cls`` run as a :class:`SimActor` of this node."""
        found = self._actor_classes.get(cls)
        if found is None:
            found = type(f"Sim{cls.__name__}", (SimActor, cls), {"_sim_node": self.node})
            self._actor_classes[cls] = found
        return found

    def close(self, timeout: timedelta) -> list[str]:
        """Cancels the node's timers and waits for its tasks (each within ``timeout`` of virtual time)."""
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        left = []
        for task in list(self._tasks):
            if task is self.world.current or task.done:
                continue
            task.join(timeout.total_seconds())
            if not task.done:
                left.append(task.name)
        return left


# -- pykka on the world -------------------------------------------------------------------------------------------


class SimFuture(pykka.Future[Any]):
    """A pykka future whose ``get`` yields to the world until it is set."""

    def __init__(self) -> None:
        super().__init__()
        self._value: Any = None
        self._exc_info: Any = None
        self._set = False

    def get(self, *, timeout: float | None = None) -> Any:
        try:
            return super().get(timeout=timeout)
        except NotImplementedError:
            pass
        if not self._set:
            world = current_world()
            until = None if timeout is None else world.now + timedelta(seconds=timeout)
            if not world.block(lambda: self._set, until):
                raise pykka.Timeout(f"{timeout} seconds")
        if self._exc_info is not None:
            _type, value, traceback = self._exc_info
            raise value.with_traceback(traceback)
        return self._value

    def set(self, value: Any | None = None) -> None:
        if self._set:
            raise queue.Full
        self._value, self._set = value, True

    def set_exception(self, exc_info: Any = None) -> None:
        if self._set:
            raise queue.Full
        if exc_info is None:
            exc_info = sys.exc_info()
        if exc_info[1] is None:
            exc_info = (exc_info[0], exc_info[0](), exc_info[2])
        self._exc_info, self._set = exc_info, True


class _SimInbox:
    """An actor's inbox: a deque whose ``get`` yields to the world until a message is there."""

    def __init__(self) -> None:
        self._messages: deque[Any] = deque()

    def put(self, envelope: Any, /) -> None:
        self._messages.append(envelope)

    def get(self) -> Any:
        if not self._messages:
            current_world().block(lambda: bool(self._messages))
        return self._messages.popleft()

    def empty(self) -> bool:
        return not self._messages


class SimActor(pykka.Actor):
    """The pykka actor implementation of the simulation: the inbox, the futures and the loop live in the world.

    Mixed in before a real actor class (``SimScheduler.actor_class``), so the actor's own code runs unchanged;
    its loop is a task of the node that started it. Unlike pykka's own loop, a :class:`SimCrash` unwinds the
    actor without running its stop hooks: a crashed process runs nothing more.
    """

    _sim_node: SimNode

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> pykka.ActorRef[Any]:
        """Starts the actor as a task of its node. It is not put in pykka's process-wide registry: the
        simulation keeps its own references, and a host's ``ActorRegistry.stop_all()`` never reaches it."""
        obj = cls(*args, **kwargs)
        obj._start_actor_loop()
        return obj.actor_ref

    @staticmethod
    def _create_actor_inbox() -> Any:
        return _SimInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return SimFuture()

    def _start_actor_loop(self) -> None:
        self._sim_node.world.spawn(self._sim_node, type(self).__name__, self._actor_loop)

    def _actor_loop_running(self) -> None:
        while not self.actor_stopped.is_set():
            envelope = self.actor_inbox.get()
            try:
                response = self._handle_receive(envelope.message)
                if envelope.reply_to is not None:
                    envelope.reply_to.set(response)
            except SimCrash:
                raise
            except Exception:
                if envelope.reply_to is not None:
                    envelope.reply_to.set_exception()
                else:
                    self._handle_failure(*sys.exc_info())
                    try:
                        self.on_failure(*sys.exc_info())
                    except Exception:  # noqa: BLE001
                        self._handle_failure(*sys.exc_info())

    def _actor_loop_teardown(self) -> None:
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            if envelope.reply_to is not None:
                if isinstance(envelope.message, pykka_messages._ActorStop):  # noqa: SLF001
                    envelope.reply_to.set(None)
                else:
                    error = pykka.ActorDeadError(f"{self.actor_ref} stopped before handling the message")
                    envelope.reply_to.set_exception((pykka.ActorDeadError, error, None))

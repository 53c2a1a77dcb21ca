"""Wake-ups for ``await_events_after``: who waits on which thread, and what tells them a commit landed.

A store that can notice commits keeps one :class:`Waiters` registry and offers it, with how it watches, as a
:class:`Wakeups` (``store.wakeups()``). A waiter registers a *wake* - any object with ``set()``: a
``threading.Event`` for a blocking call, a :class:`LoopWake` for a coroutine - *before* it reads, then re-reads
after every wake. A wake is only a hint: the waiter always re-reads, so a spurious one costs one read and a lost
one at most the wait's timeout.

How each store notices commits (README "asyncio"):

* memory - the commit itself wakes the waiters of its thread;
* SQLite - one watcher thread per store polls ``PRAGMA data_version`` on a connection of its own (it changes when
  any connection or process commits to the file, and reading it costs no disk read) and wakes every waiter;
* PostgreSQL - one ``LISTEN`` connection per store wakes the waiters of the thread a notification names, and
  offers them the events it carried (a commit's notification carries them when they fit): a :class:`LoopWake`
  whose waiter's position they continue returns them without reading them again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from threadloom.domain.values import EventRecord


class Wake(Protocol):
    """What a waiter registers: ``set()`` is called from any thread, any number of times."""

    def set(self) -> None: ...


class Waiters:
    """The wakes of the calls waiting for events, by thread id. Safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_thread: dict[str, set[Wake]] = {}
        self._count = 0

    def add(self, thread_id: str, wake: Wake | None = None) -> threading.Event:
        """Registers ``wake`` (default: a new ``threading.Event``) for ``thread_id`` and returns it; give it back
        with :meth:`remove`."""
        event = threading.Event() if wake is None else wake
        with self._lock:
            group = self._by_thread.setdefault(thread_id, set())
            if event not in group:
                group.add(event)
                self._count += 1
        return event  # type: ignore[return-value]

    def remove(self, thread_id: str, wake: Wake) -> None:
        """Forgets ``wake``; removing one that is not registered does nothing."""
        with self._lock:
            group = self._by_thread.get(thread_id)
            if group is not None and wake in group:
                group.discard(wake)
                self._count -= 1
                if not group:
                    del self._by_thread[thread_id]

    def count(self) -> int:
        """How many wakes are registered (over every thread)."""
        return self._count

    def notify(self, thread_id: str, events: Sequence[EventRecord] | None = None) -> None:
        """Wakes the waiters of ``thread_id`` (those of one event loop with one callback on it).

        ``events``: the events of the commit that woke them, in ``seq`` order (immutable records, shared by every
        waiter): each :class:`LoopWake` is offered them (its :attr:`LoopWake.offered`) before it fires."""
        with self._lock:
            waiters = list(self._by_thread.get(thread_id, ()))
        if events is not None:
            for wake in waiters:
                if isinstance(wake, LoopWake):
                    wake.offered = events
        set_all(waiters)

    def wake_all(self) -> None:
        """Wakes every waiter (those of one event loop with one callback on it)."""
        with self._lock:
            waiters = [wake for group in self._by_thread.values() for wake in group]
        set_all(waiters)


class Wakeups:
    """What a store offers its waiters: the registry, how to start watching, and whether wakes can be trusted.

    Args:
        waiters: the store's registry.
        start: starts the watcher (a listener thread, a ``data_version`` poller) if it does not run; cheap,
            called by every waiter.
        listening: True while the watcher runs; while False a waiter re-reads every ``poll_interval`` too.
    """

    def __init__(
        self, waiters: Waiters, *, start: Callable[[], None] | None = None, listening: Callable[[], bool] | None = None
    ) -> None:
        self.waiters = waiters
        self._start = start
        self._listening = listening

    def start(self) -> None:
        if self._start is not None:
            self._start()

    def listening(self) -> bool:
        return True if self._listening is None else self._listening()


class LoopWake:
    """A wake that sets an ``asyncio.Event`` on its event loop, from any thread.

    Built on the loop's thread (it takes the running loop). ``set`` after the loop closed does nothing. With
    ``stamp``, :attr:`mark` holds what ``stamp()`` returned when the wake last fired (on the loop's thread, just
    before the event is set): an async store uses it to tell the reads issued after the wake from those before.
    :attr:`offered` holds the events the last notification carried (see :meth:`Waiters.notify`), or None.
    """

    __slots__ = ("_loop", "_owner", "_stamp", "event", "mark", "offered")

    def __init__(self, stamp: Callable[[], int] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._owner = threading.get_ident()
        self._stamp = stamp
        self.event = asyncio.Event()
        self.mark = 0
        self.offered: Sequence[EventRecord] | None = None

    def on_running_loop(self) -> bool:
        """True when called on the thread and loop this wake was built for."""
        return threading.get_ident() == self._owner and asyncio.get_running_loop() is self._loop

    def _fire(self) -> None:
        if self._stamp is not None:
            self.mark = self._stamp()
        self.event.set()

    def set(self) -> None:
        if self._loop.is_closed():  # nobody waits any more (setting its event would raise: found by hostile testing)
            return
        if threading.get_ident() == self._owner:  # on the loop's own thread: no need to wake its selector
            self._fire()
            return
        try:
            self._loop.call_soon_threadsafe(self._fire)
        except RuntimeError:  # the loop closed: nobody waits any more
            pass


def set_all(wakes: Iterable[Wake]) -> None:
    """Sets every wake. The :class:`LoopWake` s of an event loop running on another thread are set by one
    callback on that loop (one ``call_soon_threadsafe``, one wake-up of its selector, however many wait there)."""
    here = threading.get_ident()
    elsewhere: dict[asyncio.AbstractEventLoop, list[LoopWake]] = {}
    for wake in wakes:
        if isinstance(wake, LoopWake) and wake._owner != here:
            elsewhere.setdefault(wake._loop, []).append(wake)
        else:
            wake.set()
    for loop, group in elsewhere.items():
        try:
            loop.call_soon_threadsafe(_fire_all, group)
        except RuntimeError:  # the loop closed: nobody waits any more
            pass


def _fire_all(wakes: list[LoopWake]) -> None:
    for wake in wakes:
        wake._fire()


__all__ = ["LoopWake", "Wake", "Waiters", "Wakeups", "set_all"]

"""Store harnesses: how the contract suite builds, shares, reopens and ages a store (STYLE: eventsourcing).

A harness says only how to build a store; the suite (:mod:`threadloom.testing.contract`) holds every test.
A store that legitimately differs (the database decides time) says so with :attr:`StoreHarness.database_clock`,
never by copying a test.
"""

from __future__ import annotations

import abc
import itertools
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from threadloom.domain.clock import ManualClock
from threadloom.persistence.base import OPERATIONS, Checkpointer
from threadloom.persistence.memory.store import InMemoryCheckpointer

START = datetime(2026, 1, 1, tzinfo=timezone.utc)


class StoreHarness(abc.ABC):
    """Builds stores over one storage for one test; :meth:`cleanup` removes the storage.

    Attributes:
        name: shown in test ids.
        database_clock: True when the store reads the storage's own clock (PostgreSQL): :meth:`advance` then
            waits in real time, so time-dependent tests use durations made of :attr:`tick`.
        tick: the unit of every duration a time-dependent contract test uses (ttl, max_age, tombstone_age).
        reopenable: whether :meth:`reopen` keeps the data (False for memory).
        shared: whether :meth:`sibling` reaches the same data (False for memory).
    """

    name: str = "store"
    database_clock: bool = False
    tick: timedelta = timedelta(seconds=1)
    reopenable: bool = True
    shared: bool = True

    def __init__(self) -> None:
        self.clock = ManualClock(START)
        self._opened: list[Checkpointer] = []

    def open(self) -> Checkpointer:
        """The store under test over this test's storage (made on first use)."""
        store = self._open()
        self._opened.append(store)
        return store

    def sibling(self) -> Checkpointer:
        """Another store over the same storage (a second connection, pool or process-equivalent)."""
        store = self._sibling()
        self._opened.append(store)
        return store

    def reopen(self, store: Checkpointer) -> Checkpointer:
        """Closes ``store`` and opens a new one over the same storage."""
        store.close()
        return self.sibling()

    def advance(self, delta: timedelta) -> None:
        """Moves the store's clock forward by ``delta`` (a real wait for a database clock)."""
        if self.database_clock:
            time.sleep(delta.total_seconds())
        else:
            self.clock.advance(delta)

    def cleanup(self) -> None:
        """Closes every store this harness opened and removes the storage."""
        for store in self._opened:
            store.close()
        self._remove()

    @abc.abstractmethod
    def _open(self) -> Checkpointer: ...

    def _sibling(self) -> Checkpointer:
        return self._open()

    def _remove(self) -> None:
        return None


class MemoryHarness(StoreHarness):
    """One :class:`InMemoryCheckpointer`; its sibling is itself (memory is one process's storage)."""

    name = "memory"
    reopenable = False

    def __init__(self) -> None:
        super().__init__()
        self._store: InMemoryCheckpointer | None = None

    def _open(self) -> Checkpointer:
        self._store = InMemoryCheckpointer(self.clock)
        return self._store

    def _sibling(self) -> Checkpointer:
        assert self._store is not None, "open() first"
        return self._store

    def reopen(self, store: Checkpointer) -> Checkpointer:
        return store


class AlternatingCheckpointer(Checkpointer):
    """Sends each call to the next of several stores over one storage in turn (the "store pair" arrangement).

    Used to run the contract suite against two stores at once: every rule must hold whichever store a call
    reaches. ``close`` closes them all.
    """

    def __init__(self, *stores: Checkpointer) -> None:
        super().__init__()
        self._stores = stores
        self._turn = itertools.cycle(range(len(stores)))
        self._lock = threading.Lock()

    def _next(self) -> Checkpointer:
        with self._lock:
            return self._stores[next(self._turn)]

    def __getattribute__(self, name: str) -> Any:
        if name in OPERATIONS:
            if object.__getattribute__(self, "_closed"):
                return getattr(Checkpointer, name).__get__(self)
            return getattr(object.__getattribute__(self, "_next")(), name)
        return object.__getattribute__(self, name)

    def _close(self) -> None:
        for store in self._stores:
            store.close()

    # Every call is forwarded before it reaches these; they exist to satisfy the abstract base.
    def _unreachable(self, *_args: Any) -> Any:
        raise AssertionError("AlternatingCheckpointer forwards every call")

    _claim = _renew = _release = _commit = _latest = _checkpoint = _history = _children = _unreachable
    _events_after = _compact_events = _delete_thread = _effect = _lookup_run = _prune = _unreachable
    _sweep = _threads = _incomplete = _unreachable

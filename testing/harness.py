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
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.forwarding import ForwardingCheckpointer
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


class AlternatingCheckpointer(ForwardingCheckpointer):
    """Sends each call to the next of several stores over one storage in turn (the "store pair" arrangement).

    Used to run the contract suite against two stores at once: every rule must hold whichever store a call
    reaches. Each call is forwarded to that store's public method unchanged (it validates the call); ``close``
    closes them all, and the closed stores then refuse every call.
    """

    def __init__(self, *stores: Checkpointer) -> None:
        super().__init__(None)
        self._stores = stores
        self._turn = itertools.cycle(range(len(stores)))
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AlternatingCheckpointer{self._stores!r}"

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            store = self._stores[next(self._turn)]
        return getattr(store, operation)(*args, **kwargs)

    def close(self) -> None:
        super().close()
        for store in self._stores:
            store.close()


"""Store harnesses: how the contract suite builds, shares, reopens and ages a store.

A harness says only how to build a store; the suite (:mod:`threadloom.testing.contract`) holds every test.
A store that legitimately differs (the database decides time) says so with :attr:`StoreHarness.database_clock`,
never by copying a test.
"""

from __future__ import annotations

import abc
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from threadloom.domain.access import AccessSchemas
from threadloom.domain.clock import ManualClock
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.forwarding import ForwardingCheckpointer
from threadloom.persistence.memory.store import InMemoryCheckpointer

START = datetime(2026, 1, 1, tzinfo=UTC)


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

    access: AccessSchemas | None = None
    """The access schemas the stores this harness opens stamp with (:meth:`node` opens one with others)."""

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

    def node(self, access: AccessSchemas | None) -> Checkpointer:
        """Another store over the same storage that stamps with ``access`` (a node of another release).

        Memory included: its node shares the first store's storage (open a store first)."""
        previous, self.access = self.access, access
        try:
            store = self._node()
        finally:
            self.access = previous
        self._opened.append(store)
        return store

    def _node(self) -> Checkpointer:
        return self._sibling()

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
        self._store = InMemoryCheckpointer(self.clock, access=self.access)
        return self._store

    def _node(self) -> Checkpointer:
        assert self._store is not None, "open() first"
        return InMemoryCheckpointer(self.clock, access=self.access, shared=self._store)

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


_wrapping: dict[tuple[Any, ...], type[StoreHarness]] = {}


def wrapping_harness(
    base: type[StoreHarness],
    wrap: Callable[[StoreHarness, Checkpointer], Checkpointer] = lambda _harness, store: ForwardingCheckpointer(store),
    *,
    prefix: str = "forwarding",
    setup: Callable[[StoreHarness], None] | None = None,
) -> type[StoreHarness]:
    """A subclass of ``base`` whose every store (``open``, ``sibling``, ``reopen``) is ``base``'s store wrapped.

    The contract must hold unchanged through a wrapper, so the whole suite runs against it::

        class TestForwardingMemory(CheckpointerContract):
            harness_class = wrapping_harness(MemoryHarness)

    Args:
        base: any store harness class (memory, SQLite, PostgreSQL, …); its flags (``database_clock``,
            ``reopenable``, ``shared``, ``tick``) and its storage handling are inherited unchanged.
        wrap: builds the wrapper of one store, given the harness instance (default: a bare
            :class:`~threadloom.persistence.forwarding.ForwardingCheckpointer`).
        prefix: the start of the class's name and of its ``name`` (``"<prefix>-<base name>"``).
        setup: runs once on each new harness instance, before any store is opened (e.g. to make a shared meter).

    Returns:
        The harness class, named ``<Prefix><Base>``; the same class for the same arguments. Its instances have
        ``inner_stores`` (the unwrapped stores, in the order they were opened) and ``wrapped_stores`` (their
        wrappers, in the same order). A harness whose sibling is the store itself (memory) gets the same wrapper
        back too.
    """
    key = (base, wrap, prefix, setup)
    cached = _wrapping.get(key)
    if cached is not None:
        return cached

    def __init__(self: Any, *args: object, **kwargs: object) -> None:
        base.__init__(self, *args, **kwargs)
        self.inner_stores = []
        self.wrapped_stores = []
        if setup is not None:
            setup(self)

    def _wrap(self: Any, store: Checkpointer) -> Checkpointer:
        if any(wrapped is store for wrapped in self.wrapped_stores):
            return store
        for inner, wrapped in zip(self.inner_stores, self.wrapped_stores, strict=True):
            if inner is store:
                return wrapped
        wrapped = wrap(self, store)
        self.inner_stores.append(store)
        self.wrapped_stores.append(wrapped)
        return wrapped

    def _open(self: StoreHarness) -> Checkpointer:
        return _wrap(self, base._open(self))

    def _sibling(self: StoreHarness) -> Checkpointer:
        return _wrap(self, base._sibling(self))

    def _node(self: StoreHarness) -> Checkpointer:
        return _wrap(self, base._node(self))

    cls = type(
        f"{prefix.title().replace('-', '')}{base.__name__}",
        (base,),
        {
            "__init__": __init__,
            "__doc__": f"{base.__name__}'s stores, each wrapped ({prefix}).",
            "__module__": __name__,
            "name": f"{prefix}-{base.name}",
            "_open": _open,
            "_sibling": _sibling,
            "_node": _node,
        },
    )
    _wrapping[key] = cls
    return cls


class CountingCheckpointer(ForwardingCheckpointer):
    """A ``Checkpointer`` that counts the calls made to it, by operation name (``calls``), and forwards each."""

    def __init__(self, inner: Checkpointer) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        self.calls[operation] += 1
        return super()._forward(operation, *args, **kwargs)

"""Harnesses that run the contract suite through :class:`~threadloom.persistence.metrics.metered.MeteredCheckpointer`.

``metered_harness(SomeHarness)`` is a :class:`~threadloom.testing.harness.StoreHarness` subclass whose every store
(``open``, ``sibling``, ``reopen``) is ``SomeHarness``'s store wrapped in a ``MeteredCheckpointer``, all of one
harness instance sharing one meter (:attr:`meter`). The contract must hold unchanged through the wrapper
(seeds 000 ``MeteredCheckpointer``: it restates the whole contract)::

    class TestMeteredMemory(CheckpointerContract):
        harness_class = metered_harness(MemoryHarness)
"""

from __future__ import annotations

from collections.abc import Callable

from threadloom.persistence.base import Checkpointer
from threadloom.persistence.metrics.meter import InMemoryMeter, Meter
from threadloom.persistence.metrics.metered import MeteredCheckpointer
from threadloom.testing.harness import StoreHarness

_cache: dict[tuple[type[StoreHarness], Callable[[], Meter]], type[StoreHarness]] = {}


def metered_harness(
    base: type[StoreHarness], meter_factory: Callable[[], Meter] = InMemoryMeter
) -> type[StoreHarness]:
    """A subclass of ``base`` whose stores are wrapped in :class:`MeteredCheckpointer`.

    Args:
        base: any store harness class (memory, SQLite, PostgreSQL, …); its flags (``database_clock``,
            ``reopenable``, ``shared``, ``tick``) and its storage handling are inherited unchanged.
        meter_factory: builds the meter each harness instance shares among its stores (called once per
            harness instance, i.e. once per test).

    Returns:
        The harness class, named ``Metered<Base>`` (``name`` ``"metered-<base name>"``); the same class for the
        same arguments. Its instances have ``meter`` (the shared meter) and ``inner_stores`` (the unwrapped
        stores, in the order they were opened).
    """
    key = (base, meter_factory)
    cached = _cache.get(key)
    if cached is not None:
        return cached

    def __init__(self: StoreHarness, *args: object, **kwargs: object) -> None:
        base.__init__(self, *args, **kwargs)
        self.meter = meter_factory()  # type: ignore[attr-defined]
        self.inner_stores = []  # type: ignore[attr-defined]
        self.wrapped_stores = []  # type: ignore[attr-defined]

    def _wrap(self: StoreHarness, store: Checkpointer) -> Checkpointer:
        if isinstance(store, MeteredCheckpointer):
            return store
        for inner, wrapped in zip(self.inner_stores, self.wrapped_stores):  # type: ignore[attr-defined]
            if inner is store:  # a harness whose sibling is the store itself (memory): one wrapper too
                return wrapped
        self.inner_stores.append(store)  # type: ignore[attr-defined]
        wrapped = MeteredCheckpointer(store, self.meter)  # type: ignore[attr-defined]
        self.wrapped_stores.append(wrapped)  # type: ignore[attr-defined]
        return wrapped

    def _open(self: StoreHarness) -> Checkpointer:
        return _wrap(self, base._open(self))

    def _sibling(self: StoreHarness) -> Checkpointer:
        return _wrap(self, base._sibling(self))

    cls = type(
        f"Metered{base.__name__}",
        (base,),
        {
            "__init__": __init__,
            "__doc__": f"{base.__name__}'s stores, each wrapped in a MeteredCheckpointer sharing one meter.",
            "__module__": __name__,
            "name": f"metered-{base.name}",
            "_open": _open,
            "_sibling": _sibling,
        },
    )
    _cache[key] = cls
    return cls


__all__ = ["metered_harness"]

"""Harnesses that run the contract suite through :class:`~threadloom.persistence.metrics.metered.MeteredCheckpointer`.

``metered_harness(SomeHarness)`` is a :class:`~threadloom.testing.harness.StoreHarness` subclass whose every store
(``open``, ``sibling``, ``reopen``) is ``SomeHarness``'s store wrapped in a ``MeteredCheckpointer``, all of one
harness instance sharing one meter (:attr:`meter`). The contract must hold unchanged through the wrapper::

    class TestMeteredMemory(CheckpointerContract):
        harness_class = metered_harness(MemoryHarness)
"""

from __future__ import annotations

from collections.abc import Callable

from threadloom.persistence.base import Checkpointer
from threadloom.persistence.metrics.meter import InMemoryMeter, Meter
from threadloom.persistence.metrics.metered import MeteredCheckpointer
from threadloom.testing.harness import StoreHarness, wrapping_harness

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
    if cached is None:

        def setup(harness: StoreHarness) -> None:
            harness.meter = meter_factory()  # type: ignore[attr-defined]

        def wrap(harness: StoreHarness, store: Checkpointer) -> Checkpointer:
            return MeteredCheckpointer(store, harness.meter)  # type: ignore[attr-defined]

        cached = _cache[key] = wrapping_harness(base, wrap, prefix="metered", setup=setup)
    return cached


__all__ = ["metered_harness"]

"""The store contract suite: every rule of the ``Checkpointer`` contract, method by method, for any store.

A store's test module only says how to build its store::

    from threadloom.testing.contract import CheckpointerContract
    from threadloom.testing.harness import MemoryHarness

    class TestMemory(CheckpointerContract):
        harness_class = MemoryHarness

Each test gets a fresh :class:`~threadloom.testing.harness.StoreHarness` (the ``harness`` fixture), opens its
store with ``harness.open()``, reaches the same storage through ``harness.sibling()`` (tests that need a second
store skip when ``harness.shared`` is False) and moves the store's clock with ``harness.advance``. Every duration
a test's outcome depends on is a multiple of ``harness.tick``, so a store whose database decides time
(``harness.database_clock``) runs the same tests with real waits of a few ticks; the few tests that need an
exact instant (a claim at exactly its ``expires_at``) run only on a store that takes a clock.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import Writer, expect, snapshot, sweep_all, valid_call
from threadloom.testing.contract.access import AccessContract
from threadloom.testing.contract.claims import ClaimsContract
from threadloom.testing.contract.commits import CommitsContract
from threadloom.testing.contract.deletes import DeletesContract
from threadloom.testing.contract.reads import ReadsContract
from threadloom.testing.contract.registry import RegistryContract
from threadloom.testing.contract.retention import RetentionContract
from threadloom.testing.contract.storage import StorageContract
from threadloom.testing.harness import StoreHarness

__all__ = ["CheckpointerContract", "Writer", "expect", "snapshot", "sweep_all", "valid_call"]


class CheckpointerContract(
    ClaimsContract,
    CommitsContract,
    ReadsContract,
    DeletesContract,
    RetentionContract,
    RegistryContract,
    StorageContract,
    AccessContract,
):
    """Every store's contract tests.

    Subclass it with ``harness_class`` set to the store's :class:`StoreHarness`; override :meth:`make_harness`
    when the harness needs arguments.
    """

    harness_class: ClassVar[type[StoreHarness]]

    def make_harness(self) -> StoreHarness:
        """A fresh harness for one test."""
        return self.harness_class()

    @pytest.fixture
    def harness(self) -> Any:
        harness = self.make_harness()
        try:
            yield harness
        finally:
            harness.cleanup()

    @pytest.fixture
    def store(self, harness: StoreHarness) -> Checkpointer:
        return harness.open()


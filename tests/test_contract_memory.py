"""The store contract suite against the in-memory reference store."""

from threadloom.testing.contract import CheckpointerContract
from threadloom.testing.harness import MemoryHarness


class TestMemoryContract(CheckpointerContract):
    harness_class = MemoryHarness

"""The in-memory store: the executable reference of the contract, and its run queue."""

from threadloom.persistence.memory.store import InMemoryCheckpointer

__all__ = ["InMemoryCheckpointer"]

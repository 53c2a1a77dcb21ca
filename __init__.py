"""threadloom: durable, fenced agent threads in memory, SQLite or PostgreSQL (DESIGN.md).

Everything public is importable from here. Importing has no side effects (logging is never configured).
"""

from threadloom.domain import *  # noqa: F403
from threadloom.domain import __all__ as _domain_all
from threadloom.persistence import Checkpointer, InMemoryCheckpointer, SystemClock, open_store


def __getattr__(name: str):  # stores with optional dependencies load on first use
    if name == "SqliteCheckpointer":
        from threadloom.persistence.sqlite import SqliteCheckpointer

        return SqliteCheckpointer
    if name in ("PostgresCheckpointer", "PostgresCheckpointerConfig"):
        from threadloom.persistence import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module 'threadloom' has no attribute {name!r}")


__all__ = [
    *_domain_all,
    "Checkpointer",
    "InMemoryCheckpointer",
    "SystemClock",
    "open_store",
]

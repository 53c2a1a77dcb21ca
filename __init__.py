"""threadloom: durable, fenced agent threads in memory, SQLite or PostgreSQL (DESIGN.md).

Everything public is importable from here. Importing has no side effects (logging is never configured).
"""

from threadloom.domain import *  # noqa: F403
from threadloom.domain import __all__ as _domain_all
from threadloom.actors import *  # noqa: F403
from threadloom.actors import __all__ as _actors_all
from threadloom.persistence.queue import RunQueue
from threadloom.persistence import Checkpointer, InMemoryCheckpointer, SystemClock, open_store
from threadloom.persistence.metrics.meter import InMemoryMeter, Meter
from threadloom.persistence.metrics.metered import MeteredCheckpointer
from threadloom.persistence.sqlite.store import SqliteCheckpointer

# Imports without psycopg: the postgres extra is needed only to open one (which says so otherwise).
from threadloom.persistence.postgres.store import PostgresCheckpointer, PostgresCheckpointerConfig


__all__ = [
    *_domain_all,
    *_actors_all,
    "RunQueue",
    "Checkpointer",
    "InMemoryCheckpointer",
    "InMemoryMeter",
    "Meter",
    "MeteredCheckpointer",
    "PostgresCheckpointer",
    "PostgresCheckpointerConfig",
    "SqliteCheckpointer",
    "SystemClock",
    "open_store",
]
